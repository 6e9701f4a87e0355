"""The Runs page of an experiment (``ckptview serve DIR`` on a directory of runs) in Chromium:
the runs table equals ``exp.runs``, the plots draw one line per run, compare at a step shows a
table, a click on a run opens it in the Browse tab (and the Runs tab leads back), the page fits
1280 × 800 in either theme, and run names reach the page as text.

The experiment is ``ckptview demo --experiment``'s sweep plus a copy of the corpus's HF Trainer
tree (a run whose best serial the tree itself records). Expected values come from
``cv.open_experiment``, never from the page.
"""

from __future__ import annotations

import shutil

import pandas as pd
import pytest
from conftest import corpus_copy
from hostile_names import payload
from playwright.sync_api import Browser, Page, expect
from test_browser_app import WAIT, Server, expect_serials, shot
from test_browser_layout import OVERFLOW

import ckptview as cv
from ckptview.demo import write_sweep
from ckptview.widgets._format import fmt_number, human_bytes

pytestmark = pytest.mark.browser
WIDTH, HEIGHT = 1280, 800
STEP = 300  # compare at this step

#: the line renderers of one of the Runs page's plots (``kind``: size or metric)
LINES = """(kind) => {
  let n = 0;
  for (const doc of Bokeh.documents) for (const m of doc.all_models)
    if (m.name === `ckptview-${kind}-line`) n++;
  return n;
}"""


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """The demo sweep (4 runs) plus the corpus's HF Trainer tree as a fifth run."""
    root = tmp_path_factory.mktemp("experiment") / "sweep"
    write_sweep(root)
    corpus_copy("modern/hf", root / "hf_trainer")
    return root


@pytest.fixture(scope="module")
def served(sweep):
    server = Server([str(sweep)], app_args=["--poll", "0"])
    yield server
    server.stop()


@pytest.fixture(scope="module")
def exp(sweep):
    return cv.open_experiment(sweep)


def open_runs_page(page: Page, url: str) -> None:
    page.goto(url)
    expect(page.locator(".ckptview-runs-table .tabulator-row").first).to_be_visible(timeout=WAIT)
    expect(page.get_by_role("tab", name="Runs")).to_have_attribute("aria-selected", "true")
    expect(page.locator(".ckptview-runs-size canvas").first).to_be_visible(timeout=WAIT)


def cell(row, field: str):
    return row.locator(f".tabulator-cell[tabulator-field={field}]")


def row_of(page: Page, run: str):
    rows = page.locator(".ckptview-runs-table .tabulator-row")
    return rows.filter(has=page.locator(".tabulator-cell[tabulator-field=run]", has_text=run)).first


def test_the_runs_page_lists_every_run_as_exp_runs(page: Page, served, exp):
    open_runs_page(page, served.url)
    runs = exp.runs
    assert len(runs) == 5
    rows = page.locator(".ckptview-runs-table .tabulator-row")
    expect(rows).to_have_count(len(runs))
    for i, (run, r) in enumerate(runs.iterrows()):
        row = rows.nth(i)
        expect(cell(row, "run")).to_have_text(run)
        expect(cell(row, "latest")).to_have_text(str(r["latest"]))
        expect(cell(row, "best")).to_have_text("" if pd.isna(r["best"]) else str(r["best"]))
        expect(cell(row, "size")).to_have_text(human_bytes(int(r["nbytes"])))
        expect(cell(row, "serials")).to_have_text(str(r["n_serials"]))
        expect(cell(row, "step")).to_have_text(str(r["latest_step"]))
        expect(cell(row, "last_write")).to_have_text(r["last_write"].strftime("%Y-%m-%d %H:%M"))
    crashed = row_of(page, "paddle_fluid_crashed")
    expect(crashed.locator(".cv-badge.cv-incomplete")).to_have_count(1)  # its last save crashed
    expect(row_of(page, "lr_1e-3").locator(".cv-badge.cv-complete")).to_have_count(1)
    hf = runs.loc["hf_trainer"]
    expect(cell(row_of(page, "hf_trainer"), "metric")).to_have_text(
        f"{hf['metric_name']} {fmt_number(hf['best_metric'])}"
    )  # the tree's own record: metric_for_best_model and best_metric
    summary = page.locator(".ckptview-runs-summary")
    expect(summary).to_contain_text(f"{len(runs)} runs")
    expect(summary).to_contain_text(human_bytes(int(runs["nbytes"].sum())))


