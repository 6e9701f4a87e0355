"""The dashboard served by ``panel serve app/ckptview_app.py`` and driven in Debian's Chromium.

Trees are copies in ``tmp_path`` (the demo tree and corpus trees), so nothing shared is ever
changed. Expected values are computed from the catalogs, not from the page.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest
from conftest import corpus_path, free_port, open_picker, reveal
from playwright.sync_api import Page, expect

import ckptview as cv
from ckptview.demo import write_demo
from ckptview.widgets._format import fmt_number, human_bytes, serials_frame

ROOT = Path(__file__).resolve().parents[1]
APP = Path(os.environ.get("CKPTVIEW_APP", ROOT / "app" / "ckptview_app.py"))
SHOTS = Path(os.environ.get("CKPTVIEW_SHOTS", Path(tempfile.gettempdir()) / "ckptview-shots"))
CORPUS_TREES = ["paddle/fluid_ckpt", "caffe2/ckpt", "modern/hf"]
SERIALS = 6
WAIT = 60_000

pytestmark = pytest.mark.browser



@pytest.fixture(scope="session")
def browser_context_args(browser_context_args):
    return {**browser_context_args, "viewport": {"width": 1500, "height": 1400}}


# -- the server -------------------------------------------------------------------------------

class Server:
    """``panel serve APP --args URL...`` in a subprocess, stopped by its own pid.

    ``hardened``: through ``python -m ckptview.widgets`` (what ``ckptview serve`` runs: the same
    arguments, plus the Host check and the Content-Security-Policy), else plain ``panel serve``.
    The trees are catalogued before the server answers (``--warm``, as ``ckptview serve``), so
    a test's page is never the one that shows the progress and then reloads under its clicks
    (the loading page has tests of its own: test_browser_loading.py).
    """

    def __init__(self, urls: list[str], allow_write: bool = False, extra: list[str] = (),
                 app_args: list[str] = (), timeout: float = 120,
                 hardened: bool = True, env: dict | None = None,
                 app: Path = APP):  # fmt: skip
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/{app.stem}"
        serve = ["ckptview.widgets"] if hardened else ["panel", "serve"]
        cmd = [sys.executable, "-m", *serve, str(app), "--port", str(self.port),
               "--address", "127.0.0.1", "--allow-websocket-origin", f"127.0.0.1:{self.port}",
               *(["--warm"] if urls else []), *extra, "--args", *urls,
               *(["--allow-write"] if allow_write else []), *app_args]  # fmt: skip
        self.log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, text=True,
                                     cwd=ROOT, env={**os.environ, **(env or {})})  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"panel serve exited: {self.log.read()[-4000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/", timeout=5):
                    return
            except urllib.error.HTTPError:
                return  # answering (e.g. a login redirect)
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise TimeoutError("panel serve did not answer")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    """Copies of the corpus trees and a demo tree, all below one scratch directory."""
    base = tmp_path_factory.mktemp("trees")
    out = {}
    for rel in CORPUS_TREES:
        dest = base / rel.replace("/", "_")
        shutil.copytree(corpus_path(*rel.split("/")), dest)
        out[rel] = dest
    out["demo"] = write_demo(base / "demo", serials=SERIALS).root
    return out


@pytest.fixture(scope="module")
def writable(tmp_path_factory):
    root = write_demo(tmp_path_factory.mktemp("rw") / "demo", serials=SERIALS).root
    server = Server([str(root)], allow_write=True)
    yield server, Path(root)
    server.stop()


@pytest.fixture(scope="module")
def read_only(trees):
    urls = [str(trees[k]) for k in (*CORPUS_TREES, "demo")]
    server = Server(urls)
    yield server
    server.stop()


# -- helpers ----------------------------------------------------------------------------------
SCROLL_TOP = """() => {
    const walk = (root) => root.querySelectorAll('*').forEach((e) => {
        if (e.scrollTop) e.scrollTop = 0;
        if (e.shadowRoot) walk(e.shadowRoot);
    });
    walk(document);
}"""


def shot(page: Page, name: str, top: bool = False) -> None:
    """A screenshot of the viewport (``top``: scrolled back to the top of the page first)."""
    SHOTS.mkdir(exist_ok=True)
    page.mouse.move(5, 600, steps=5)  # over the sidebar: no hover tooltip in the picture
    if top:
        page.evaluate(SCROLL_TOP)
    page.wait_for_timeout(600)
    page.screenshot(path=str(SHOTS / f"app_{name}.png"))


def tab(page: Page, name: str) -> None:
    page.get_by_role("tab", name=name).click()


def pick_run(page: Page, label: str) -> None:
    page.locator(".ckptview-run-select label", has_text=label).first.click()


def expect_serials(page: Page, cat: cv.Catalog) -> None:
    frame = serials_frame(cat)
    rows = page.locator(".ckptview-serials .tabulator-row")
    expect(rows).to_have_count(len(frame), timeout=WAIT)
    for i, status in enumerate(frame["status"]):
        expect(rows.nth(i).locator("[tabulator-field=serial]")).to_have_text(
            str(frame["serial"].iloc[i])
        )  # fmt: skip
        expect(rows.nth(i).locator(f".cv-badge.cv-{status}")).to_have_count(1)
    expect(page.locator(".ckptview-summary")).to_contain_text(f"{len(frame)} serials")
    expect(page.locator(".ckptview-summary")).to_contain_text(cat.layout)


def force_click(page: Page, css_class: str) -> None:
    """Make a hidden button visible in the browser's copy of the document, then click it."""
    found = page.evaluate(
        """(cls) => {
            for (const doc of Bokeh.documents) for (const m of doc.all_models)
                if (m.css_classes && m.css_classes.includes(cls)) { m.visible = true; return true }
            return false }""",
        css_class,
    )
    assert found, f"no model with class {css_class} in the page"
    page.locator(f".{css_class} button").first.click()


