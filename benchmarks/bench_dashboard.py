"""The served dashboard in Chromium: first paint, a page change, one serial's variables;
and in process, what one session costs the server beside a one-table Panel app.

    .venv/bin/python benchmarks/bench_dashboard.py [--runs 3] [--scale-serials 1000] [--no-browser]

Two trees: the demo tree (``ckptview.demo``, 45 serials so the serials table has pages) and
the scale tree of ``tests/test_browser_scale.py`` (1,000 serials x 1,000 variables). Each is
served by ``panel serve app/ckptview_app.py --warm`` (catalogued at startup); each figure is
the median of ``--runs`` page loads, each in a fresh browser context. Prints a Markdown table.

In process (no browser), for each tree: the Bokeh models of one session and the server time to
build it (``build_app`` + ``server_doc`` under a fresh Document, as ``panel serve`` does for each
page GET; median of ``--runs``), beside the peer: the same serials DataFrame in one
``pn.widgets.Tabulator`` (remote pagination, 20 rows a page). And Compare of two serials
(``CompareView``: the diff and its table), on the scale tree's 1,000-variable serials.
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

from conftest import CHROMIUM, CHROMIUM_ARGS  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402
from test_browser_app import Server  # noqa: E402
from test_browser_scale import VARIABLES, measure, write_scale_tree  # noqa: E402

import ckptview as cv  # noqa: E402
from ckptview.demo import write_demo  # noqa: E402


def first_paint_traffic(page, url: str) -> dict:
    """WebSocket messages (both ways) and bytes over the wire until the first serial row shows."""
    frames = {"sent": 0, "received": 0}
    responses = []

    def on_socket(ws) -> None:
        ws.on("framesent", lambda _: frames.__setitem__("sent", frames["sent"] + 1))
        ws.on("framereceived", lambda _: frames.__setitem__("received", frames["received"] + 1))

    page.on("websocket", on_socket)
    page.on("response", lambda r: responses.append(r))  # a Python function: playwright tags it
    page.goto(url, wait_until="commit")
    page.locator(".ckptview-serials .tabulator-row").first.wait_for(timeout=600_000)
    counts = dict(frames)
    wire = body = 0
    for r in responses:
        try:
            sizes = r.request.sizes()
            wire += sizes["responseBodySize"]
            body += len(r.body())
        except Exception:  # noqa: BLE001 - a response without a body (redirect, 304)
            pass
    return {"messages": counts["sent"] + counts["received"], "wire_mb": wire / 1e6,
            "body_mb": body / 1e6}  # fmt: skip


def peer_paint(root: Path, runs: int, browser) -> float:
    """Median seconds to the first row of the one-Tabulator peer app, same tree and browser."""
    server = Server([str(root)], timeout=600,
                    app=ROOT / "benchmarks" / "peer_table_app.py")  # fmt: skip
    try:
        times = []
        for _ in range(runs + 1):  # the first: resources compressed once, not counted
            context = browser.new_context(viewport={"width": 1500, "height": 1100})
            try:
                page = context.new_page()
                t0 = time.perf_counter()
                page.goto(server.url, wait_until="commit")
                page.locator(".ckptview-serials .tabulator-row").first.wait_for(timeout=600_000)
                times.append(time.perf_counter() - t0)
            finally:
                context.close()
        return statistics.median(times[1:])
    finally:
        server.stop()


def bench(name: str, root: Path, runs: int, browser) -> dict:
    cat = cv.open(root)
    n_serials, n_rows = len(cat.serials), len(cat.variables)
    t0 = time.perf_counter()
    server = Server([str(root)], timeout=600)
    ready = time.perf_counter() - t0
    try:
        context = browser.new_context(viewport={"width": 1500, "height": 1100})
        try:
            traffic = first_paint_traffic(context.new_page(), server.url)
        finally:
            context.close()
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
            "paint": med("first_paint_s"), "peer": peer_paint(root, runs, browser),
            "page": med("page_change_s"),
            "variables": med("variables_s"), **traffic}  # fmt: skip


def session_cost(root: Path, runs: int) -> dict:
    """Models and server seconds of one session: ckptview's page and the one-table peer."""
    import panel as pn
    from bokeh.document import Document
    from panel.io.state import set_curdoc

    from ckptview.widgets._format import serials_frame
    from ckptview.widgets.shell.app import build_app, shared_catalog

    pn.extension("tabulator")
    frame = serials_frame(shared_catalog(str(root)))  # catalogued once, as --warm does

    def ckptview_page():
        return build_app([str(root)], poll_seconds=0)

    def one_table():
        return pn.Column(pn.widgets.Tabulator(frame, pagination="remote", page_size=20))

    out = {}
    for name, make in (("ckptview", ckptview_page), ("one Tabulator", one_table)):
        times, models = [], 0
        for _ in range(runs + 1):  # the first builds warm imports and caches: not counted
            doc = Document()
            t0 = time.perf_counter()
            with set_curdoc(doc):
                make().server_doc(doc)
            times.append(time.perf_counter() - t0)
            models = len(doc.models)
        out[name] = {"models": models, "seconds": statistics.median(times[1:]),
                     "best": min(times[1:])}  # fmt: skip
    return out


