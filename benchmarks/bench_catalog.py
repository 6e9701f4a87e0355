"""Catalog scan: ckptview against the frameworks' own loaders and the header-read floor, on
numbered torch, safetensors and TensorFlow trees, at two tensor sizes (the same tree with 100x
bigger tensors), each contender in its own process. Each contender does its work twice in
process: the second (warm: imports and first-call setup done, OS page cache warm for all)
is the compared time; the first and the whole process time are printed too. Prints
Markdown tables of time ratios and peak RSS.

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

WRITE_TF = r"""
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np, tensorflow as tf
root, serials, tensors, numel = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = np.random.default_rng(0)
ckpt = tf.train.Checkpoint(**{f"w{i}": tf.Variable(rng.standard_normal(numel, dtype=np.float32))
                              for i in range(tensors)})
manager = tf.train.CheckpointManager(ckpt, f"{root}/tf", max_to_keep=None)
for s in range(1, serials + 1):
    manager.save(checkpoint_number=s * 100)
print("{}")
"""

TF_LIST = r"""
import os, sys, json, glob, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf
def work():
    rows = 0
    for index in sorted(glob.glob(sys.argv[1] + "/*.index")):
        rows += len(tf.train.list_variables(index[: -len(".index")]))
    return {"rows": rows}
"""

TF_FLOOR = r"""
import json, sys, glob, time
def work():
    n = 0
    for index in sorted(glob.glob(sys.argv[1] + "/*.index")):
        with open(index, "rb") as fh:
            n += len(fh.read())
    return {"index_bytes": n}
"""

CKPTVIEW = r"""
import json, sys, time, ckptview as cv
def work():
    cat = cv.open(sys.argv[1], cache=False)
    return {"rows": len(cat.variables), "bytes_read": cat.storage.counters.bytes_read}
"""

TORCH_LOAD = r"""
import json, sys, glob, time, torch
def work():
    rows = 0
    for f in sorted(glob.glob(sys.argv[1] + "/*.pt")):
        sd = torch.load(f, mmap=True, weights_only=True)
        rows += sum(1 for t in sd.values() if hasattr(t, "shape") and (t.dtype, tuple(t.shape)))
    return {"rows": rows}
"""

TORCH_FLOOR = r"""
import json, sys, glob, time, zipfile
def work():
    n = 0
    for f in sorted(glob.glob(sys.argv[1] + "/*.pt")):
        with zipfile.ZipFile(f) as z:
            name = next(i for i in z.namelist() if i.endswith("data.pkl"))
            n += len(z.read(name))
    return {"pickle_bytes": n}
"""

SAFE_OPEN = r"""
import json, sys, glob, time
from safetensors import safe_open
def work():
    rows = 0
    for f in sorted(glob.glob(sys.argv[1] + "/*.safetensors")):
        with safe_open(f, framework="numpy") as h:
            for k in h.keys():
                h.get_slice(k).get_shape(); rows += 1
    return {"rows": rows}
"""

SAFE_FLOOR = r"""
import json, sys, glob, struct, time
def work():
    n = 0
    for f in sorted(glob.glob(sys.argv[1] + "/*.safetensors")):
        with open(f, "rb") as fh:
            size = struct.unpack("<Q", fh.read(8))[0]
            n += len(fh.read(size))
    return {"header_bytes": n}
"""


def has_tensorflow() -> bool:
    return (
        subprocess.run([sys.executable, "-c", "import tensorflow"], capture_output=True).returncode
        == 0
    )


def ensure_tree(root: Path, serials: int, tensors: int, numel: int) -> None:
    args = [str(root), str(serials), str(tensors), str(numel)]
    if not (root / "st" / f"step_{serials * 100}.safetensors").exists():
        (root / "pt").mkdir(parents=True, exist_ok=True)
        (root / "st").mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-c", WRITE, *args], check=True)
    if has_tensorflow() and not (root / "tf" / "checkpoint").exists():
        subprocess.run([sys.executable, "-c", WRITE_TF, *args], check=True)


def bench(root: Path, label: str) -> None:
    for fmt, contenders in (
        ("pt", (("header floor (zip+pickle)", TORCH_FLOOR), ("ckptview", CKPTVIEW),
                ("torch.load mmap", TORCH_LOAD))),
        ("st", (("header floor (8+N bytes)", SAFE_FLOOR), ("ckptview", CKPTVIEW),
                ("safetensors.safe_open", SAFE_OPEN))),
        ("tf", (("index floor (read .index)", TF_FLOOR), ("ckptview", CKPTVIEW),
                ("tf.train.list_variables", TF_LIST))),
    ):  # fmt: skip
        if not (root / fmt).exists():
            print(f"\n({fmt}: skipped, its framework is not installed in the peer venv)")
            continue
        rows = []
        for name, script in contenders:
            rec = run_contender(script, str(root / fmt))
            rows.append({"name": name, **rec})
            print(label, fmt, name, json.dumps(rec), file=sys.stderr)
        size = sum(p.stat().st_size for p in (root / fmt).rglob("*") if p.is_file()) / (1 << 20)
        print(f"\n### Catalog scan, {fmt} tree, {label} ({size:.0f} MiB)\n")
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
