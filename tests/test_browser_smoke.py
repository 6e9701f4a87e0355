"""The served page in a real browser: ``panel serve app/ckptview_app.py`` driven by Chromium.

The app file is the thin script over :mod:`ckptview.widgets.shell.app` (the whole dashboard).

Also ``ckptview serve`` itself: it starts the same server and refuses a bad tree in one line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import free_port, reveal
from playwright.sync_api import expect

import ckptview as cv
from ckptview.demo import write_demo

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "app" / "ckptview_app.py"
RESULTS = ROOT / "test-results"
SERIALS = 6




def wait_until_serving(url: str, proc: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {proc.stdout.read()}")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"{url} did not answer in {timeout} s")


def start(cmd: list[str], url: str) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=ROOT, env={**os.environ, "BOKEH_LOG_LEVEL": "warn"})  # fmt: skip
    try:
        wait_until_serving(url, proc)
    except BaseException:
        stop(proc)
        raise
    return proc


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return write_demo(tmp_path_factory.mktemp("demo") / "tree", serials=SERIALS)


@pytest.fixture(scope="module")
def served(demo):
    port = free_port()
    url = f"http://127.0.0.1:{port}/ckptview_app"
    cmd = [sys.executable, "-m", "panel", "serve", str(APP), "--port", str(port),
           "--address", "127.0.0.1", "--allow-websocket-origin", f"127.0.0.1:{port}",
           "--args", str(demo.root)]  # fmt: skip
    proc = start(cmd, url)
    yield url
    stop(proc)


@pytest.mark.browser
def test_serials_listed_and_a_click_shows_variables(page, served, demo):
    cat = cv.open(demo.root)
    counts = cat.variables.groupby("serial").size()
    page.set_viewport_size({"width": 1400, "height": 1000})
    page.goto(served)
    serial_rows = page.locator(".ckptview-serials .tabulator-row")
    expect(serial_rows).to_have_count(SERIALS, timeout=60_000)
    expect(serial_rows.first).to_contain_text("trainer_0")
    reveal(page)  # the variables below the serials: built once scrolled to
    heading = page.locator(".ckptview-vars-heading")
    latest = demo.latest
    expect(heading).to_contain_text(f"Serial {latest} · {counts[latest]} variables")
    expect(page.locator(".ckptview-summary")).to_contain_text("paddle-fluid")

    serial_rows.nth(1).click()
    expect(heading).to_contain_text(f"Serial 1 · {counts[1]} variables", timeout=30_000)
    var_rows = page.locator(".ckptview-variables .tabulator-row")
    expect(var_rows).to_have_count(int(counts[1]))
    expect(page.locator(".ckptview-variables")).to_contain_text("fc_0.w_0_moment1_0")
    RESULTS.mkdir(exist_ok=True)
    page.mouse.move(0, 0)  # no hover tooltip in the picture
    page.wait_for_timeout(600)
    page.screenshot(path=str(RESULTS / "browser_smoke_serial1.png"), full_page=True)

    crashed = SERIALS - 1
    serial_rows.nth(crashed).click()
    expect(heading).to_contain_text(f"Serial {crashed} · {counts[crashed]} variables")
    expect(page.locator(".ckptview-variables")).to_contain_text("TruncatedError")
    page.mouse.move(0, 0)
    page.wait_for_timeout(600)
    page.screenshot(path=str(RESULTS / "browser_smoke_crashed.png"), full_page=True)


def test_cli_serve_starts_the_server(demo):
    port = free_port()
    url = f"http://127.0.0.1:{port}/ckptview_app"
    cmd = [sys.executable, "-m", "ckptview.cli", "serve", str(demo.root), "--port", str(port),
           "--address", "127.0.0.1"]  # fmt: skip
    proc = start(cmd, url)
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            assert r.status == 200 and "ckptview" in r.read().decode()
    finally:
        stop(proc)
    out = proc.stdout.read()
    assert f"serving 1 tree(s) at http://127.0.0.1:{port}/ckptview_app" in out


def test_cli_serve_refuses_a_tree_it_cannot_open(tmp_path):
    (tmp_path / "notes.md").write_text("not a checkpoint")
    proc = subprocess.run(
        [sys.executable, "-m", "ckptview.cli", "serve", str(tmp_path), "--port", str(free_port())],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckptview serve: no layout recognizes")
