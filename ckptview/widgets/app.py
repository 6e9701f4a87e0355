"""The dashboard: every widget over a workspace of runs, in a ``pmui.Page`` shell.

``build_app(urls, allow_write=False)`` is the body of ``app/ckptview_app.py`` (``panel serve``)
and of ``ckptview serve``. Only the given trees and trees below them can be opened; without
``allow_write`` no change to a tree is offered, and one forced from the browser is refused here.
"""

from __future__ import annotations

import panel as pn
import param

from ._base import Workspace, notice
from .browser import RunBrowser
from .compare import CompareView
from .guard import Guard
from .picker import TreePicker
from .restore import RestoreView
from .retention import RetentionView
from .trajectory import TrajectoryPlot

TABS = ["Browse", "Compare", "Trajectory", "Restore", "Retention"]


class Dashboard(pn.viewable.Viewer):
    """Runs on the left, one tab per task on the right; per-run views built on first use."""

    run = param.Selector(objects=[], doc="the run the Browse/Trajectory tabs show")

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
        self.tabs = pn.Tabs(
            ("Browse", self.browse_area), ("Compare", self.compare),
            ("Trajectory", self.trajectory_area), ("Restore", self.restore),
            ("Retention", self.retention), dynamic=True, sizing_mode="stretch_width",
            css_classes=["ckptview-tabs"],
        )  # fmt: skip
        workspace.param.watch(self._on_runs, "runs")
        workspace.param.watch(self._on_changed, "changed")
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
        try:
            if self.run not in self._browsers:
                self._browsers[self.run] = RunBrowser(cat)
            self.browse_area.objects = [self._browsers[self.run]]
            if self.run not in self._trajectories:
                self._trajectories[self.run] = TrajectoryPlot(cat)
            self.trajectory_area.objects = [self._trajectories[self.run]]
        except Exception as e:  # noqa: BLE001 - a tree that cannot be read is shown, not fatal
            self.browse_area.objects = [
                notice(f"**{self.run}**: {type(e).__name__}: {e}", kind="danger")
            ]

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
        return pn.Row(pn.Column(*self.sidebar(), width=320), self.tabs,
                      sizing_mode="stretch_width")  # fmt: skip


def build_app(urls: list[str], allow_write: bool = False):
    """The served page for the trees at ``urls`` (the only roots it will open)."""
    import panel_material_ui as pmui

    pn.extension("tabulator", notifications=True)
    workspace = Workspace(guard=Guard(roots=list(urls), allow_write=allow_write))
    problems = []
    for url in urls:
        try:
            workspace.add(url)
        except Exception as e:  # noqa: BLE001 - shown on the page
            problems.append(notice(f"`{url}`: {type(e).__name__}: {e}", kind="danger"))
    dashboard = Dashboard(workspace)
    if not urls:
        problems.append(notice("No tree given: `ckptview serve URL...`",
                                      kind="warning"))  # fmt: skip
    return pmui.Page(
        title="ckptview" + ("" if allow_write else " · read-only"),
        sidebar=dashboard.sidebar(), sidebar_width=340,
        main=[*problems, dashboard.tabs],
    )  # fmt: skip


def parse_args(argv: list[str]) -> tuple[list[str], bool]:
    """The tree URLs and the write flag from ``panel serve ... --args URL... [--allow-write]``."""
    import argparse

    p = argparse.ArgumentParser(prog="ckptview_app")
    p.add_argument("urls", nargs="*")
    p.add_argument("--allow-write", action="store_true")
    ns = p.parse_args(argv)
    return ns.urls, ns.allow_write


def serve(argv: list[str]):
    """Build the page from ``--args`` and mark it servable (the whole of the app script)."""
    urls, allow_write = parse_args(argv)
    return build_app(urls, allow_write=allow_write).servable(title="ckptview")
