"""The dashboard: every widget over a workspace of runs, in a ``pmui.Page`` shell.

``build_app(urls, allow_write=False)`` is the body of ``app/ckptview_app.py`` (``panel serve``)
and of ``ckptview serve``. Only the given trees and trees below them can be opened; without
``allow_write`` no change to a tree is offered, and one forced from the browser is refused here.
"""

from __future__ import annotations

import argparse
import gc
import os
import weakref
from functools import cached_property

import panel as pn
import panel_material_ui as pmui
import param

import ckptview as cv
from ckptview.experiment import Experiment
from ckptview.scan.isolated import IsolatedExecutor

from .._base import Workspace, in_background, notice, set_notice
from .._base import served as is_served
from .._format import md_code, md_error, md_text
from ..guard import Guard
from ..pages.browse.browser import RunBrowser
from ..pages.compare import CompareView
from ..pages.health import HealthView
from ..pages.restore import RestoreView
from ..pages.retention import RetentionView
from ..pages.runs import RunsView, add_runs
from ..pages.trajectory import TrajectoryPlot
from .loading import TreeLoad
from .picker import TreePicker

TABS = ["Browse", "Compare", "Trajectory", "Restore", "Retention", "Health"]
#: the dark theme's primary colour: buttons white on a mid blue (pale blue with white text
#: was unreadable); the light theme keeps Material's defaults
THEME = {"light": {}, "dark": {"palette": {"primary": {"main": "#1976d2", "contrastText": "#fff"}}}}
#: the tabs whose view covers the whole workspace, built when the tab is first opened
WORKSPACE_VIEWS = {"Compare": CompareView, "Restore": RestoreView, "Retention": RetentionView,
                   "Health": HealthView}  # fmt: skip


