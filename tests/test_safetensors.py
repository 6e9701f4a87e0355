"""safetensors codec and the bare sharded-model layout, on the real corpus and on hostile bytes."""

from __future__ import annotations

import json
import struct
import tracemalloc

import ml_dtypes
import numpy as np
import pandas as pd
import pytest
from conftest import corpus_path, ground_truth

import ckptview as cv
from ckptview.codecs.safetensors import SafetensorsCodec
from ckptview.io import Storage

GT = "modern/ground_truth.json"


def gt_file(rel: str) -> dict:
    return ground_truth(GT)["files"][rel]


def assert_matches_gt(cat, rel: str, prefix: str = "") -> None:
    rows = cat.variables
    rows = rows[rows["file"].str.endswith(rel.split("/")[-1])]
    for t in gt_file(rel)["tensors"]:
        row = rows[rows["name"] == prefix + t["key"]]
        assert len(row) == 1, t["key"]
        row = row.iloc[0]
        assert row["dtype"] == t["dtype"] and row["shape"] == tuple(t["shape"]), t["key"]
        assert row["nbytes"] == t["nbytes"] and pd.isna(row["error"])
        values = cat.read(row["name"], serial=int(row["serial"]))
        assert values.dtype.name == t["dtype"] and values.shape == tuple(t["shape"])
        assert np.asarray(values, dtype=np.float64).sum() == pytest.approx(t["sum"], rel=1e-6)


def st_bytes(tensors: dict[str, tuple[str, list, bytes]], meta: dict | None = None) -> bytes:
    """A safetensors file: name -> (dtype code, shape, raw bytes)."""
    header, buf = {}, b""
    if meta is not None:
        header["__metadata__"] = meta
    for name, (code, shape, raw) in tensors.items():
        header[name] = {
            "dtype": code,
            "shape": shape,
            "data_offsets": [len(buf), len(buf) + len(raw)],
        }
        buf += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + buf


# -- the corpus --------------------------------------------------------------------------------
def test_single_file_every_tensor_and_metadata():
    cat = cv.open(corpus_path("modern/safetensors/single"))
    assert_matches_gt(cat, "safetensors/single/model.safetensors")
    meta = gt_file("safetensors/single/model.safetensors")["metadata"]
    assert all(a["metadata"] == meta for a in (v.attrs for v in _vars(cat)))


def _vars(cat):
    cat.variables  # noqa: B018 - builds the index
    return [cat.variable(n, serial=0) for n in cat.variables["name"]]


def test_sharded_dir_has_logical_names():
    cat = cv.open(corpus_path("modern/safetensors/sharded"))
    assert cat.layout == "safetensors-sharded"
    index = gt_file("safetensors/sharded/model.safetensors.index.json")["content"]
    assert sorted(cat.variables["name"]) == sorted(index["weight_map"])
    for shard in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        assert_matches_gt(cat, f"safetensors/sharded/{shard}")
    assert cat.attrs["metadata"]["step"] == index["metadata"]["step"]
    assert list(cat.serials.index) == [0]


def test_listing_reads_exactly_the_header():
    path = corpus_path("modern/safetensors/single/model.safetensors")
    info = gt_file("safetensors/single/model.safetensors")
    storage, p = Storage.from_url(str(path))
    blob = storage.blob(p)
    assert blob.size == info["size"] > 4096  # no head-block caching in play
    SafetensorsCodec().list_variables(blob, {})
    assert storage.counters.requests == 2
    assert storage.counters.bytes_read == 8 + info["header_len"]


def test_catalog_scan_reads_headers_only():
    cat = cv.open(corpus_path("modern/safetensors/sharded"))
    # counted from open: detection already scans the layout (its reads count once)
    cat.variables  # noqa: B018
    shards = [gt_file(f"safetensors/sharded/model-0000{i}-of-00002.safetensors") for i in (1, 2)]
    index = gt_file("safetensors/sharded/model.safetensors.index.json")
    # the index once, then two reads per shard: the length and the JSON header
    assert cat.storage.counters.requests == 1 + 2 * len(shards)
    want = index["size"] + sum(8 + s["header_len"] for s in shards)
    assert cat.storage.counters.bytes_read == want