# -- tests ------------------------------------------------------------------------------------
def test_serials_and_variables_of_the_demo(page: Page, writable):
    server, root = writable
    cat = cv.open(root)
    page.goto(server.url)
    expect_serials(page, cat)
    reveal(page)  # scrolled to the variables: built once seen
    counts = cat.variables.groupby("serial").size()
    heading = page.locator(".ckptview-vars-heading")
    expect(heading).to_contain_text(f"Serial {cat.latest} · {counts[cat.latest]} variables")
    page.locator(".ckptview-serials .tabulator-row").nth(1).click()
    expect(heading).to_contain_text(f"Serial 1 · {counts[1]} variables", timeout=WAIT)
    expect(page.locator(".ckptview-variables .tabulator-row")).to_have_count(int(counts[1]))
    page.locator(".ckptview-variables .tabulator-row", has_text="fc_1.w_0").first.click()
    expect(page.locator(".ckptview-detail-info")).to_contain_text("64×10", timeout=WAIT)
    page.locator(".ckptview-stats-button button").click()
    st = cat.stats(1, names=["fc_1.w_0"]).iloc[0]
    expect(page.locator(".ckptview-stats")).to_contain_text(fmt_number(st["l2"]), timeout=WAIT)
    shot(page, "browse", top=True)


def test_size_column_sorts_by_bytes(page: Page, writable):
    server, root = writable
    cat = cv.open(root)
    page.goto(server.url)
    rows = page.locator(".ckptview-serials .tabulator-row")
    expect(rows.first).to_be_visible(timeout=WAIT)
    page.locator(
        ".ckptview-serials .tabulator-col[tabulator-field=size] .tabulator-col-title"
    ).click()
    order = cat.serials.sort_values("nbytes", kind="stable").index
    expect(rows.first.locator("[tabulator-field=serial]")).to_have_text(str(order[0]), timeout=WAIT)
    expect(rows.last.locator("[tabulator-field=serial]")).to_have_text(str(order[-1]))
    expect(rows.first.locator("[tabulator-field=size]")).to_have_text(
        human_bytes(cat.serials["nbytes"].min())
    )


