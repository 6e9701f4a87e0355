"""stats, diff and trajectory against plain numpy (corpus trees and synthetic Paddle trees)."""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import corpus_path, ground_truth

import ckptview as cv
from ckptview.engine.diff import aligned
from ckptview.formats.protobuf import encode_varint as _varint

# -- a plain-numpy Paddle LoDTensor reader/writer (spec: paddle.md §1) ---------------------------
PADDLE_DTYPES = {0: "bool", 1: "<i2", 2: "<i4", 3: "<i8", 4: "<f2", 5: "<f4", 6: "<f8",
                 20: "u1", 21: "i1", 23: "<c8", 24: "<c16"}  # fmt: skip
PADDLE_CODES = {np.dtype(v): k for k, v in PADDLE_DTYPES.items()}


def lod_header(dtype, shape) -> bytes:
    desc = b"\x08" + _varint(PADDLE_CODES[np.dtype(dtype)])
    desc += b"".join(b"\x10" + _varint(d) for d in shape)
    return struct.pack("<IQIi", 0, 0, 0, len(desc)) + desc


def write_lod(path: Path, arr: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    arr = np.ascontiguousarray(arr)
    path.write_bytes(lod_header(arr.dtype, arr.shape) + arr.tobytes())


def read_lod(path: Path) -> np.ndarray:
    data = path.read_bytes()
    (levels,) = struct.unpack_from("<Q", data, 4)
    pos = 12
    for _ in range(levels):
        (n,) = struct.unpack_from("<Q", data, pos)
        pos += 8 + n
    (desc_len,) = struct.unpack_from("<i", data, pos + 4)
    desc, pos = data[pos + 8 : pos + 8 + desc_len], pos + 8 + desc_len
    fields, i = [], 0
    while i < len(desc):
        tag, i = desc[i], i + 1
        value, shift = 0, 0
        while True:
            b, i = desc[i], i + 1
            value |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        fields.append((tag, value))
    dtype = np.dtype(PADDLE_DTYPES[fields[0][1]])
    shape = tuple(v for t, v in fields if t == 0x10)
    return np.frombuffer(data, dtype, count=math.prod(shape), offset=pos).reshape(shape)


def write_fluid_tree(root: Path, serials: dict[int, dict[str, np.ndarray]],
                     complete=None) -> Path:  # fmt: skip
    """A V2 flat fluid tree: checkpoint_N/<var> + checkpoint_N/_SUCCESS (written last)."""
    for n, variables in serials.items():
        for name, arr in variables.items():
            write_lod(root / f"checkpoint_{n}" / name, arr)
        if complete is None or n in complete:
            (root / f"checkpoint_{n}" / "_SUCCESS").write_text(time.ctime())
    return root


def numpy_stats(a: np.ndarray) -> dict:
    x = np.abs(a.astype(np.complex128)) if a.dtype.kind == "c" else a.astype(np.float64)
    x = x.reshape(-1)
    fin = x[np.isfinite(x)]
    return {"min": fin.min(), "max": fin.max(), "mean": fin.mean(), "std": fin.std(),
            "l2": np.sqrt((fin**2).sum()), "n_nan": int(np.isnan(x).sum()),
            "n_inf": int(np.isinf(x).sum()), "frac_zero": float((x == 0).mean())}  # fmt: skip


def numpy_diff(a: np.ndarray, b: np.ndarray) -> dict:
    a, b = a.astype(np.float64).reshape(-1), b.astype(np.float64).reshape(-1)
    d = b - a
    l2 = np.linalg.norm(d)
    return {"max_abs": np.abs(d).max(), "l2": l2, "rel_l2": l2 / np.linalg.norm(a),
            "cosine": a @ b / (np.linalg.norm(a) * np.linalg.norm(b))}  # fmt: skip


FLUID = "paddle/fluid_ckpt"


def model_vars(serial: int) -> dict[str, np.ndarray]:
    folder = corpus_path(FLUID, f"checkpoint_{serial}", "__model__")
    return {p.name: read_lod(p) for p in sorted(folder.iterdir()) if p.name != "_SUCCESS"}


# -- stats -----------------------------------------------------------------------------------
def test_stats_match_numpy_and_ground_truth_on_fluid():
    cat = cv.open(corpus_path(FLUID))
    st = cat.stats(2).set_index(["node", "name"])
    gt = ground_truth("paddle/ground_truth.json")["files"]
    model = model_vars(2)
    assert len(model) >= 20
    for name, arr in model.items():
        row = st.loc[("", name)]
        for key, want in numpy_stats(arr).items():
            assert row[key] == pytest.approx(want, rel=1e-9, abs=1e-12), (name, key)
        entry = gt[f"fluid_ckpt/checkpoint_2/__model__/{name}"]["entries"][0]
        assert row["mean"] * row["numel"] == pytest.approx(entry["sum"], rel=1e-6, abs=1e-9)
    assert st["error"].isna().all()


def test_stats_caffe2_against_ground_truth():
    cat = cv.open(corpus_path("caffe2/ckpt"))
    st = cat.stats(2)
    blobs = ground_truth("caffe2/ground_truth.json")["files"]["ckpt/trainer_0.2"]["blobs"]
    st0 = st[st["node"] == "trainer_0"].set_index("name")
    checked = 0
    for name, info in blobs.items():
        if info.get("kind") != "tensor" or info.get("sum") is None or name not in st0.index:
            continue
        row = st0.loc[name]
        total = 0.0 if row["numel"] == 0 else row["mean"] * row["numel"]
        assert total == pytest.approx(info["sum"], rel=1e-6, abs=1e-6), name
        checked += 1
    assert checked >= 15
    objects = st0[st0["dtype"] == "object"]
    assert len(objects) and objects["mean"].isna().all() and objects["error"].isna().all()


def test_stats_nan_inf_complex_bool_int(tmp_path):
    f = np.array([1.5, np.nan, -np.inf, 0.0, 2.0, np.inf, -3.0], dtype=np.float32)
    c = np.array([3 + 4j, 0, 1j, -2], dtype=np.complex64)
    b = np.array([True, False, False, True, True])
    i = np.arange(-5, 7, dtype=np.int64).reshape(3, 4)
    big = np.random.default_rng(0).standard_normal(300_001).astype(np.float32)
    arrays = {"f": f, "c": c, "b": b, "i": i, "big": big, "zero_d": np.float64(2.5) * np.ones(())}
    write_fluid_tree(tmp_path / "t", {0: arrays})
    st = cv.open(tmp_path / "t").stats(0, chunk_bytes=4096).set_index("name")
    for name, arr in arrays.items():
        for key, want in numpy_stats(np.asarray(arr)).items():
            assert st.loc[name, key] == pytest.approx(want, rel=1e-9), (name, key)
    assert (st.loc["f", "n_nan"], st.loc["f", "n_inf"]) == (1, 2)


#: stats against numpy: min, max, counts and frac_zero exactly; mean, l2 and std (float64
#: sums by rows, M2 from Σx² - (Σx)²/k unless that cancels) to this relative tolerance
STATS_RTOL = 1e-9


def _multi_piece_arrays() -> dict[str, np.ndarray]:
    """Tensors of several float64 pieces (:data:`~ckptview.engine.sums.PIECE` values), with
    NaN/inf rows, single NaN/inf values, zeros, and means far from zero."""
    from ckptview.engine.sums import PIECE, ROW

    rng = np.random.default_rng(11)
    n = 3 * PIECE + 5 * ROW + 77  # three full pieces, a part piece with a short last row
    w = rng.standard_normal(n).astype(np.float32)
    w[ROW : 2 * ROW] = np.nan  # a whole row of NaN
    w[PIECE + 3 * ROW : PIECE + 4 * ROW] = np.inf  # a whole row of +inf
    w[2 * PIECE + 5 :: 99_991] = -np.inf
    w[PIECE + 17 :: 123_457] = np.nan
    w[-40:] = 0.0
    w[3 * PIECE : 3 * PIECE + ROW] = 0.0  # a piece starting with a zero row
    offset = 1e4 + 1e-3 * rng.standard_normal((PIECE + 3, 3))  # |mean| >> std: centred
    offset[5, 1] = np.nan
    return {
        "w": w.reshape(3, -1),
        "offset": offset,
        "shifted32": (100 + rng.standard_normal(2 * PIECE + 1)).astype(np.float32),
        "half": rng.standard_normal(PIECE + ROW + 3).astype(np.float16),
        "ints": rng.integers(-3, 4, (2 * PIECE + 9,)).astype(np.int32),
        "flags": rng.random(PIECE + 1) < 0.25,
        "const": np.full(2 * PIECE + 13, -2.5, np.float32),
        "rows_of_nan": np.full(PIECE + ROW, np.nan, np.float32),
    }


def _assert_stats_equal_numpy(got, arr: np.ndarray, what: str) -> None:
    x = arr.astype(np.float64).reshape(-1)
    fin = x[np.isfinite(x)]
    exact = {"n_nan": int(np.isnan(x).sum()), "n_inf": int(np.isinf(x).sum()),
             "frac_zero": float((x == 0).mean())}  # fmt: skip
    for key, want in exact.items():
        assert got[key] == want, (what, key)
    if not fin.size:
        assert all(math.isnan(got[k]) for k in ("min", "max", "mean", "std", "l2")), what
        return
    assert (got["min"], got["max"]) == (fin.min(), fin.max()), what
    close = {"mean": fin.mean(), "std": fin.std(), "l2": np.sqrt(np.dot(fin, fin))}
    for key, want in close.items():
        assert got[key] == pytest.approx(want, rel=STATS_RTOL, abs=1e-300), (what, key)


@pytest.mark.parametrize("chunk_bytes", [4 << 20, 1_000_003, 65_536 + 12, 4096])
def test_stats_of_multi_piece_tensors_equal_numpy(tmp_path, chunk_bytes):
    """Read in chunks cut anywhere (across pieces and rows, odd sizes), from a tree."""
    arrays = _multi_piece_arrays()
    write_fluid_tree(tmp_path / "t", {0: arrays})
    st = cv.open(tmp_path / "t").stats(0, chunk_bytes=chunk_bytes).set_index("name")
    assert st["error"].isna().all()
    for name, arr in arrays.items():
        _assert_stats_equal_numpy(st.loc[name], arr, f"{name} @ {chunk_bytes}")


def test_stats_accumulator_on_chunks_cut_anywhere():
    """The accumulator on chunks of uneven lengths (a few values, more than a piece, one
    value), float64 chunks used in place and left unchanged."""
    from ckptview.engine.stats import chunk_stats

    rng = np.random.default_rng(5)
    for name, arr in _multi_piece_arrays().items():
        flat = arr.reshape(-1)
        cuts = np.sort(rng.choice(np.arange(1, flat.size), size=6, replace=False))
        cuts = np.unique(np.concatenate([cuts, cuts[:2] + 1]))  # one-value chunks too
        before = flat.copy()
        got = chunk_stats(np.split(flat, cuts))
        _assert_stats_equal_numpy(got, arr, name)
        assert np.array_equal(flat, before, equal_nan=True), name


def test_stats_names_filter_and_bad_input():
    cat = cv.open(corpus_path(FLUID))
    st = cat.stats(1, names=["fc_0.w_0", "fc_1.b_0"])
    assert sorted(st["name"]) == ["fc_0.w_0", "fc_1.b_0"] and set(st["serial"]) == {1}
    with pytest.raises(KeyError):
        cat.stats(1, names=["nope"])
    with pytest.raises(KeyError):
        cat.stats(42)


def test_trajectory_matches_numpy():
    cat = cv.open(corpus_path(FLUID))
    traj = cat.trajectory("fc_0.w_0", "l2")
    assert list(traj.index) == [0, 1, 2, 3]
    for s in range(4):
        arr = read_lod(corpus_path(FLUID, f"checkpoint_{s}", "__model__", "fc_0.w_0"))
        assert traj[s] == pytest.approx(np.linalg.norm(arr.astype(np.float64)), rel=1e-12)
    mean = cat.trajectory("share_w", "mean", node="pserver_1")
    assert list(mean.index) == [0, 1, 2]
    with pytest.raises(KeyError):
        cat.trajectory("share_w")  # on two nodes: ambiguous
    with pytest.raises(ValueError):
        cat.trajectory("fc_0.w_0", "median")


# -- diff ------------------------------------------------------------------------------------
def test_aligned_rechunks_any_boundaries():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(1000), rng.standard_normal(1000)

    def cut(x, sizes):
        out, i = [], 0
        for s in sizes:
            out.append(x[i : i + s])
            i += s
        return out + [x[i:]]

    pieces = list(aligned(cut(a, [3, 0, 500, 7]), cut(b, [250, 250, 1, 1, 1])))
    assert np.array_equal(np.concatenate([p for p, _ in pieces]), a)
    assert np.array_equal(np.concatenate([q for _, q in pieces]), b)
    assert all(len(p) == len(q) > 0 for p, q in pieces)
    with pytest.raises(ValueError):
        list(aligned([a], [b[:-1]]))


def test_diff_fluid_serials_exact():
    cat = cv.open(corpus_path(FLUID))
    df = cat.diff(1, 2)
    assert set(df.columns) >= {"node", "name", "status", "dtype_a", "dtype_b", "shape_a",
                               "shape_b", "max_abs", "l2", "rel_l2", "cosine"}  # fmt: skip
    rows = df[df["node"] == ""].set_index("name")
    a, b = model_vars(1), model_vars(2)
    for name in a:
        if np.array_equal(a[name], b[name]):
            assert rows.loc[name, "status"] == "identical"
            assert rows.loc[name, "l2"] == 0
            continue
        assert rows.loc[name, "status"] == "changed"
        for key, want in numpy_diff(a[name], b[name]).items():
            assert rows.loc[name, key] == pytest.approx(want, rel=1e-9), (name, key)
    assert rows.loc["learning_rate_0", "status"] == "identical"
    assert {("pserver_0", "share_w"), ("pserver_1", "share_w")} <= set(zip(df.node, df.name))


def test_diff_incomplete_serial_reports_removed_vars():
    cat = cv.open(corpus_path(FLUID))
    df = cat.diff(2, 3).set_index(["node", "name"])
    missing = [n for n in model_vars(2) if "moment2" in n]
    assert len(missing) == 4
    assert all(df.loc[("", n), "status"] == "removed" for n in missing)
    assert df.loc[("pserver_0", "share_w"), "status"] == "removed"


def test_diff_caffe2_matches_numpy_on_read_values():
    cat = cv.open(corpus_path("caffe2/ckpt"))
    df = cat.diff(1, 3).set_index(["node", "name"])
    numeric = cat.variables
    numeric = numeric[(numeric["serial"] == 1) & (numeric["dtype"] != "object")]
    changed = 0
    for r in numeric.itertuples():
        a = cat.read(r.name, 1, r.node)
        b = cat.read(r.name, 3, r.node)
        row = df.loc[(r.node, r.name)]
        if np.array_equal(a, b):
            assert row["status"] == "identical", r.name
            continue
        changed += 1
        assert row["status"] == "changed"
        want = numpy_diff(a, b)
        assert row["max_abs"] == pytest.approx(want["max_abs"], rel=1e-9)
        assert row["l2"] == pytest.approx(want["l2"], rel=1e-9)
    assert changed >= 2
    assert (df.loc[df["dtype_a"] == "object", "status"].isin(["identical", "changed"])).all()


def test_diff_statuses_on_synthetic_tree(tmp_path):
    rng = np.random.default_rng(2)
    w = rng.standard_normal((16, 8)).astype(np.float32)
    s0 = {"same": w, "tweak": w, "gone": w, "reshape": w, "retype": w,
          "nan": np.array([1.0, np.nan, 3.0], np.float32), "ints": np.arange(10)}  # fmt: skip
    tweak = w.copy()
    tweak[3, 4] += 0.5
    s1 = {"same": w, "tweak": tweak, "new": w, "reshape": w.reshape(8, 16),
          "retype": w.astype(np.float64), "nan": np.array([1.0, np.nan, 3.0], np.float32),
          "ints": np.arange(10)}  # fmt: skip
    write_fluid_tree(tmp_path / "t", {0: s0, 1: s1})
    df = cv.open(tmp_path / "t").diff(0, 1, chunk_bytes=64).set_index("name")
    want = {"same": "identical", "tweak": "changed", "gone": "removed", "new": "added",
            "reshape": "shape_changed", "retype": "dtype_changed", "nan": "identical",
            "ints": "identical"}  # fmt: skip
    assert df["status"].to_dict() == want
    assert df.loc["tweak", "max_abs"] == pytest.approx(0.5, rel=1e-6)
    assert df.loc["tweak", "n_changed"] == 1
    assert df.loc["retype", "l2"] == 0  # same values, wider dtype
    assert df.loc["nan", "l2"] == 0


def test_diff_cross_format_against_npz_export(tmp_path):
    model = model_vars(2)
    np.savez(tmp_path / "export.npz", **model)
    fluid = cv.open(corpus_path(FLUID))
    npz = cv.open(tmp_path / "export.npz")
    df = fluid.diff(2, None, other=npz).set_index(["node", "name"])
    for name in model:
        assert df.loc[("", name), "status"] == "identical", name
    assert df.loc[("pserver_0", "share_w"), "status"] == "removed"
    one = fluid.diff(1, None, other=npz, names=["fc_0.w_0"])
    assert list(one["name"]) == ["fc_0.w_0"] and one["status"].iloc[0] == "changed"


# -- bounded memory ------------------------------------------------------------------------
def _write_big(path: Path, n: int, seed: int, jitter: float) -> None:
    """A float32 LoDTensor of n values written block by block (never whole in memory)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(lod_header(np.float32, (n,)))
        step = 1 << 22
        for start in range(0, n, step):
            rng = np.random.default_rng(seed + start)
            block = rng.standard_normal(min(step, n - start), dtype=np.float32)
            if jitter:
                block[(-start) % 1000 :: 1000] += jitter
            f.write(block.tobytes())


#: run in a fresh process: the catalog opened first, then the peak resident set reset
#: (``/proc/self/clear_refs``) and the diff run; prints the growth of the peak over the
#: resident set before the diff, and the rows
_DIFF_PEAK = """
import json, sys
import ckptview as cv

def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith(key + ":"))

