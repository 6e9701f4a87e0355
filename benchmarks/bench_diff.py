"""Diff two ~1 GB serials: ckptview against torch (mmap load + per-tensor ops) and the
numpy floor (read both files and subtract), each in its own process; prints a Markdown table
of wall time, ratio to the floor, and peak RSS.

usage: benchmarks/.venv/bin/python benchmarks/bench_diff.py [--gib 1.0] [--dir /tmp/ckptview-bench]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from common import run_contender, table

WRITE = r"""
import sys, torch
root, n, numel = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
g = torch.Generator().manual_seed(0)
a = {f"layer{i}.weight": torch.randn(numel // 1024, 1024, generator=g) for i in range(n)}
torch.save(a, f"{root}/step_1.pt")
for i, k in enumerate(a):
    if i % 2 == 0:
        a[k] += 0.01 * torch.randn(a[k].shape, generator=g)
torch.save(a, f"{root}/step_2.pt")
print("{}")
"""

CKPTVIEW = r"""
import json, sys, ckptview as cv
import time as _t; _t0 = _t.perf_counter()
d = cv.open(sys.argv[1]).diff(1, 2)
print(json.dumps({"work_s": _t.perf_counter() - _t0, "changed": int((d["status"] == "changed").sum()), "l2": float(d["l2"].sum())}))
"""

TORCH = r"""
import json, sys, torch
import time as _t; _t0 = _t.perf_counter()
a = torch.load(sys.argv[1] + "/step_1.pt", mmap=True, weights_only=True)
b = torch.load(sys.argv[1] + "/step_2.pt", mmap=True, weights_only=True)
changed, total = 0, 0.0
for k in a:
    x, y = a[k].double(), b[k].double()
    d = y - x
    l2 = float(d.norm()); mx = float(d.abs().max())
    cos = float(torch.nn.functional.cosine_similarity(x.flatten(), y.flatten(), dim=0))
    changed += l2 > 0; total += l2
print(json.dumps({"work_s": _t.perf_counter() - _t0, "changed": int(changed), "l2": total}))
"""

FLOOR = r"""
import json, sys, numpy as np
import time as _t; _t0 = _t.perf_counter()
chunk = 64 << 20
acc = 0.0
with open(sys.argv[1] + "/step_1.pt", "rb") as fa, open(sys.argv[1] + "/step_2.pt", "rb") as fb:
    while True:
        x, y = fa.read(chunk), fb.read(chunk)
        if not x:
            break
        n = min(len(x), len(y)) // 4 * 4
        d = np.frombuffer(y[:n], np.float32).astype(np.float64) - np.frombuffer(x[:n], np.float32)
        acc += float(np.dot(d, d))
print(json.dumps({"work_s": _t.perf_counter() - _t0, "sumsq": acc}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0, help="size of each serial")
    ap.add_argument("--dir", default="/tmp/ckptview-bench/diff")
    args = ap.parse_args()
    root = Path(args.dir)
    n = 16
    numel = int(args.gib * (1 << 30) / 4 / n) // 1024 * 1024
    if not (root / "step_2.pt").exists():
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-c", WRITE, str(root), str(n), str(numel)], check=True)
    rows = []
    for name, script in (
        ("numpy floor", FLOOR),
        ("ckptview diff", CKPTVIEW),
        ("torch mmap", TORCH),
    ):
        rec = run_contender(script, str(root), repeat=2)
        rows.append({"name": name, **rec})
        print(name, json.dumps(rec), file=sys.stderr)
    size = sum(p.stat().st_size for p in root.glob("*.pt")) / (1 << 30)
    print(f"\n### Diff of two serials ({size:.2f} GiB on disk in all, {n} tensors each)\n")
    print(table(rows, "numpy floor"))


if __name__ == "__main__":
    main()
