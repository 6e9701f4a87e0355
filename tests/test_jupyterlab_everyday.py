"""Issue 29 items 1 and 6 at notebook width: the widgets in a JupyterLab notebook (a 1280 px
window with the file browser open: cell outputs ~830 px wide) in JupyterLab's dark and light
themes, over the two LLM corpus trees with the longest names and the longest unbreakable
name pieces (found in the catalogs, not named here).

One ``jupyter lab`` (``test_jupyterlab.Lab``: 127.0.0.1, its own config, data and runtime
dirs, this interpreter's kernel, no request off the host) serves a notebook written here. It
is opened in the dark theme (the user's setting) and run from the Run menu once; the light
theme follows from the Settings menu. In each: the serials, variables and compare tables show
every cell and header title whole, the trees' longest names whole with no piece between
``/`` and ``.`` broken over two lines, badges whole, and table text, the restore message box
and the primary buttons readable (WCAG AA contrast, dark backgrounds in the dark theme, light
in the light one). The variables table fits the notebook's width; the compare table (ten
columns beside a whole name piece) scrolls sideways. Screenshots go to ``$CKPTVIEW_SHOTS``.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import nbformat
import pytest
from conftest import CORPUS, corpus_path
from playwright.sync_api import Browser, Locator, Page, expect
from test_browser_everyday import BROKEN_PIECES, CELLS
from test_jupyterlab import WAIT, Lab, run_all

import ckptview as cv
from ckptview.widgets._format import name_pieces, text_px

pytestmark = pytest.mark.browser
WIDTH, HEIGHT = 1280, 900
SHOTS = Path(os.environ.get("CKPTVIEW_SHOTS", Path(tempfile.gettempdir()) / "ckptview-shots"))
NOTEBOOK = "everyday"
THEMES = {"light": "JupyterLab Light", "dark": "JupyterLab Dark"}

#: an element's text colour against what is painted behind it (its own background and its
#: ancestors', across shadow roots, composited): WCAG luminances and contrast ratio
CONTRAST = """(el) => {
  const rgba = (s) => { const m = (s.match(/[\\d.]+/g) || []).map(Number);
                        return m.length < 3 ? null : [m[0], m[1], m[2], m.length > 3 ? m[3] : 1]; };
  const up = (e) => e.parentElement
    || (e.getRootNode() instanceof ShadowRoot ? e.getRootNode().host : null);
  const layers = [];
  for (let e = el; e; e = up(e)) {
    const c = rgba(getComputedStyle(e).backgroundColor);
    if (c && c[3] > 0) { layers.push(c); if (c[3] >= 1) break; }
  }
  let bg = [255, 255, 255];
  for (const c of layers.reverse()) bg = bg.map((x, i) => c[3] * c[i] + (1 - c[3]) * x);
  const c = rgba(getComputedStyle(el).color);
  const fg = bg.map((x, i) => c[3] * c[i] + (1 - c[3]) * x);
  const lum = (rgb) => { const f = rgb.map((v) => { v /= 255;
    return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; });
    return 0.2126 * f[0] + 0.7152 * f[1] + 0.0722 * f[2]; };
  const b = lum(bg), f = lum(fg);
  return {bg: b, fg: f, contrast: (Math.max(b, f) + 0.05) / (Math.min(b, f) + 0.05)};
}"""

#: each status badge under ``root``: whether it lies whole inside its cell
BADGES = """(root) => {
  const out = [];
  const walk = (node) => {
    for (const b of node.querySelectorAll('.cv-badge')) {
      const cell = b.closest('.tabulator-cell');
      if (!cell) continue;
      const r = b.getBoundingClientRect(), c = cell.getBoundingClientRect();
      out.push({text: b.textContent, whole: b.scrollWidth <= b.clientWidth + 1
                && r.left >= c.left - 1 && r.right <= c.right + 1 && r.height < 2 * 18});
    }
    for (const e of node.querySelectorAll('*')) if (e.shadowRoot) walk(e.shadowRoot);
  };
  walk(root.shadowRoot || root);
  return out;
}"""

#: the first element under ``root`` (shadow roots included) matching ``sel``
FIND = """([root, sel]) => {
  const walk = (node) => {
    const hit = node.querySelector(sel);
    if (hit) return hit;
    for (const e of node.querySelectorAll('*'))
      if (e.shadowRoot) { const h = walk(e.shadowRoot); if (h) return h; }
    return null;
  };
  return walk(root.shadowRoot || root);
}"""


def llm_trees() -> list[str]:
    """The LLM corpus trees with serials (the one-file trees have no compare)."""
    index = json.loads(corpus_path("llm", "INDEX.json").read_text())
    return [t["root"] for t in index["trees"] if len(t.get("serials", [])) >= 2]


def chosen_trees() -> list[str]:
    """The trees holding the longest name and the longest unbreakable piece of a name."""
    names = {rel: cv.open(CORPUS / "llm" / rel).variables["name"].unique() for rel in llm_trees()}
    by_name = max(names, key=lambda r: max(map(len, names[r])))
    by_piece = max(names, key=lambda r: max(len(p) for n in names[r] for p in name_pieces(n)))
    return list(dict.fromkeys([by_name, by_piece]))


class Tree:
    """One tree of the notebook: its catalog, the names its tables are turned to (the longest
    name of its latest serial; the diff's name with the widest piece) and its cells."""

    def __init__(self, rel: str, first_cell: int):
        self.rel = rel
        self.path = corpus_path("llm", rel)
        self.cat = cv.open(self.path)
        self.serial = self.cat.latest
        self.first = int(self.cat.serials.index[0])
        shown = self.cat.variables[self.cat.variables["serial"] == self.serial]
        self.longest = max(shown["name"], key=len)
        names = self.cat.diff(self.first, self.serial)["name"]
        self.widest = max(names, key=lambda n: max(text_px(p) for p in name_pieces(n)))
        self.cells = dict(zip(("serials", "variables", "compare", "restore"),
                              range(first_cell, first_cell + 4)))  # fmt: skip

    def sources(self) -> list[str]:
        cat = f"cat_{self.rel}"
        page = ("{0}.table.page = (list({0}.table.value['name']).index({1!r})"
                " // {0}.table.page_size + 1)")  # fmt: skip
        return [
            f"{cat} = cv.open({str(self.path)!r})\n"
            f"SerialsTable({cat}, poll_seconds=0)",
            f"variables = VariablesTable({cat})\n"
            f"{page.format('variables', self.longest)}  # the longest name's page\n"
            "variables",
            f"compare = CompareView({cat})\n"
            f"compare.param.update(serial_a={self.first}, serial_b={self.serial})\n"
            "compare.show(compare.compute())\n"
            f"{page.format('compare', self.widest)}  # the widest name piece's page\n"
            "compare",
            f"RestoreView({cat})",
        ]


@pytest.fixture(scope="module")
def trees() -> list[Tree]:
    out, cell = [], 1
    for rel in chosen_trees():
        out.append(Tree(rel, cell))
        cell += 4
    return out


@pytest.fixture(scope="module")
def lab(tmp_path_factory, trees):
    server = Lab(tmp_path_factory.mktemp("jupyterlab"))
    head = ("import ckptview as cv\n"
            "from ckptview.widgets import (CompareView, RestoreView, SerialsTable,"
            " VariablesTable, extension)\n\n"
            "extension()")  # fmt: skip
    cells = [head, *(s for tree in trees for s in tree.sources())]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}  # fmt: skip
    nbformat.write(nb, server.notebooks / f"{NOTEBOOK}.ipynb")
    yield server
    server.stop()