cat = cv.open(sys.argv[1])
cat.variables  # listed before the measure: the catalog is not the diff's memory
before = status("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # VmHWM := VmRSS (Linux >= 4.0)
df = cat.diff(0, 1)
growth = status("VmHWM") - before
cols = ["status", "n_changed", "max_abs", "l2"]
print(json.dumps({"growth": growth, **{c: df[c].astype(object).tolist() for c in cols}}))
"""


@pytest.mark.slow
def test_diff_of_1gb_tree_keeps_memory_bounded(tmp_path):
    """A diff holds a few chunks per pair in flight, never a tensor (DESIGN.md §3: memory
    bounded whatever the checkpoint size). Measured in a fresh process as its peak resident
    set over the one before the diff: in this process the figure depended on what earlier
    tests had left in malloc's arenas (236-268 MiB after tests/test_health.py)."""
    from ckptview.engine.stats import CHUNK_BYTES, WINDOW
    from ckptview.engine.sums import PIECE

    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the peak resident set")
    n, names = 1 << 25, ["w0", "w1", "w2", "w3"]  # 4 x 128 MiB per serial: 1 GiB in all
    root = tmp_path / "big"
    for serial, jitter in ((0, 0.0), (1, 0.25)):
        for i, name in enumerate(names):
            _write_big(root / f"checkpoint_{serial}" / name, n, seed=i * 7919, jitter=jitter)
        (root / f"checkpoint_{serial}" / "_SUCCESS").write_text(time.ctime())
    data_bytes = 2 * len(names) * n * 4
    assert data_bytes >= 1 << 30
    out = subprocess.run([sys.executable, "-c", _DIFF_PEAK, str(root)], capture_output=True,
                         text=True, timeout=300, check=True)  # fmt: skip
    got = json.loads(out.stdout.strip().splitlines()[-1])
    # by design: WINDOW pairs at once, each two chunks per side (the one compared, the next
    # read ahead) and its float64 scratch (3 rows of PIECE values); half a tensor on top for
    # the allocator and the rest. A diff holding one whole tensor more fails.
    tensor = n * 4
    bound = WINDOW * (2 * 2 * CHUNK_BYTES + 3 * PIECE * 8)
    limit = bound + tensor // 2
    assert limit < bound + tensor
    growth = got["growth"]
    print(f"peak grew {growth / 2**20:.0f} MiB (design bound {bound / 2**20:.0f} MiB, "
          f"limit {limit / 2**20:.0f} MiB)")  # fmt: skip
    assert growth < limit, f"peak resident set grew {growth / 2**20:.0f} MiB"
    assert got["status"] == ["changed"] * len(names)
    changed = (n + 999) // 1000
    assert got["n_changed"] == [changed] * len(names)
    assert np.allclose(got["max_abs"], 0.25, rtol=1e-5)
    assert np.allclose(got["l2"], np.sqrt(changed) * 0.25, rtol=1e-4)


# -- the blocked float64 accumulator against the general (whole-chunk) path -------------------
def _accumulate(pairs, general: bool) -> dict:
    from ckptview.engine.diff import DiffAccumulator

    acc = DiffAccumulator()
    for xa, xb in pairs:
        acc.n += 0 if not general else xa.size
        if general:
            with np.errstate(invalid="ignore"):
                acc._add_general(xa, xb)
        else:
            acc.add(xa, xb)
    return acc.result()


@pytest.mark.parametrize(
    "dtype_a, dtype_b",
    [("float32", "float32"), ("float16", "float32"), ("float64", "float64"), ("int64", "int64"),
     ("int32", "int64"), ("bool", "bool"), ("uint8", "uint8"), ("bfloat16", "bfloat16")],
)  # fmt: skip
def test_blocked_accumulator_matches_the_general_path(dtype_a, dtype_b):
    from ckptview.dtypes import np_dtype
    from ckptview.engine.diff import BLOCK

    rng = np.random.default_rng(7)
    n = 3 * BLOCK + 123  # blocks, and a short last one
    base = rng.standard_normal(n) * 100
    a = base.astype(np_dtype(dtype_a))
    b = base.copy()
    b[rng.integers(0, n, 40)] += rng.standard_normal(40) * 10
    b = b.astype(np_dtype(dtype_b))
    for cut in (n, BLOCK // 3, 5 * BLOCK):  # chunk boundaries inside, at and beyond blocks
        pairs = [(a[i : i + cut], b[i : i + cut]) for i in range(0, n, cut)]
        fast, ref = _accumulate(pairs, False), _accumulate(pairs, True)
        assert fast["n_changed"] == ref["n_changed"]
        for key in ("max_abs", "l2", "rel_l2", "cosine", "norm_a", "norm_b"):
            assert fast[key] == pytest.approx(ref[key], rel=1e-12, nan_ok=True), key
    want = numpy_diff(a, b)
    for key in ("max_abs", "l2", "rel_l2", "cosine"):
        assert fast[key] == pytest.approx(want[key], rel=1e-9), key


def test_blocked_accumulator_nan_and_inf_blocks():
    from ckptview.engine.diff import BLOCK

    rng = np.random.default_rng(3)
    n = 4 * BLOCK
    a = rng.standard_normal(n).astype(np.float32)
    b = a.copy()
    b[5] += 1.0  # block 0: an ordinary change
    a[BLOCK + 1] = b[BLOCK + 1] = np.nan  # block 1: equal NaNs are no difference
    a[2 * BLOCK + 2] = b[2 * BLOCK + 2] = np.inf  # block 2: the same infinity on both sides
    b[2 * BLOCK + 3] = -np.inf  # ... and one that changed
    fast = _accumulate([(a, b)], False)
    ref = _accumulate([(a, b)], True)
    assert fast["n_changed"] == ref["n_changed"] == 2
    assert fast["max_abs"] == ref["max_abs"] == np.inf
    b[3 * BLOCK + 4] = np.nan  # a one-sided NaN: max_abs is NaN, as in the general path
    fast = _accumulate([(a, b)], False)
    ref = _accumulate([(a, b)], True)
    assert fast["n_changed"] == ref["n_changed"] == 3
    assert math.isnan(fast["max_abs"]) and math.isnan(ref["max_abs"])
    # a NaN block first, ordinary blocks after: still NaN
    pairs = [(a[3 * BLOCK :], b[3 * BLOCK :]), (a[:BLOCK], b[:BLOCK])]
    assert math.isnan(_accumulate(pairs, False)["max_abs"])


def test_pieces_of_many_rows_equal_rows_one_by_one():
    """Values widened in pieces of many rows give what rows compared one at a time give: an
    ordinary piece, a piece with an equal-NaN row and one with a changed infinity, a short
    last row."""
    from ckptview.engine.diff import BLOCK
    from ckptview.engine.sums import PIECE

    rng = np.random.default_rng(4)
    n = 2 * PIECE + 3 * BLOCK + 11
    a = rng.standard_normal(n).astype(np.float32)
    b = a + np.float32(1e-3) * rng.standard_normal(n).astype(np.float32)

    def both(a, b):
        whole = _accumulate([(a, b)], False)
        pairs = [(a[i : i + BLOCK], b[i : i + BLOCK]) for i in range(0, n, BLOCK)]
        return whole, _accumulate(pairs, False)

    whole, rows = both(a, b)  # finite: every figure, to rounding
    assert all(math.isfinite(v) for v in whole.values())
    for k, v in rows.items():
        assert whole[k] == pytest.approx(v, rel=1e-12), k
    a[PIECE + 7] = b[PIECE + 7] = np.nan  # piece 1: equal NaNs are no difference
    whole, rows = both(a, b)
    for k in ("l2", "max_abs", "n_changed"):
        assert math.isfinite(whole[k]) and whole[k] == pytest.approx(rows[k], rel=1e-12), k
    assert whole["n_changed"] == int(np.count_nonzero(a != b)) - 1  # the NaN pair is equal
    a[2 * PIECE + BLOCK] = np.inf  # piece 2: an infinity that changed
    whole, rows = both(a, b)
    assert whole["l2"] == whole["max_abs"] == rows["l2"] == rows["max_abs"] == np.inf
    assert whole["n_changed"] == rows["n_changed"]


def test_diff_on_a_one_thread_executor_and_a_file_cut_after_listing(tmp_path):
    """Reads ahead run on their own threads: a one-worker executor cannot deadlock; a side
    failing mid-stream is an error row."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(5)
    s0 = {f"w{i}": rng.standard_normal(300_000).astype(np.float32) for i in range(3)}
    s1 = {k: v + 1 for k, v in s0.items()}
    root = write_fluid_tree(tmp_path / "t", {0: s0, 1: s1})
    with ThreadPoolExecutor(1) as ex:
        cat = cv.open(root, executor=ex, cache=False)
        assert len(cat.variables) == 6
        victim = root / "checkpoint_1" / "w1"
        victim.write_bytes(victim.read_bytes()[:600_000])
        df = cat.diff(0, 1, chunk_bytes=64 << 10).set_index("name")
    assert df.loc["w0", "status"] == df.loc["w2", "status"] == "changed"
    assert df.loc["w0", "max_abs"] == pytest.approx(1.0, rel=1e-6)
    assert df.loc["w1", "status"] == "error" and df.loc["w1", "error"]
