"""The dashboard's Health tab in Chromium: compute, the first divergence and rollback point,
the heatmap, and one click to the rollback point's restore plan."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect
from test_browser_app import WAIT, Server, shot, tab
from test_health import write_run

import ckptview as cv

pytestmark = pytest.mark.browser


def test_health_tab_finds_the_spike_and_plans_the_rollback(page: Page, tmp_path):
    root = tmp_path / "run"
    write_run(root, n=8, spike=6)
    want = cv.open(root, cache=False).health_summary().attrs
    assert (want["divergence"], want["rollback_point"]) == (600, 500)
    server = Server([str(root)])
    try:
        page.goto(server.url)
        tab(page, "Health")
        compute = page.locator(".ckptview-health-compute button")
        expect(compute).to_be_enabled(timeout=WAIT)
        compute.click(timeout=WAIT)  # a busy machine: the page may still be settling
        message = page.locator(".ckptview-health-message")
        expect(message).to_contain_text("First divergence at serial 600", timeout=WAIT)
        expect(message).to_contain_text("Rollback point: 500")
        expect(page.locator(".ckptview-health-heatmap canvas").first).to_be_visible(timeout=WAIT)
        restore = page.locator(".ckptview-health-restore button")
        expect(restore).to_have_text("Plan restore of serial 500")
        shot(page, "health")
        restore.click(timeout=WAIT)
        expect(page.get_by_role("tab", name="Restore")).to_have_attribute(
            "aria-selected", "true", timeout=WAIT
        )  # fmt: skip
        plan = page.locator(".ckptview-restore-message")
        expect(plan).to_contain_text("restore serial 500", timeout=WAIT)
    finally:
        server.stop()
