"""A page opened while its tree is still being catalogued: the progress, then the rows.

A threaded Panel server in this process serves ``build_app``; the cataloguing is held at a
known point (``open_catalog`` waits on an event after reporting progress), so the page is
seen in both states in Chromium.
"""

from __future__ import annotations

import threading
import time

import panel as pn
import pytest
from conftest import free_port
from playwright.sync_api import Page, expect

from ckptview.demo import write_demo
from ckptview.widgets.shell import loading
from ckptview.widgets.shell.app import build_app

WAIT = 60_000


def serve_held(roots, monkeypatch, releases):
    """Serve ``build_app(roots)``; the cataloguing of ``roots[i]`` reports 3 of 10 files, then
    waits for ``releases[i]``."""
    real = loading.open_catalog
    hold = {str(r): e for r, e in zip(roots, releases)}

    def slow(url, executor=None, progress=None):
        progress(3, 10)
        assert hold[url].wait(120)
        return real(url, executor, progress)

    monkeypatch.setattr(loading, "open_catalog", slow)
    port = free_port()
    server = pn.serve({"app": lambda: build_app([str(r) for r in roots], poll_seconds=0)},
                      port=port, address="127.0.0.1", threaded=True, show=False,
                      websocket_origin=[f"127.0.0.1:{port}"])  # fmt: skip
    time.sleep(0.5)
    return server, f"http://127.0.0.1:{port}/app"


@pytest.fixture
def held(tmp_path, monkeypatch):
    """A demo tree whose cataloguing reports 3 of 10 files, then waits for ``release``."""
    root = write_demo(tmp_path / "demo", serials=6).root
    release = threading.Event()
    server, url = serve_held([root], monkeypatch, [release])
    try:
        yield url, root, release
    finally:
        release.set()
        server.stop()


def test_a_page_shows_the_progress_then_the_rows(page: Page, held):
    url, root, release = held
    page.goto(url)
    status = page.locator(".ckptview-loading")
    expect(status).to_contain_text("3 of 10 files read (30%)", timeout=WAIT)
    expect(status).to_contain_text(str(root))
    expect(page.locator(".ckptview-serials .tabulator-row")).to_have_count(0)
    release.set()
    expect(page.locator(".ckptview-serials .tabulator-row")).to_have_count(6, timeout=WAIT)
    expect(status).to_have_count(0)  # the progress goes once the tree is in


def test_trees_join_in_the_order_given_and_the_first_stays_shown(page: Page, tmp_path,
                                                                  monkeypatch):  # fmt: skip
    """The second tree ready first waits for the first; the page shows the first tree."""
    first = write_demo(tmp_path / "first", serials=4).root
    second = write_demo(tmp_path / "second", serials=7).root
    releases = [threading.Event(), threading.Event()]
    server, url = serve_held([first, second], monkeypatch, releases)
    try:
        page.goto(url)
        status = page.locator(".ckptview-loading")
        expect(status).to_contain_text(str(second), timeout=WAIT)
        releases[1].set()  # the second is ready: not shown before the first
        page.wait_for_timeout(1500)
        expect(page.locator(".ckptview-serials .tabulator-row")).to_have_count(0)
        releases[0].set()
        expect(page.locator(".ckptview-serials .tabulator-row")).to_have_count(4, timeout=WAIT)
        expect(page.locator(".ckptview-summary")).to_contain_text(str(first))
        expect(status).to_have_count(0)
        expect(page.locator(".ckptview-run-select")).to_contain_text("second")
    finally:
        for r in releases:
            r.set()
        server.stop()


def test_a_page_showing_a_tree_is_not_reloaded_when_the_next_is_ready(page: Page, tmp_path,
                                                                        monkeypatch):  # fmt: skip
    """The visitor works on the first tree while the second is catalogued: the second joins the
    run list in place; the page, and what was clicked on it, stay."""
    first = write_demo(tmp_path / "first", serials=4).root
    second = write_demo(tmp_path / "second", serials=7).root
    releases = [threading.Event(), threading.Event()]
    releases[0].set()
    server, url = serve_held([first, second], monkeypatch, releases)
    try:
        page.goto(url)
        rows = page.locator(".ckptview-serials .tabulator-row")
        expect(rows).to_have_count(4, timeout=WAIT)
        status = page.locator(".ckptview-loading")
        expect(status).to_contain_text(str(second), timeout=WAIT)
        rows.nth(1).click()
        expect(page.locator(".ckptview-vars-heading")).to_contain_text("Serial", timeout=WAIT)
        heading = page.locator(".ckptview-vars-heading").inner_text()
        page.evaluate("window.__same_page = 1")
        releases[1].set()
        expect(page.locator(".ckptview-run-select")).to_contain_text("second", timeout=WAIT)
        expect(status).to_be_hidden(timeout=WAIT)
        page.wait_for_timeout(1500)  # a reload would have started by now
        assert page.evaluate("window.__same_page") == 1
        assert page.locator(".ckptview-vars-heading").inner_text() == heading
        expect(rows).to_have_count(4)
    finally:
        for r in releases:
            r.set()
        server.stop()