def test_compare_shows_a_changed_variable_with_its_numbers(page: Page, writable):
    server, root = writable
    cat = cv.open(root)
    page.goto(server.url)
    expect(page.locator(".ckptview-serials .tabulator-row").first).to_be_visible(timeout=WAIT)
    tab(page, "Compare")
    a = int(cat.serials.index[cat.serials["complete"]][0])
    page.locator(".ckptview-compare-button button").click()
    diff = cat.diff(a, cat.latest)
    top = diff[diff["status"] == "changed"].sort_values("rel_l2", ascending=False).iloc[0]
    first = page.locator(".ckptview-diff .tabulator-row").first
    expect(first).to_contain_text(top["name"], timeout=WAIT)
    expect(first).to_contain_text(fmt_number(top["rel_l2"]))
    expect(first.locator(".cv-badge.cv-changed")).to_have_count(1)
    expect(page.locator(".ckptview-compare-heading")).to_contain_text(
        f"{(diff['status'] == 'changed').sum()} changed"
    )
    row = diff[diff["name"] == "fc_1.w_0"].iloc[0]
    target = page.locator(".ckptview-diff .tabulator-row", has_text="fc_1.w_0").first
    expect(target).to_contain_text(fmt_number(row["rel_l2"]))
    target.click()
    expect(page.locator(".ckptview-diff-variable")).to_contain_text("fc_1.w_0", timeout=WAIT)
    expect(page.locator(".ckptview-diff-plots .bk-Canvas, .ckptview-diff-plots canvas").first
           ).to_be_visible(timeout=WAIT)  # fmt: skip
    time.sleep(1.5)
    shot(page, "compare")


RECORD_CSP = """document.addEventListener('securitypolicyviolation', (e) =>
    (window.__csp = window.__csp || []).push(e.effectiveDirective + ' ' + e.blockedURI))"""


def test_the_page_works_under_its_content_security_policy(page: Page, writable):
    """Every tab of the served page (tables with template formatters, plots, Choices, the
    dialog) runs without a single CSP violation; markup that reaches the page runs nothing."""
    server, root = writable
    page.add_init_script(RECORD_CSP)
    page.goto(server.url)
    rows = page.locator(".ckptview-serials .tabulator-row")
    expect(rows.first.locator("[tabulator-field=size]")).to_contain_text("KiB", timeout=WAIT)
    page.locator(".ckptview-columns-toggle button").click()
    page.locator(".ckptview-columns .choices").first.click()
    tab(page, "Compare")
    page.locator(".ckptview-compare-button button").click()
    expect(page.locator(".ckptview-diff .tabulator-row").first).to_be_visible(timeout=WAIT)
    tab(page, "Trajectory")
    expect(page.locator(".ckptview-trajectory canvas").first).to_be_visible(timeout=WAIT)
    tab(page, "Retention")
    page.locator(".ckptview-retention-plan button").click()
    expect(page.locator(".ckptview-retention-table .tabulator-row").first).to_be_visible(
        timeout=WAIT
    )
    page.locator(".ckptview-retention-delete button").click()
    expect(page.locator(".ckptview-confirm")).to_contain_text("Delete", timeout=WAIT)
    page.locator(".ckptview-retention-cancel button").click()
    assert page.evaluate("window.__csp || []") == []
    page.evaluate("""() => { const d = document.createElement('div');
        d.innerHTML = '<img src=x onerror="window.__injected = 1">';
        document.body.appendChild(d) }""")
    page.wait_for_timeout(1000)
    assert page.evaluate("window.__injected") is None
    assert any(v.startswith("script-src") for v in page.evaluate("window.__csp"))


