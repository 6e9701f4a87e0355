"""One run at a glance: its serials, the clicked serial's variables, the clicked variable."""

from __future__ import annotations

from functools import cached_property

import panel as pn
import param

import ckptview as cv

from ..._base import built_once, reveal, rule
from .detail import VariableDetail
from .serials import SerialsTable
from .variables import VariablesTable
from .verify import VerifyPanel


class RunBrowser(pn.viewable.Viewer):
    """Serials -> variables -> detail, wired by clicks.

    The variables, the variable's detail and the verify action are built on first use (served:
    once the visitor scrolls to them or clicks a serial), for the serial selected then."""

    catalog = param.ClassSelector(class_=cv.Catalog)
    poll_seconds = param.Number(
        default=5.0,
        bounds=(0, None),
        doc="live run: check the tree for new serials this often; 0: off",
    )

    def __init__(self, catalog: cv.Catalog, **params):
        super().__init__(catalog=catalog, **params)
        self.serials = SerialsTable(catalog, poll_seconds=self.poll_seconds)
        self.serials.param.watch(self._on_serial, "selected")
        self.serials.param.watch(self._on_sync, "version")
        self.param.watch(lambda e: setattr(self.serials, "poll_seconds", e.new), "poll_seconds")

    # -- the parts below the serials, built on first use ------------------------------------
    @cached_property
    def variables(self) -> VariablesTable:
        variables = VariablesTable(self.catalog, serial=self.serials.selected)
        variables.param.watch(self._on_variable, "selected")
        return variables

    @cached_property
    def detail(self) -> VariableDetail:
        return VariableDetail(self.catalog, serial=self.serials.selected)

    @cached_property
    def verify(self) -> VerifyPanel:
        return VerifyPanel(self.catalog, serial=self.serials.selected)

    def _part(self, name: str):
        """The part ``name`` (variables, detail, verify) if built yet, else None."""
        return self.__dict__.get(name)

    @property
    def built(self) -> list[str]:
        """The parts below the serials built so far."""
        return [name for name in ("variables", "detail", "verify") if self._part(name) is not None]

    def poll(self) -> list[int]:
        """Check the tree and take in new serials now (blocking); the new serials."""
        return self.serials.poll()

    def _on_sync(self, event) -> None:
        variables, detail = self._part("variables"), self._part("detail")
        if variables is not None and variables.serial in self.serials.updated:
            variables._update_serial()  # the shown serial changed on disk
            if detail is not None:
                detail._describe()

    def _on_serial(self, event) -> None:
        # a serial clicked: its variables are what the visitor asked for (served, the parts
        # still waiting to be scrolled to are built now, for this serial)
        reveal()
        variables, verify, detail = (self._part(n) for n in ("variables", "verify", "detail"))
        if variables is not None:
            variables.serial = event.new
        if verify is not None:
            verify.serial = event.new
        if detail is not None:
            detail.param.update(serial=event.new, variable="", node="")

    def _on_variable(self, event) -> None:
        if event.new:
            node, name = event.new
            self.detail.param.update(serial=self.variables.serial, node=node, variable=name)

    @built_once
    def __panel__(self):
        # served, the first screen holds the serials; the serial's variables are built with
        # the serials' timeline once the visitor scrolls to it (or clicks a serial): a page
        # that is only glanced at never builds them; all in the serials' Column (no Column
        # of their own)
        return self.serials.view(lambda: [self.verify, rule(), self.variables, rule(),
                                          self.detail])  # fmt: skip