def test_the_plots_draw_one_line_per_run(page: Page, served, exp):
    open_runs_page(page, served.url)
    expect(page.locator(".ckptview-runs-size canvas").first).to_be_visible(timeout=WAIT)
    expect(page.locator(".ckptview-runs-metric canvas").first).to_be_visible(timeout=WAIT)
    assert page.evaluate(LINES, "size") == len(exp.runs)
    metrics = exp.metrics
    select = page.locator(".ckptview-runs-metric-select select")
    expect(select).to_have_value("loss")  # what most runs rank their best by
    with_loss = metrics.loc[metrics["name"] == "loss", "run"].nunique()
    assert page.evaluate(LINES, "metric") == with_loss >= 3
    select.select_option("eval_loss")
    with_eval = metrics.loc[metrics["name"] == "eval_loss", "run"].nunique()
    page.wait_for_function(f"() => ({LINES})('metric') === {with_eval}", timeout=WAIT)
    assert page.evaluate(LINES, "size") == len(exp.runs)  # the size plot stays


def test_compare_at_a_step_shows_a_table(page: Page, served, exp):
    open_runs_page(page, served.url)
    want = exp.compare(at=STEP)
    page.locator(".ckptview-runs-at button", has_text="step").click()
    step = page.locator(".ckptview-runs-step input")
    expect(step).to_be_enabled(timeout=WAIT)
    step.fill(str(STEP))
    step.press("Tab")
    page.locator(".ckptview-runs-compare-button button").click()
    table = page.locator(".ckptview-runs-compare")
    expect(table.locator(".tabulator-row").first).to_be_visible(timeout=WAIT)
    message = page.locator(".ckptview-runs-compare-message")
    expect(message).to_contain_text(f"at or before step {STEP}")
    for run, serial in want.attrs["serial"].items():
        expect(message).to_contain_text(f"{run}: serial {serial}")
    headers = table.locator(".tabulator-col-title")
    for run in want.index:
        expect(headers.filter(has_text=run)).to_have_count(1)
    row = table.locator(".tabulator-row").filter(has_text="model.fc1.weight").first
    col = list(want.index).index("lr_1e-3")
    expect(cell(row, f"run_{col}")).to_have_text(fmt_number(want.loc["lr_1e-3", "model.fc1.weight"]))


def test_a_click_on_a_run_opens_it_in_browse_and_the_runs_tab_leads_back(page: Page, served, exp):
    open_runs_page(page, served.url)
    cell(row_of(page, "lr_1e-3"), "run").click()
    browse = page.get_by_role("tab", name="Browse")
    expect(browse).to_have_attribute("aria-selected", "true", timeout=WAIT)
    expect_serials(page, exp["lr_1e-3"])
    expect(page.locator(".ckptview-summary")).to_contain_text(exp["lr_1e-3"].url)
    expect(page.locator(".ckptview-run-select input:checked")).to_have_count(1)
    page.get_by_role("tab", name="Runs").click()
    expect(page.locator(".ckptview-runs-table .tabulator-row").first).to_be_visible(timeout=WAIT)
    cell(row_of(page, "paddle_fluid_crashed"), "run").click()
    expect(browse).to_have_attribute("aria-selected", "true", timeout=WAIT)
    expect_serials(page, exp["paddle_fluid_crashed"])


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_the_runs_page_fits_1280_pixels(browser: Browser, served, theme: str):
    page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
    try:
        open_runs_page(page, served.url + ("?theme=dark" if theme == "dark" else ""))
        expect(page.locator(".ckptview-runs-metric canvas").first).to_be_visible(timeout=WAIT)
        page.wait_for_timeout(800)  # the table settles its column widths
        shot(page, "runs" if theme == "light" else "runs-dark")
        page.locator(".ckptview-runs-compare-button button").click()
        expect(page.locator(".ckptview-runs-compare .tabulator-row").first).to_be_visible(
            timeout=WAIT
        )
        page.wait_for_timeout(500)
        measured = page.evaluate(OVERFLOW)
        assert measured["scrollWidth"] <= measured["width"] == WIDTH
        assert measured["offenders"] == [], f"runs ({theme}): {measured['offenders'][:8]}"
    finally:
        page.close()


def test_run_names_reach_the_page_as_text(page: Page, tmp_path):
    root = tmp_path / "sweep"
    write_sweep(root)
    name = "lr" + payload("run")
    shutil.move(root / "lr_3e-4", root / name)
    server = Server([str(root)], app_args=["--poll", "0"])
    try:
        open_runs_page(page, server.url)
        expect(cell(row_of(page, name), "run")).to_have_text(name)
        page.locator(".ckptview-runs-compare-button button").click()
        headers = page.locator(".ckptview-runs-compare .tabulator-col-title")
        expect(headers.filter(has_text=name)).to_have_count(1, timeout=WAIT)
        expect(page.locator(".ckptview-runs-compare-message")).to_contain_text(name)
        cell(row_of(page, name), "run").click()
        expect(page.get_by_role("tab", name="Browse")).to_have_attribute(
            "aria-selected", "true", timeout=WAIT
        )
        expect(page.locator(".ckptview-run-select")).to_contain_text(name)
        assert page.evaluate("() => window.__xss_run") is None
        assert page.locator("img[src=x]").count() == 0
    finally:
        server.stop()