class Dashboard(pn.viewable.Viewer):
    """Runs on the left, one tab per task on the right; every view but Browse is built when its
    tab is first opened (a page that is only browsed never builds Compare, Restore, Retention).

    With an ``experiment`` its runs join the workspace and a first tab, Runs, shows them side
    by side (:class:`RunsView`); a click on a run opens it in the Browse tab."""

    run = param.Selector(objects=[], doc="the run the Browse/Trajectory tabs show")
    poll_seconds = param.Number(
        default=5.0,
        bounds=(0, None),
        doc="live runs: check the trees for new serials this often; 0: off",
    )

    def __init__(self, workspace: Workspace, experiment: Experiment | None = None, **params):
        self.workspace = workspace
        super().__init__(**params)
        #: the experiment's run names -> their labels in the workspace
        self.run_labels = add_runs(workspace, experiment) if experiment is not None else {}
        self.tab_names = ["Runs", *TABS] if experiment is not None else list(TABS)
        self.runs_view = (RunsView(experiment, on_open=self.open_run, workspace=workspace)
                          if experiment is not None else None)  # fmt: skip
        #: in the sidebar(s), till clicked; held by their layouts only (a notebook that shows
        #: the dashboard again makes new ones: the old go with their outputs)
        self._picker_buttons: weakref.WeakSet[pn.widgets.Button] = weakref.WeakSet()
        self._sidebar_hosts: list[tuple[weakref.ref, str]] = []  # (layout, its list) showing it
        self._views: dict[str, pn.viewable.Viewer] = {}  # tab name -> its view, once built
        self._browsers: dict[str, RunBrowser] = {}
        self._trajectories: dict[str, TrajectoryPlot] = {}
        self.browse_area = pn.Column(sizing_mode="stretch_width", css_classes=["ckptview-browse"])
        #: the other tabs' Columns, each made when its tab is first opened (till then the tab
        #: holds :data:`LATER`: most pages only browse)
        self._areas: dict[str, pn.Column] = {}
        self.tabs = TextTabs(  # Material tabs: role="tablist"/"tab", keyboard navigation
            ("Browse", self.browse_area), *((name, LATER) for name in TABS[1:]), dynamic=True,
            sizing_mode="stretch_width", css_classes=["ckptview-tabs"],
        )  # fmt: skip
        if self.runs_view is not None:  # an experiment: its Runs page first, and shown first
            self.tabs.insert(0, ("Runs", pn.Column(self.runs_view, sizing_mode="stretch_width")))
            self.tabs.active = 0
        self._watchers = [workspace.param.watch(self._on_runs, "runs"),
                          workspace.param.watch(self._on_changed, "changed")]  # fmt: skip
        self.tabs.param.watch(self._on_tab, "active")
        self._callback = None
        self._failures_shown: dict[str, str] = {}
        self._on_runs()

    # -- views built on first use -------------------------------------------------------------
    def area(self, name: str) -> pn.Column:
        """The Column of the tab ``name`` (not Browse), put into its tab on first use."""
        if name not in self._areas:
            self._areas[name] = pn.Column(sizing_mode="stretch_width")
            self.tabs[self.tab_names.index(name)] = (name, self._areas[name])
        return self._areas[name]

    @property
    def trajectory_area(self) -> pn.Column:
        return self.area("Trajectory")

    @cached_property
    def picker(self) -> TreePicker:
        """The "Open another tree" form, built on first use (its button in the sidebar)."""
        return TreePicker(self.workspace)

    def view(self, name: str) -> pn.viewable.Viewer:
        """The view of the tab ``name`` (Compare, Restore, Retention), built on first use."""
        if name not in self._views:
            self._views[name] = WORKSPACE_VIEWS[name](self.workspace)
            if name == "Health":  # its rollback point opens the Restore tab's plan
                self._views[name].on_restore = self._plan_restore
            self.area(name).objects = [self._views[name]]
        return self._views[name]

    @property
    def built(self) -> list[str]:
        """The tabs whose view exists so far (Browse always)."""
        return ["Browse", *self._views, *(["Trajectory"] if self._trajectories else [])]

    @property
    def compare(self) -> CompareView:
        return self.view("Compare")

    @property
    def restore(self) -> RestoreView:
        return self.view("Restore")

    @property
    def retention(self) -> RetentionView:
        return self.view("Retention")

    async def _plan_restore(self, run: str, serial: int) -> None:
        """The Restore tab, showing the dry-run plan of ``serial`` of ``run``."""
        self.tabs.active = self.tab_names.index("Restore")
        view = self.restore
        view.param.update(run=run, serial=serial)
        await view._on_plan()

    async def open_run(self, run: str) -> None:
        """Show the experiment's run ``run`` in the Browse tab (the Runs tab leads back)."""
        label = self.run_labels.get(run, run)
        if label in self.workspace.runs:  # the run, then the tab (which builds its browser)
            self.run = label
            self.tabs.active = self.tab_names.index("Browse")

    def _on_tab(self, event) -> None:
        name = self.tab_names[event.new]
        if name == "Runs":
            return
        if name in WORKSPACE_VIEWS:
            self.view(name)
        else:
            self._show()

    def close(self) -> None:
        """Let go of everything this dashboard holds (its browser session ended): polling
        stops, the views are dropped and nothing shared keeps a reference to them."""
        if self._callback is not None:
            self._callback.stop()
            self._callback = None
        for browser in self._browsers.values():
            browser.serials.stop_polling()
        for watcher in self._watchers:
            self.workspace.param.unwatch(watcher)
        self._watchers = []
        self._browsers.clear()
        self._trajectories.clear()
        self._views.clear()

    def _on_runs(self, event=None) -> None:
        labels = list(self.workspace.runs)
        self.param.run.objects = labels
        before = self.run
        grown = event is not None and event.new and len(event.new) > len(event.old or {})
        if grown and self.workspace.show_added:
            self.run = labels[-1]  # a run just opened: show it
        elif grown and self.run in labels:
            return  # a tree catalogued in the background joins the lists, the page stays
        elif labels and self.run not in labels:
            self.run = labels[0]
        if self.run == before:  # else ``_show`` ran when ``run`` changed
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
        if self.tab_names[self.tabs.active] == "Runs":
            # built when the Browse tab opens: a figure built into the hidden tab could fail
            # Bokeh's layout when shown (and the tab then did not switch)
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
        if self.tab_names[self.tabs.active] != "Trajectory":
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
        if refreshed and self.runs_view is not None:
            self.runs_view.sync()
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
        """The sidebar's parts; whoever lays them out says where with :meth:`host_sidebar`."""
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
            self._picker_toggle(),
        ]  # fmt: skip

    def host_sidebar(self, layout, attr: str = "objects") -> None:
        """``layout``'s list ``attr`` holds the parts of :meth:`sidebar` (the button of the
        tree picker is replaced there by the picker)."""
        self._sidebar_hosts = [(ref, a) for ref, a in self._sidebar_hosts if ref() is not None]
        self._sidebar_hosts.append((weakref.ref(layout), attr))

    def _picker_toggle(self) -> pn.widgets.Button:
        """A button that opens the tree picker (:meth:`open_picker`) in its place.

        The form (two text inputs, its button, the list of open trees) is used by few
        visitors; built for every page it was a tenth of the server's work per page."""
        button = pn.widgets.Button(label="Open another tree…", color="primary", variant="outline",
                                   css_classes=["ckptview-picker-toggle"],
                                   sizing_mode="stretch_width")  # fmt: skip
        self._picker_buttons.add(button)
        button.on_click(lambda event: self.open_picker())
        return button

    def open_picker(self) -> TreePicker:
        """Show the tree picker in the sidebar, in its button's place (what the button
        does); the picker."""
        picker = self.picker
        buttons = {id(b) for b in self._picker_buttons}
        for ref, attr in self._sidebar_hosts:
            if (layout := ref()) is None:
                continue
            parts = list(getattr(layout, attr))
            at = next((i for i, part in enumerate(parts) if id(part) in buttons), None)
            if at is not None:
                parts[at:at + 1] = [pn.pane.Markdown("#### Open another tree"), picker]
                setattr(layout, attr, parts)
        return picker

    def __panel__(self):
        self.start_polling()
        side = pn.Column(*self.sidebar(), width=320)
        self.host_sidebar(side)
        return pn.Row(side, self.tabs, sizing_mode="stretch_width")


