"""A plain ``pip install`` gives a working dashboard: the wheel, built from this checkout,
installed into a fresh venv (base dependencies only, resolved with the CI constraints), serves
a corpus tree with ``ckptview serve``; the page holds the app and Chromium shows its serials.

Slow (a venv of the dashboard's dependencies, about a minute from pip's cache), run in CI.
"""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from conftest import corpus_path
from playwright.sync_api import expect
from test_browser_smoke import free_port, stop, wait_until_serving

import ckptview as cv

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / ".ci" / "constraints.txt"
TREE = "paddle/fluid_ckpt"
#: what the base install must not bring: training frameworks, a browser, the extras
NOT_IN_BASE = ["torch", "tensorflow", "jax", "paddle", "playwright", "s3fs", "tensorstore",
               "h5py", "dask"]  # fmt: skip

pytestmark = pytest.mark.slow



def pip(python: Path | str, *args: str, timeout: float = 600) -> str:
    done = subprocess.run([str(python), "-m", "pip", *args, "--disable-pip-version-check"],
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout + done.stderr


@pytest.fixture(scope="session")
def venv(tmp_path_factory) -> Path:
    """A fresh venv holding the wheel of this checkout and its base dependencies only.

    Session-wide: the browser test of this module runs with the other Chromium tests, after
    the module's others; a module fixture was built twice (a minute of pip each)."""
    tmp = tmp_path_factory.mktemp("install")
    log = pip(sys.executable, "wheel", "--no-deps", "-v", str(ROOT), "-w", str(tmp / "dist"))
    warnings = [w for w in ("BuildBackendWarning", "DeprecationWarning", "project.license")
                if w in log]  # e.g. setuptools on a `license` table, once per build step
    assert not warnings, log[-3000:]
    (wheel,) = (tmp / "dist").glob("ckptview-*.whl")
    subprocess.run([sys.executable, "-m", "venv", str(tmp / "venv")], check=True, timeout=120)
    python = tmp / "venv" / "bin" / "python"
    pip(python, "install", "-q", "-c", str(CONSTRAINTS), str(wheel))
    return tmp / "venv"


def serve(venv: Path) -> tuple[str, subprocess.Popen]:
    """``ckptview serve`` of the fresh venv, run outside the checkout (``python -m`` puts the
    working directory first on sys.path: the checkout's package would shadow the wheel's)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/ckptview_app"
    cmd = [str(venv / "bin" / "ckptview"), "serve", str(corpus_path(TREE)), "--port", str(port),
           "--address", "127.0.0.1"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=venv)  # fmt: skip
    try:
        wait_until_serving(url, proc)
    except BaseException:
        stop(proc)
        raise
    return url, proc


def in_venv(venv: Path, code: str) -> str:
    done = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True,
                          text=True, check=True, cwd=venv)  # fmt: skip
    return done.stdout.strip()


def test_base_install_is_light(venv):
    probe = ("import importlib.util, json; print(json.dumps([m for m in "
             f"{NOT_IN_BASE!r} if importlib.util.find_spec(m)]))")  # fmt: skip
    assert in_venv(venv, probe) == "[]"
    where = in_venv(venv, "import ckptview, ckptview.cli.serve as s; print(ckptview.__file__, s.app_path())")
    package, app = where.split()
    assert package.startswith(str(venv)) and app.startswith(str(venv))  # the wheel, not the checkout
    assert app.endswith("ckptview/widgets/ckptview_app.py")


def test_installed_ckptview_serves_the_app(venv):
    url, proc = serve(venv)
    with urllib.request.urlopen(url, timeout=30) as r:
        assert r.status == 200
        page = r.read().decode()
    assert "<title>ckptview</title>" in page  # the app ran: a failing script leaves Bokeh's page
    assert "tabulator" in page  # its tables' resources are on the page
    static = url.rsplit("/", 1)[0] + "/static/js/bokeh.min.js"
    with urllib.request.urlopen(static, timeout=30) as r:
        assert r.status == 200 and len(r.read()) > 100_000
    stop(proc)  # the log is complete once the server is gone
    log = proc.stdout.read()
    assert "ModuleNotFoundError" not in log and "Traceback" not in log and "ERROR" not in log, log


@pytest.mark.browser
def test_installed_dashboard_shows_the_serials(venv, page):
    tree = corpus_path(TREE)
    serials = cv.open(tree).serials
    url, proc = serve(venv)
    try:
        page.goto(url)
        rows = page.locator(".ckptview-serials .tabulator-row")
        expect(rows).to_have_count(len(serials), timeout=60_000)
        expect(rows.first).to_contain_text("trainer_0")
    finally:
        stop(proc)
    log = proc.stdout.read()
    assert "ModuleNotFoundError" not in log and "Traceback" not in log, log
