"""Names from checkpoint trees are text on the page, never markup (stored XSS).

Every name a tree can put on the dashboard carries a payload (``tests/hostile_names.py``):
the run label and serial paths, file names, tensor names, metric names, node names. The page
is served by plain ``panel serve`` (no Content-Security-Policy), so nothing but the escaping
stands between a payload and the browser: each test opens part of the page (tables, column
chooser, selects, Trajectory, Compare, Restore and Retention plans, detail panes, tooltips)
and checks that no payload ran (``window.__xss_*`` unset) and that the names are shown as the
literal text (``<img`` visible).
"""

from __future__ import annotations

import pytest
from conftest import corpus_path, open_picker, reveal
from hostile_names import (
    BROKEN_FILE,
    METRIC,
    METRIC_BREAKOUT,
    METRIC_CODE,
    NODE,
    ROOT_NAME,
    TENSOR,
    TENSOR_BREAKOUT,
    WEIGHTS_FILE,
    caffe2_tree,
    hf_tree,
    payload,
)
from playwright.sync_api import Page, expect
from test_browser_app import WAIT, Server, pick_run, shot, tab

import ckptview as cv

pytestmark = pytest.mark.browser



@pytest.fixture(scope="session")
def browser_context_args(browser_context_args):
    return {**browser_context_args, "viewport": {"width": 1500, "height": 1400}}


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    base = tmp_path_factory.mktemp("hostile")
    return {"hf": hf_tree(base), "caffe2": caffe2_tree(base, corpus_path("caffe2", "ckpt"))}


@pytest.fixture(scope="module")
def served(hostile):
    """Write access on: the Delete dialog is part of what must stay inert."""
    server = Server([str(hostile["hf"]), str(hostile["caffe2"])], allow_write=True,
                    hardened=False)  # fmt: skip
    yield server
    server.stop()


def ran(page: Page) -> list[str]:
    """The payloads that ran in this page (their ``window.__xss_<field>`` markers)."""
    return page.evaluate("Object.keys(window).filter((k) => k.startsWith('__xss'))")


def assert_inert(page: Page, where: str) -> None:
    page.wait_for_timeout(800)  # an <img onerror> fires once its load fails
    assert ran(page) == [], f"{where}: payloads ran: {ran(page)}"


def open_page(page: Page, server: Server) -> None:
    page.goto(server.url)
    expect(page.locator(".ckptview-serials .tabulator-row").first).to_be_visible(timeout=WAIT)


def open_choices(page: Page, css_class: str):
    """Open a MultiChoice's dropdown; its list of options."""
    page.locator(f".{css_class} .choices").first.click()
    options = page.locator(f".{css_class} .choices__list--dropdown")
    expect(options).to_be_visible(timeout=WAIT)
    return options


def test_browse_shows_names_as_text(page: Page, served, hostile):
    open_page(page, served)
    assert_inert(page, "page load")
    expect(page.locator(".ckptview-summary")).to_contain_text(str(hostile["hf"]))
    expect(page.locator(".ckptview-run-select")).to_contain_text(ROOT_NAME)
    open_picker(page)
    expect(page.locator(".ckptview-runs")).to_contain_text(ROOT_NAME)
    headers = page.locator(".ckptview-serials .tabulator-headers")
    expect(headers).to_contain_text(METRIC)
    expect(headers).to_contain_text(METRIC_BREAKOUT)
    page.locator(".ckptview-columns-toggle button").click()  # the chooser, in its place
    expect(page.locator(".ckptview-columns")).to_contain_text(METRIC)
    options = open_choices(page, "ckptview-columns")
    expect(options).to_contain_text(METRIC_CODE)  # not a default column: offered here
    assert_inert(page, "columns chooser")
    page.keyboard.press("Escape")
    reveal(page)  # the timeline and the variables: built once scrolled to
    timeline = page.locator(".ckptview-timeline-y select")
    expect(timeline.locator("option", has_text=METRIC)).to_have_count(1)
    timeline.select_option(label=METRIC)
    assert_inert(page, "timeline of a metric")
    variables = page.locator(".ckptview-variables")
    for name in (TENSOR, TENSOR_BREAKOUT, payload("file")):
        expect(variables).to_contain_text(name, timeout=WAIT)
    cell = variables.locator(".tabulator-row", has_text=TENSOR).first
    cell.locator("[tabulator-field=name]").hover()  # Tabulator's own tooltip ran this payload
    expect(page.locator(".tabulator-tooltip")).to_contain_text(TENSOR, timeout=WAIT)
    assert_inert(page, "cell tooltip")
    variables.locator(".tabulator-row", has_text=TENSOR).first.click()
    detail = page.locator(".ckptview-detail-info")
    expect(detail).to_contain_text(TENSOR, timeout=WAIT)
    expect(detail).to_contain_text(ROOT_NAME)
    variables.locator(".tabulator-row", has_text=payload("file")).first.click()
    expect(detail).to_contain_text(WEIGHTS_FILE, timeout=WAIT)
    assert_inert(page, "detail pane")
    shot(page, "hostile_names", top=True)


