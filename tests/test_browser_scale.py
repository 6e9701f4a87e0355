"""The dashboard on a big tree, in Chromium: 1,000 serials x 1,000 variables (1,000,000 variable
rows), served by ``panel serve app/ckptview_app.py --warm`` (the catalog is built once, before
the first page). Both tables page server-side (``pagination="remote"``): the browser only ever
gets one page of rows. First paint, a page change and one serial's variables are timed, printed
and held to sane bounds for a shared 2-core box.
"""

from __future__ import annotations

import json
import os
import struct
import time
from pathlib import Path

import numpy as np
import pytest
from playwright.sync_api import Page, expect
from test_browser_app import WAIT, Server, shot

SERIALS = 1000
VARIABLES = 1000
SERIALS_PAGE = 20  # SerialsTable.page_size
VARIABLES_PAGE = 50  # VariablesTable's page size

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def write_scale_tree(root: Path, serials: int = SERIALS, variables: int = VARIABLES) -> Path:
    """``step_<s>.safetensors`` per serial (the tree of ``tests/test_scale.py``, written fast:
    one JSON header shared by every file). Variable ``i`` of serial ``s`` holds
    ``[s + i, 2 (s - 1)]``. Files are backdated a minute, as a run's files are."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    names = [f"layer{i // 10}.block{i % 10}.weight" for i in range(variables)]
    header = {n: {"dtype": "F32", "shape": [2], "data_offsets": [8 * i, 8 * i + 8]}
              for i, n in enumerate(names)}  # fmt: skip
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    head = struct.pack("<Q", len(text)) + text
    idx = np.arange(variables, dtype="<f4")
    when = time.time() - 60
    for s in range(1, serials + 1):
        data = np.stack([s + idx, np.full(variables, 2 * (s - 1), "<f4")], axis=1)
        path = root / f"step_{s}.safetensors"
        path.write_bytes(head + data.astype("<f4").tobytes())
        os.utime(path, (when, when))
    os.utime(root, (when, when))
    return root


def first_serial(page: Page) -> str:
    return page.locator(
        ".ckptview-serials .tabulator-row [tabulator-field=serial]"
    ).first.inner_text()


def measure(page: Page, url: str, serial_row: int = 4) -> dict:
    """Seconds: first paint of the serials table, a page change, one serial's variables."""
    rows = page.locator(".ckptview-serials .tabulator-row")
    t0 = time.perf_counter()
    page.goto(url, wait_until="commit")  # the rows, not the load event (late resources)
    expect(rows.first).to_be_visible(timeout=WAIT)
    paint = time.perf_counter() - t0
    first = first_serial(page)
    t0 = time.perf_counter()
    page.locator(".ckptview-serials .tabulator-page[data-page=next]").click()
    expect(rows.first.locator("[tabulator-field=serial]")).not_to_have_text(first, timeout=WAIT)
    turn = time.perf_counter() - t0
    serial = int(rows.nth(serial_row).locator("[tabulator-field=serial]").inner_text())
    t0 = time.perf_counter()
    rows.nth(serial_row).click()
    heading = page.locator(".ckptview-vars-heading")
    expect(heading).to_contain_text(f"Serial {serial} ·", timeout=WAIT)
    expect(page.locator(".ckptview-variables .tabulator-row").first).to_be_visible(timeout=WAIT)
    variables = time.perf_counter() - t0
    return {"first_paint_s": paint, "page_change_s": turn, "variables_s": variables,
            "serial": serial}  # fmt: skip


@pytest.fixture(scope="module")
def scale_tree(tmp_path_factory) -> Path:
    return write_scale_tree(tmp_path_factory.mktemp("scale") / "run")


@pytest.fixture(scope="module")
def scale_server(scale_tree):
    t0 = time.perf_counter()
    server = Server([str(scale_tree)], timeout=240)  # warm
    server.startup_s = time.perf_counter() - t0
    yield server
    server.stop()


def test_a_million_variable_rows_page_in_the_browser(page: Page, scale_server, scale_tree):
    page.set_viewport_size({"width": 1500, "height": 1100})
    r = measure(page, scale_server.url)
    rows = page.locator(".ckptview-serials .tabulator-row")
    expect(page.locator(".ckptview-summary")).to_contain_text(f"{SERIALS} serials")
    expect(rows).to_have_count(SERIALS_PAGE)  # one page in the browser, never the whole table
    expect(rows.first.locator("[tabulator-field=serial]")).to_have_text(str(SERIALS_PAGE + 1))
    heading = page.locator(".ckptview-vars-heading")
    expect(heading).to_contain_text(f"Serial {r['serial']} · {VARIABLES} variables")
    var_rows = page.locator(".ckptview-variables .tabulator-row")
    expect(var_rows).to_have_count(VARIABLES_PAGE)
    # a filter runs server-side over the serial's rows: "layer7." matches 10 of them
    name = page.locator(".ckptview-name-filter input")
    name.fill("layer7.")
    name.press("Enter")
    expect(heading).to_contain_text(f"Serial {r['serial']} · 10 variables", timeout=WAIT)
    expect(var_rows).to_have_count(10)
    shot(page, "scale", top=True)
    print(
        f"\nscale tree ({SERIALS} serials, {SERIALS * VARIABLES:,} variable rows): server ready "
        f"{scale_server.startup_s:.1f} s (catalogued at startup, --warm); first paint of the "
        f"serials table {r['first_paint_s']:.2f} s; page change {r['page_change_s']:.2f} s; "
        f"variables of serial {r['serial']} {r['variables_s']:.2f} s"
    )
    assert r["first_paint_s"] < 30
    assert r["page_change_s"] < 5
    assert r["variables_s"] < 10
