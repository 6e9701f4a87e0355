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
from ckptview.widgets import loading
from ckptview.widgets.app import build_app

WAIT = 60_000


@pytest.fixture
def held(tmp_path, monkeypatch):
    """A demo tree whose cataloguing reports 3 of 10 files, then waits for ``release``."""
    root = write_demo(tmp_path / "demo", serials=6).root
    release = threading.Event()
    real = loading.open_catalog

    def slow(url, executor=None, progress=None):
        progress(3, 10)
        assert release.wait(120)
        return real(url, executor, progress)

    monkeypatch.setattr(loading, "open_catalog", slow)
    port = free_port()
    server = pn.serve({"app": lambda: build_app([str(root)], poll_seconds=0)}, port=port,
                      address="127.0.0.1", threaded=True, show=False,
                      websocket_origin=[f"127.0.0.1:{port}"])  # fmt: skip
    time.sleep(0.5)
    try:
        yield f"http://127.0.0.1:{port}/app", root, release
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
