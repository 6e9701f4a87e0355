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


NOTICE_STYLES = {
    "info": {"background": "#e3f2fd", "color": "#0d3c61", "border-left": "4px solid #1976d2"},
    "success": {"background": "#e8f5e9", "color": "#1b4d20", "border-left": "4px solid #2e7d32"},
    "warning": {"background": "#fff8e1", "color": "#5d4200", "border-left": "4px solid #f9a825"},
    "danger": {"background": "#ffebee", "color": "#7f1d1d", "border-left": "4px solid #c62828"},
}


def notice(text: str = "", kind: str = "info", **kwargs) -> pn.pane.Markdown:
    """A readable message box (dark text on a light tint) in any design or theme."""
    kwargs.setdefault("sizing_mode", "stretch_width")
    pane = pn.pane.Markdown(text, **kwargs)
    set_notice(pane, text, kind)
    return pane


def set_notice(pane: pn.pane.Markdown, text: str, kind: str = "info") -> None:
    """Change a :func:`notice`'s text and kind; the kind is also a CSS class (for tests)."""
    style = {**NOTICE_STYLES[kind], "padding": "2px 12px", "border-radius": "4px"}
    classes = [c for c in pane.css_classes if not c.startswith("cv-notice-")]
    pane.param.update(object=text, styles=style, css_classes=[*classes, f"cv-notice-{kind}"])