def set_theme(lab: Lab, theme: str) -> None:
    """JupyterLab's theme from its user settings (read again by the next page load)."""
    path = (lab.notebooks.parent / "config" / "lab" / "user-settings" / "@jupyterlab"
            / "apputils-extension" / "themes.jupyterlab-settings")  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"theme": THEMES[theme]}))


def output(page: Page, cell: int) -> Locator:
    return page.locator(".jp-Notebook .jp-Cell").nth(cell).locator(".jp-OutputArea-output")


#: how far a table's rows reach past its box (> 0: the table scrolls sideways)
SIDEWAYS = """(root) => {
  const find = (node) => node.querySelector('.tabulator-tableholder') || [...node.querySelectorAll('*')]
    .filter((e) => e.shadowRoot).map((e) => find(e.shadowRoot)).find(Boolean) || null;
  const holder = find(root.shadowRoot || root);
  return holder.scrollWidth - holder.clientWidth;
}"""


#: a table scrolled sideways to its last column, and back
SCROLL_RIGHT = SIDEWAYS.replace("return holder.scrollWidth - holder.clientWidth;",
                                "holder.scrollLeft = holder.scrollWidth;")
SCROLL_LEFT = SIDEWAYS.replace("return holder.scrollWidth - holder.clientWidth;",
                               "holder.scrollLeft = 0;")


def check_table(page: Page, area: Locator, selector: str, names: list[str], shot: str) -> int:
    """Every cell and header title of the table whole; the ``names`` among its name cells,
    each whole and none broken inside a piece; its badges whole; its text readable. Returns
    how many pixels the table scrolls sideways."""
    table = area.locator(selector).first
    expect(table.locator(".tabulator-row").first).to_be_visible(timeout=WAIT)
    table.locator(".tabulator-header").scroll_into_view_if_needed()
    page.wait_for_timeout(300)  # the column layout settles after a scroll
    if names:  # the table's top and the row of the longest name, to look at
        page.screenshot(path=str(SHOTS / f"{shot}.png"))
        cell = table.locator(".tabulator-cell[tabulator-field=name]", has_text=names[0]).first
        cell.scroll_into_view_if_needed()
        page.screenshot(path=str(SHOTS / f"{shot}-longest.png"))
    cells = table.evaluate(CELLS)
    cut = [c["text"] for c in cells if not c["fits"] and c["field"] not in (None, "_index")]
    assert not cut, f"{shot}: cut: {cut[:5]}"
    titles = [c["text"] for c in cells if c["header"]]
    assert titles, f"{shot}: no header titles"
    if names:
        shown = {c["text"] for c in cells if c["field"] == "name" and not c["header"]}
        missing = [n for n in names if n not in shown]
        assert not missing, f"{shot}: longest names not shown whole: {missing}"
        broken = table.evaluate(BROKEN_PIECES)
        assert not broken, f"{shot}: names broken mid-word: {broken[:5]}"
    badges = table.evaluate(BADGES)
    assert all(b["whole"] for b in badges), f"{shot}: badges cut: {badges}"
    readable(page, table, ".tabulator-row .tabulator-cell", shot)
    readable(page, table, ".tabulator-col-title", shot)
    return table.evaluate(SIDEWAYS)


