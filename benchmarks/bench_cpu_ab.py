"""Server CPU per page of two source trees of ckptview and the one-Tabulator peer, with the
protocol client (what a browser asks: the page, its document, ``document_ready``; no static
resources), visits interleaved one to each server in turn so the machine's drift hits all
three alike.

    git archive OLD | tar -x -C /tmp/before; git archive NEW | tar -x -C /tmp/after
    .venv/bin/python benchmarks/bench_cpu_ab.py /tmp/before /tmp/after [--visits 60] [--chromium]

``--chromium``: each visit is a page opened in Debian's Chromium instead (a fresh context, until
the first serial row, then its load and 1.5 s, as ``bench_load.py``), and Chromium's CPU per
page (all its processes) is reported beside the server's: what a page costs a 2-core machine
when the browsers share it (the 20-session p95 of ``bench_load.py``).

Each tree is served by its own ``python -m ckptview.widgets app/ckptview_app.py --warm`` (the
peer, ``benchmarks/peer_table_app.py``, from the second tree); the CPU of each server process
is summed over its visits' windows (psutil, 10 ms ticks: compare means; the medians are
printed too, less moved by a neighbour's burst on a shared machine). Sessions are
discarded every 20 rounds outside the windows.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from bench_load import DISCARDED, LIFETIME, cpu_s, first_row, visit  # noqa: E402
from conftest import CHROMIUM, CHROMIUM_ARGS, free_port  # noqa: E402

from ckptview.demo import write_demo  # noqa: E402


def start(root: Path, app: Path, tree: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "ckptview.widgets", str(app), "--port", str(port),
           "--address", "127.0.0.1", "--allow-websocket-origin", f"127.0.0.1:{port}", "--warm",
           *LIFETIME, "--args", tree, "--poll", "0"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).close()
            return proc, f"http://127.0.0.1:{port}/{app.stem}"
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


async def run(args) -> None:
    tree = str(Path(tempfile.mkdtemp(prefix="ckptview-ab-")) / "demo")
    write_demo(tree)
    before, after = Path(args.before).resolve(), Path(args.after).resolve()
    servers = {
        "before": start(before, before / "app" / "ckptview_app.py", tree),
        "after": start(after, after / "app" / "ckptview_app.py", tree),
        "peer": start(after, after / "benchmarks" / "peer_table_app.py", tree),
    }
    pw = browser = None
    if args.chromium:
        from playwright.async_api import async_playwright

        pw = await async_playwright().start()
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)

    async def page(url: str, chromium: list[float] | None = None) -> None:
        await (first_row(browser, url, chromium) if browser else visit(url))

    try:
        for _, url in servers.values():
            for _ in range(3):  # first pages: resources, caches
                await page(url)
        await asyncio.sleep(DISCARDED)
        used: dict[str, list[float]] = {name: [] for name in servers}
        chromium: dict[str, list[float]] = {name: [] for name in servers}
        for i in range(args.visits):
            for name, (proc, url) in servers.items():
                c0 = cpu_s(proc.pid)
                await page(url, chromium[name])
                used[name].append(cpu_s(proc.pid) - c0)
            if i % 20 == 19:
                await asyncio.sleep(DISCARDED)
    finally:
        if browser:
            await browser.close()
            await pw.stop()
        for proc, _ in servers.values():
            proc.terminate()
        for proc, _ in servers.values():
            proc.wait()
    mean = {name: statistics.mean(v) for name, v in used.items()}
    median = {name: statistics.median(v) for name, v in used.items()}
    for name, v in used.items():
        print(f"{name}: {mean[name] * 1000:.1f} ms per page (mean of {len(v)} visits; median "
              f"{median[name] * 1000:.1f} ms)")
    print(f"medians: after/before {median['after'] / median['before']:.3f}; before "
          f"{median['before'] / median['peer']:.2f}x the peer, after "
          f"{median['after'] / median['peer']:.2f}x")
    print(f"after/before {mean['after'] / mean['before']:.3f}; before {mean['before'] / mean['peer']:.2f}x "
          f"the peer, after {mean['after'] / mean['peer']:.2f}x")  # fmt: skip
    if args.chromium:
        whole = {name: mean[name] + statistics.mean(chromium[name]) for name in servers}
        for name in servers:
            print(f"{name}: Chromium {statistics.mean(chromium[name]) * 1000:.0f} ms per page, "
                  f"server and Chromium {whole[name] * 1000:.0f} ms")
        print(f"server and Chromium: after/before {whole['after'] / whole['before']:.3f}; before "
              f"{whole['before'] / whole['peer']:.2f}x the peer, after "
              f"{whole['after'] / whole['peer']:.2f}x")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--visits", type=int, default=60)
    p.add_argument("--chromium", action="store_true", help="pages in Chromium, its CPU too")
    asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    main()
