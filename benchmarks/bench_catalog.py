"""Catalog scan: ckptview against the frameworks' own loaders and the header-read floor, on
numbered torch, safetensors and TensorFlow trees, at two tensor sizes (the same tree with 100x
bigger tensors), each contender in its own process. Each contender does its work twice in
process: the second (warm: imports and first-call setup done, OS page cache warm for all)
is the compared time; the first and the whole process time are printed too. Prints
Markdown tables of time ratios and peak RSS.

Scale section (issue 13, ``--scale``): a 1,000 serials x 1,000 safetensors tensors tree
(1 M variable rows), paddle-fluid trees of 100 and 1,000 serials x 60 small files, each timed
once in a fresh process after its imports (the first call is the compared one: nothing warm
in process, the OS page cache warm for all), against the floor of reading (and, for
safetensors, ``json.loads``-ing) every header in a plain loop; plus a header-cache hit
(the same tree opened again in process) and the per-serial cost from 100 to 1,000 serials.

ckptview's modules are byte-compiled before the first contender runs, as ``pip install``
does: without ``.pyc`` files (a checkout run with ``PYTHONDONTWRITEBYTECODE`` set) every fresh
process would compile the modules it imports inside its timed first call.

usage: benchmarks/.venv/bin/python benchmarks/bench_catalog.py [--dir /tmp/ckptview-bench]
       [--scale | --small]
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


#: the 1 M-row tree: spec-conformant safetensors files, 8 bytes of data per tensor
WRITE_ST_SCALE = r"""
import json, struct, sys
from pathlib import Path
root, serials, tensors = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
root.mkdir(parents=True, exist_ok=True)
names = [f"layer{i // 10}.block{i % 10}.weight" for i in range(tensors)]
for s in range(1, serials + 1):
    header = {n: {"dtype": "F32", "shape": [2], "data_offsets": [8 * i, 8 * i + 8]}
              for i, n in enumerate(names)}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    data = struct.pack("<Q", len(text)) + text + bytes(8 * tensors)
    (root / f"step_{s}.safetensors").write_bytes(data)
"""

#: paddle-fluid checkpoints: checkpoint_N/ with one LoDTensor stream per variable + _SUCCESS
WRITE_PADDLE = r"""
import struct, sys
from pathlib import Path
root, serials, files = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
def varint(n):
    out = b""
    while True:
        b = n & 0x7F; n >>= 7
        if n: out += bytes([b | 0x80])
        else: return out + bytes([b])
desc = b"\x08\x05" + b"\x10" + varint(16)  # FP32, dims [16]
body = struct.pack("<IQ", 0, 0) + struct.pack("<Ii", 0, len(desc)) + desc + bytes(64)
stamp = b"Sun Nov 22 09:07:24 2026"
for s in range(serials):
    d = root / f"checkpoint_{s}"
    d.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        (d / f"fc_{i // 4}.w_{i % 4}").write_bytes(body)
    (d / "_SUCCESS").write_bytes(stamp)
"""

SCALE_CKPTVIEW = r"""
import json, sys, time, resource
import ckptview as cv
t0 = time.perf_counter()
cat = cv.open(sys.argv[1], cache=False)
rows = len(cat.variables)
work = time.perf_counter() - t0
print(json.dumps({"work_s": work, "rows": rows, "serials": len(cat.serials)}))
"""

SCALE_CACHE_HIT = r"""
import json, sys, time
import ckptview as cv
t0 = time.perf_counter()
rows = len(cv.open(sys.argv[1]).variables)  # fills the in-memory header cache
cold = time.perf_counter() - t0
t0 = time.perf_counter()
cat = cv.open(sys.argv[1])
rows = len(cat.variables)
work = time.perf_counter() - t0
print(json.dumps({"work_s": work, "cold_s": cold, "rows": rows,
                  "bytes_read": cat.storage.counters.bytes_read}))
"""

SCALE_ST_FLOOR = r"""
import json, os, struct, sys, time
t0 = time.perf_counter()
n = 0
for root, dirs, files in os.walk(sys.argv[1]):
    for f in sorted(files):
        with open(os.path.join(root, f), "rb") as fh:
            size = struct.unpack("<Q", fh.read(8))[0]
            n += len(json.loads(fh.read(size)))
print(json.dumps({"work_s": time.perf_counter() - t0, "rows": n}))
"""

SCALE_READ64_FLOOR = r"""
import json, os, sys, time
t0 = time.perf_counter()
n = 0
for root, dirs, files in os.walk(sys.argv[1]):
    for f in files:
        with open(os.path.join(root, f), "rb") as fh:
            n += len(fh.read(64))