def test_retention_deletes_nothing_before_confirm_and_exactly_the_plan_after(page, writable):
    server, root = writable
    cat = cv.open(root)
    before = set(cat.serials.index)
    plan = cat.plan_retention(keep_last=2)
    doomed = sorted(int(s) for s in plan.index[plan["action"] == "delete"])
    assert doomed
    page.goto(server.url)
    expect(page.locator(".ckptview-serials .tabulator-row").first).to_be_visible(timeout=WAIT)
    tab(page, "Retention")
    field = page.locator(".ckptview-keep-last input")
    field.fill("2")
    field.press("Enter")
    page.locator(".ckptview-retention-plan button").click()
    expect(page.locator(".ckptview-retention-table .tabulator-row")).to_have_count(len(plan),
                                                                                  timeout=WAIT)  # fmt: skip
    delete = page.locator(".ckptview-retention-delete button")
    expect(delete).to_have_text(f"Delete {len(doomed)} checkpoints…")
    assert set(cv.open(root).serials.index) == before  # planning deleted nothing
    delete.click()
    dialog = page.locator(".ckptview-confirm")
    expect(dialog).to_contain_text(f"Delete {len(doomed)} checkpoints?")
    assert set(cv.open(root).serials.index) == before  # asking deleted nothing
    shot(page, "retention_confirm")
    page.locator(".ckptview-retention-confirm button").click()
    expect(page.locator(".ckptview-retention-message")).to_contain_text(
        f"Deleted {len(doomed)} checkpoints", timeout=WAIT
    )
    assert sorted(before - set(cv.open(root).serials.index)) == doomed
    shot(page, "retention_done")


@pytest.mark.parametrize("rel", [*CORPUS_TREES, "demo"])
def test_corpus_trees_list_their_serials(page: Page, read_only, trees, rel):
    cat = cv.open(trees[rel])
    page.goto(read_only.url)
    expect(page.locator(".ckptview-serials .tabulator-row").first).to_be_visible(timeout=WAIT)
    pick_run(page, Path(trees[rel]).name)
    expect(page.locator(".ckptview-summary")).to_contain_text(cat.url, timeout=WAIT)
    expect_serials(page, cat)
    first = int(cat.serials.index[0])
    page.locator(".ckptview-serials .tabulator-row").first.click()
    n = int((cat.variables["serial"] == first).sum())
    expect(page.locator(".ckptview-vars-heading")).to_contain_text(
        f"Serial {first} · {n} variables", timeout=WAIT
    )
    shot(page, f"corpus_{Path(trees[rel]).name}")


def test_read_only_offers_no_change_and_refuses_a_forced_one(page: Page, read_only, trees):
    root = trees["demo"]
    before = sorted(cv.open(root).serials.index)
    page.goto(read_only.url)
    expect(page.locator(".ckptview-mode")).to_contain_text("read-only", timeout=WAIT)
    pick_run(page, Path(root).name)
    tab(page, "Retention")
    page.locator(".ckptview-retention-run select").select_option(Path(root).name)
    page.locator(".ckptview-retention-plan button").click()
    expect(page.locator(".ckptview-retention-message")).to_contain_text("read-only", timeout=WAIT)
    expect(page.locator(".ckptview-retention-delete button")).to_be_hidden()
    expect(page.locator(".ckptview-retention-save button")).to_be_hidden()
    force_click(page, "ckptview-retention-delete")
    expect(page.locator(".ckptview-retention-message")).to_contain_text("Refused", timeout=WAIT)
    expect(page.locator(".ckptview-confirm")).to_be_hidden()
    tab(page, "Restore")
    page.locator(".ckptview-restore-plan button").click()
    expect(page.locator(".ckptview-restore-message")).to_contain_text("read-only", timeout=WAIT)
    expect(page.locator(".ckptview-restore-confirm button")).to_be_hidden()
    force_click(page, "ckptview-restore-confirm")
    expect(page.locator(".ckptview-restore-message")).to_contain_text("Refused", timeout=WAIT)
    shot(page, "read_only_refused")
    assert sorted(cv.open(root).serials.index) == before
    assert not (Path(root) / ".ckptview").exists()


def test_a_fresh_page_fetches_only_the_latin_roboto_faces(page: Page, read_only):
    """The icon stylesheet is served without its Roboto faces that had no ``unicode-range``
    (``server.RobotoRanges``): a page of Latin text fetches Roboto's Latin files, not all 16
    (Cyrillic, Greek, Vietnamese, math and symbols in two weights each)."""
    fonts: list[str] = []
    page.on("request", lambda r: fonts.append(r.url) if ".woff" in r.url else None)
    page.goto(read_only.url)
    expect(page.locator(".ckptview-serials .tabulator-row").first).to_be_visible(timeout=WAIT)
    page.wait_for_load_state("load")
    page.wait_for_timeout(1000)
    roboto = {u.rsplit("/", 1)[-1].split("-normal")[0] for u in fonts if "/roboto-" in u}
    # Latin, and Latin Extended for the names of the corpus trees that need it
    assert {"roboto-latin-400", "roboto-latin-700"} <= roboto, fonts
    assert roboto <= {"roboto-latin-400", "roboto-latin-700", "roboto-latin-ext-400",
                      "roboto-latin-ext-700"}, fonts  # fmt: skip