class _NoHeader(pn.viewable.Viewable):
    """The header of a tab titled by text in :class:`TextTabs`: a place holder, never sent."""

    def select(self, selector=None) -> list:
        return []

    def _cleanup(self, root=None) -> None:
        pass


#: one for every tab titled by text (it holds nothing and never becomes a model)
_NO_HEADER = _NoHeader()
#: stands in every tab whose content is not made yet (:meth:`Dashboard.area`); TextTabs shows
#: a Spacer for it, as for a tab not shown
LATER = pn.Spacer()


class TextTabs(pmui.Tabs):
    """``pmui.Tabs`` whose tabs titled by text get no header pane.

    ``pmui.Tabs`` makes a header pane for every tab, an empty text pane (and the ``Row`` every
    pane has) when the title is plain text, which is then all the browser shows: two Panel
    objects and a Bokeh model per tab, built and sent for nothing. Here such a tab's header is
    :data:`_NO_HEADER`, so ``_headers`` stays in step with the tabs through ``insert``,
    ``append``, ``pop``... and no header is sent while every tab is titled by text. Once a tab
    has a header of its own, the others get their empty text pane, as in ``pmui.Tabs``."""

    def __init__(self, *objects, **params):
        super().__init__(*objects, **params)
        self._step_headers()

    def _to_object_and_name(self, item):
        pane, header, name = super()._to_object_and_name(item)
        return pane, _NO_HEADER if header is None else header, name

    def _step_headers(self) -> None:
        """No text pane for a tab titled by text, unless another tab has a header pane."""
        headers = self._headers
        blank = [h is _NO_HEADER or (isinstance(h, pn.pane.Str) and h.object is None)
                 for h in headers]  # fmt: skip
        if all(blank):
            headers[:] = [_NO_HEADER] * len(headers)
        else:
            headers[:] = [pn.pane.Str() if h is _NO_HEADER else h for h in headers]

    @param.depends("objects", watch=True)
    def _trigger_names(self):  # every change of the tabs ends here (``objects`` set)
        self._step_headers()
        super()._trigger_names()

    def _get_child_model(self, child, doc, root, parent, comm):
        if child is self._headers and all(h is _NO_HEADER for h in child):
            return [], []
        if child is self.objects and self.dynamic:
            return self._shown_models(child, doc, root, parent, comm)
        return super()._get_child_model(child, doc, root, parent, comm)

    def _shown_models(self, child, doc, root, parent, comm) -> tuple[list, list]:
        """The tabs' models when only the shown tab is drawn: its content, and one Spacer
        standing for every other tab and for :data:`LATER` (``pmui.Tabs`` builds a Spacer per
        tab; the browser draws the shown tab's content only)."""
        from bokeh.models import Spacer
        from panel_material_ui.layout.base import _acquire_model

        ref = root.ref["id"]
        models, old, spacer = [], [], None
        for i, obj in enumerate(child):
            if obj is LATER or not self._is_active(i):
                spacer = spacer or Spacer()
                models.append(spacer)
                continue
            if ref in obj._models:
                old.append(obj._models[ref][0])
            models.append(_acquire_model(obj, doc, root, parent, comm))
        return models, old


