"""NumPy ``.npy`` / ``.npz`` codecs: the npz corpus, every header version, big-endian and
Fortran order, deflated members read lazily, and hostile files."""

from __future__ import annotations

import io
import struct
import tracemalloc
import zipfile

import numpy as np
import pandas as pd
import pytest
from conftest import corpus_path, ground_truth

import ckptview as cv
from ckptview.codecs.numpy import NpzCodec
from ckptview.io import Storage


def npy_bytes(arr: np.ndarray, version=(1, 0)) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, arr, version=version)
    return buf.getvalue()


# -- the corpus --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name", ["step_100.npz", "step_200.npz", "step_300.npz", "step_300_compressed.npz"]
)
def test_corpus_npz_every_member(name):
    gt = ground_truth("modern/ground_truth.json")["files"][f"npz/{name}"]
    cat = cv.open(corpus_path("modern/npz", name))
    v = cat.variables.set_index("name")
    assert len(v) == len(gt["tensors"])
    for t in gt["tensors"]:
        row = v.loc[t["key"]]
        assert row["dtype"] == t["dtype"] and row["shape"] == tuple(t["shape"]), t["key"]
        assert row["nbytes"] == t["nbytes"] and pd.isna(row["error"])
        arr = cat.read(t["key"])
        assert arr.shape == tuple(t["shape"]) and arr.dtype.name == t["dtype"]
        assert float(np.asarray(arr, np.float64).sum()) == pytest.approx(t["sum"], rel=1e-9)
        assert arr.flags.f_contiguous if t["fortran_order"] and arr.ndim > 1 else True
        chunks = list(cat.iter_chunks(t["key"], max_bytes=16))
        assert np.concatenate([c.reshape(-1) for c in chunks]).sum() == pytest.approx(t["sum"])


def test_compressed_listing_inflates_only_headers(tmp_path):
    rng = np.random.default_rng(1)
    big = rng.standard_normal((512, 512)).astype(np.float32)  # 1 MiB, barely compressible
    np.savez_compressed(tmp_path / "c.npz", big=big, small=np.arange(3))
    storage, p = Storage.from_url(str(tmp_path / "c.npz"))
    blob = storage.blob(p)
    found = {v.name: v for v in NpzCodec().list_variables(blob, {})}
    assert found["big"].shape == (512, 512) and found["big"].dtype == "float32"
    assert storage.counters.bytes_read < 64 << 10 < blob.size
    np.testing.assert_array_equal(NpzCodec().read(blob, found["big"]), big)
    pieces = list(NpzCodec().iter_chunks(blob, found["big"], 100_000))
    assert max(p.nbytes for p in pieces) <= 100_000
    np.testing.assert_array_equal(np.concatenate(pieces), big.reshape(-1))


def test_stored_members_are_spans(tmp_path):
    arr = np.arange(10, dtype=">i4")
    np.savez(tmp_path / "s.npz", a=arr)
    cat = cv.open(tmp_path / "s.npz")
    var = cat.variable("a", serial=0)
    assert var.span is not None and var.span.disk_dtype == ">i4" and var.dtype == "int32"
    data = (tmp_path / "s.npz").read_bytes()
    assert data[var.span.offset : var.span.offset + 40] == arr.tobytes()
    assert cat.read("a").tolist() == list(range(10))


# -- .npy --------------------------------------------------------------------------------------
@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_npy_versions_orders_and_byte_orders(tmp_path, version):
    cases = {
        "c": np.arange(12, dtype="<f8").reshape(3, 4),
        "f": np.asfortranarray(np.arange(12, dtype="<i2").reshape(3, 4)),
        "be": np.arange(6, dtype=">f4").reshape(2, 3),
        "scalar": np.array(7, dtype=np.int64),
        "empty": np.zeros((0, 5), dtype=np.float32),
        "bools": np.array([True, False, True]),
    }
    for name, arr in cases.items():
        path = tmp_path / f"{name}.npy"
        path.write_bytes(npy_bytes(arr, version))
        cat = cv.open(path)
        row = cat.variables.iloc[0]
        assert row["name"] == f"{name}.npy"  # an unnamed tensor is named after its file
        assert row["shape"] == arr.shape and row["dtype"] == arr.dtype.newbyteorder("=").name
        got = cat.read(f"{name}.npy")
        np.testing.assert_array_equal(got, arr)
        assert got.dtype.isnative


def test_npy_fixed_width_strings_keep_their_dtype(tmp_path):
    """``<U3`` is numpy's ``str96`` (3 UCS-4 characters), ``|S3`` its ``bytes24``: sized and
    read like any array, with no numeric statistics."""
    (tmp_path / "s.npy").write_bytes(npy_bytes(np.array(["ab", "cde"])))
    (tmp_path / "b.npy").write_bytes(npy_bytes(np.array([b"ab", b"cde"])))
    cat = cv.open(tmp_path)
    v = cat.variables.set_index("name")
    assert (v.loc["s.npy", "dtype"], v.loc["s.npy", "nbytes"]) == ("str96", 2 * 12)
    assert (v.loc["b.npy", "dtype"], v.loc["b.npy", "nbytes"]) == ("bytes24", 2 * 3)
    assert cat.read("s.npy").tolist() == ["ab", "cde"]
    assert cat.read("b.npy").tolist() == [b"ab", b"cde"]
    st = cat.stats().set_index("name")
    assert st["l2"].isna().all() and st["error"].isna().all()