# -- every dtype, by hand ----------------------------------------------------------------------
def test_all_dtypes_round_trip(tmp_path):
    arrays = {
        "F64": np.array([1.5, -2.0]), "F32": np.array([0.25], np.float32),
        "F16": np.array([3.0, 4.0], np.float16),
        "BF16": np.array([1.0, -0.5], ml_dtypes.bfloat16),
        "I64": np.array([-7], np.int64), "I32": np.array(5, np.int32),
        "I16": np.array([300], np.int16), "I8": np.array([-3], np.int8),
        "U64": np.array([2**40], np.uint64), "U32": np.array([7], np.uint32),
        "U16": np.array([65535], np.uint16), "U8": np.array([9], np.uint8),
        "BOOL": np.array([True, False, True]),
        "F8_E4M3": np.array([0.5, 2.0], ml_dtypes.float8_e4m3fn),
        "F8_E5M2": np.array([-4.0], ml_dtypes.float8_e5m2),
        "C64": np.array([1 + 2j], np.complex64),
    }  # fmt: skip
    tensors = {code: (code, list(a.shape), a.tobytes()) for code, a in arrays.items()}
    (tmp_path / "all.safetensors").write_bytes(st_bytes(tensors, {"format": "pt"}))
    cat = cv.open(tmp_path / "all.safetensors")
    for code, a in arrays.items():
        got = cat.read(code)
        assert got.dtype == a.dtype and got.shape == a.shape, code
        np.testing.assert_array_equal(got.astype(np.complex128), a.astype(np.complex128))


def test_unknown_dtype_is_an_error_safe_open_would_raise(tmp_path):
    """safetensors refuses a dtype it does not define: listed (bytes, shape), in error, and
    the serial does not load (DESIGN.md §3c)."""
    (tmp_path / "x.safetensors").write_bytes(st_bytes({"q": ("F3_NEW", [4], b"\x12\x34")}))
    cat = cv.open(tmp_path / "x.safetensors")
    row = cat.variables.iloc[0]
    assert row["dtype"] == "object" and row["nbytes"] == 2
    assert "unknown safetensors dtype 'F3_NEW'" in row["error"]
    assert not cat.serials["loadable"].any()
    with pytest.raises(ValueError, match="unknown safetensors dtype"):
        cat.read("q")


# -- bad input ---------------------------------------------------------------------------------
def error_of(path) -> str:
    cat = cv.open(path)
    v = cat.variables
    assert len(v) == 1 and v["error"].iloc[0], v
    return v["error"].iloc[0]


def test_truncated_header(tmp_path):
    good = st_bytes({"w": ("F32", [2], b"\0" * 8)})
    (tmp_path / "t.safetensors").write_bytes(good[:20])
    assert "past the end" in error_of(tmp_path / "t.safetensors")


def test_header_claiming_terabytes(tmp_path):
    (tmp_path / "huge.safetensors").write_bytes(struct.pack("<Q", 1 << 42) + b'{"a": 1}')
    tracemalloc.start()
    msg = error_of(tmp_path / "huge.safetensors")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert "exceeds" in msg and peak < 50 << 20


def test_tensor_claiming_terabytes(tmp_path):
    header = json.dumps({"w": {"dtype": "F32", "shape": [1 << 38], "data_offsets": [0, 1 << 40]}})
    data = struct.pack("<Q", len(header)) + header.encode() + b"\0" * 16
    (tmp_path / "big.safetensors").write_bytes(data)
    cat = cv.open(tmp_path / "big.safetensors")
    v = cat.variables
    assert v["error"].iloc[0] and "truncated" in v["error"].iloc[0]
    assert cat.serials["complete"].tolist() == [False]


def test_zero_bytes_and_random_bytes(tmp_path):
    (tmp_path / "empty.safetensors").write_bytes(b"")
    assert error_of(tmp_path / "empty.safetensors")
    rng = np.random.default_rng(0)
    (tmp_path / "noise.safetensors").write_bytes(rng.bytes(5000))
    assert error_of(tmp_path / "noise.safetensors")
    (tmp_path / "notjson.safetensors").write_bytes(struct.pack("<Q", 8) + b"{{{{{{{{")
    assert "JSON" in error_of(tmp_path / "notjson.safetensors")


def test_partial_file_keeps_tensors_before_the_cut(tmp_path):
    data = st_bytes({"a": ("F32", [2], np.ones(2, np.float32).tobytes()),
                     "b": ("F32", [4], np.ones(4, np.float32).tobytes())})  # fmt: skip
    (tmp_path / "cut.safetensors").write_bytes(data[:-4])
    cat = cv.open(tmp_path / "cut.safetensors")
    v = cat.variables.set_index("name")
    assert pd.isna(v.loc["a", "error"]) and cat.read("a").tolist() == [1.0, 1.0]
    assert "truncated" in v.loc["cut.safetensors", "error"]


def test_size_mismatch_and_bad_entries(tmp_path):
    header = {
        "short": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]},
        "neg": {"dtype": "F32", "shape": [-1], "data_offsets": [8, 12]},
        "back": {"dtype": "U8", "shape": [1], "data_offsets": [12, 11]},
    }
    text = json.dumps(header).encode()
    (tmp_path / "bad.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + b"\0" * 16)
    v = cv.open(tmp_path / "bad.safetensors").variables.set_index("name")
    assert "needs 16 bytes" in v.loc["short", "error"]
    assert "bad shape" in v.loc["neg", "error"]
    assert "decrease" in v.loc["back", "error"]
