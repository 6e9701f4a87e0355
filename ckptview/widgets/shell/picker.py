"""Open checkpoint trees (runs): a URL plus fsspec storage options; several at once."""

from __future__ import annotations

import json

import panel as pn
import param

from .._base import (
    BUTTON_CSS,
    Workspace,
    as_workspace,
    built_once,
    in_background,
    wrapping,
)
from .._format import md_code, md_problem, md_text


class TreePicker(pn.viewable.Viewer):
    """URL + storage options -> a new run in the workspace (refused outside the roots)."""

    url = param.String(default="", doc="checkpoint tree URL (any fsspec URL)")
    storage_options = param.String(default="", doc='JSON, e.g. {"anon": true}')

    def __init__(self, workspace=None, **params):
        self.workspace: Workspace = as_workspace(workspace if workspace is not None else [])
        super().__init__(**params)
        self.button = pn.widgets.Button(label="Open", color="primary", stylesheets=[BUTTON_CSS],
                                        css_classes=["ckptview-open"])  # fmt: skip
        self.button.on_click(self._on_open)
        self.message = pn.pane.Markdown(**wrapping(css_classes=["ckptview-picker-message"]))
        self.runs = pn.pane.Markdown(**wrapping(css_classes=["ckptview-runs"]))
        self.workspace.param.watch(lambda e: self._list(), "runs")
        self._list()

    def _list(self) -> None:
        runs = self.workspace.runs
        self.runs.object = (
            "\n".join(
                f"- **{md_text(label)}** · {md_text(cat.layout)} · {md_code(cat.url)}"
                for label, cat in runs.items()
            )  # fmt: skip
            or "*No tree open.*"
        )

    def open(self) -> str:
        """Open ``url`` (blocking); returns the run's label. Raises on refusal or bad input."""
        try:
            options = json.loads(self.storage_options) if self.storage_options.strip() else {}
        except json.JSONDecodeError as e:
            raise ValueError(f"storage options are not JSON: {e}") from None
        if not isinstance(options, dict):
            raise ValueError("storage options must be a JSON object")
        label = self.workspace.add(self.url.strip(), storage_options=options)
        cat = self.workspace.runs[label]
        cat.serials  # noqa: B018 - scan now, in the worker thread, not later in the UI
        return label

    async def _on_open(self, event=None) -> None:
        try:
            label = await in_background(self.button, self.open)
            self.message.object = f"Opened **{md_text(label)}**."
        except Exception as e:  # noqa: BLE001 - refusals and bad trees are shown
            self.message.object = md_problem(e, "open this tree")

    @built_once
    def __panel__(self):
        return pn.Column(
            pn.widgets.TextInput.from_param(self.param.url, label="tree URL",
                                            placeholder="s3://bucket/run or /path/to/run",
                                            css_classes=["ckptview-url"],
                                            sizing_mode="stretch_width"),
            pn.widgets.TextInput.from_param(self.param.storage_options,
                                            label="storage options (JSON)",
                                            placeholder='{"anon": true}',
                                            css_classes=["ckptview-storage-options"],
                                            sizing_mode="stretch_width"),
            self.button, self.message, self.runs, sizing_mode="stretch_width",
        )  # fmt: skip
