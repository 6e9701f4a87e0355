"""Issue 29, the dashboard items at 1280 × 800 in both themes: whole names in the variables
and compare tables (wrapped at separators, never cut), whole headers and badges, message
boxes that follow the dark theme, and no page error on Compare -> Browse -> a variable."""

from __future__ import annotations

import pytest
from conftest import corpus_path, reveal
from playwright.sync_api import Browser, Page, expect
from test_browser_app import WAIT, Server

pytestmark = pytest.mark.browser
WIDTH, HEIGHT = 1280, 800
SHOTS = "/tmp/ckptview-everyday"

#: every visible cell and header title of the tables under ``sel``: its text, and whether it
#: shows all of it (nothing scrolled out sideways or below)
CELLS = """(root) => {
  const out = [];
  const walk = (node) => {
    for (const c of node.querySelectorAll('.tabulator-cell, .tabulator-col-title')) {
      const r = c.getBoundingClientRect();
      if (r.width === 0 || getComputedStyle(c).display === 'none') continue;
      const col = c.closest('.tabulator-col');
      out.push({field: c.getAttribute('tabulator-field')
                       || (col && col.getAttribute('tabulator-field')),
                header: c.classList.contains('tabulator-col-title'), text: c.textContent,
                fits: c.scrollWidth <= c.clientWidth + 1 && c.scrollHeight <= c.clientHeight + 1});
    }
    for (const e of node.querySelectorAll('*')) if (e.shadowRoot) walk(e.shadowRoot);
  };
  walk(root.shadowRoot || root);
  return out;
}"""

#: the pieces of names (the text between the ``<wbr>`` the name formatter puts after each
#: ``/`` and ``.``: a text node each) under ``root`` that the browser broke over more than
#: one line
BROKEN_PIECES = """(root) => {
  const out = [];
  const walk = (node) => {
    for (const span of node.querySelectorAll('.cv-name')) {
      const texts = document.createTreeWalker(span, NodeFilter.SHOW_TEXT);
      for (let piece = texts.nextNode(); piece; piece = texts.nextNode()) {
        if (!piece.textContent) continue;
        const range = document.createRange();
        range.selectNodeContents(piece);
        const lines = new Set([...range.getClientRects()].filter((r) => r.width > 0)
                              .map((r) => Math.round(r.top)));
        if (lines.size > 1) out.push(piece.textContent);
      }
    }
    for (const e of node.querySelectorAll('*')) if (e.shadowRoot) walk(e.shadowRoot);
  };
  walk(root.shadowRoot || root);
  return out;
}"""

#: the luminance of an element's own background colour over the page's (``base``, 0..255
#: grey; 0 black … 1 white; -1 transparent)
LUMINANCE = """([e, base]) => {
  const c = (getComputedStyle(e).backgroundColor.match(/[\\d.]+/g) || []).map(Number);
  if (c.length < 3 || (c.length > 3 && c[3] === 0)) return -1;
  const a = c.length > 3 ? c[3] : 1;
  const mix = c.slice(0, 3).map((x) => (a * x + (1 - a) * base) / 255);
  return 0.2126 * mix[0] + 0.7152 * mix[1] + 0.0722 * mix[2];
}"""


@pytest.fixture(scope="module")
def served():
    server = Server([str(corpus_path("llm/megatron_legacy"))], allow_write=True,
                    app_args=["--poll", "0"])  # fmt: skip
    yield server
    server.stop()


@pytest.fixture(params=["light", "dark"])
def themed(request, browser: Browser, served) -> Page:
    page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
    page.errors = []  # type: ignore[attr-defined]
    page.on("pageerror", lambda e: page.errors.append(str(e)))  # type: ignore[attr-defined]
    page.goto(served.url + ("?theme=dark" if request.param == "dark" else ""))
    reveal(page)  # the variables below the serials: built once scrolled to
    expect(page.locator(".ckptview-variables .tabulator-row").first).to_be_visible(timeout=WAIT)
    page.theme = request.param  # type: ignore[attr-defined]
    yield page
    page.close()


def check_whole(page: Page, selector: str, field: str, shot: str) -> list[dict]:
    """Every ``field`` cell under ``selector`` shows its whole text; headers and badges too."""
    page.wait_for_timeout(800)  # the table's column layout settles after a redraw
    page.locator(selector).first.scroll_into_view_if_needed()
    page.screenshot(path=f"{SHOTS}/{shot}-{page.theme}.png")
    cells = page.locator(selector).first.evaluate(CELLS)
    names = [c for c in cells if c["field"] == field and not c["header"]]
    assert names, f"no {field} cells under {selector}"
    cut = [c["text"] for c in cells if not c["fits"] and c["field"] not in (None, "_index")]
    assert not cut, f"cut in {selector}: {cut[:5]}"
    broken = page.locator(selector).first.evaluate(BROKEN_PIECES)
    assert not broken, f"names broken mid-word in {selector}: {broken[:5]}"
    return names


def test_variables_names_whole_and_empty_columns_hidden(themed: Page):
    names = check_whole(themed, ".ckptview-variables", "name", "variables")
    longest = max(names, key=lambda c: len(c["text"]))["text"]
    assert len(longest) > 45 and "/" in longest  # the corpus's long optimizer names
    widths = {c: themed.locator(f".ckptview-variables .tabulator-col[tabulator-field={c}]")
              .first.bounding_box()["width"] for c in ("name", "node")}  # fmt: skip
    assert widths["name"] >= 380 and widths["node"] <= 90, widths


def test_compare_names_whole_then_browse_click_has_no_page_error(themed: Page):
    """Compare's names whole, none broken mid-word (the longest piece,
    ``num_floating_point_operations_so_far``, on one line); back on Browse (its tab built
    again, the timeline plot with it) a click on a variable throws no page error."""
    themed.get_by_role("tab", name="Compare").click()
    themed.locator(".ckptview-compare-button button").click()
    expect(themed.locator(".ckptview-diff .tabulator-row").first).to_be_visible(timeout=WAIT)
    names = check_whole(themed, ".ckptview-diff", "name", "compare")
    assert any("num_floating_point_operations_so_far" in c["text"] for c in names)
    width = themed.locator(".ckptview-diff .tabulator-col[tabulator-field=name]").first
    assert width.bounding_box()["width"] >= 240, width.bounding_box()  # the longest piece: ~238
    themed.get_by_role("tab", name="Browse").click()
    row = themed.locator(".ckptview-variables .tabulator-row").first
    expect(row).to_be_visible(timeout=WAIT)
    row.click()
    themed.wait_for_timeout(2000)
    assert themed.errors == [], themed.errors  # type: ignore[attr-defined]
    plot = themed.locator(".ckptview-timeline canvas").first  # drawn again, not left blank
    assert plot.bounding_box()["width"] > 300 and plot.bounding_box()["height"] > 100


def test_serials_badges_and_headers_whole(themed: Page):
    check_whole(themed, ".ckptview-serials", "status", "serials")


def test_message_boxes_follow_the_theme(themed: Page):
    themed.get_by_role("tab", name="Restore").click()
    box = themed.locator(".cv-notice-info").first
    expect(box).to_be_visible(timeout=WAIT)
    themed.screenshot(path=f"{SHOTS}/restore-{themed.theme}.png")
    lum = themed.evaluate(LUMINANCE, [box.element_handle(), 18 if themed.theme == "dark" else 255])
    if themed.theme == "dark":
        assert 0 <= lum < 0.2, lum  # a dark tint, not light blue
    else:
        assert lum > 0.7, lum
