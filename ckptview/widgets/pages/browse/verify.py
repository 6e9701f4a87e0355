"""Verify one serial from the dashboard: the findings of :meth:`ckptview.Catalog.verify`."""

from __future__ import annotations

import pandas as pd
import panel as pn
import param

import ckptview as cv

from ..._base import BUTTON_CSS, in_background, notice, set_notice, table
from ..._format import md_problem

SHOWN = ["file", "check", "severity", "message"]


class VerifyPanel(pn.viewable.Viewer):
    """A Verify action for ``serial`` (headers; ``deep`` reads values and checksums) and its
    findings table."""

    catalog = param.ClassSelector(class_=cv.Catalog)
    serial = param.Integer(default=None, allow_None=True)
    deep = param.Boolean(default=False, doc="read every value and check the zip CRC-32s")

    def __init__(self, catalog: cv.Catalog, **params):
        super().__init__(catalog=catalog, **params)
        self.button = pn.widgets.Button(label="Verify", button_type="primary", width=110,
                                        stylesheets=[BUTTON_CSS],
                                        css_classes=["ckptview-verify"])  # fmt: skip
        self.button.on_click(self._on_verify)
        self.message = notice("", visible=False, css_classes=["ckptview-verify-result"])
        self._findings: pn.widgets.Tabulator | None = None
        self.body = pn.Column(
            pn.Row(self.button, pn.widgets.Checkbox.from_param(self.param.deep, label="deep")),
            self.message, sizing_mode="stretch_width",
        )  # fmt: skip

    @property
    def findings(self) -> pn.widgets.Tabulator:
        """The findings table; it joins the page with the first verify (a page that never
        verifies never builds it)."""
        if self._findings is None:
            self._add_findings(pd.DataFrame(columns=SHOWN), visible=False)
        assert self._findings is not None
        return self._findings

    def _add_findings(self, value: pd.DataFrame, visible: bool) -> None:
        # built with its rows: a Tabulator given new rows before the browser has built it
        # breaks the page
        self._findings = table(value, css_classes=["ckptview-findings"],
                               layout="fit_columns", widths={"check": 130, "severity": 90},
                               formatters={"file": {"type": "textarea"},
                                           "message": {"type": "textarea"}},
                               visible=visible)  # fmt: skip
        self.body.append(self._findings)

    @param.depends("serial", watch=True)
    def _reset(self) -> None:
        self.message.visible = False
        if self._findings is not None:
            self._findings.visible = False

    def run(self) -> pd.DataFrame:
        """The findings for the current serial (blocking)."""
        return self.catalog.verify(self.serial, deep=self.deep)

    def show(self, found: pd.DataFrame) -> None:
        errors = (found["severity"] == "error").any()
        kind = "success" if found.empty else "danger" if errors else "warning"
        text = (
            f"Serial {self.serial}: no findings" + (" (deep)" if self.deep else "")
            if found.empty
            else f"Serial {self.serial}: {len(found)} finding(s)"
        )
        set_notice(self.message, text, kind)
        self.message.visible = True
        rows = found[SHOWN].astype(object)
        if self._findings is None:
            self._add_findings(rows, visible=not found.empty)
        else:
            self._findings.param.update(value=rows, visible=not found.empty)

    async def _on_verify(self, event=None) -> None:
        if self.serial is None:
            return
        try:
            self.show(await in_background(self.body, self.run))
        except Exception as e:  # noqa: BLE001 - shown to the user, never a dead page
            set_notice(self.message, md_problem(e, "verify"), "danger")
            self.message.visible = True

    def __panel__(self):
        return self.body