def compare_time(root: Path, runs: int) -> tuple[int, float]:
    """Seconds to compare two serials in the Compare tab (diff + table), median of runs."""
    from ckptview.widgets._base import Workspace
    from ckptview.widgets.pages.compare import CompareView

    cat = cv.open(root)
    view = CompareView(Workspace([cat]))
    serials = list(cat.serials.index)
    view.param.update(serial_a=int(serials[-2]), serial_b=int(serials[-1]))
    n = int((cat.variables["serial"] == serials[-1]).sum())
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        view.show(view.compute())
        times.append(time.perf_counter() - t0)
    assert view.diff is not None and len(view.diff) >= n
    return n, statistics.median(times)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--scale-serials", type=int, default=1000)
    p.add_argument("--no-browser", action="store_true", help="the in-process figures only")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ckptview-bench-") as tmp:
        demo = write_demo(Path(tmp) / "demo", serials=45).root
        scale = write_scale_tree(Path(tmp) / "scale", serials=args.scale_serials)
        costs = {"demo": session_cost(demo, args.runs), "scale": session_cost(scale, args.runs)}
        n_vars, compare_s = compare_time(scale, args.runs)
        print(f"\none session, in process ({args.runs} builds after a first)\n")
        print("| tree | app | Bokeh models | server time to build, best / median (s) |\n"
              "|---|---|---:|---:|")  # fmt: skip
        for tree, by_app in costs.items():
            for app, c in by_app.items():
                print(f"| {tree} | {app} | {c['models']} | {c['best']:.2f} / {c['seconds']:.2f} |")
        print(f"\nCompare of two {n_vars:,}-variable serials (scale tree): {compare_s:.2f} s")
        if args.no_browser:
            return
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                rows = [bench("demo", demo, args.runs, browser),
                        bench(f"scale ({VARIABLES:,} variables/serial)", scale, args.runs,
                              browser)]  # fmt: skip
            finally:
                browser.close()
    print(f"\nmedian of {args.runs} page loads (Chromium headless; server started with --warm)\n")
    print("| tree | serials | variable rows | server ready (s) | first row (s) "
          "| peer's first row (s) | ratio | page change (s) | one serial's variables (s) "
          "| messages before first row | MB over the wire (uncompressed) |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['tree']} | {r['serials']:,} | {r['rows']:,} | {r['ready']:.1f} "
              f"| {r['paint']:.2f} | {r['peer']:.2f} | {r['paint'] / r['peer']:.2f} "
              f"| {r['page']:.2f} | {r['variables']:.2f} | {r['messages']} "
              f"| {r['wire_mb']:.2f} ({r['body_mb']:.2f}) |")  # fmt: skip


if __name__ == "__main__":
    main()
