"""A served page's main thread while it loads, in Chromium: its table waits for the page to
settle a frame at a time (``_panel_fixes.pace_table_resizes``), not by message-channel turns.

Panel's Tabulator view waits for its stylesheets, its first draw and its scroll by ``defer()``
(a ``MessagePort.postMessage`` each turn): 13,000–24,000 turns per load of the demo page here,
and as many more as its stylesheets come late. The turns are counted by wrapping
``MessagePort.prototype.postMessage`` before any page script runs.
"""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import Page, expect
from test_browser_app import WAIT, Server

from ckptview.demo import write_demo

pytestmark = pytest.mark.browser

COUNT_TURNS = """(() => {
  window.__turns = 0;
  const post = MessagePort.prototype.postMessage;
  MessagePort.prototype.postMessage = function (...args) {
    window.__turns++;
    return post.apply(this, args);
  };
})()"""

#: the serials table's view: whether its redraw is still pending, and its wait's source
TABLE_VIEW = """() => {
  const found = [];
  const walk = (view) => {
    if (!view || found.includes(view)) return;
    found.push(view);
    for (const child of view.child_views ?? []) walk(child);
  };
  for (const root of Bokeh.index) walk(root);
  const table = found.find((v) => v.el?.classList?.contains('ckptview-serials'));
  return {pending: table._resize_pending, waiting: table._resize_flush !== null,
          wait: String(table._flush_resize_when_root_ready)};
}"""
ROWS = ".ckptview-serials .tabulator-row"
#: a load makes a few turns of its own (Bokeh, React's scheduler): far fewer than a spin's
MAX_TURNS = 500


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = write_demo(tmp_path_factory.mktemp("idle") / "demo", serials=4).root
    server = Server([str(root)])
    yield server
    server.stop()


def loaded(page: Page, url: str) -> dict:
    """Open ``url`` counting turns; once the rows are drawn and the page rested 1 s: the
    turns, the table view's state and its size against its container's."""
    page.add_init_script(COUNT_TURNS)
    page.goto(url)
    expect(page.locator(ROWS).first).to_be_visible(timeout=WAIT)
    page.wait_for_timeout(1000)
    table = page.locator(".ckptview-serials .tabulator").first
    return {"turns": page.evaluate("window.__turns"), **page.evaluate(TABLE_VIEW),
            "width": table.evaluate("(t) => [t.clientWidth, t.getRootNode().host.clientWidth]")}  # fmt: skip


def assert_paced(state: dict) -> None:
    print(f"{state['turns']} message-channel turns; table {state['width']}")
    assert "await frame()" in state["wait"]  # the paced wait, not Panel's defer()
    assert not state["pending"] and not state["waiting"]  # redrawn, nothing left waiting
    assert state["turns"] < MAX_TURNS
    width, container = state["width"]
    assert width > 0 and abs(width - container) <= 2  # drawn to its container's width


def test_a_loading_page_waits_for_its_table_a_frame_at_a_time(page: Page, served):
    assert_paced(loaded(page, served.url))


def test_late_stylesheets_are_waited_for_without_spinning(page: Page, served):
    """The table's stylesheets held 0.4 s each (a busy server): the wait stays a frame at a
    time however long they take."""

    def late(route) -> None:
        time.sleep(0.4)
        route.continue_()

    page.route("**/*tabulator*.css*", late)
    assert_paced(loaded(page, served.url))
