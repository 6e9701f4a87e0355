"""Every tab of the served dashboard at 1280 × 800, in the light and the dark theme: nothing
runs off the right edge of the window (the page, a tab's content, a scrolled container), the
tabs are ARIA tabs, the Restore button is reachable, and text is readable in either theme.

One server and one page per theme for the whole module (the tabs are visited in turn)."""

from __future__ import annotations

import pytest
from conftest import open_picker, reveal
from playwright.sync_api import Browser, Page, expect
from test_browser_app import SCROLL_TOP, SERIALS, WAIT, Server

import ckptview as cv
from ckptview.demo import write_demo
from ckptview.widgets.shell.app import TABS

pytestmark = pytest.mark.browser
WIDTH, HEIGHT = 1280, 800

#: everything that reaches past the window's right edge where the window shows it: an element
#: is measured inside the boxes of its clipping ancestors; a container scrolled sideways or
#: holding wider content than it shows is itself an offender
OVERFLOW = """() => {
  const W = window.innerWidth, out = [];
  const up = (e) => e.parentElement || (e.getRootNode() && e.getRootNode().host) || null;
  const name = (e) => (e.tagName + '.' + String(e.className || '').split(' ').slice(0, 2)
                       .join('.')).slice(0, 70);
  const visit = (e) => {
    const r = e.getBoundingClientRect();
    const s = getComputedStyle(e);
    if (r.width > 0 && r.height > 0 && s.visibility !== 'hidden') {
      let right = r.right;
      for (let a = up(e); a; a = up(a)) {
        if (['hidden', 'clip', 'auto', 'scroll'].includes(getComputedStyle(a).overflowX))
          right = Math.min(right, a.getBoundingClientRect().right);
      }
      if (right > W + 1) out.push(name(e) + ' right=' + Math.round(right));
      if (e.scrollLeft > 0) out.push(name(e) + ' scrolled sideways by ' + e.scrollLeft);
      if (['auto', 'scroll'].includes(s.overflowX) && e.scrollWidth > e.clientWidth + 2)
        out.push(name(e) + ' content ' + e.scrollWidth + ' wider than ' + e.clientWidth);
    }
    for (const c of e.children) visit(c);
    if (e.shadowRoot) for (const c of e.shadowRoot.children) visit(c);
  };
  visit(document.documentElement);
  return {scrollWidth: document.documentElement.scrollWidth, width: W, offenders: out};
}"""

#: WCAG contrast of an element's text against the colour actually behind it
CONTRAST = """(e) => {
  const rgb = (c) => (c.match(/[\\d.]+/g) || []).map(Number);
  const up = (x) => x.parentElement || (x.getRootNode() && x.getRootNode().host) || null;
  const layers = [];  // backgrounds from the element down to the first opaque one
  for (let a = e; a; a = up(a)) {
    const c = rgb(getComputedStyle(a).backgroundColor);
    if (c.length >= 3 && (c.length < 4 || c[3] > 0)) layers.push(c);
    if (c.length === 3 || c[3] === 1) break;
  }
  let bg = [255, 255, 255];
  for (const c of layers.reverse()) {
    const alpha = c.length > 3 ? c[3] : 1;
    bg = bg.map((x, i) => alpha * c[i] + (1 - alpha) * x);
  }
  const lum = (c) => { const v = c.slice(0, 3).map((x) => { x /= 255;
      return x <= 0.03928 ? x / 12.92 : Math.pow((x + 0.055) / 1.055, 2.4); });
    return 0.2126 * v[0] + 0.7152 * v[1] + 0.0722 * v[2]; };
  const a = lum(rgb(getComputedStyle(e).color)), b = lum(bg);
  return {ratio: (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05), background: b,
          colors: [getComputedStyle(e).color, ...layers.map(String)]};
}"""



