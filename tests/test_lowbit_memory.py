"""Memory of low-bit statistics and reads (issue 25 item 6): an FP8 block-scaled weight is
dequantized a slab of rows at a time, as plain tensors stream, never whole.

Each measurement runs in a child process (tracemalloc counts numpy's buffers) on a file this
test writes: a 128 MiB ``float8_e4m3fn`` weight with its 128x128-block ``weight_scale_inv``."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import ckptview as cv

MIB = 1 << 20
ROOT = Path(__file__).resolve().parent.parent


def write_fp8_block(path: Path, rows: int, cols: int, seed: int = 0) -> None:
    """``w.weight`` (F8_E4M3, rows x cols) and ``w.weight_scale_inv`` (F32, 128-blocks),
    written row slab by row slab (no whole-tensor array in this process either)."""
    srows, scols = -(-rows // 128), -(-cols // 128)
    scale = np.random.default_rng(seed).uniform(0.5, 2.0, (srows, scols)).astype("<f4")
    nw = rows * cols
    head = {
        "w.weight": {"dtype": "F8_E4M3", "shape": [rows, cols], "data_offsets": [0, nw]},
        "w.weight_scale_inv": {"dtype": "F32", "shape": [srows, scols],
                               "data_offsets": [nw, nw + scale.nbytes]},
    }  # fmt: skip
    raw = json.dumps(head).encode()
    raw += b" " * (-(8 + len(raw)) % 8)
    rng = np.random.default_rng(seed + 1)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        step = max(1, (8 * MIB) // cols)
        for a in range(0, rows, step):
            n = min(step, rows - a)
            # codes 0x00..0x76 and 0x80..0xf6: finite e4m3fn values (0x7f / 0xff are NaN)
            f.write((rng.integers(0, 0x77, n * cols, dtype=np.uint8)
                     | (rng.integers(0, 2, n * cols, dtype=np.uint8) << 7)).tobytes())  # fmt: skip
        f.write(scale.tobytes())


CHILD = r"""
import json, sys, tracemalloc
import ckptview as cv
path, what = sys.argv[1], sys.argv[2]
cat = cv.open(path, cache=False)
cat.variables
tracemalloc.start()
if what == "stats":
    st = cat.stats()
    row = st.set_index("name").loc["w.weight"]
    out = {"error": row["error"], "n_nan": int(row["n_nan"])}
else:
    a = cat.read("w.weight")
    out = {"nbytes": int(a.nbytes), "dtype": str(a.dtype)}
out["peak"] = tracemalloc.get_traced_memory()[1]
print(json.dumps(out))
"""


def _child(path: Path, what: str) -> dict:
    p = subprocess.run([sys.executable, "-c", CHILD, str(path), what], capture_output=True,
                       text=True, timeout=300, cwd=ROOT)  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def big_fp8(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("fp8") / "model.safetensors"
    write_fp8_block(path, 8192, 16384)  # 128 MiB stored
    return path


def test_stats_of_a_128mib_fp8_block_weight_peak_at_most_256mib(big_fp8):
    out = _child(big_fp8, "stats")
    assert out["error"] is None and out["n_nan"] == 0
    assert out["peak"] <= 256 * MIB, f"stats peaked at {out['peak'] / MIB:.0f} MiB"


def test_read_of_a_128mib_fp8_block_weight_peaks_at_the_result_plus_a_chunk(big_fp8):
    out = _child(big_fp8, "read")
    assert out["nbytes"] == 8192 * 16384 * 4 and out["dtype"] == "float32"
    extra = out["peak"] - out["nbytes"]
    assert extra <= 64 * MIB, f"read peaked {extra / MIB:.0f} MiB above its result"


@pytest.mark.parametrize("rows,cols", [(300, 200), (256, 384), (1, 130), (257, 129)])
def test_streamed_dequantization_matches_the_whole_tensor_formula(tmp_path, rows, cols):
    path = tmp_path / "model.safetensors"
    write_fp8_block(path, rows, cols, seed=rows + cols)
    cat = cv.open(path, cache=False)
    row = cat.variables.set_index("name").loc["w.weight"]
    assert row["quant"].startswith("fp8-") and row["error"] is None
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    start = 8 + n
    w = np.frombuffer(raw, ml_dtypes.float8_e4m3fn, rows * cols, start).reshape(rows, cols)
    s = np.frombuffer(raw, "<f4", offset=start + rows * cols).reshape(-(-rows // 128), -1)
    full = np.repeat(np.repeat(s, 128, axis=0), 128, axis=1)[:rows, :cols]
    want = w.astype(np.float32) * full
    assert np.array_equal(cat.read("w.weight"), want)
    for chunk_bytes in (4, 128 * cols * 4, 1 << 30):  # under, at and over one block row
        got = np.concatenate(list(cat._scan.iter_chunks("w.weight", max_bytes=chunk_bytes)))
        assert np.array_equal(got, want.reshape(-1))
    st = cat.stats().set_index("name").loc["w.weight"]
    assert st["max"] == pytest.approx(float(want.max()), rel=1e-6)


def test_channel_and_tensor_scales_stream_too(tmp_path):
    rng = np.random.default_rng(3)
    w = rng.uniform(-4, 4, (300, 40)).astype(ml_dtypes.float8_e4m3fn)
    sc = rng.uniform(0.5, 2, (300, 1)).astype("<f4")
    st = np.array([0.25], "<f4")
    tensors = {"a.weight": ("F8_E4M3", w), "a.weight_scale": ("F32", sc),
               "b.weight": ("F8_E4M3", w), "b.weight_scale": ("F32", st)}  # fmt: skip
    head, at, data = {}, 0, b""
    for name, (code, arr) in tensors.items():
        head[name] = {"dtype": code, "shape": list(arr.shape),
                      "data_offsets": [at, at + arr.nbytes]}  # fmt: skip
        at += arr.nbytes
        data += arr.tobytes()
    h = json.dumps(head).encode()
    (tmp_path / "m.safetensors").write_bytes(struct.pack("<Q", len(h)) + h + data)
    cat = cv.open(tmp_path / "m.safetensors", cache=False)
    want = {"a.weight": w.astype(np.float32) * sc, "b.weight": w.astype(np.float32) * 0.25}
    for name, expect in want.items():
        assert np.array_equal(cat.read(name), expect)
        got = np.concatenate(list(cat._scan.iter_chunks(name, max_bytes=1000)))
        assert np.array_equal(got, expect.reshape(-1))
