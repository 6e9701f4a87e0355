"""The served dashboard in Chromium: first paint, a page change, one serial's variables.

    .venv/bin/python benchmarks/bench_dashboard.py [--runs 3] [--scale-serials 1000]

Two trees: the demo tree (``ckptview.demo``, 45 serials so the serials table has pages) and
the scale tree of ``tests/test_browser_scale.py`` (1,000 serials x 1,000 variables). Each is
served by ``panel serve app/ckptview_app.py --warm`` (catalogued at startup); each figure is
the median of ``--runs`` page loads, each in a fresh browser context. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from playwright.sync_api import sync_playwright  # noqa: E402
from test_browser_app import CHROMIUM, CHROMIUM_ARGS, Server  # noqa: E402
from test_browser_scale import VARIABLES, measure, write_scale_tree  # noqa: E402

import ckptview as cv  # noqa: E402
from ckptview.demo import write_demo  # noqa: E402


def bench(name: str, root: Path, runs: int, browser) -> dict:
    cat = cv.open(root)
    n_serials, n_rows = len(cat.serials), len(cat.variables)
    t0 = time.perf_counter()
    server = Server([str(root)], extra=["--warm"], timeout=600)
    ready = time.perf_counter() - t0
    try:
        results = []
        for _ in range(runs):
            context = browser.new_context(viewport={"width": 1500, "height": 1100})
            try:
                results.append(measure(context.new_page(), server.url))
            finally:
                context.close()
    finally:
        server.stop()

    def med(key: str) -> float:
        return statistics.median(r[key] for r in results)

    return {"tree": name, "serials": n_serials, "rows": n_rows, "ready": ready,
            "paint": med("first_paint_s"), "page": med("page_change_s"),
            "variables": med("variables_s")}  # fmt: skip


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--scale-serials", type=int, default=1000)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ckptview-bench-") as tmp:
        demo = write_demo(Path(tmp) / "demo", serials=45).root
        scale = write_scale_tree(Path(tmp) / "scale", serials=args.scale_serials)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                rows = [bench("demo", demo, args.runs, browser),
                        bench(f"scale ({VARIABLES:,} variables/serial)", scale, args.runs,
                              browser)]  # fmt: skip
            finally:
                browser.close()
    print(f"\nmedian of {args.runs} page loads (Chromium headless; server started with --warm)\n")
    print("| tree | serials | variable rows | server ready (s) | first paint (s) "
          "| page change (s) | one serial's variables (s) |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['tree']} | {r['serials']:,} | {r['rows']:,} | {r['ready']:.1f} "
              f"| {r['paint']:.2f} | {r['page']:.2f} | {r['variables']:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