def readable(page: Page, root: Locator, selector: str, shot: str, background=True) -> None:
    """The first ``selector`` under ``root`` (``root`` itself for ``""``): its text stands
    out from what is behind it (WCAG AA: 4.5:1); ``background``: that is dark in the dark
    theme and light in the light one."""
    el = root.element_handle()
    if selector:
        el = page.evaluate_handle(FIND, [el, selector])
    seen = page.evaluate(CONTRAST, el)
    dark = page.locator("body[data-jp-theme-light=false]").count() == 1
    assert seen["contrast"] >= 4.5, f"{shot} {selector}: unreadable {seen}"
    if background:
        assert (seen["bg"] < 0.1) if dark else (seen["bg"] > 0.6), f"{shot} {selector}: {seen}"


@pytest.fixture(scope="module")
def notebook(browser: Browser, lab, trees):
    """The notebook opened in a 1280 px window (the file browser open) in JupyterLab's dark
    theme (the user's setting, read as the page loads) and run from the Run menu; the light
    theme comes after it from the Settings menu (one run of the notebook for both)."""
    set_theme(lab, "dark")
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
    try:
        watch = run_all(page, lab, NOTEBOOK)
        expect(page.locator(".jp-DirListing")).to_be_visible()  # the file browser is open
        width = output(page, trees[0].cells["variables"]).first.bounding_box()["width"]
        assert 750 <= width <= 950, f"cell output {width} px wide, not a notebook's"
        yield page
        watch.assert_clean()
    finally:
        lab.end_sessions()
        page.close()


def check_theme(page: Page, trees: list[Tree], theme: str) -> None:
    expect(page.locator(f"body[data-jp-theme-light={str(theme == 'light').lower()}]")
           ).to_have_count(1)  # fmt: skip
    page.screenshot(path=str(SHOTS / f"jupyterlab-everyday-{theme}.png"))
    for tree in trees:
        tag = f"jupyterlab-{tree.rel}-{theme}"
        check_table(page, output(page, tree.cells["serials"]), ".ckptview-serials", [],
                    f"{tag}-serials")  # fmt: skip
        sideways = check_table(page, output(page, tree.cells["variables"]),
                               ".ckptview-variables", [tree.longest],
                               f"{tag}-variables")  # fmt: skip
        assert sideways <= 1, f"{tag}: the variables table scrolls sideways by {sideways}"
        # the diff's ten columns and a whole name piece need more than a notebook's width: it
        # scrolls sideways (its last columns are checked whole all the same)
        check_table(page, output(page, tree.cells["compare"]), ".ckptview-diff",
                    [tree.widest], f"{tag}-compare")  # fmt: skip
        compare = output(page, tree.cells["compare"])
        diff = compare.locator(".ckptview-diff").first
        diff.evaluate(SCROLL_RIGHT)
        page.screenshot(path=str(SHOTS / f"{tag}-compare-right.png"))
        diff.evaluate(SCROLL_LEFT)
        readable(page, compare.locator(".ckptview-compare-button").first, "button",
                 f"{tag}-compare-button", background=False)  # fmt: skip
        restore = output(page, tree.cells["restore"])
        box = restore.locator(".cv-notice-info").first
        expect(box).to_be_visible(timeout=WAIT)
        box.scroll_into_view_if_needed()
        page.screenshot(path=str(SHOTS / f"{tag}-restore.png"))
        readable(page, box, "", f"{tag}-restore")
        readable(page, restore.locator(".ckptview-restore-plan").first, "button",
                 f"{tag}-plan-button", background=False)  # fmt: skip


def test_dark_theme_names_headers_badges_whole_and_readable(notebook: Page, trees):
    check_theme(notebook, trees, "dark")


def test_light_theme_names_headers_badges_whole_and_readable(notebook: Page, trees):
    """Settings > Theme > JupyterLab Light, as a user switches: the widgets follow."""
    notebook.get_by_role("menuitem", name="Settings", exact=True).click()
    label = notebook.locator(".lm-Menu-itemLabel")
    notebook.locator(".lm-Menu-item").filter(has=label.get_by_text("Theme", exact=True)).hover()
    label.get_by_text(THEMES["light"], exact=True).click()
    expect(notebook.locator("body[data-jp-theme-light=true]")).to_have_count(1, timeout=WAIT)
    notebook.wait_for_timeout(1000)  # the widgets take the new theme's colours
    check_theme(notebook, trees, "light")
