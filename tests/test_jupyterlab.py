"""The notebooks opened where users open them: JupyterLab (and Notebook 7) in Chromium, offline.

One ``jupyter lab`` on 127.0.0.1 serves copies of ``notebooks/`` from ``tmp_path``, with its
own config, data and runtime dirs and a ``python3`` kernelspec running this interpreter. Each
test opens a notebook, runs all cells from the Run menu and checks what the widgets show, that
no request left the loopback host (no CDN) and that no JavaScript error was logged. Expected
values come from a demo tree written like the notebooks write theirs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import pytest
from conftest import free_port
from playwright.sync_api import Page, expect

import ckptview as cv
from ckptview.demo import write_demo
from ckptview.widgets import RetentionView, Workspace
from ckptview.widgets._format import fmt_number

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
SHOTS = Path(os.environ.get("CKPTVIEW_SHOTS", Path(tempfile.gettempdir()) / "ckptview-shots"))
TOKEN = "ckptview-test"
RUN = 240_000  # ms for a whole notebook to run (a cold kernel imports panel, bokeh, hvplot)
WAIT = 60_000
# Lab settings: no news/update check (a request outside), every cell in the DOM (no windowing).
SETTINGS = {
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false",
                                                    "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
}  # fmt: skip

# Notebook 7.6's own start-up (its settings registry, its file browser commands) throws these
# from its bundle, widgets or not; an error with a frame in inline code (Bokeh, Panel) counts.
APP_ERRORS = ("reading 'schema'", "Command 'filebrowser:open-path' not registered")

pytestmark = pytest.mark.browser



@pytest.fixture(scope="session")
def browser_context_args(browser_context_args):
    return {**browser_context_args, "viewport": {"width": 1400, "height": 1100}}



class Lab:
    """``python -m jupyterlab`` on 127.0.0.1 in a subprocess, isolated in ``root``."""

    def __init__(self, root: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.notebooks = root / "notebooks"
        shutil.copytree(NOTEBOOKS, self.notebooks)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *sys.path]))
        for name in ("config", "data", "runtime", "path"):
            env[f"JUPYTER_{name.upper()}_DIR" if name != "path" else "JUPYTER_PATH"] = str(
                root / name
            )  # fmt: skip
        spec = root / "path" / "kernels" / "python3"  # shadows any other python3 kernel
        spec.mkdir(parents=True)
        argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        spec.joinpath("kernel.json").write_text(
            json.dumps({"argv": argv, "display_name": "Python 3", "language": "python"})
        )
        for plugin, values in SETTINGS.items():
            path = root / "config" / "lab" / "user-settings" / f"{plugin}.jupyterlab-settings"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root",
               "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}",
               "--ServerApp.port_retries=0", f"--IdentityProvider.token={TOKEN}",
               f"--ServerApp.root_dir={self.notebooks}", "--ServerApp.open_browser=False",
               "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
               "--LabApp.extension_manager=readonly"]  # fmt: skip
        self.log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self._wait_up(timeout=120)

    def _wait_up(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                pytest.fail(f"jupyter lab exited {self.proc.returncode}:\n{self.output()}")
            try:
                urllib.request.urlopen(f"{self.url}/api/status?token={TOKEN}", timeout=5)
                return
            except OSError:
                time.sleep(0.5)
        self.stop()
        pytest.fail(f"jupyter lab did not answer in {timeout}s:\n{self.output()}")

    def wait_kernel_idle(self, path: str, timeout: float = 90) -> None:
        """Until the notebook at ``path`` has a session whose kernel is up and idle."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with urllib.request.urlopen(f"{self.url}/api/sessions?token={TOKEN}") as r:
                sessions = json.load(r)
            if any(s["path"] == path and s["kernel"]["execution_state"] == "idle"
                   for s in sessions):  # fmt: skip
                return
            time.sleep(0.5)
        pytest.fail(f"no idle kernel for {path} in {timeout}s:\n{self.output()}")

    def end_sessions(self) -> None:
        """Shut every notebook's kernel down: the next test starts from a fresh kernel."""
        with urllib.request.urlopen(f"{self.url}/api/sessions?token={TOKEN}") as r:
            sessions = json.load(r)
        for session in sessions:
            req = urllib.request.Request(f"{self.url}/api/sessions/{session['id']}",
                                         method="DELETE",
                                         headers={"Authorization": f"token {TOKEN}"})  # fmt: skip
            urllib.request.urlopen(req).close()

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()[-4000:]

    def stop(self) -> None:
        """Stop the server and its kernels (its own child processes, by pid)."""
        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        for child in children:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        self.log.close()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    server = Lab(tmp_path_factory.mktemp("jupyterlab"))
    yield server
    server.stop()


@pytest.fixture
def fresh(lab):
    """The JupyterLab server, its kernels shut down after the test."""
    yield lab
    lab.end_sessions()


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> cv.Catalog:
    """The tree the notebooks write (``write_demo(..., serials=8)``), for expected values."""
    return cv.open(write_demo(tmp_path_factory.mktemp("demo") / "demo", serials=8).root)


