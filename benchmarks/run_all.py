"""Run every benchmark and print one Markdown report (also written to benchmarks/RESULTS.md).

Peers run in the peer environment made by ``benchmarks/setup.sh`` (torch, safetensors, and
tensorflow-cpu when it installs there); the S3 and dashboard benchmarks run in the project's
venv (moto, s3fs, playwright + Debian chromium). All contenders of a table are measured in the
same run on the same machine; the tables give ratios, not absolute claims.

usage: python benchmarks/run_all.py [--skip diff,catalog,s3,dashboard]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PEER = HERE / ".venv" / "bin" / "python"
PROJECT = ROOT / ".venv" / "bin" / "python"

BENCHES = {  # name -> (interpreter, script, args)
    "diff": (PEER, "bench_diff.py", []),
    "catalog": (PEER, "bench_catalog.py", []),
    "llm": (PEER, "bench_llm.py", []),
    "s3": (PROJECT, "bench_s3.py", []),
    "dashboard": (PROJECT, "bench_dashboard.py", []),
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip", default="", help="comma-separated benchmark names to skip")
    args = ap.parse_args()
    skip = {s for s in args.skip.split(",") if s}
    if not PEER.exists():
        subprocess.run(["bash", str(HERE / "setup.sh")], check=True)
    header = (
        f"# ckptview benchmarks\n\n{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC · "
        f"{platform.machine()} · {os.cpu_count()} cores · Python {platform.python_version()}\n"
    )
    parts = [header]
    status = 0
    for name, (python, script, extra) in BENCHES.items():
        if name in skip:
            continue
        print(f"== {name}", file=sys.stderr)
        proc = subprocess.run([str(python), str(HERE / script), *extra], cwd=HERE,
                              capture_output=True, text=True)  # fmt: skip
        if proc.returncode:
            status = 1
            parts.append(f"\n## {name}: failed\n\n```\n{proc.stderr[-2000:]}\n```\n")
        else:
            parts.append(f"\n## {name}\n{proc.stdout}")
    report = "".join(parts)
    (HERE / "RESULTS.md").write_text(report)
    print(report)
    return status


if __name__ == "__main__":
    sys.exit(main())
