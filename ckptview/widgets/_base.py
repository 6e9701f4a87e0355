"""Shared plumbing: the set of open runs, background work with a loading indicator, tables."""

from __future__ import annotations

import asyncio
import os
import posixpath
from collections.abc import Callable
from typing import Any

import pandas as pd
import panel as pn
import param

import ckptview as cv

from .guard import Guard

TABLE_CSS = """
.tabulator { font-size: 13px; }
.tabulator .tabulator-cell { padding: 3px 6px; }
.tabulator-row.tabulator-selected { background-color: #bbdefb !important; }
"""


def table(value: pd.DataFrame, **kwargs) -> pn.widgets.Tabulator:
    """A read-only Tabulator with the package's defaults (fits the page width)."""
    opts = dict(
        show_index=False, disabled=True, layout="fit_data_stretch", sizing_mode="stretch_width",
        stylesheets=[TABLE_CSS], theme="simple",
    )  # fmt: skip
    opts.update(kwargs)
    return pn.widgets.Tabulator(value, **opts)


async def in_background(target: pn.viewable.Viewable | None, fn: Callable[..., Any], *args):
    """Run ``fn(*args)`` in a worker thread while ``target`` shows a loading indicator.

    The event loop (the browser connection, the Jupyter kernel) stays responsive meanwhile.
    """
    if target is not None:
        target.loading = True
    try:
        return await asyncio.to_thread(fn, *args)
    finally:
        if target is not None:
            target.loading = False


def label_for(url: str, taken) -> str:
    """A short, unique label for a run: the tree's last path component."""
    base = posixpath.basename(os.fspath(url).rstrip("/")) or os.fspath(url)
    label, n = base, 2
    while label in taken:
        label, n = f"{base} ({n})", n + 1
    return label


class Workspace(param.Parameterized):
    """The runs (checkpoint trees) open at once, keyed by label, and what may be done to them."""

    runs = param.Dict(default={}, doc="label -> ckptview.Catalog")
    guard = param.ClassSelector(class_=Guard, doc="roots and write access")
    changed = param.Integer(default=0, doc="bumped after a restore or retention changed a tree")

    def __init__(self, catalogs=None, guard: Guard | None = None, **params):
        super().__init__(guard=guard or Guard(restrict=False, allow_write=True), **params)
        for item in catalogs or []:
            self.add(item)

    def add(self, catalog: cv.Catalog | str | os.PathLike, storage_options=None) -> str:
        """Open (if a URL) and add a run; URLs outside the guard's roots are refused."""
        if not isinstance(catalog, cv.Catalog):
            self.guard.check_url(catalog)
            catalog = cv.open(catalog, storage_options=storage_options or None)
        else:
            self.guard.check_url(catalog.url)
        for label, cat in self.runs.items():
            if cat.url == catalog.url:
                return label
        label = label_for(catalog.url, self.runs)
        self.runs = {**self.runs, label: catalog}
        return label

    def touch(self) -> None:
        """Tell the views that a tree changed (they rebuild from the refreshed catalog)."""
        self.changed += 1

    @property
    def allow_write(self) -> bool:
        return self.guard.allow_write


def as_workspace(source) -> Workspace:
    """A :class:`Workspace` from a Workspace, a Catalog, a URL, or a list of those."""
    if isinstance(source, Workspace):
        return source
    if isinstance(source, (list, tuple)):
        return Workspace(list(source))
    return Workspace([source])
