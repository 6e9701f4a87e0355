"""The Content-Security-Policy of ``ckptview serve`` in Debian's Chromium: the whole dashboard
works under it, and no script that page code inserts or re-creates runs.

Panel re-creates every ``<script>`` of an HTML or Markdown pane so that it runs; under
``'strict-dynamic'`` such a script was trusted. Here a tiny Panel app with payloads in its panes
is served by the same server (``python -m ckptview.widgets``): nothing may run. The same app
under plain ``panel serve`` (no policy) runs them, so the payloads are live.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect
from test_browser_app import WAIT, Server

from ckptview.demo import write_demo
from ckptview.widgets.shell.server import CSP

pytestmark = pytest.mark.browser

RECORD_CSP = """document.addEventListener('securitypolicyviolation', (e) =>
    (window.__csp = window.__csp || []).push(e.effectiveDirective + ' ' + e.blockedURI))"""

#: payloads: each sets ``window.__pwned_<where>`` if it runs
HOSTILE_APP = """
import panel as pn

pn.extension()
pn.Column(
    pn.pane.Markdown("# markdown pane\\n\\n<script>window.__pwned_md = 1</script>\\n\\nmd-end"),
    pn.pane.HTML("<p>html-pane</p><script>window.__pwned_html = 1</script>"
                 "<img src='nowhere.png' onerror='window.__pwned_img = 1'>"
                 "<script src='/assets/pwn.js'></script>"
                 "<script type='module'>window.__pwned_module = 1</script>"
                 "<script type='module-shim'>window.__pwned_shim = 1</script>"),
).servable()
"""


class Recorder:
    """What a page reports: CSP violations (event and console), failed script loads."""

    def __init__(self, page: Page) -> None:
        self.page, self.console, self.failed = page, [], []
        self.bundles: list[str] = []  # how panel-material-ui's bundle was requested
        page.on("request", lambda r: "panel-material-ui.bundle.js" in r.url
                and self.bundles.append(r.resource_type))  # fmt: skip
        page.add_init_script(RECORD_CSP)
        page.on("console", lambda m: m.type == "error" and self.console.append(m.text))
        page.on("requestfailed", lambda r: r.resource_type == "script"
                and self.failed.append(r.url))  # fmt: skip

    def violations(self) -> list[str]:
        return self.page.evaluate("window.__csp || []")

    def csp_errors(self) -> list[str]:
        return [m for m in self.console if "Content Security Policy" in m]


def pwned(page: Page) -> list[str]:
    return page.evaluate("Object.keys(window).filter((k) => k.startsWith('__pwned'))")


@pytest.fixture(scope="module")
def hostile_app(tmp_path_factory):
    """The app script and a static directory holding a same-origin script, ``pwn.js``."""
    base = tmp_path_factory.mktemp("csp")
    (base / "assets").mkdir()
    (base / "assets" / "pwn.js").write_text("window.__pwned_src = 1;\n")
    app = base / "hostile_panes.py"
    app.write_text(HOSTILE_APP)
    return app, ["--static-dirs", f"assets={base / 'assets'}"]


def open_panes(page: Page, server: Server) -> None:
    page.goto(server.url)
    expect(page.get_by_text("md-end")).to_be_visible(timeout=WAIT)
    expect(page.get_by_text("html-pane")).to_be_visible()
    expect(page.locator("img[src='nowhere.png']")).to_have_count(1)
    page.wait_for_timeout(1500)  # the onerror of the image and the script loads


def test_the_policy_trusts_only_the_nonce():
    script = next(d.split()[1:] for d in CSP.split(";") if d.split()[0] == "script-src")
    assert script == ["'nonce-{nonce}'", "'unsafe-eval'"]


def test_markup_in_html_and_markdown_panes_runs_nothing(page: Page, hostile_app):
    app, extra = hostile_app
    server = Server([], app=app, extra=extra)
    try:
        seen = Recorder(page)
        open_panes(page, server)
        assert pwned(page) == []
        blocked = seen.violations()
        assert any(v.startswith("script-src-attr inline") for v in blocked), blocked
        assert any(v.startswith("script-src-elem inline") for v in blocked), blocked
        assert any(v.startswith("script-src-elem") and v.endswith("/assets/pwn.js")
                   for v in blocked), blocked  # fmt: skip
        assert page.evaluate("typeof importShim") == "function"  # es-module-shims loaded
    finally:
        server.stop()


def test_without_the_policy_the_same_panes_run_their_payloads(page: Page, hostile_app):
    app, extra = hostile_app
    server = Server([], app=app, extra=extra, hardened=False)
    try:
        open_panes(page, server)
        ran = pwned(page)
        assert {"__pwned_md", "__pwned_html", "__pwned_img", "__pwned_src"} <= set(ran), ran
    finally:
        server.stop()


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory):
    root = write_demo(tmp_path_factory.mktemp("csp-demo") / "demo", serials=4).root
    server = Server([str(root)], allow_write=True)
    yield server
    server.stop()


def test_every_tab_works_and_an_injected_script_is_blocked(page: Page, demo_server):
    """Each tab of the dashboard renders (its actions run: a diff, a plot, plans) with no CSP
    violation and every script loads; then a ``<script>`` that page code appends is blocked."""
    page.set_viewport_size({"width": 1500, "height": 1400})
    seen = Recorder(page)
    page.goto(demo_server.url)
    rows = page.locator(".ckptview-serials .tabulator-row")
    expect(rows.first.locator("[tabulator-field=size]")).to_contain_text("KiB", timeout=WAIT)
    tabs = page.get_by_role("tab")  # Material tabs: drawn by the panel-material-ui ES module
    names = tabs.all_inner_texts()
    assert {"BROWSE", "COMPARE", "TRAJECTORY", "RESTORE", "RETENTION"} <= set(names), names
    for i, name in enumerate(names):
        tabs.nth(i).click()
        expect(tabs.nth(i)).to_have_attribute("aria-selected", "true")
        own = page.locator(f"[class*=ckptview-{name.lower()}]:visible")  # the tab's widgets
        expect(own.first).to_be_visible(timeout=WAIT)
        if name == "COMPARE":
            page.locator(".ckptview-compare-button button").click()
            expect(page.locator(".ckptview-diff .tabulator-row").first).to_be_visible(
                timeout=WAIT
            )  # fmt: skip
        elif name == "TRAJECTORY":
            expect(page.locator(".ckptview-trajectory canvas").first).to_be_visible(timeout=WAIT)
        elif name == "RETENTION":
            page.locator(".ckptview-retention-plan button").click()
            expect(page.locator(".ckptview-retention-table .tabulator-row").first
                   ).to_be_visible(timeout=WAIT)  # fmt: skip
    tabs.first.click()
    rows.nth(1).click()
    expect(page.locator(".ckptview-vars-heading")).to_contain_text("Serial 1", timeout=WAIT)
    page.wait_for_timeout(1000)
    assert seen.violations() == [] and seen.csp_errors() == [] and seen.failed == []
    # loaded by the browser's import() (a script), never read by es-module-shims (a fetch)
    assert seen.bundles and set(seen.bundles) == {"script"}, seen.bundles
    page.evaluate("""() => { const s = document.createElement('script');
        s.textContent = 'window.__pwned_injected = 1'; document.body.appendChild(s) }""")
    page.wait_for_timeout(500)
    assert pwned(page) == []
    assert [v.split()[0] for v in seen.violations()] == ["script-src-elem"]
