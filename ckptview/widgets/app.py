"""The dashboard: every widget over a workspace of runs, in a ``pmui.Page`` shell.

``build_app(urls, allow_write=False)`` is the body of ``app/ckptview_app.py`` (``panel serve``)
and of ``ckptview serve``. Only the given trees and trees below them can be opened; without
``allow_write`` no change to a tree is offered, and one forced from the browser is refused here.
"""

from __future__ import annotations

import argparse
import os

import panel as pn
import panel_material_ui as pmui
import param

import ckptview as cv
from ckptview.scan.isolated import IsolatedExecutor

from ._base import Workspace, in_background, notice
from ._format import md_code, md_error, md_text
from .browser import RunBrowser
from .compare import CompareView
from .guard import Guard
from .picker import TreePicker
from .restore import RestoreView
from .retention import RetentionView
from .trajectory import TrajectoryPlot

TABS = ["Browse", "Compare", "Trajectory", "Restore", "Retention"]
#: the dark theme's primary colour: buttons white on a mid blue (pale blue with white text
#: was unreadable); the light theme keeps Material's defaults
THEME = {"light": {}, "dark": {"palette": {"primary": {"main": "#1976d2", "contrastText": "#fff"}}}}


class Dashboard(pn.viewable.Viewer):
    """Runs on the left, one tab per task on the right; per-run views built on first use."""

    run = param.Selector(objects=[], doc="the run the Browse/Trajectory tabs show")
    poll_seconds = param.Number(
        default=5.0,
        bounds=(0, None),
        doc="live runs: check the trees for new serials this often; 0: off",
    )

    def __init__(self, workspace: Workspace, **params):
        self.workspace = workspace
        super().__init__(**params)
        self.picker = TreePicker(workspace)
        self.compare = CompareView(workspace)
        self.restore = RestoreView(workspace)
        self.retention = RetentionView(workspace)
        self._browsers: dict[str, RunBrowser] = {}
        self._trajectories: dict[str, TrajectoryPlot] = {}
        self.browse_area = pn.Column(sizing_mode="stretch_width", css_classes=["ckptview-browse"])
        self.trajectory_area = pn.Column(sizing_mode="stretch_width")
        self.tabs = pmui.Tabs(  # Material tabs: role="tablist"/"tab", keyboard navigation
            ("Browse", self.browse_area), ("Compare", self.compare),
            ("Trajectory", self.trajectory_area), ("Restore", self.restore),
            ("Retention", self.retention), dynamic=True, sizing_mode="stretch_width",
            css_classes=["ckptview-tabs"],
        )  # fmt: skip
        workspace.param.watch(self._on_runs, "runs")
        workspace.param.watch(self._on_changed, "changed")
        self.tabs.param.watch(lambda e: self._show(), "active")
        self._callback = None
        self._failures_shown: dict[str, str] = {}
        self._on_runs()

    def _on_runs(self, event=None) -> None:
        labels = list(self.workspace.runs)
        self.param.run.objects = labels
        if event is not None and event.new and len(event.new) > len(event.old or {}):
            self.run = labels[-1]  # a run just opened: show it
        elif labels and self.run not in labels:
            self.run = labels[0]
        self._show()

    def _on_changed(self, event=None) -> None:
        self._browsers.clear()
        self._trajectories.clear()
        self._show()

    @param.depends("run", watch=True)
    def _show(self) -> None:
        if self.run is None:
            self.browse_area.objects = [notice("No tree open.", kind="warning")]
            return
        cat = self.workspace.runs[self.run]
        failed = self.workspace.failures.get(self.run)
        warning = [notice(f"**{md_text(self.run)}**: could not check the tree for new serials: "
                          f"{md_text(failed)}", kind="danger", css_classes=["ckptview-tree-error"])
                   ] if failed else []  # fmt: skip
        try:
            if self.run not in self._browsers:  # the dashboard polls for all of them
                self._browsers[self.run] = RunBrowser(cat, poll_seconds=0)
            self.browse_area.objects = [*warning, self._browsers[self.run]]
        except Exception as e:  # noqa: BLE001 - a tree that cannot be read is shown, not fatal
            self.browse_area.objects = [
                notice(f"**{md_text(self.run)}**: {md_error(e)}", kind="danger")
            ]
        if TABS[self.tabs.active] != "Trajectory":
            return  # built on first use: it reads values across every serial
        try:
            if self.run not in self._trajectories:
                self._trajectories[self.run] = TrajectoryPlot(cat)
            self.trajectory_area.objects = [self._trajectories[self.run]]
        except Exception as e:  # noqa: BLE001
            self.trajectory_area.objects = [
                notice(f"**{md_text(self.run)}**: {md_error(e)}", kind="danger")
            ]

    # -- live runs ------------------------------------------------------------------------------
    def poll(self) -> list[int]:
        """Check every open tree (blocking) and take in new serials; the new serials shown."""
        return self.sync(self.workspace.poll())

    def sync(self, refreshed=()) -> list[int]:
        """Update the views from the (already refreshed) catalogs, keeping selections."""
        new = []
        for browser in self._browsers.values():
            new += browser.serials.sync()
        stale = [r for r in self._trajectories if r in refreshed]
        for label in stale:  # rebuilt with the new serials when next shown
            del self._trajectories[label]
        failures = dict(self.workspace.failures)
        if (stale and self.run in stale) or failures != self._failures_shown:
            self._failures_shown = failures
            self._show()
        if refreshed or new:
            self.workspace.grown += 1
        return new

    async def _tick(self) -> None:
        try:
            refreshed = await in_background(None, self.workspace.poll)
        except Exception:  # noqa: BLE001 - a storage hiccup: try again next period
            return
        self.sync(refreshed)

    def start_polling(self) -> None:
        """Poll every ``poll_seconds`` while the page is open (tied to the browser session)."""
        if self.poll_seconds > 0 and self._callback is None:
            self._callback = pn.state.add_periodic_callback(
                self._tick, period=int(self.poll_seconds * 1000)
            )

    def sidebar(self) -> list:
        mode = (
            "**write access enabled**: restore and retention can change trees"
            if self.workspace.allow_write
            else "**read-only**: nothing can be changed from this page"
        )
        return [
            notice(mode, kind="warning" if self.workspace.allow_write else "info",
                          css_classes=["ckptview-mode"]),
            pn.widgets.RadioBoxGroup.from_param(self.param.run, label="run",
                                                css_classes=["ckptview-run-select"]),
            pn.pane.Markdown("#### Open another tree"),
            self.picker,
        ]  # fmt: skip

    def __panel__(self):
        self.start_polling()
        return pn.Row(pn.Column(*self.sidebar(), width=320), self.tabs,
                      sizing_mode="stretch_width")  # fmt: skip