# -- bad input ---------------------------------------------------------------------------------
def error_of(path) -> str:
    v = cv.open(path).variables
    assert len(v) == 1 and isinstance(v["error"].iloc[0], str), v
    return v["error"].iloc[0]


def test_object_array_is_refused_never_unpickled(tmp_path):
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    (tmp_path / "obj.npy").write_bytes(buf.getvalue())
    assert "pickle" in error_of(tmp_path / "obj.npy")
    np.savez(tmp_path / "obj.npz", ok=np.arange(2), bad=np.array([1, "x"], dtype=object))
    v = cv.open(tmp_path / "obj.npz").variables.set_index("name")
    assert pd.isna(v.loc["ok", "error"]) and "pickle" in v.loc["bad", "error"]
    # listed with the shape its header states (2 elements each), never read
    assert v.loc["bad", "shape"] == (2,) and v.loc["bad", "dtype"] == "object"
    assert cv.open(tmp_path / "obj.npy").variables["shape"].iloc[0] == (2,)


def test_python2_header_with_long_integers(tmp_path):
    """Python 2's numpy wrote ``repr`` of longs: ``'shape': (2L, 3L)``."""
    header = b"{'descr': '<f8', 'fortran_order': False, 'shape': (2L, 3L), }"
    header += b" " * (-(10 + len(header) + 1) % 64) + b"\n"
    data = np.arange(6, dtype="<f8").tobytes()
    raw = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + data
    (tmp_path / "py2.npy").write_bytes(raw)
    cat = cv.open(tmp_path / "py2.npy")
    row = cat.variables.iloc[0]
    assert row["shape"] == (2, 3) and row["dtype"] == "float64" and pd.isna(row["error"])
    assert cat.read("py2.npy").tolist() == [[0, 1, 2], [3, 4, 5]]


def test_zero_random_and_truncated(tmp_path):
    (tmp_path / "zero.npy").write_bytes(b"")
    assert "empty" in error_of(tmp_path / "zero.npy")
    (tmp_path / "noise.npy").write_bytes(np.random.default_rng(0).bytes(300))
    assert error_of(tmp_path / "noise.npy")
    full = npy_bytes(np.arange(100, dtype=np.float64))
    (tmp_path / "cut.npy").write_bytes(full[:-8])
    assert "file has" in error_of(tmp_path / "cut.npy")
    (tmp_path / "noise.npz").write_bytes(b"PK\x03\x04" + np.random.default_rng(1).bytes(200))
    assert "zip" in error_of(tmp_path / "noise.npz")


def test_header_claiming_terabytes(tmp_path):
    header = "{'descr': '<f8', 'fortran_order': False, 'shape': (1099511627776, 1024), }"
    header += " " * (-(len(header) + 11) % 64) + "\n"
    data = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + b"\0" * 64
    (tmp_path / "huge.npy").write_bytes(data)
    tracemalloc.start()
    assert "file has" in error_of(tmp_path / "huge.npy")
    assert tracemalloc.get_traced_memory()[1] < 50 << 20
    tracemalloc.stop()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("huge.npy", data)
    (tmp_path / "huge.npz").write_bytes(buf.getvalue())
    assert "shorter than its header" in error_of(tmp_path / "huge.npz")


def test_corrupt_deflate_stream(tmp_path):
    np.savez_compressed(tmp_path / "c.npz", a=np.arange(1000.0))
    data = bytearray((tmp_path / "c.npz").read_bytes())
    data[1100:1400] = b"\xff" * 300  # the member's deflate stream, after its npy header
    (tmp_path / "c.npz").write_bytes(bytes(data))
    cat = cv.open(tmp_path / "c.npz")
    assert pd.isna(cat.variables["error"].iloc[0])  # listing inflates only the header
    with pytest.raises(ValueError, match="CRC|deflate|ends early"):
        cat.read("a")
    with pytest.raises(ValueError, match="CRC|deflate|ends early"):
        list(cat.iter_chunks("a", max_bytes=64))


@pytest.mark.parametrize("compressed", [False, True])
def test_npz_listing_reads_each_byte_once(tmp_path, compressed):
    """The zip directory is parsed from ranged reads (no zipfile): a small archive costs its
    cached head only, a big one its tail, directory and the members' first bytes."""
    small, big = tmp_path / "small.npz", tmp_path / "big.npz"
    save = np.savez_compressed if compressed else np.savez
    save(small, a=np.arange(10.0), b=np.ones((2, 3), dtype=">i4"))
    rng = np.random.default_rng(0)
    save(big, **{f"w{i}": rng.standard_normal(20_000).astype("<f4") for i in range(8)})
    for path in (small, big):
        cat = cv.open(str(path), cache=False)
        assert cat.variables["error"].isna().all()
        got = cat.storage.counters.bytes_read
        assert got <= path.stat().st_size
        if path is big:
            assert got < 16 << 10, got
    cat = cv.open(str(small), cache=False)
    np.testing.assert_array_equal(cat.read("b"), np.ones((2, 3)))