def test_a_url_outside_the_roots_is_refused(page: Page, read_only, tmp_path):
    outside = write_demo(tmp_path / "outside", serials=2).root
    page.goto(read_only.url)
    expect(page.locator(".ckptview-serials .tabulator-row").first).to_be_visible(timeout=WAIT)
    open_picker(page)
    url = page.locator(".ckptview-url input")
    url.fill(str(outside))
    url.press("Enter")
    page.locator(".ckptview-open button").click()
    expect(page.locator(".ckptview-picker-message")).to_contain_text("Refused", timeout=WAIT)
    expect(page.locator(".ckptview-runs")).not_to_contain_text(str(outside))


def test_storage_options_cannot_leave_the_roots(page: Page, read_only, trees, tmp_path):
    """The red team's escapes, typed into the page: a ``reference`` filesystem fetching its
    ``fo`` from a loopback service (SSRF) and a ``simplecache`` writing where the visitor says
    (on a read-only dashboard). Both are refused before anything is fetched or written."""
    from test_guard import Recorder

    recorder = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    recorder.paths, recorder.refs = [], {"version": 1, "refs": {}}
    threading.Thread(target=recorder.serve_forever, daemon=True).start()
    cache = tmp_path / "visitor-cache"
    root = str(trees["demo"])
    attempts = [
        {"protocol": "reference", "fo": f"http://127.0.0.1:{recorder.server_address[1]}/r"},
        {"protocol": "simplecache", "target_protocol": "file", "cache_storage": str(cache)},
    ]
    try:
        page.goto(read_only.url)
        expect(page.locator(".ckptview-serials .tabulator-row").first).to_be_visible(timeout=WAIT)
        open_picker(page)
        message = page.locator(".ckptview-picker-message")

        def try_open(url: str, options: dict | None, says: str) -> None:
            for field, value in ((".ckptview-url", url),
                                 (".ckptview-storage-options", json.dumps(options or {}))):
                page.locator(f"{field} input").fill(value)
                page.locator(f"{field} input").press("Enter")
            page.locator(".ckptview-open button").click()
            expect(message).to_contain_text(says, timeout=WAIT)

        for options in attempts:
            try_open(root, options, "storage option 'protocol' is not accepted")
            try_open("", None, "no URL given")  # the next message is a new one
        try_open(f"simplecache::{root}", None, "chained URL")
    finally:
        recorder.shutdown()
        recorder.server_close()
    assert recorder.paths == [] and not cache.exists()
    expect(page.locator(".ckptview-runs")).not_to_contain_text("reference")


def test_a_parser_crash_costs_one_error_row_not_the_server(page: Page, tmp_path):
    """A codec plugin whose parser dies by SIGSEGV (and one that asks for 16 GiB), installed
    for the served app: the files are listed in the server's worker processes, so the page
    shows the two error rows and the healthy file's tensors, and the server stays up."""
    from test_isolated import install_plugin

    site = install_plugin(tmp_path / "site")
    root = tmp_path / "files"
    root.mkdir()
    shutil.copyfile(corpus_path("modern/safetensors/single/model.safetensors"),
                    root / "model.safetensors")  # fmt: skip
    (root / "boom.crash").write_bytes(b"x")
    (root / "big.hog").write_bytes(b"x")
    server = Server([str(root)], env={"PYTHONPATH": str(site)})
    try:
        page.goto(server.url)
        row = page.locator(".ckptview-serials .tabulator-row").first
        expect(row.locator("[tabulator-field=error]")).to_contain_text("SIGSEGV", timeout=WAIT)
        expect(row.locator("[tabulator-field=error]")).to_contain_text("big.hog: MemoryError")
        reveal(page)
        variables = page.locator(".ckptview-variables")
        expect(variables).to_contain_text("killed its worker process", timeout=WAIT)
        assert server.proc.poll() is None  # the server lives on
        workers = psutil.Process(server.proc.pid).children(recursive=True)
        assert workers  # the listings ran in child processes
        page.reload()  # and a new page is served as before
        expect(row.locator("[tabulator-field=error]")).to_contain_text("SIGSEGV", timeout=WAIT)
        shot(page, "parser_crash")
    finally:
        server.stop()
    gone, alive = psutil.wait_procs(workers, timeout=15)
    assert not alive  # no worker outlives the server