@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The demo tree (in a directory named like the docs' one), served with write access."""
    root = write_demo(tmp_path_factory.mktemp("layout") / "demo_tree", serials=SERIALS).root
    server = Server([str(root)], allow_write=True, app_args=["--poll", "0"])
    yield server, root
    server.stop()


@pytest.fixture(scope="module", params=["light", "dark"])
def themed(request, browser: Browser, served) -> Page:
    """One 1280 × 800 page per theme (``?theme=dark``: panel's session theme)."""
    server, _ = served
    page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
    page.goto(server.url + ("?theme=dark" if request.param == "dark" else ""))
    expect(page.locator(".ckptview-serials .tabulator-row").first).to_be_visible(timeout=WAIT)
    reveal(page)  # the timeline and the variables below the serials: built once scrolled to
    page.evaluate(SCROLL_TOP)
    page.theme = request.param  # type: ignore[attr-defined] - read by the tests
    yield page
    page.close()


def contrast(page: Page, locator) -> dict:
    """:data:`CONTRAST` of a rendered element (a table may redraw a row under the locator)."""
    for _ in range(20):
        got = locator.evaluate(CONTRAST)
        if got["colors"][0]:  # no style: the element was just replaced
            return got
        page.wait_for_timeout(250)
    return got


def open_tab(page: Page, name: str) -> None:
    tab = page.get_by_role("tab", name=name)
    tab.click()
    expect(tab).to_have_attribute("aria-selected", "true", timeout=WAIT)


def fill_tab(page: Page, name: str) -> None:
    """Put the tab's usual content on screen (a diff, a plan, a plot)."""
    if name == "Browse":
        expect(page.locator(".ckptview-variables .tabulator-row").first).to_be_visible(
            timeout=WAIT
        )
    elif name == "Compare":
        page.locator(".ckptview-compare-button button").click()
        expect(page.locator(".ckptview-diff .tabulator-row").first).to_be_visible(timeout=WAIT)
    elif name == "Trajectory":
        expect(page.locator(".ckptview-trajectory canvas").first).to_be_visible(timeout=WAIT)
    elif name == "Restore":
        page.locator(".ckptview-restore-plan button").click()
        expect(page.locator(".ckptview-restore-ops .tabulator-row").first).to_be_visible(
            timeout=WAIT
        )
    elif name == "Retention":
        page.locator(".ckptview-retention-plan button").click()
        expect(page.locator(".ckptview-retention-table .tabulator-row").first).to_be_visible(
            timeout=WAIT
        )
    page.wait_for_timeout(500)  # tables settle their column widths


@pytest.mark.parametrize("name", TABS)
def test_every_tab_fits_1280_pixels(themed: Page, name: str):
    open_tab(themed, name)
    fill_tab(themed, name)
    measured = themed.evaluate(OVERFLOW)
    assert measured["scrollWidth"] <= measured["width"] == WIDTH
    assert measured["offenders"] == [], f"{name} ({themed.theme}): {measured['offenders'][:8]}"
    panel = themed.locator(".ckptview-tabs").first.bounding_box()
    assert panel is not None and panel["x"] >= 0 and panel["x"] + panel["width"] <= WIDTH + 1


def test_the_tabs_are_aria_tabs(themed: Page):
    expect(themed.get_by_role("tablist")).to_have_count(1)
    tabs = themed.get_by_role("tab")
    expect(tabs).to_have_count(len(TABS))
    for i, name in enumerate(TABS):
        expect(tabs.nth(i)).to_have_text(name, ignore_case=True)
    open_tab(themed, "Compare")
    expect(themed.get_by_role("tab", name="Browse")).to_have_attribute("aria-selected", "false")


def test_the_restore_plan_button_is_on_screen_and_plans(themed: Page):
    open_tab(themed, "Restore")
    button = themed.locator(".ckptview-restore-plan button")
    box = button.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= WIDTH
    assert box["y"] + box["height"] <= HEIGHT  # no scrolling needed to reach it
    button.click()
    expect(themed.locator(".ckptview-restore-message")).to_contain_text("Plan:", timeout=WAIT)
    assert themed.evaluate(OVERFLOW)["offenders"] == []  # the click scrolled nothing sideways
    after = button.bounding_box()
    assert after is not None and after["x"] == pytest.approx(box["x"], abs=1)


def test_a_refusal_says_what_to_do_and_clears_the_plan(themed: Page):
    open_tab(themed, "Restore")
    themed.locator(".ckptview-restore-plan button").click()
    ops = themed.locator(".ckptview-restore-ops .tabulator-row")
    expect(ops.first).to_be_visible(timeout=WAIT)
    themed.locator(".ckptview-restore-mode button", has_text="copy to URL").click()
    dest = themed.locator(".ckptview-restore-dest input")
    dest.fill("/etc/ckptview-copy")
    dest.press("Enter")
    themed.locator(".ckptview-restore-plan button").click()
    message = themed.locator(".ckptview-restore-message")
    expect(message).to_contain_text("Refused:", timeout=WAIT)
    expect(message).to_contain_text("is outside the roots this dashboard serves")
    expect(message).to_contain_text("Only trees under those roots can be opened here")
    expect(message).not_to_contain_text("AccessRefused")
    expect(themed.locator(".ckptview-restore-ops")).to_be_hidden()
    expect(themed.locator(".ckptview-restore-confirm button")).to_be_hidden()
    themed.locator(".ckptview-restore-mode button", has_text="in place").click()


def test_text_is_readable_in_either_theme(themed: Page, served):
    _, root = served
    open_tab(themed, "Browse")
    share = themed.locator(".ckptview-variables .tabulator-row").first.locator(
        "[tabulator-field=share] span"
    )
    cat = cv.open(root)
    v = cat.variables[cat.variables["serial"] == cat.latest]
    top = round(100 * v["nbytes"].max() / v["nbytes"].sum(), 1)
    expect(share).to_have_text(f"{top:.1f}", timeout=WAIT)
    checks = {
        "% of serial": share,
        "selected row": themed.locator(".ckptview-serials .tabulator-selected .tabulator-cell").first,
        "button": themed.locator(".ckptview-verify button"),
        "summary": themed.locator(".ckptview-summary").first,
    }
    themed.mouse.move(5, HEIGHT - 5)  # over the sidebar: no row is hovered
    for what, locator in checks.items():
        got = contrast(themed, locator)
        assert got["ratio"] >= 4.5, f"{what} ({themed.theme}): {got}"
    dark = contrast(themed, checks["summary"])["background"] < 0.2
    assert dark == (themed.theme == "dark")


def test_a_cells_tooltip_is_readable_in_either_theme(themed: Page):
    """Tabulator's tooltip box is white in any theme; its text took the page's colour (white
    on white in the dark theme)."""
    open_tab(themed, "Browse")
    row = themed.locator(".ckptview-variables .tabulator-row").first
    row.scroll_into_view_if_needed()
    row.locator("[tabulator-field=name]").hover()
    tip = themed.locator(".tabulator-tooltip")
    expect(tip).to_be_visible(timeout=WAIT)
    got = contrast(themed, tip)
    themed.mouse.move(5, HEIGHT - 5)  # over the sidebar: the tooltip goes
    themed.evaluate(SCROLL_TOP)
    assert got["ratio"] >= 4.5, f"tooltip ({themed.theme}): {got}"


def test_long_paths_wrap_in_the_sidebar(themed: Page, served):
    _, root = served
    open_picker(themed)
    runs = themed.locator(".ckptview-runs").first
    expect(runs).to_contain_text(str(root), timeout=WAIT)
    sidebar = themed.locator(".ckptview-url").first.bounding_box()
    code = runs.locator("code").first.bounding_box()
    assert sidebar is not None and code is not None
    assert code["x"] + code["width"] <= sidebar["x"] + sidebar["width"] + 1


def test_the_timeline_offers_what_the_tree_records(themed: Page):
    open_tab(themed, "Browse")
    options = themed.locator(".ckptview-timeline-y select option").all_inner_texts()
    assert {"size", "bytes by kind", "epoch", "step", "variables", "files"} <= set(options)
    themed.locator(".ckptview-timeline-y select").select_option("epoch")
    expect(themed.locator(".ckptview-timeline canvas").first).to_be_visible(timeout=WAIT)
    themed.locator(".ckptview-timeline-y select").select_option("size")
