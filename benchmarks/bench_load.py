"""Load on the served dashboard: concurrent page GETs, concurrent browser sessions, and the
server's memory across waves of sessions.

    .venv/bin/python benchmarks/bench_load.py [--gets 200] [--sessions 20] [--waves 5]

The demo tree (``ckptview demo``) is served by ``panel serve app/ckptview_app.py --warm`` as
``ckptview serve`` does. Measured in one run:

* ``--gets`` page GETs at once (threads): latency p50 / p95 / max;
* ``--sessions`` Chromium pages opened at once (one browser, a context each): time until the
  serials table shows its rows, p50 / p95 / max;
* the server's RSS before any session, after each wave of ``--sessions`` sessions (all
  closed), and once Bokeh has discarded the closed sessions: growth per discarded session.

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

from conftest import CHROMIUM, CHROMIUM_ARGS  # noqa: E402
from test_browser_app import Server  # noqa: E402

from ckptview.demo import write_demo  # noqa: E402

ROWS = ".ckptview-serials .tabulator-row"
#: Bokeh discards a closed session after it has been unused this long (ms), checked this often
LIFETIME = ["--unused-session-lifetime", "2000", "--check-unused-sessions", "1000"]


def rss_mib(pid: int) -> float:
    proc = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)]) / 2**20


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


async def sessions(url: str, n: int, browser) -> list[float]:
    async def one() -> float:
        context = await browser.new_context(viewport={"width": 1280, "height": 800})
        try:
            page = await context.new_page()
            t = time.perf_counter()
            await page.goto(url, timeout=600_000)
            await page.wait_for_selector(ROWS, timeout=600_000)
            return time.perf_counter() - t
        finally:
            await context.close()

    return list(await asyncio.gather(*(one() for _ in range(n))))


async def run(args) -> list[tuple[str, str]]:
    from playwright.async_api import async_playwright

    tree = Path(tempfile.mkdtemp(prefix="ckptview-load-")) / "demo"
    write_demo(tree)
    server = Server([str(tree)], extra=["--warm", *LIFETIME], timeout=600)
    pid = server.proc.pid
    out: list[tuple[str, str]] = []
    try:
        base = rss_mib(pid)
        out.append(("server RSS at start", f"{base:.0f} MiB"))
        lat = gets(server.url, args.gets)
        out.append((f"{args.gets} concurrent GETs: p50 / p95 / max",
                    f"{statistics.median(lat):.2f} / {pct(lat, .95):.2f} / {max(lat):.2f} s"))  # fmt: skip
        await asyncio.sleep(4)  # let the GETs' sessions be discarded
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            loads: list[float] = []
            after = []
            for _ in range(args.waves):
                loads += await sessions(server.url, args.sessions, browser)
                await asyncio.sleep(4)  # closed sessions discarded (LIFETIME)
                after.append(rss_mib(pid))
            await browser.close()
        out.append((f"{args.sessions} concurrent sessions, first rows: p50 / p95 / max",
                    f"{statistics.median(loads):.2f} / {pct(loads, .95):.2f} / "
                    f"{max(loads):.2f} s ({len(loads)} loads)"))  # fmt: skip
        out.append(("server RSS after each wave (sessions closed)",
                    " → ".join(f"{m:.0f}" for m in after) + " MiB"))  # fmt: skip
        per = (after[-1] - after[0]) / max(1, (args.waves - 1) * args.sessions)
        out.append(("growth per discarded session (waves 2..n)", f"{per * 1024:.0f} KiB"))
    finally:
        server.stop()
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gets", type=int, default=200)
    p.add_argument("--sessions", type=int, default=20)
    p.add_argument("--waves", type=int, default=5)
    args = p.parse_args(argv)
    rows = asyncio.run(run(args))
    print("| measure | value |\n|---|---|")
    for k, v in rows:
        print(f"| {k} | {v} |")


if __name__ == "__main__":
    main()
