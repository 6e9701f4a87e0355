"""What one served page costs the server, and that it is all given back when the page ends.

In process, with no browser: a session is built under a Bokeh ``Document`` (as ``panel serve``
does for each page GET) and its models counted; a threaded Panel server is asked for pages and,
once Bokeh has discarded their sessions, no dashboard of theirs may be left alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import time
import urllib.request
import weakref
from collections import Counter

import panel as pn
import panel_material_ui as pmui
import pytest
from bokeh.document import Document
from bokeh_client import READY, message, open_document, seen, send
from conftest import free_port
from panel.io.state import set_curdoc

import ckptview as cv
from ckptview.demo import write_demo
from ckptview.widgets._base import Workspace
from ckptview.widgets.pages.browse.detail import VariableDetail
from ckptview.widgets.pages.browse.serials import SerialsTable
from ckptview.widgets.pages.browse.variables import VariablesTable
from ckptview.widgets.pages.browse.verify import VerifyPanel
from ckptview.widgets.pages.compare import CompareView
from ckptview.widgets.pages.restore import RestoreView
from ckptview.widgets.pages.retention import RetentionView
from ckptview.widgets.shell import app as appmod
from ckptview.widgets.shell.app import TABS, Dashboard, build_app

#: Bokeh models of a demo page: 288 when every view was built at once, 243 with the Browse tab
#: only, 157 now (columns share their editor and formatter, the serials table holds only its
#: shown columns, the verify table waits for a verify, the totals are plain tables, the
#: timeline is a plain Bokeh figure); a margin
#: for library versions, none for a second tab built eagerly (Compare alone is ~70 models)
MAX_MODELS = 175
#: served, what the first response holds (the shell, the run chooser, the serials table and
#: one placeholder below it): 100 models when the timeline and the variables came with the
#: tree picker once the page was up, 53 once they waited for the visitor to scroll to them
#: (and the tabs sent no empty header panes), 43 now (no Column waiting for them or around the
#: picker's button, one Spacer for the tabs not shown); a margin for library versions, none
#: for the timeline (~40 models) or the variables (~45)
MAX_SERVED_MODELS = 50


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return write_demo(tmp_path_factory.mktemp("sessions") / "demo", serials=8).root


def session_models(urls: list[str]) -> tuple[Document, object]:
    """One page as ``panel serve`` builds it: the app under a fresh Document."""
    doc = Document()
    with set_curdoc(doc):
        page = build_app(urls, poll_seconds=0)
        page.server_doc(doc)
    return doc, page


def test_a_session_builds_the_browse_tab_only(demo):
    doc, page = session_models([str(demo)])
    kinds = Counter(type(m).__name__ for m in doc.models)
    assert len(doc.models) <= MAX_MODELS, (len(doc.models), kinds.most_common(12))
    tables = [m for m in doc.models if type(m).__name__ == "DataTabulator"]
    # serials, variables (the totals are plain tables; statistics and verify wait for use)
    assert len(tables) == 2
    assert kinds["figure"] == 1  # the timeline; the histogram waits for its button
    columns = [m for m in doc.models if type(m).__name__ == "TableColumn"]
    editors = {id(c.editor) for c in columns}
    assert len(editors) == len(tables)  # one shared editor per (read-only) table
    from panel.util import edit_readonly

    with edit_readonly(pn.state):
        pn.state.busy = True  # another visitor's callback
    try:
        assert not page.busy  # a page does not follow the server-wide busy state
    finally:
        with edit_readonly(pn.state):
            pn.state.busy = False
    dash = page.main[-1]
    assert isinstance(dash, pmui.Tabs) and [n for n in dash._names] == TABS


def test_a_served_page_sends_the_serials_first(demo):
    """The document a browser pulls first: the serials table, the button that opens the tree
    picker and a placeholder where the timeline and the variables are drawn once the visitor
    sees it; no notification area (nothing on the page raises one)."""
    from bokeh.client import pull_session

    app = lambda: build_app([str(demo)], poll_seconds=0)  # noqa: E731
    with serving(app) as url, pull_session(url=url) as session:
        models = list(session.document.models)
    kinds = Counter(type(m).__name__ for m in models)
    assert kinds["DataTabulator"] == 1 and kinds["Figure"] + kinds["figure"] == 0, kinds
    assert kinds["TextInput"] == 0  # the picker's and the variables' filters wait
    assert not [k for k in kinds if "Notification" in k], kinds
    assert kinds["Select"] + kinds["CustomSelect"] == 0  # the timeline's chooser waits too
    assert len(models) <= MAX_SERVED_MODELS, (len(models), kinds.most_common(12))
    # the Browse tab's and the serials': no Column waits for the timeline or the variables
    # (their placeholder sits in the serials' Column), none holds the picker's button; one
    # Spacer stands for the five tabs not shown
    assert kinds["Column"] == 2 and kinds["Spacer"] == 1, kinds
    assert kinds["Tooltip"] == 0, kinds  # the column chooser's label says what it is
    assert kinds["MultiChoice"] == 0 and kinds["Button"] == 2, kinds  # the chooser's button
    headers = [m for m in models if "&lt;pre&gt; &lt;/pre&gt;" in str(getattr(m, "text", ""))]
    assert not headers  # no empty header pane per tab


async def _late_messages(url: str, quiet: float = 3.0, then_seen: bool = False):
    """As a browser: the page, its document, then ``document_ready``; the PATCH-DOC contents
    the server sends after it, until ``quiet`` seconds pass without one (``then_seen``: and
    those it sends once the page says the visitor sees the placeholder below the serials)."""
    ws, doc = await open_document(url, timeout=120, content=True)

    async def patches() -> list[str]:
        got = []
        while True:
            try:
                header, content = await asyncio.wait_for(message(ws), quiet)
            except asyncio.TimeoutError:
                return got
            if header["msgtype"] == "PATCH-DOC":
                got.append(content)

    try:
        await send(ws, "PATCH-DOC", READY)
        ready = await patches()
        if not then_seen:
            return ready
        await send(ws, "PATCH-DOC", seen(doc))
        return ready, await patches()
    finally:
        ws.close()


@contextlib.contextmanager
def serving(app, **kwargs):
    """``app`` served by ``pn.serve`` in a thread on a free loopback port; its URL."""
    port = free_port()
    server = pn.serve({"app": app}, port=port, address="127.0.0.1", threaded=True, show=False,
                      websocket_origin=[f"127.0.0.1:{port}"], **kwargs)  # fmt: skip
    try:
        wait_listening(port)
        yield f"http://127.0.0.1:{port}/app"
    finally:
        server.stop()


def test_the_parts_below_the_serials_wait_until_seen_and_come_in_one_message(demo, monkeypatch):
    """Once the page says it is ready, nothing more is sent (the tree picker waits for its
    button); the timeline and the variables (with their verify action and the variable's
    detail) are not even built until the page says the visitor sees their placeholder
    (scrolled to it): then all of them in one batch, one walk of the document's models and
    one message to the browser."""
    built = Counter()
    for cls in (VariablesTable, VariableDetail, VerifyPanel):
        init = cls.__init__

        def counted(self, *args, _init=init, _name=cls.__name__, **kwargs):
            built[_name] += 1
            _init(self, *args, **kwargs)

        monkeypatch.setattr(cls, "__init__", counted)
    appmod.shared_catalog(str(demo))  # catalogued before the first page, as with --warm
    with serving(lambda: build_app([str(demo)], poll_seconds=0)) as url:
        ready, after_seen = asyncio.run(_late_messages(url, then_seen=True))
    assert ready == [], [p[:200] for p in ready]  # the picker waits for its button
    assert len(after_seen) == 1, [p[:200] for p in after_seen]
    for part in ('"name":"Figure"', '"ckptview-variables"', '"ckptview-timeline-y"',
                 '"ckptview-verify"', '"ckptview-detail-info"'):  # fmt: skip
        assert part in after_seen[0], part
    assert built == {"VariablesTable": 1, "VariableDetail": 1, "VerifyPanel": 1}


def test_a_page_never_scrolled_builds_nothing_below_the_serials(demo, monkeypatch):
    """A visitor who only looks at the first screen costs the server no timeline, variables,
    detail or verify action."""
    timelines, parts = [], Counter()
    monkeypatch.setattr(SerialsTable, "timeline", lambda self: timelines.append(1) or None)
    for cls in (VariablesTable, VariableDetail, VerifyPanel):
        monkeypatch.setattr(cls, "__init__", lambda self, *a, _n=cls.__name__, **k:
                            parts.update([_n]))  # fmt: skip
    appmod.shared_catalog(str(demo))
    with serving(lambda: build_app([str(demo)], poll_seconds=0)) as url:
        ready = asyncio.run(_late_messages(url))
    assert ready == []  # not even the tree picker
    assert not timelines and not parts


def test_the_tree_picker_is_built_when_its_button_is_clicked(demo, monkeypatch):
    """The sidebar holds a button, not the tree picker (two text inputs, a button, the list
    of open trees: a tenth of a page's server time, for the few visitors who open a tree):
    the form is built on the click that asks for it, once, and joins the page then."""
    from ckptview.widgets.shell.picker import TreePicker

    built = []
    init = TreePicker.__init__

    def counted(self, *args, **kwargs):
        built.append(1)
        init(self, *args, **kwargs)

    monkeypatch.setattr(TreePicker, "__init__", counted)
    doc, page = session_models([str(demo)])
    css = lambda m: getattr(m, "css_classes", None) or []  # noqa: E731
    assert not built and not [m for m in doc.models if "ckptview-url" in css(m)]
    assert len([m for m in doc.models if "ckptview-picker-toggle" in css(m)]) == 1
    button = page.sidebar[-1]  # in the sidebar itself, no Column around it
    assert isinstance(button, pn.widgets.Button)
    with set_curdoc(doc):
        button.clicks += 1
    assert built == [1]
    form = page.sidebar[-1]  # in the button's place
    assert all(part is not button for part in page.sidebar)
    assert [m for m in doc.models if "ckptview-url" in css(m)]  # the form joined the page
    runs = [m for m in doc.models if "ckptview-runs" in css(m)]
    assert len(runs) == 1 and str(demo) in runs[0].text  # with the trees open
    with set_curdoc(doc):
        button.clicks += 1  # a second click (or the form asked for again) builds nothing
    assert built == [1] and page.sidebar[-1] is form


def test_the_picker_opens_in_place_of_each_of_its_buttons_in_a_notebook(demo):
    """Shown twice in a notebook (two sidebars, two buttons), a click on either opens the
    picker in both sidebars, in the buttons' place."""
    dash = Dashboard(Workspace([cv.open(str(demo))]), poll_seconds=0)
    sides = [dash.__panel__().objects[0], dash.__panel__().objects[0]]
    buttons = [side.objects[-1] for side in sides]
    assert all(isinstance(b, pn.widgets.Button) for b in buttons)
    buttons[0].clicks += 1
    for side in sides:
        assert len(side.objects) == 4 and all(p is not b for p in side.objects for b in buttons)
        assert "Open another tree" in side.objects[2].object


def test_a_notebook_showing_the_dashboard_again_does_not_keep_the_old_sidebars(demo):
    """Each display makes a sidebar and a button; those of outputs gone are not held."""
    dash = Dashboard(Workspace([cv.open(str(demo))]), poll_seconds=0)
    kept = dash.__panel__().objects[0]
    for _ in range(5):
        dash.__panel__()  # shown again, the output replaced
    gc.collect()
    dash.__panel__()  # the hosts are pruned as a new one joins
    assert len(dash._sidebar_hosts) == 2 and len(dash._picker_buttons) == 2
    kept.objects[-1].clicks += 1  # the kept output's button still opens the picker
    assert "Open another tree" in kept.objects[2].object


def test_the_column_chooser_is_shown_in_place_of_its_button(demo):
    """A page shows a button; the chooser (a Choices widget) is built on its click, in its
    place, and changes the table's columns."""
    from ckptview.widgets.pages.browse.serials import SerialsTable

    view = SerialsTable(cv.open(str(demo)), poll_seconds=0)
    column = view.view()
    assert "chooser" not in view.__dict__
    button = next(o for o in column.objects if "ckptview-columns-toggle" in o.css_classes)
    at = column.objects.index(button)
    button.clicks += 1
    assert column.objects[at] is view.chooser and button not in column.objects
    assert isinstance(view.chooser, pn.widgets.MultiChoice)
    view.chooser.value = view.chooser.value[:1]
    assert view.columns == view.chooser.value
    assert len(view.table.value.columns) < len(view.frame.columns)
    assert view.show_chooser() is view.chooser and column.objects.count(view.chooser) == 1


def test_a_late_part_that_fails_is_shown_and_the_others_are_drawn():
    """One part drawn once seen raising does not keep the others (same batch) off the page."""
    from ckptview.widgets._base import draw_when_seen

    def app():
        broken, fine = pn.Column(), pn.Column()

        def fail():
            raise OSError("the storage went away")

        draw_when_seen(broken, fail, text="below")
        draw_when_seen(fine, lambda: pn.pane.Markdown("drawn once seen"), marker=False)
        return pn.Column(broken, fine)

    with serving(app) as url:
        ready, after_seen = asyncio.run(_late_messages(url, then_seen=True))
    assert ready == []
    late = "".join(after_seen)
    assert "drawn once seen" in late
    assert "Could not draw this part:" in late and "the storage went away" in late


def wait_listening(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:  # listening (no page asked for: each GET of the page is a session)
        try:
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_served_means_a_session_of_a_server():
    """Not in a notebook, nor in the session ``panel serve --warm`` runs the app in at startup
    (a session context with no server behind it: the trees are catalogued there, at once)."""
    from bokeh.server.contexts import BokehSessionContext

    from ckptview.widgets._base import served

    assert not served()
    doc = Document()
    doc._session_context = weakref.ref(BokehSessionContext("warm", None, doc))
    with set_curdoc(doc):
        assert not served()
    server_doc = Document()
    context = BokehSessionContext("page", object(), server_doc)
    server_doc._session_context = weakref.ref(context)
    with set_curdoc(server_doc):
        assert served()


def test_other_tabs_are_built_when_first_opened(demo):
    ws = Workspace([cv.open(demo)])
    dash = Dashboard(ws, poll_seconds=0)
    assert dash.built == ["Browse"] and not dash._views
    assert not dash._areas  # no tab but Browse made its Column
    dash.tabs.active = TABS.index("Restore")
    assert dash.built == ["Browse", "Restore"]
    assert isinstance(dash._views["Restore"], RestoreView) and dash._areas["Restore"].objects
    assert list(dash._areas) == ["Restore"]  # in its tab, the others still wait
    assert dash.tabs.objects[TABS.index("Restore")] is dash._areas["Restore"]
    dash.tabs.active = TABS.index("Compare")
    dash.tabs.active = TABS.index("Restore")  # opened again: the same view, not a new one
    assert dash.built == ["Browse", "Restore", "Compare"]
    assert isinstance(dash.compare, CompareView) and dash.compare is dash._views["Compare"]
    assert isinstance(dash.retention, RetentionView)  # asked for in code: built then
    dash.tabs.active = TABS.index("Trajectory")
    assert "Trajectory" in dash.built


def test_close_lets_go_of_the_workspace(demo):
    ws = Workspace([cv.open(demo)])
    dash = Dashboard(ws, poll_seconds=0)
    dash.view("Compare")
    before = sum(len(w) for by in ws.param.watchers.values() for w in by.values())
    dash.close()
    after = sum(len(w) for by in ws.param.watchers.values() for w in by.values())
    assert after == before - 2  # the dashboard's own two (its views were dropped with it)
    assert not dash._views and not dash._browsers



def test_served_sessions_are_released_when_they_end(demo, monkeypatch):
    """Pages asked for and left: once Bokeh discards their sessions nothing keeps their
    dashboards alive (no watcher on the server-wide ``pn.state``, no stale ``pn.state._views``
    entry, no periodic callback)."""
    dashboards: list[weakref.ref] = []
    destroyed: list[str] = []
    init = Dashboard.__init__

    def tracked(self, *args, **kwargs):
        init(self, *args, **kwargs)
        dashboards.append(weakref.ref(self))

    monkeypatch.setattr(appmod.Dashboard, "__init__", tracked)

    def app():
        pn.state.on_session_destroyed(lambda ctx: destroyed.append(ctx.id))
        return build_app([str(demo)], poll_seconds=5)  # polling on, as served

    # other tests' pages, built without a server, stay registered: only this test's count
    views_before = set(pn.state._views)
    busy_before = len(pn.state.param.watchers.get("busy", {}).get("value", []))
    with serving(app, unused_session_lifetime_milliseconds=300,
                 check_unused_sessions_milliseconds=200) as url:  # fmt: skip
        n = 6
        for _ in range(n):
            with urllib.request.urlopen(url, timeout=300) as r:
                assert r.status == 200 and b"bokeh" in r.read()
        assert len(dashboards) == n
        deadline = time.monotonic() + 60
        while len(destroyed) < n and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(destroyed) == n  # Bokeh discarded every session
        for _ in range(20):
            gc.collect()
            alive = [d for d in dashboards if d() is not None]
            if not alive:
                break
            time.sleep(0.2)
        assert not alive, f"{len(alive)} of {n} dashboards still alive after their sessions"
        assert set(pn.state._views) <= views_before  # no served session's models left there
        busy = pn.state.param.watchers.get("busy", {}).get("value", [])
        assert len(busy) <= busy_before  # no served page still follows pn.state.busy


def test_a_run_browser_builds_what_is_below_its_serials_on_first_use(demo):
    """The variables, the detail and the verify action are made when first shown (at once
    outside a server), for the serial selected by then."""
    from ckptview.widgets.pages.browse.browser import RunBrowser

    browser = RunBrowser(cv.open(demo), poll_seconds=0)
    assert browser.built == []
    browser.serials.select(1)  # a click before anything below was shown
    assert browser.built == []
    pn.panel(browser)  # a notebook: everything at once
    assert browser.built == ["variables", "detail", "verify"]
    assert browser.variables.serial == browser.verify.serial == browser.detail.serial == 1
    browser.serials.select(2)
    assert browser.variables.serial == browser.verify.serial == 2


SETTLED_PAGES = """
import gc, sys
from bokeh.document import Document
from panel.io.state import set_curdoc
from ckptview.widgets.shell.app import build_app, settle

settle([sys.argv[1]])
full = []
gc.callbacks.append(lambda phase, info: phase == "stop" and info["generation"] == 2
                    and full.append(1))
pages = []
for _ in range(30):  # 30 visitors at once: their pages all alive
    doc = Document()
    with set_curdoc(doc):
        page = build_app([sys.argv[1]], poll_seconds=0)
        page.server_doc(doc)
    pages.append((doc, page))
    doc.to_json()
print(gc.get_freeze_count() > 0, gc.get_threshold()[2], len(full))
"""


def test_a_settled_server_builds_pages_without_full_collections(demo):
    """Once ``settle`` froze what lives as long as the server, the collector's own full
    collections walked every open session's objects while pages were being built (one in
    every 10 of the middle generation's); they are left to Panel's collection after sessions
    end. 30 pages built and kept: no full collection."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", SETTLED_PAGES, str(demo)], capture_output=True,
                         text=True, timeout=300, check=True).stdout.split()  # fmt: skip
    assert out == ["True", str(appmod.FULL_COLLECTION_EVERY), "0"]