def test_works_behind_basic_auth(page: Page, trees):
    server = Server([str(trees["caffe2/ckpt"])],
                    extra=["--basic-auth", "s3cret-pw", "--cookie-secret", "ckptview-test"])  # fmt: skip
    try:
        page.goto(server.url)
        page.locator("input[name=username]").fill("ana")
        page.locator("input[name=password]").fill("s3cret-pw")
        page.locator("button[type=submit], input[type=submit]").first.click()
        expect_serials(page, cv.open(trees["caffe2/ckpt"]))
    finally:
        server.stop()


def test_live_run_new_serial_appears_while_the_page_is_open(page: Page, tmp_path):
    root = write_demo(tmp_path / "live", serials=4).root
    server = Server([str(root)], app_args=["--poll", "1"])
    try:
        page.goto(server.url)
        rows = page.locator(".ckptview-serials .tabulator-row")
        expect(rows).to_have_count(4, timeout=WAIT)
        rows.nth(1).click()
        heading = page.locator(".ckptview-vars-heading")
        expect(heading).to_contain_text("Serial 1 ·", timeout=WAIT)
        shutil.copytree(Path(root) / "checkpoint_2", Path(root) / "checkpoint_4")  # a new save
        expect(rows).to_have_count(5, timeout=15_000)  # a few poll periods
        expect(rows.nth(4).locator("[tabulator-field=serial]")).to_have_text("4")
        expect(rows.nth(4).locator(".cv-badge.cv-latest")).to_have_count(1)
        expect(page.locator(".ckptview-live")).to_contain_text("new serial 4")
        expect(page.locator(".ckptview-summary")).to_contain_text("5 serials")
        expect(rows.nth(1)).to_have_class(re.compile("tabulator-selected"))  # selection kept
        expect(heading).to_contain_text("Serial 1 ·")
        shot(page, "live")
    finally:
        server.stop()


def test_verdicts_banner_and_verify_action(page: Page, tmp_path):
    """A DeepSpeed run whose newest tag (the one ``latest`` names) does not load: the page says
    the framework's pointer is passed over, and Verify lists that tag's findings."""
    root = tmp_path / "ds"
    shutil.copytree(corpus_path("llm/deepspeed_zero"), root)
    newest = root / (root / "latest").read_text().strip()
    for f in newest.glob("*model_states.pt"):
        f.write_bytes(b"\0" * f.stat().st_size)
    cat = cv.open(root)
    broken = int(newest.name[len("global_step") :])
    findings = cat.verify(broken)
    assert len(findings)
    server = Server([str(root)])
    try:
        page.goto(server.url)
        expect_serials(page, cat)
        expect(page.locator(".ckptview-summary")).to_contain_text(
            f"pointer names serial {broken}", timeout=WAIT
        )
        at = serials_frame(cat)["serial"].tolist().index(broken)
        row = page.locator(".ckptview-serials .tabulator-row").nth(at)
        expect(row.locator("[tabulator-field=loadable]")).to_have_text("no")
        row.click()
        page.locator(".ckptview-verify button").click()
        result = page.locator(".ckptview-verify-result")
        expect(result).to_contain_text(f"Serial {broken}: {len(findings)} finding(s)", timeout=WAIT)
        expect(page.locator(".ckptview-findings .tabulator-row")).to_have_count(len(findings))
        shot(page, "verify")
    finally:
        server.stop()