def test_errors_and_findings_show_file_names_as_text(page: Page, served, hostile):
    cat = cv.open(hostile["hf"])
    broken = int(cat.serials.index[~cat.serials["loadable"]][0])
    open_page(page, served)
    row = page.locator(".ckptview-serials .tabulator-row", has_text=str(broken)).first
    expect(row.locator("[tabulator-field=error]")).to_contain_text(BROKEN_FILE)
    row.click()
    expect(page.locator(".ckptview-vars-heading")).to_contain_text(f"Serial {broken}",
                                                                   timeout=WAIT)  # fmt: skip
    page.locator(".ckptview-verify button").click()
    expect(page.locator(".ckptview-findings")).to_contain_text(BROKEN_FILE, timeout=WAIT)
    assert_inert(page, "verify findings")


def test_node_names_are_text(page: Page, served, hostile):
    open_page(page, served)
    pick_run(page, hostile["caffe2"].name)
    expect(page.locator(".ckptview-serials")).to_contain_text(NODE, timeout=WAIT)
    expect(page.locator(".ckptview-totals-node")).to_contain_text(NODE, timeout=WAIT)
    options = open_choices(page, "ckptview-node-filter")
    expect(options).to_contain_text(NODE)
    assert_inert(page, "node filter")
    page.keyboard.press("Escape")
    page.locator(".ckptview-variables .tabulator-row", has_text=NODE).first.click()
    expect(page.locator(".ckptview-detail-info")).to_contain_text(NODE, timeout=WAIT)
    assert_inert(page, "node detail")


def test_trajectory_and_compare_show_names_as_text(page: Page, served):
    open_page(page, served)
    tab(page, "Trajectory")
    chooser = page.locator(".ckptview-trajectory-names")
    expect(chooser).to_contain_text(TENSOR, timeout=WAIT)  # the two biggest, chosen
    expect(chooser).to_contain_text(TENSOR_BREAKOUT)
    options = open_choices(page, "ckptview-trajectory-names")  # the others
    expect(options).to_contain_text(payload("file"))
    assert_inert(page, "trajectory chooser")
    page.keyboard.press("Escape")
    tab(page, "Compare")
    expect(page.locator(".ckptview-run-a select option", has_text=ROOT_NAME)).to_have_count(1)
    page.locator(".ckptview-compare-button button").click()
    diff = page.locator(".ckptview-diff")
    expect(diff).to_contain_text(TENSOR_BREAKOUT, timeout=WAIT)
    expect(page.locator(".ckptview-compare-heading")).to_contain_text(ROOT_NAME)
    diff.locator(".tabulator-row", has_text=TENSOR).first.click()
    expect(page.locator(".ckptview-diff-variable")).to_contain_text(TENSOR, timeout=WAIT)
    assert_inert(page, "compare")


def test_restore_and_retention_plans_show_names_as_text(page: Page, served, hostile):
    before = sorted(cv.open(hostile["hf"]).serials.index)
    open_page(page, served)
    tab(page, "Restore")
    expect(page.locator(".ckptview-restore-run select option", has_text=ROOT_NAME)
           ).to_have_count(1, timeout=WAIT)  # fmt: skip
    page.locator(".ckptview-restore-plan button").click()
    expect(page.locator(".ckptview-restore-ops")).to_contain_text(WEIGHTS_FILE, timeout=WAIT)
    page.locator(".ckptview-restore-mode button", has_text="copy").click()
    dest = page.locator(".ckptview-restore-dest input")
    dest.fill("/elsewhere/" + payload("dest"))
    dest.press("Enter")
    page.locator(".ckptview-restore-plan button").click()
    expect(page.locator(".ckptview-restore-message")).to_contain_text(payload("dest"),
                                                                      timeout=WAIT)  # fmt: skip
    assert_inert(page, "restore plan")
    tab(page, "Retention")
    metric = page.locator(".ckptview-best-metric select")
    expect(metric.locator("option", has_text=METRIC)).to_have_count(1, timeout=WAIT)
    field = page.locator(".ckptview-keep-last input")
    field.fill("1")
    field.press("Enter")
    page.locator(".ckptview-retention-plan button").click()
    page.locator(".ckptview-retention-delete button").click()
    expect(page.locator(".ckptview-confirm")).to_contain_text(ROOT_NAME, timeout=WAIT)
    assert_inert(page, "retention confirm")
    page.locator(".ckptview-retention-cancel button").click()
    assert sorted(cv.open(hostile["hf"]).serials.index) == before  # cancelled: nothing deleted


def test_picker_messages_show_the_url_as_text(page: Page, served):
    open_page(page, served)
    open_picker(page)
    url = page.locator(".ckptview-url input")
    url.fill("/elsewhere/" + payload("url"))
    url.press("Enter")
    page.locator(".ckptview-open button").click()
    expect(page.locator(".ckptview-picker-message")).to_contain_text(payload("url"),
                                                                     timeout=WAIT)  # fmt: skip
    assert_inert(page, "picker message")
