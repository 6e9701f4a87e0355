"""Measurement helpers: each contender runs in its own subprocess so peak RSS is its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


#: appended to scripts that define ``work()``: a first (cold) and a second (warm) run in process
TIMED_WORK = """
import json as _json, time as _time
_t0 = _time.perf_counter(); work(); _cold = _time.perf_counter() - _t0
_t0 = _time.perf_counter(); _out = work(); _warm = _time.perf_counter() - _t0
print(_json.dumps({"work_s": _warm, "cold_s": _cold, **_out}))
"""


def run_contender(script: str, *args: str, python: str = sys.executable, repeat: int = 3) -> dict:
    """Run ``python -c script args`` ``repeat`` times; best wall time and peak RSS (MiB).

    The script prints one JSON object (its own result, e.g. a checksum) on its last line; a
    script that defines ``work()`` instead gets :data:`TIMED_WORK` appended.
    """
    if "\ndef work()" in script:
        script += TIMED_WORK
    best = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [python, "-c", script, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - t0
        out = proc.stdout.read()
        err = proc.stderr.read()
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"contender failed:\n{err[-2000:]}")
        result = json.loads(out.strip().splitlines()[-1])
        work = float(result.pop("work_s", elapsed))
        cold = float(result.pop("cold_s", work))
        rec = {"seconds": work, "cold_seconds": cold, "process_seconds": elapsed,
               "peak_rss_mib": usage.ru_maxrss / 1024, "result": result}  # fmt: skip
        if best is None or work < best["seconds"]:
            best = rec
    return best


def table(rows: list[dict], baseline: str) -> str:
    """A Markdown table; ``ratio`` is each row's work time over the baseline row's.

    Work time is measured inside the contender after its imports (warm: a second run where
    the contender does one); first run and whole-process time (interpreter start and imports:
    pandas for ckptview, torch for torch) are shown beside it.
    """
    base = next(r for r in rows if r["name"] == baseline)["seconds"]
    lines = [
        f"| contender | work s | ratio vs {baseline} | first run s | process s | peak RSS MiB |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['seconds']:.4f} | {r['seconds'] / base:.2f} | "
            f"{r['cold_seconds']:.3f} | {r['process_seconds']:.2f} | {r['peak_rss_mib']:.0f} |"
        )
    return "\n".join(lines)