def server_executor() -> IsolatedExecutor:
    """The server's process pool for listing files (one per server process, shared by every
    session): a parser that crashes or blows up its memory takes down a worker, not the page."""
    return pn.state.as_cached("ckptview-isolated-executor", IsolatedExecutor)


def tree_load(url: str, executor=None) -> TreeLoad:
    """The server-wide background cataloguing of ``url``, started on first use (``executor``
    lists its files: the server's :func:`server_executor`)."""
    return pn.state.as_cached(f"ckptview-catalog:{url}", lambda: TreeLoad(url, executor))


def shared_catalog(url: str, executor=None) -> cv.Catalog:
    """One catalog per tree for the whole server, waiting for it: every browser session shares
    it (a big tree is catalogued once; ``panel serve --warm`` does it before the first page is
    asked for; without it the first page shows the progress, see :func:`build_app`)."""
    return tree_load(url, executor).result()


def shared_experiment(url: str, executor=None):
    """The experiment at ``url`` when it is one (a directory whose runs are below it, as
    ``ckptview ls`` tells), else None; found and opened once for the whole server."""
    from ckptview.experiment import experiment_at

    def find():
        try:
            return experiment_at(url, executor=executor)
        except Exception:  # noqa: BLE001 - not an experiment: opened as a tree (its error shown)
            return None

    return pn.state.as_cached(f"ckptview-experiment:{url}", find)


