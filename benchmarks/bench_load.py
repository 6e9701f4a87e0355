"""Load on the served dashboard beside its peer (one Panel Tabulator of the same serials):
server CPU per page, first rows alone and under concurrent sessions, and the server's memory
across waves of sessions.

    .venv/bin/python benchmarks/bench_load.py [--gets 20] [--sessions 20] [--waves 3]

The demo tree (``ckptview demo``) is served by ``python -m ckptview.widgets APP --warm`` (what
``ckptview serve`` runs), once with the dashboard (``app/ckptview_app.py``) and once with the
peer (``benchmarks/peer_table_app.py``). Measured for each, in one run:

* ``--pages`` page loads one after another (a fresh browser context each, so nothing cached):
  the server process's CPU seconds per page (everything it does for one visitor: the page,
  its resources, the WebSocket session), Chromium's (all its processes: what the page costs
  the machine when the browser shares its cores) and the time from navigation to the first
  serial row;
  then, once those sessions were discarded, ``--visits`` visits of the protocol client (below)
  one after another: the server's CPU seconds per page without the page's resources and
  without discarding its session (steadier: no browser on the same cores);
* ``--gets`` page GETs at once (threads): latency p50 / p95;
* ``--sessions`` visitors at once, ``--waves`` times, each asking the server exactly what a
  browser asks (the page, then over its WebSocket the document, then ``document_ready``) but
  drawing nothing: the time until the document holding the first rows has arrived and until
  the server acknowledged ``document_ready`` (neither app draws anything then), p50 / p95
  (20 people open the page from their own machines; the server's cores serve them alone);
* ``--sessions`` Chromium pages opened at once, ``--waves`` times: time from navigation to the
  first serial row, p50 / p95 (Chromium renders on the same 2 cores as the server);
* the dashboard's RSS before any session, after each wave (all closed) once Bokeh discarded
  the sessions: growth per discarded session.

Both servers run all along; the waves take turns between them (the dashboard's, then the
peer's, ``--waves`` times), so a drift of the machine's speed hits both alike. The p95 of
all waves pooled is, with 20 visitors, about the slowest wave's (a wave's visitors all wait for
the whole wave: the server builds every page before it sends any document), so a neighbour's
burst during one wave sets it; the ratio of each wave's p95 to that of the peer's wave that
followed it is printed too, with their median.

Prints a Markdown table (RESULTS.md § load).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from bokeh_client import READY, message, open_document, send  # noqa: E402
from conftest import CHROMIUM, CHROMIUM_ARGS  # noqa: E402
from test_browser_app import APP, Server  # noqa: E402

from ckptview.demo import write_demo  # noqa: E402

PEER = ROOT / "benchmarks" / "peer_table_app.py"
ROWS = ".ckptview-serials .tabulator-row"
#: Bokeh discards a session unused this long (ms; its default), checked this often. Not shorter:
#: under load a page's WebSocket may come more than a few seconds after its GET, and a session
#: discarded meanwhile is built a second time (a 2 s lifetime doubled the server's work here)
LIFETIME = ["--unused-session-lifetime", "15000", "--check-unused-sessions", "1000"]
DISCARDED = 17  # seconds after the last page closed: every session discarded


def rss_mib(pid: int) -> float:
    proc = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)]) / 2**20


def cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def browser_cpu_s() -> float:
    """CPU seconds of the Chromium processes this benchmark started (its descendants)."""
    total = 0.0
    for proc in psutil.Process().children(recursive=True):
        try:
            if "chrom" in proc.name():
                t = proc.cpu_times()
                total += t.user + t.system
        except psutil.Error:  # a renderer that ended meanwhile: its time is not counted
            continue
    return total


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def gets(url: str, n: int) -> list[float]:
    def one(_: int) -> float:
        t = time.perf_counter()
        with urllib.request.urlopen(url, timeout=600) as r:
            r.read()
        return time.perf_counter() - t

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


async def visit(url: str) -> tuple[float, float]:
    """What a browser asks of the server for one page, drawing nothing: seconds until the
    document (with the first rows) has arrived, and until the server acknowledged
    ``document_ready`` (neither app sends anything then: the dashboard's tree picker waits for
    its button, what is below the serials for a scroll)."""
    t = time.perf_counter()
    ws = await open_document(url)
    try:
        document = time.perf_counter() - t
        await send(ws, "PATCH-DOC", READY)
        while True:
            header, _ = await message(ws)
            if header["msgtype"] == "OK":
                break
        return document, time.perf_counter() - t
    finally:
        ws.close()


async def first_row(browser, url: str, chromium: list[float] | None = None) -> float:
    """Seconds from navigation to the first serial row, in a fresh context; with ``chromium``,
    Chromium's CPU seconds for the page (navigation to its late parts, measured before the
    context closes: a renderer's time is lost with its process) are appended to it."""
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        page = await context.new_page()
        b0 = browser_cpu_s()
        t = time.perf_counter()
        await page.goto(url, wait_until="commit", timeout=600_000)
        await page.wait_for_selector(ROWS, timeout=600_000)
        seconds = time.perf_counter() - t
        await page.wait_for_load_state("load", timeout=600_000)
        await page.wait_for_timeout(1500)  # what the page does after its rows (late parts)
        if chromium is not None:
            chromium.append(browser_cpu_s() - b0)
        return seconds
    finally:
        await context.close()