class Watch:
    """What a page did that it must not: requests off the loopback host, JavaScript errors."""

    def __init__(self, page: Page):
        self.outside: list[str] = []
        self.errors: list[str] = []
        page.on("request", lambda r: self._check(r.url))
        page.on("websocket", lambda ws: self._check(ws.url))
        page.on("pageerror", self._page_error)
        page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))

    def _page_error(self, error) -> None:
        stack = error.stack or str(error)
        own = "/static/notebook/" in stack and "<anonymous>" not in stack
        if not (own and any(known in stack for known in APP_ERRORS)):
            self.errors.append(f"pageerror: {stack}")

    def _check(self, url: str) -> None:
        if urlsplit(url).scheme in ("data", "blob", "about"):
            return
        if urlsplit(url).hostname != "127.0.0.1":
            self.outside.append(url)

    def assert_clean(self) -> None:
        assert not self.outside, f"requests off the loopback host: {self.outside[:5]}"
        assert not self.errors, f"JavaScript errors: {self.errors[:5]}"


def run_all(page: Page, lab: Lab, name: str, ui: str = "lab") -> Watch:
    """Open ``name`` in JupyterLab (``ui="lab"``) or Notebook 7, Run > Run All Cells, wait."""
    watch = Watch(page)
    path = f"lab/tree/{name}.ipynb?reset&" if ui == "lab" else f"notebooks/{name}.ipynb?"
    page.goto(f"{lab.url}/{path}token={TOKEN}")  # reset: no tab of an earlier test comes back
    prompts = page.locator(".jp-CodeCell .jp-InputPrompt")
    expect(prompts.first).to_be_visible(timeout=WAIT)
    expect(page.locator(".jp-NotebookPanel")).to_have_count(1)
    lab.wait_kernel_idle(f"{name}.ipynb")
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
    count, done = prompts.count(), prompts.filter(has_text=re.compile(r"^\[\d+\]:$"))
    errors = page.locator(".jp-OutputArea-output[data-mime-type*=error]")
    end = time.monotonic() + RUN / 1000
    while done.count() < count and not errors.count() and time.monotonic() < end:
        page.wait_for_timeout(500)  # every code cell numbered: all ran, in order
    assert errors.count() == 0, errors.first.inner_text()
    assert done.count() == count, f"{done.count()} of {count} cells ran in {RUN // 1000}s"
    return watch


def shot(page: Page, name: str, locator=None) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    if locator is not None:
        locator.scroll_into_view_if_needed()
    page.wait_for_timeout(800)
    page.screenshot(path=str(SHOTS / f"{name}.png"))


# -- tests ------------------------------------------------------------------------------------
@pytest.mark.parametrize("ui", ["lab", "notebook7"])
def test_quickstart_browser_rows_and_a_click_on_a_serial(page: Page, fresh, demo, ui):
    watch = run_all(page, fresh, "quickstart", ui)
    rows = page.locator(".ckptview-serials .tabulator-row")
    expect(rows).to_have_count(len(demo.serials), timeout=WAIT)
    expect(rows.nth(2).locator("[tabulator-field=serial]")).to_have_text("2")
    counts = demo.variables.groupby("serial").size()
    heading = page.locator(".ckptview-vars-heading")
    expect(heading).to_contain_text("Serial ")  # latest, or 1 once the select(1) cell's update
    # reached the page (whether it does depends on the comm being open in time)
    wanted = f"Serial 3 · {counts[3]} variables"
    for _ in range(3):  # a click before the widget's comm is open is dropped by the page (seen
        rows.nth(3).click()  # once, under a full suite's load, with a cold JupyterLab): again
        try:
            expect(heading).to_contain_text(wanted, timeout=WAIT // 4)
            break
        except AssertionError:
            continue
    expect(heading).to_contain_text(wanted, timeout=WAIT)
    expect(page.locator(".ckptview-variables .tabulator-row")).to_have_count(int(counts[3]))
    shot(page, f"jupyter_{ui}_quickstart", rows.first)
    watch.assert_clean()


def test_compare_view_shows_its_table_and_plots(page: Page, fresh, demo):
    watch = run_all(page, fresh, "compare")
    first, latest = int(demo.serials.index[0]), demo.latest
    diff = demo.diff(first, latest)
    top = diff[diff["status"] == "changed"].sort_values("rel_l2", ascending=False).iloc[0]
    row = page.locator(".ckptview-diff .tabulator-row").first
    expect(row).to_contain_text(top["name"], timeout=WAIT)
    expect(row).to_contain_text(fmt_number(top["rel_l2"]))
    expect(page.locator(".ckptview-compare-heading")).to_contain_text(
        f"{(diff['status'] == 'changed').sum()} changed"
    )
    expect(page.locator(".ckptview-diff-variable")).to_contain_text("fc_1.w_0")
    expect(page.locator(".ckptview-diff-plots canvas").first).to_be_visible(timeout=WAIT)
    # the hvplot cell and the TrajectoryPlot widget draw too (Bokeh canvases outside CompareView)
    expect(page.locator(".jp-OutputArea-output canvas")).not_to_have_count(0)
    shot(page, "jupyter_lab_compare", page.locator(".ckptview-diff-plots").first)
    watch.assert_clean()


def test_manage_retention_plan_table(page: Page, fresh, tmp_path):
    view = RetentionView(Workspace([cv.open(write_demo(tmp_path / "fresh", serials=6).root)]))
    view.keep_last = 2  # as the notebook's cell does
    plan = view.make_plan()
    watch = run_all(page, fresh, "manage")
    rows = page.locator(".ckptview-retention-table .tabulator-row")
    expect(rows).to_have_count(len(plan), timeout=WAIT)
    expect(page.locator(".ckptview-retention-table .cv-badge.cv-delete")).to_have_count(
        int((plan["action"] == "delete").sum())
    )  # fmt: skip
    expect(page.locator(".ckptview-retention-table .cv-badge.cv-delete")).not_to_have_count(0)
    watch.assert_clean()