def build_app(urls: list[str], allow_write: bool = False, poll_seconds: float = 5.0,
              isolate: bool = False):  # fmt: skip
    """The served page for the trees at ``urls`` (the only roots it will open).

    The trees are checked for new serials every ``poll_seconds`` while a page is open (0: off).
    ``isolate``: their files (and those of trees opened from the page) are listed by the
    server's :func:`server_executor`, in worker processes with resource limits. A URL that
    holds several runs (an experiment) opens on its Runs page; a second experiment's runs
    join the run list.
    """
    # no notification area: nothing on the page raises a toast, and Panel's area (two models
    # and a Material component per page) cost each page ~5 ms of the server's time; served,
    # not the signatures of every Panel class again for each page (a notebook's help, ~5 ms)
    pn.extension("tabulator", **({"apply_signatures": False} if is_served() else {}))
    executor = server_executor() if isolate else None
    workspace = Workspace(guard=Guard(roots=list(urls), allow_write=allow_write),
                          executor=executor)  # fmt: skip
    problems = []
    experiment, trees = None, []
    for url in urls:
        exp = shared_experiment(url, executor)
        if exp is None:
            trees.append(url)
        elif experiment is None:
            experiment = exp
        else:
            try:
                add_runs(workspace, exp)
            except Exception as e:  # noqa: BLE001 - shown on the page
                problems.append(notice(f"{md_code(url)}: {md_error(e)}", kind="danger"))
    loads = [tree_load(url, executor) for url in trees]
    served = is_served()
    waiting = [i for i, load in enumerate(loads) if served and not load.finished]
    pending = loads[waiting[0]:] if waiting else []  # in order: a tree waits for those before
    for load in loads:
        if load not in pending:  # in a notebook or --warm: waited for
            try:
                workspace.add(load.result())
            except Exception as e:  # noqa: BLE001 - shown on the page
                problems.append(notice(f"{md_code(load.url)}: {md_error(e)}", kind="danger"))
    if experiment is None:
        dashboard = Dashboard(workspace, poll_seconds=poll_seconds)
    else:
        try:
            dashboard = Dashboard(workspace, experiment, poll_seconds=poll_seconds)
        except Exception as e:  # noqa: BLE001 - the experiment refused (outside the roots)
            problems.append(notice(f"{md_code(experiment.root or '')}: {md_error(e)}",
                                   kind="danger"))  # fmt: skip
            dashboard = Dashboard(workspace, poll_seconds=poll_seconds)
    if served:
        dashboard.start_polling()  # served: tied to this browser session
    if not urls:
        problems.append(notice("No tree given: `ckptview serve URL...`",
                                      kind="warning"))  # fmt: skip
    page = pmui.Page(
        title="ckptview" + ("" if allow_write else " · read-only"),
        sidebar=dashboard.sidebar(), sidebar_width=300, theme_config=THEME,
        main=[*problems, dashboard.tabs],
    )  # fmt: skip
    dashboard.host_sidebar(page, "sidebar")
    own_busy(page)
    if pending:
        follow_loads(pending, page, workspace)
    if served:
        pn.state.on_session_destroyed(release_on_end(page, dashboard))
    return page


def follow_loads(pending: list[TreeLoad], page, workspace: Workspace) -> None:
    """While the trees ``pending`` (taken off as they join) are still being catalogued: their
    progress at the top of the page.

    A page that shows no tree yet reloads once the first is ready (and is built with it, as
    any page: a table added to a page already shown, then resized by what follows it, can
    break Tabulator). A page that already shows a tree is never reloaded under its visitor:
    the later trees join its run list, in the order given, as they become ready."""
    status = notice("", kind="info", css_classes=["ckptview-loading"])
    page.main = [status, *page.main]
    location = pn.state.location
    empty = not workspace.runs
    reloading = False

    def reload() -> None:
        location.reload = True  # the browser reloads; the new page has the tree

    def check() -> None:
        nonlocal reloading
        if empty:
            if pending[0].finished and not reloading:  # once the page is up
                reloading = True
                pn.state.onload(reload)
        else:
            while pending and pending[0].finished:
                load = pending.pop(0)
                try:
                    workspace.add(load.result(), show=False)
                except Exception as e:  # noqa: BLE001 - shown on the page, above the tabs
                    problem = notice(f"{md_code(load.url)}: {md_error(e)}", kind="danger")
                    page.main = [*page.main[:-1], problem, page.main[-1]]
        if not pending:
            status.visible = False
        elif not reloading:
            set_notice(status, "\n\n".join(p.describe() for p in pending), "info")

    doc = pn.state.curdoc

    def notify() -> None:  # from a loading thread: the page is updated on its own event loop
        doc.add_next_tick_callback(check)

    for load in pending:  # check() takes them off, on the event loop, after this loop
        load.follow(notify)
    check()