async def alone(server: Server, args, browser) -> dict:
    """Pages one after another, protocol-client visits, then GETs at once, on ``server``."""
    pid = server.proc.pid
    out: dict = {}
    await first_row(browser, server.url)  # the first visitor: resources compressed, caches
    out["rss"] = [rss_mib(pid)]
    c0, chromium = cpu_s(pid), []
    out["alone"] = [await first_row(browser, server.url, chromium) for _ in range(args.pages)]
    out["cpu"] = (cpu_s(pid) - c0) / args.pages
    out["browser"] = statistics.mean(chromium)
    await asyncio.sleep(DISCARDED)  # the pages' sessions discarded (not counted below)
    c0 = cpu_s(pid)
    for _ in range(args.visits):
        await visit(server.url)
    out["cpu_client"] = (cpu_s(pid) - c0) / args.visits
    await asyncio.sleep(4)
    out["gets"] = await asyncio.to_thread(gets, server.url, args.gets)
    await asyncio.sleep(DISCARDED)  # the GETs' sessions discarded
    return out


async def measure(apps: dict[str, Path], tree: Path, args, browser) -> dict[str, dict]:
    """Every measure of each app; the waves of visitors and of Chromium sessions take turns
    between the apps (one app's wave, then the other's), so the machine's drift hits both."""
    servers = {name: Server([str(tree)], extra=LIFETIME, app_args=["--poll", "0"],
                            timeout=600, app=app) for name, app in apps.items()}  # fmt: skip
    try:
        out = {name: await alone(server, args, browser) for name, server in servers.items()}
        for r in out.values():
            r["visit_waves"], r["session_waves"] = [], []
        for _ in range(args.waves):
            for name, server in servers.items():
                wave = await asyncio.gather(*(visit(server.url) for _ in range(args.sessions)))
                out[name]["visit_waves"].append(wave)
                await asyncio.sleep(DISCARDED)
        for name, server in servers.items():
            out[name]["rss"].append(rss_mib(server.proc.pid))
        for _ in range(args.waves):
            for name, server in servers.items():
                pages = await asyncio.gather(*(first_row(browser, server.url)
                                               for _ in range(args.sessions)))  # fmt: skip
                out[name]["session_waves"].append(pages)
                await asyncio.sleep(DISCARDED)  # closed sessions discarded (LIFETIME)
                out[name]["rss"].append(rss_mib(server.proc.pid))
    finally:
        for server in servers.values():
            server.stop()
    for r in out.values():  # every wave's, pooled
        r["visits"] = [v for wave in r["visit_waves"] for v in wave]
        r["sessions"] = [s for wave in r["session_waves"] for s in wave]
    return out


def visits_row(name: str, r: dict) -> list[str]:
    document = [v[0] for v in r["visits"]]
    whole = [v[1] for v in r["visits"]]
    return [name, f"{statistics.median(document):.2f} / {pct(document, .95):.2f}",
            f"{statistics.median(whole):.2f} / {pct(whole, .95):.2f}", str(len(document))]