print(json.dumps({"work_s": time.perf_counter() - t0, "bytes": n}))
"""

SCALE_SAFE_OPEN = r"""
import json, glob, sys, time
from safetensors import safe_open
t0 = time.perf_counter()
rows = 0
for f in sorted(glob.glob(sys.argv[1] + "/*.safetensors")):
    with safe_open(f, framework="numpy") as h:
        for k in h.keys():
            h.get_slice(k).get_shape(); rows += 1
print(json.dumps({"work_s": time.perf_counter() - t0, "rows": rows}))
"""


def has_module(name: str) -> bool:
    return (
        subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True).returncode
        == 0
    )


def bench_scale(base: Path, repeat: int) -> None:
    """The issue-13 measures: 1 M safetensors rows, small paddle files, per-serial cost."""
    st = base / "st_1000x1000"
    if not (st / "step_1000.safetensors").exists():
        subprocess.run([sys.executable, "-c", WRITE_ST_SCALE, str(st), "1000", "1000"], check=True)
    rows = []
    contenders = [
        ("header floor (read + json.loads)", SCALE_ST_FLOOR),
        ("ckptview", SCALE_CKPTVIEW),
        ("ckptview, header-cache hit", SCALE_CACHE_HIT),
    ]
    if has_module("safetensors"):
        contenders.append(("safetensors.safe_open", SCALE_SAFE_OPEN))
    for name, script in contenders:
        rec = run_contender(script, str(st), repeat=repeat)
        rows.append({"name": name, **rec})
        print("scale st", name, json.dumps(rec), file=sys.stderr)
    print(
        "\n### Catalog scan, 1,000 serials x 1,000 safetensors tensors (1 M rows), fresh process\n"
    )
    print(table(rows, rows[0]["name"]))
    per_serial = {}
    for serials in (100, 1000):
        pd_root = base / f"paddle_{serials}x60"
        if not (pd_root / f"checkpoint_{serials - 1}" / "_SUCCESS").exists():
            subprocess.run([sys.executable, "-c", WRITE_PADDLE, str(pd_root), str(serials), "60"],
                           check=True)  # fmt: skip
        rows = []
        for name, script in (("read 64 bytes of each file", SCALE_READ64_FLOOR),
                             ("ckptview", SCALE_CKPTVIEW)):  # fmt: skip
            rec = run_contender(script, str(pd_root), repeat=repeat)
            rows.append({"name": name, **rec})
            print("scale paddle", serials, name, json.dumps(rec), file=sys.stderr)
        per_serial[serials] = rows[1]["seconds"] / serials
        print(
            f"\n### Catalog scan, paddle-fluid, {serials} serials x 60 small files "
            f"({serials * 61:,} files), fresh process\n"
        )
        print(table(rows, rows[0]["name"]))
    growth = per_serial[1000] / per_serial[100]
    print("\n### Per-serial cost, paddle-fluid, 1,000 vs 100 serials (60 files each)\n")
    print("| serials | ckptview s per serial | ratio vs 100 serials |\n|---|---:|---:|")
    for serials in (100, 1000):
        print(
            f"| {serials} | {per_serial[serials] * 1000:.2f} ms | "
            f"{per_serial[serials] / per_serial[100]:.2f} |"
        )
    print(f"\nper-serial growth 100 -> 1,000 serials: {growth:.2f}x")


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


def compile_ckptview() -> None:
    """Byte-compile the ckptview the contenders import (an install's ``.pyc`` files)."""
    where = subprocess.run(
        [sys.executable, "-c", "import ckptview, os; print(os.path.dirname(ckptview.__file__))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    subprocess.run([sys.executable, "-m", "compileall", "-q", where], check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    print(f"ckptview from {where} (byte-compiled)", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/ckptview-bench/catalog")
    ap.add_argument("--serials", type=int, default=10)
    ap.add_argument("--tensors", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--scale", action="store_true", help="only the issue-13 scale section")
    ap.add_argument("--small", action="store_true", help="only the 10 x 64 trees")
    args = ap.parse_args()
    compile_ckptview()
    if not args.small:
        bench_scale(Path(args.dir), args.repeat)
    if args.scale:
        return
    for label, numel in (("small tensors (16 KiB)", 4096), ("100x bigger tensors", 409600)):
        root = Path(args.dir) / str(numel)
        ensure_tree(root, args.serials, args.tensors, numel)
        bench(root, label)


if __name__ == "__main__":
    main()