def server_executor() -> IsolatedExecutor:
    """The server's process pool for listing files (one per server process, shared by every
    session): a parser that crashes or blows up its memory takes down a worker, not the page."""
    return pn.state.as_cached("ckptview-isolated-executor", IsolatedExecutor)


def shared_catalog(url: str, executor=None) -> cv.Catalog:
    """One catalog per tree for the whole server: every browser session shares it (a big tree
    is catalogued once; ``panel serve --warm`` does it before the first page is asked for).
    ``executor`` lists its files (the server's :func:`server_executor`)."""

    def load() -> cv.Catalog:
        cat = cv.open(url, executor=executor)
        cat.serials  # noqa: B018 - catalogue now, not in the first page's callbacks
        cat.variables  # noqa: B018
        return cat

    return pn.state.as_cached(f"ckptview-catalog:{url}", load)


def build_app(urls: list[str], allow_write: bool = False, poll_seconds: float = 5.0,
              isolate: bool = False):  # fmt: skip
    """The served page for the trees at ``urls`` (the only roots it will open).

    The trees are checked for new serials every ``poll_seconds`` while a page is open (0: off).
    ``isolate``: their files (and those of trees opened from the page) are listed by the
    server's :func:`server_executor`, in worker processes with resource limits.
    """
    pn.extension("tabulator", notifications=True)
    executor = server_executor() if isolate else None
    workspace = Workspace(guard=Guard(roots=list(urls), allow_write=allow_write),
                          executor=executor)  # fmt: skip
    problems = []
    for url in urls:
        try:
            workspace.add(shared_catalog(url, executor))
        except Exception as e:  # noqa: BLE001 - shown on the page
            problems.append(notice(f"{md_code(url)}: {md_error(e)}", kind="danger"))
    dashboard = Dashboard(workspace, poll_seconds=poll_seconds)
    if pn.state.curdoc is not None and pn.state.curdoc.session_context is not None:
        dashboard.start_polling()  # served: tied to this browser session
    if not urls:
        problems.append(notice("No tree given: `ckptview serve URL...`",
                                      kind="warning"))  # fmt: skip
    return pmui.Page(
        title="ckptview" + ("" if allow_write else " · read-only"),
        sidebar=dashboard.sidebar(), sidebar_width=300, theme_config=THEME,
        main=[*problems, dashboard.tabs],
    )  # fmt: skip


def _parser():
    p = argparse.ArgumentParser(prog="ckptview_app")
    p.add_argument("urls", nargs="*")
    p.add_argument("--allow-write", action="store_true")
    p.add_argument(
        "--poll",
        type=float,
        default=None,
        metavar="SECONDS",
        help="check the trees for new serials this often (default 5; 0: off)",
    )
    return p


def parse_args(argv: list[str]) -> tuple[list[str], bool]:
    """The tree URLs and the write flag from ``panel serve ... --args URL... [--allow-write]``."""
    ns = _parser().parse_args(argv)
    return ns.urls, ns.allow_write


def poll_seconds(argv: list[str]) -> float:
    """``--poll SECONDS``, else ``$CKPTVIEW_POLL_SECONDS``, else 5 (0 turns polling off)."""
    value = _parser().parse_args(argv).poll
    if value is None:
        try:
            value = float(os.environ.get("CKPTVIEW_POLL_SECONDS", "5"))
        except ValueError:
            value = 5.0
    return max(0.0, value)


def serve(argv: list[str]):
    """Build the page from ``--args`` and mark it servable (the whole of the app script)."""
    urls, allow_write = parse_args(argv)
    page = build_app(urls, allow_write=allow_write, poll_seconds=poll_seconds(argv), isolate=True)
    return page.servable(title="ckptview")