def row(name: str, r: dict, args) -> list[str]:
    g, s, a = r["gets"], r["sessions"], r["alone"]
    waves = r["rss"][2:]  # after each wave (the first: sessions' one-time costs)
    per = ((waves[-1] - waves[0]) / ((len(waves) - 1) * args.sessions) * 1024
           if len(waves) > 1 else float("nan"))  # fmt: skip
    return [name, f"{r['cpu']:.2f}", f"{r['cpu_client']:.3f}", f"{r['browser']:.2f}",
            f"{statistics.median(a):.2f}",
            f"{statistics.median(g):.2f} / {pct(g, .95):.2f}",
            f"{statistics.median(s):.2f} / {pct(s, .95):.2f} ({len(s)})",
            " → ".join(f"{m:.0f}" for m in r["rss"]), f"{per:.0f}"]  # fmt: skip


async def run(args) -> None:
    from playwright.async_api import async_playwright

    tree = Path(tempfile.mkdtemp(prefix="ckptview-load-")) / "demo"
    write_demo(tree)
    results = {}
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            results = await measure({"ckptview": APP, "one Tabulator (peer)": PEER}, tree, args,
                                    browser)  # fmt: skip
        finally:
            await browser.close()
    print(f"\n{args.pages} pages one after another (and {args.visits} protocol-client visits); "
          f"{args.gets} GETs at once; "
          f"{args.waves} waves of {args.sessions} browser sessions at once\n")
    print("| app | server CPU per page, Chromium (s) | server CPU per page, protocol client (s) "
          "| Chromium's CPU per page (s) | first row, alone, median (s) "
          f"| {args.gets} GETs at once: p50 / p95 (s) "
          f"| {args.sessions} sessions at once, first row: p50 / p95 (s) (loads) "
          "| server RSS: start → before the waves → after each (MiB) "
          "| growth per discarded session, waves 2..n (KiB) |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|")
    for name, r in results.items():
        print("| " + " | ".join(row(name, r, args)) + " |")
    print(f"\n{args.waves} waves of {args.sessions} visitors at once asking what a browser asks "
          "(page, document, document_ready), drawing nothing\n")
    print("| app | document with the first rows: p50 / p95 (s) "
          "| document_ready acknowledged: p50 / p95 (s) | loads |")
    print("|---|---:|---:|---:|")
    for name, r in results.items():
        print("| " + " | ".join(visits_row(name, r)) + " |")
    ours, peer = results["ckptview"], results["one Tabulator (peer)"]
    whole = [(r["cpu"] + r["browser"]) for r in (ours, peer)]
    print(f"\nratios to the peer: CPU per page {ours['cpu'] / peer['cpu']:.2f}× (protocol client "
          f"{ours['cpu_client'] / peer['cpu_client']:.2f}×), server and Chromium per page "
          f"{whole[0] / whole[1]:.2f}×, first row alone "
          f"{statistics.median(ours['alone']) / statistics.median(peer['alone']):.2f}×, "
          f"p95 under {args.sessions} sessions "
          f"{pct(ours['sessions'], .95) / pct(peer['sessions'], .95):.2f}×, p95 of the document "
          f"under {args.sessions} visitors "
          f"{pct([v[0] for v in ours['visits']], .95) / pct([v[0] for v in peer['visits']], .95):.2f}×")
    def documents(r: dict) -> list[list[float]]:
        return [[v[0] for v in wave] for wave in r["visit_waves"]]

    for what, a_waves, b_waves in (("document", documents(ours), documents(peer)),
                                   ("first row", ours["session_waves"], peer["session_waves"])):
        pairs = [pct(a, .95) / pct(b, .95) for a, b in zip(a_waves, b_waves)]
        print(f"wave by wave (each of ours beside the peer's that followed it), p95 of the {what}: "
              + ", ".join(f"{r:.2f}×" for r in pairs)
              + f"; median {statistics.median(pairs):.2f}×")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pages", type=int, default=5)
    p.add_argument("--visits", type=int, default=20, help="protocol-client pages for CPU")
    p.add_argument("--gets", type=int, default=20)
    p.add_argument("--sessions", type=int, default=20)
    p.add_argument("--waves", type=int, default=3)
    asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    main()
