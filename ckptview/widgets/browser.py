"""One run at a glance: its serials, the clicked serial's variables, the clicked variable."""

from __future__ import annotations

import panel as pn
import param

import ckptview as cv

from ._base import built_once, draw_later, rule
from .detail import VariableDetail
from .serials import SerialsTable
from .variables import VariablesTable
from .verify import VerifyPanel


class RunBrowser(pn.viewable.Viewer):
    """Serials -> variables -> detail, wired by clicks."""

    catalog = param.ClassSelector(class_=cv.Catalog)
    poll_seconds = param.Number(
        default=5.0,
        bounds=(0, None),
        doc="live run: check the tree for new serials this often; 0: off",
    )

    def __init__(self, catalog: cv.Catalog, **params):
        super().__init__(catalog=catalog, **params)
        self.serials = SerialsTable(catalog, poll_seconds=self.poll_seconds)
        self.variables = VariablesTable(catalog, serial=self.serials.selected)
        self.detail = VariableDetail(catalog, serial=self.serials.selected)
        self.verify = VerifyPanel(catalog, serial=self.serials.selected)
        self.serials.param.watch(self._on_serial, "selected")
        self.variables.param.watch(self._on_variable, "selected")
        self.serials.param.watch(self._on_sync, "version")
        self.param.watch(lambda e: setattr(self.serials, "poll_seconds", e.new), "poll_seconds")

    def poll(self) -> list[int]:
        """Check the tree and take in new serials now (blocking); the new serials."""
        return self.serials.poll()

    def _on_sync(self, event) -> None:
        if self.variables.serial in self.serials.updated:  # the shown serial changed on disk
            self.variables._update_serial()
            self.detail._describe()

    def _on_serial(self, event) -> None:
        self.variables.serial = event.new
        self.verify.serial = event.new
        self.detail.param.update(serial=event.new, variable="", node="")

    def _on_variable(self, event) -> None:
        if event.new:
            node, name = event.new
            self.detail.param.update(serial=self.variables.serial, node=node, variable=name)

    @built_once
    def __panel__(self):
        # served, the serials paint first and the serial's variables join once the page is up
        # (the browser paints a table only when the whole page has been built and the server
        # has answered it: the variables, their filters and totals doubled that time)
        below = pn.Column(sizing_mode="stretch_width")
        draw_later(below, lambda: pn.Column(self.verify, rule(), self.variables,
                                            rule(), self.detail,
                                            sizing_mode="stretch_width"))  # fmt: skip
        return pn.Column(self.serials, below, sizing_mode="stretch_width")