def own_busy(page) -> None:
    """Unbind ``page.busy`` from the server-wide ``pn.state.busy``.

    ``pmui.Page`` follows ``pn.state.busy``, which any session's callback sets: every open
    page then updated its model (a walk over all its Bokeh models) whenever any visitor clicked,
    so the work grew with the square of the sessions, and each visitor saw the others' busy
    bar. The views show their own loading state instead (``in_background``)."""
    from panel.util import edit_readonly

    with edit_readonly(page):
        page.busy = False  # a plain value: the reference to pn.state.busy is dropped
    unwatch_shared(page, only="busy")


def unwatch_shared(*owners, only: str | None = None) -> int:
    """Remove the watchers that ``owners`` (a session's objects) left on the server-wide
    ``pn.state`` and ``pn.config`` (``only``: those of that parameter); the number removed.

    A watcher on an object that lives as long as the server would keep its owner, and through
    it every widget of the session, alive.
    """
    ids = {id(o) for o in owners}
    removed = 0
    for shared in (pn.state, pn.config):
        watched = shared.param.watchers
        for name in [only] if only else list(watched):
            for watchers in list(watched.get(name, {}).values()):
                for w in list(watchers):
                    bound = getattr(w.fn, "__self__", None)
                    owner = getattr(bound, "self", bound)  # a Parameters: the object it is of
                    if id(owner) in ids:
                        shared.param.unwatch(w)
                        removed += 1
    return removed


def release_on_end(page, dashboard):
    """The ``on_session_destroyed`` callback of one served page: releases what it held.

    It holds both weakly, so the callback itself keeps nothing alive."""
    page_ref, dash_ref = weakref.ref(page), weakref.ref(dashboard)

    def release(session_context) -> None:
        dash = dash_ref()
        if dash is not None:
            dash.close()
        unwatch_shared(*(o for o in (page_ref(), dash) if o is not None))
        forget_views(session_context._document)

    return release


def forget_views(doc) -> int:
    """Drop the server-wide registry's entries (``pn.state._views``) still naming ``doc``.

    Panel removes a page's own entry when its session ends, but not the one of the session's
    notification area (``pn.extension(notifications=True)``): that entry holds the Document,
    and the Document every model and widget of the session."""
    stale = [ref for ref, view in list(pn.state._views.items()) if view[2] is doc]
    for ref in stale:
        pn.state._views.pop(ref, None)
    return len(stale)


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


#: the collector's third threshold in a server: a full collection after this many of the
#: middle generation's (Python's default: 10)
FULL_COLLECTION_EVERY = 100


def settle(urls: list[str], executor=None) -> None:
    """Catalogue the served trees (``--warm``: before the server takes its first page), then
    move everything alive into the garbage collector's permanent generation, once per server
    process, and make the collector's own full collections rarer.

    Panel runs a full ``gc.collect()`` after sessions end; it walked every object of the
    catalogs and of the imported libraries each time (~0.25 s on the demo tree, more on a
    large catalog), on the event loop every page waits on. What lives as long as the server
    need not be walked again.

    Frozen, those objects no longer count as the old generation whose growth by a quarter
    holds a full collection back, so one ran every 10 collections of the middle generation:
    while 20 pages were being built at once, each walking all their sessions' objects (a
    twentieth of the server's CPU per page, ~35-110 ms per wave). Sessions' garbage is Panel's
    explicit collection's to take (:data:`FULL_COLLECTION_EVERY`)."""
    if pn.state.cache.get("ckptview-gc-frozen"):
        return
    for url in urls:
        if shared_experiment(url, executor) is not None:
            continue  # its runs were opened by finding it
        try:
            shared_catalog(url, executor)
        except Exception:  # noqa: BLE001, S112 - build_app shows it on the page
            continue
    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_EVERY)
    pn.state.cache["ckptview-gc-frozen"] = True


def serve(argv: list[str]):
    """Build the page from ``--args`` and mark it servable (the whole of the app script)."""
    urls, allow_write = parse_args(argv)
    if not is_served():  # a notebook or ``--warm``: catalogue now; else the first page
        settle(urls, server_executor())  # shows the progress
    page = build_app(urls, allow_write=allow_write, poll_seconds=poll_seconds(argv), isolate=True)
    return page.servable(title="ckptview")
