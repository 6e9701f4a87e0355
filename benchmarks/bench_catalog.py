"""Catalog scan: ckptview against the frameworks' own loaders and the header-read floor, on
numbered torch and safetensors trees, at two tensor sizes (the same tree with 100x bigger
tensors), each contender in its own process. Prints Markdown tables of time ratios and RSS.

usage: benchmarks/.venv/bin/python benchmarks/bench_catalog.py [--dir /tmp/ckptview-bench]
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
from safetensors.torch import save_file
root, serials, tensors, numel = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
g = torch.Generator().manual_seed(0)
for s in range(1, serials + 1):
    sd = {f"block{i // 4}.layer{i % 4}.weight": torch.randn(numel, generator=g) for i in range(tensors)}
    torch.save(sd, f"{root}/pt/step_{s * 100}.pt")
    save_file(sd, f"{root}/st/step_{s * 100}.safetensors")
print("{}")
"""

CKPTVIEW = r"""
import json, sys, ckptview as cv
import time as _t; _t0 = _t.perf_counter()
cat = cv.open(sys.argv[1])
v = cat.variables
print(json.dumps({"work_s": _t.perf_counter() - _t0, "rows": len(v), "bytes_read": cat.storage.counters.bytes_read}))
"""

TORCH_LOAD = r"""
import json, sys, glob, torch
import time as _t; _t0 = _t.perf_counter()
rows = 0
for f in sorted(glob.glob(sys.argv[1] + "/*.pt")):
    sd = torch.load(f, mmap=True, weights_only=True)
    rows += sum(1 for t in sd.values() if hasattr(t, "shape") and (t.dtype, tuple(t.shape)))
print(json.dumps({"work_s": _t.perf_counter() - _t0, "rows": rows}))
"""

TORCH_FLOOR = r"""
import json, sys, glob, zipfile
import time as _t; _t0 = _t.perf_counter()
n = 0
for f in sorted(glob.glob(sys.argv[1] + "/*.pt")):
    with zipfile.ZipFile(f) as z:
        name = next(i for i in z.namelist() if i.endswith("data.pkl"))
        n += len(z.read(name))
print(json.dumps({"work_s": _t.perf_counter() - _t0, "pickle_bytes": n}))
"""

SAFE_OPEN = r"""
import json, sys, glob
from safetensors import safe_open
import time as _t; _t0 = _t.perf_counter()
rows = 0
for f in sorted(glob.glob(sys.argv[1] + "/*.safetensors")):
    with safe_open(f, framework="numpy") as h:
        for k in h.keys():
            h.get_slice(k).get_shape(); rows += 1
print(json.dumps({"work_s": _t.perf_counter() - _t0, "rows": rows}))
"""

SAFE_FLOOR = r"""
import json, sys, glob, struct
import time as _t; _t0 = _t.perf_counter()
n = 0
for f in sorted(glob.glob(sys.argv[1] + "/*.safetensors")):
    with open(f, "rb") as fh:
        size = struct.unpack("<Q", fh.read(8))[0]
        n += len(fh.read(size))
print(json.dumps({"work_s": _t.perf_counter() - _t0, "header_bytes": n}))
"""


def ensure_tree(root: Path, serials: int, tensors: int, numel: int) -> None:
    if (root / "st" / f"step_{serials * 100}.safetensors").exists():
        return
    (root / "pt").mkdir(parents=True, exist_ok=True)
    (root / "st").mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-c", WRITE, str(root), str(serials), str(tensors), str(numel)]
    subprocess.run(cmd, check=True)


def bench(root: Path, label: str) -> None:
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) / (1 << 20)
    for fmt, contenders in (
        ("pt", (("header floor (zip+pickle)", TORCH_FLOOR), ("ckptview", CKPTVIEW),
                ("torch.load mmap", TORCH_LOAD))),
        ("st", (("header floor (8+N bytes)", SAFE_FLOOR), ("ckptview", CKPTVIEW),
                ("safetensors.safe_open", SAFE_OPEN))),
    ):  # fmt: skip
        rows = []
        for name, script in contenders:
            rec = run_contender(script, str(root / fmt))
            rows.append({"name": name, **rec})
            print(label, fmt, name, json.dumps(rec), file=sys.stderr)
        print(f"\n### Catalog scan, {fmt} tree, {label} ({size / 2:.0f} MiB per format)\n")
        print(table(rows, rows[0]["name"]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/ckptview-bench/catalog")
    ap.add_argument("--serials", type=int, default=10)
    ap.add_argument("--tensors", type=int, default=64)
    args = ap.parse_args()
    for label, numel in (("small tensors (16 KiB)", 4096), ("100x bigger tensors", 409600)):
        root = Path(args.dir) / str(numel)
        ensure_tree(root, args.serials, args.tensors, numel)
        bench(root, label)


if __name__ == "__main__":
    main()
