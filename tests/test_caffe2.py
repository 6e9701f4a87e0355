"""Caffe2 minidb codec and CheckpointManager layout, against the real corpus and bad input."""

from __future__ import annotations

import math
import os
import shutil
import struct
import tracemalloc
from functools import cache, lru_cache
from pathlib import Path

import fsspec
import numpy as np
import pandas as pd
import pytest
from conftest import corpus_path, ground_truth

import ckptview as cv
from ckptview.codecs.base import PartialRead
from ckptview.codecs.caffe2 import Caffe2Codec
from ckptview.formats.minidb import sniff
from ckptview.formats.protobuf import encode_varint as varint
from ckptview.io import Storage
from ckptview.layouts.caffe2 import Caffe2Layout, parse_name
from ckptview.tree import Tree

GT = "caffe2/ground_truth.json"
CODEC = Caffe2Codec()
TREES = {  # ground-truth file prefix -> tree root opened for it
    "ckpt/": "caffe2/ckpt",
    "extra/single_node/": "caffe2/extra/single_node",
    "extra/truncated/": "caffe2/extra/truncated",
    "extra/": "caffe2/extra",
}


@lru_cache(maxsize=1)
def truth() -> dict:
    return ground_truth(GT)


@cache
def catalog(root: str) -> cv.Catalog:
    return cv.open(str(corpus_path(root)))


def tree_of(rel: str) -> str:
    return next(root for prefix, root in TREES.items() if rel.startswith(prefix))


def file_rows(rel: str):
    cat = catalog(tree_of(rel))
    df = cat.variables
    return cat, df[df["file"].str.endswith("/caffe2/" + rel)]


def row_for(rows, name: str):
    hit = rows[(rows["name"] == name) | rows["name"].str.endswith("/" + name)]
    assert len(hit) == 1, (name, list(rows["name"]))
    return hit.iloc[0]


def index_tree(corpus_index: dict, root: str) -> dict:
    return next(t for t in corpus_index["trees"] if t["root"] == root)


# -- every blob of every corpus file ---------------------------------------------------------
@pytest.mark.parametrize("rel", sorted(ground_truth(GT)["files"]))
def test_every_blob_matches_ground_truth(rel):
    entry = truth()["files"][rel]
    cat, rows = file_rows(rel)
    for name, gt in entry["blobs"].items():
        if "shape" not in gt and gt["kind"] == "tensor":
            continue  # a blob Caffe2 could not load (cut file): checked in the truncation tests
        row = row_for(rows, name)
        assert pd.isna(row["error"]), (name, row["error"])
        value = cat.read(row["name"], serial=int(row["serial"]), node=row["node"])
        if gt["kind"] != "tensor":
            check_other_blob(row, value, gt)
            continue
        want_dtype = "object" if gt["dtype"] == "string" else gt["dtype"]
        assert (row["dtype"], row["shape"]) == (want_dtype, tuple(gt["shape"])), name
        assert value.shape == tuple(gt["shape"]) and value.dtype == np.dtype(want_dtype)
        assert row["numel"] == gt["numel"]
        if gt["dtype"] == "string":
            assert [v.hex() for v in value.ravel()] == gt["values_hex"]
            continue
        total = float(np.asarray(value, dtype=np.float64).sum())
        assert math.isclose(total, gt["sum"], rel_tol=1e-6, abs_tol=1e-9), name
        if "values" in gt:
            np.testing.assert_array_equal(value.astype(np.float64).ravel(), gt["values"])


def check_other_blob(row, value, gt) -> None:
    assert row["dtype"] == "object" and row["shape"] == ()
    item = value[()]
    if "tensor" in gt:  # Counter / TreeCursor carry an INT64 tensor
        assert item["type"] == gt["type"]
        np.testing.assert_array_equal(item["tensor"], gt["tensor"]["int64_data"])
        assert list(item["tensor"].shape) == gt["tensor"]["dims"]
    else:
        content = item["content"] if isinstance(item, dict) else item
        assert content.hex() == gt["content_hex"]


@pytest.mark.parametrize("rel", sorted(ground_truth(GT)["files"]))
def test_blob_names_and_record_counts(rel):
    entry = truth()["files"][rel]
    _, rows = file_rows(rel)
    names = set(rows["name"][rows["error"].isna()])
    for name in entry["blobs"]:  # a cut file's whole records are kept even where Caffe2 fails
        assert any(n == name or n.endswith("/" + name) for n in names), name
    assert len(rows[rows["error"].isna()]) == len(entry["blobs"])
    if entry.get("blob_names_value"):
        cat = catalog(tree_of(rel))
        row = row_for(rows, "blob_names")
        got = cat.read(row["name"], serial=int(row["serial"]), node=row["node"])
        assert [b.decode() for b in got] == entry["blob_names_value"]


def test_chunked_tensors_are_one_variable_reassembled_by_segment():
    entry = truth()["files"]["ckpt/trainer_0.3"]["blobs"]["trainer_0/model/fc1_w"]
    assert entry["n_records"] == 3
    cat = catalog("caffe2/ckpt")
    var = cat.variable("trainer_0/model/fc1_w", serial=3, node="trainer_0")
    assert var.attrs["n_records"] == 3 and var.shape == (50, 50)
    whole = cat.read("trainer_0/model/fc1_w", serial=3, node="trainer_0")
    pieces = list(cat.iter_chunks("trainer_0/model/fc1_w", serial=3, node="trainer_0"))
    assert [p.size for p in pieces] == [b - a for a, b in sorted(entry["segments"])]
    np.testing.assert_array_equal(np.concatenate(pieces), whole.ravel())
    # the default-size chunks of the 1,000,003-element bool tensor are out of order on disk
    big = truth()["files"]["extra/default_chunking.minidb"]["blobs"]["big/mask_bool"]
    assert big["segments"][0][0] > 0
    cat = catalog("caffe2/extra")
    mask = cat.read("default_chunking.minidb/big/mask_bool")
    assert mask.shape == (1_000_003,) and int(mask.sum()) == big["sum"]


def test_listing_reads_headers_only():
    path = str(corpus_path("caffe2/extra/default_chunking.minidb"))
    storage, _ = Storage.from_url(path)
    blob = storage.blob(path)
    variables = CODEC.list_variables(blob, {})
    assert [v.name for v in variables] == ["big/mask_bool", "big/small_f32"]
    assert storage.counters.bytes_read < 0.01 * blob.size  # measured: ~0.4 %


# -- serial tables -------------------------------------------------------------------------
@pytest.mark.parametrize("root", ["caffe2/ckpt", "caffe2/extra/single_node"])
def test_serial_table_matches_index(corpus_index, root):
    tree = index_tree(corpus_index, root)
    cat = catalog(root)
    df = cat.serials
    assert cat.layout == "caffe2"
    assert list(df.index) == tree["serials"]
    assert list(df.index[df["complete"]]) == tree["complete_serials"]
    assert cat.latest == tree["latest_resumable_serial"]
    assert df["latest"].sum() == 1
    for serial, facts in tree["per_serial"].items():
        assert df.loc[int(serial), "epoch"] == facts["epoch"]
        assert df.loc[int(serial), "nodes"] == tuple(sorted(tree["nodes"]))
        assert pd.isna(df.loc[int(serial), "error"])


@pytest.mark.parametrize("root", ["caffe2/ckpt", "caffe2/extra/single_node"])
def test_running_totals(corpus_index, root):
    tree = index_tree(corpus_index, root)
    cat = catalog(root)
    df = cat.variables
    totals = df[df["name"].str.endswith("/GivenTensorInt64Fill:0")]
    assert set(totals["node"]) == set(tree["nodes"])
    for serial, facts in tree["per_serial"].items():
        for row in totals[totals["serial"] == int(serial)].itertuples():
            got = cat.read(row.name, serial=int(serial), node=row.node)
            assert got.tolist() == [facts["running_total"]]


def test_loose_and_truncated_trees(corpus_index):
    extra = catalog("caffe2/extra")
    assert extra.layout == "files"  # loose minidb files: the fallback layout
    want = index_tree(corpus_index, "caffe2/extra")["files"]
    files = {os.path.basename(p) for p in extra.files["path"]}
    assert set(want) <= files
    trunc_tree = index_tree(corpus_index, "caffe2/extra/truncated")
    cat = catalog("caffe2/extra/truncated")
    errors = dict(zip(cat.files["path"].map(os.path.basename), cat.files["error"], strict=True))
    for name, outcome in trunc_tree["files_caffe2_load"].items():
        if name.endswith(".empty"):
            continue  # zero bytes, no .minidb suffix: no codec can tell it is a minidb
        # every cut is flagged, including the one Caffe2 itself loads as "ok"
        assert errors[name] and "truncated" in errors[name], (name, outcome)
    assert "silently" in errors["trainer_0.4.cut_in_key_len"]


# -- layout naming and detection -----------------------------------------------------------
def test_parse_name():
    assert parse_name("trainer:0.12") == ("trainer:0", 12)
    assert parse_name("a.b.c.3") == ("a.b.c", 3)
    assert parse_name("trainer_0.4.cut_in_key_len") is None
    assert parse_name("ckpt-3.index") is None
    assert parse_name(".3") is None


def mem_tree(files: dict[str, bytes], root: str = "/t") -> Tree:
    fs = fsspec.filesystem("memory")
    if fs.exists(root):
        fs.rm(root, recursive=True)
    for rel, data in files.items():
        fs.pipe(f"{root}/{rel}", data)
    return Tree(Storage(fs), root)


def test_layout_is_specific():
    good = corpus_path("caffe2/ckpt/trainer_0.0").read_bytes()
    layout = Caffe2Layout()
    others = {
        "checkpoint_0/__model__": b"\x0a\x00",
        "ckpt-3.index": b"\x00" * 40,
        "10/_METADATA": b"{}",
        "notes.1": b"hello world, not a checkpoint",
        "events.2": os.urandom(64),
    }
    assert not layout.guess_can_open(mem_tree(others))
    tree = mem_tree({**others, "node:a.b.7": good})
    assert layout.guess_can_open(tree)
    scan = layout.scan(tree)
    assert [s.serial for s in scan.serials] == [7]
    assert [f.node for f in scan.serials[0].files] == ["node:a.b"]


# -- damaged trees ------------------------------------------------------------------------------
def copy_ckpt(tmp_path: Path) -> Path:
    dst = tmp_path / "ckpt"
    shutil.copytree(corpus_path("caffe2/ckpt"), dst)
    for p in dst.iterdir():
        p.chmod(0o644)
    return dst


def test_damaged_tree_keeps_the_rest(tmp_path):
    root = copy_ckpt(tmp_path)
    data = (root / "trainer_1.4").read_bytes()
    (root / "trainer_1.4").write_bytes(data[: len(data) // 2])  # crash during Save
    (root / "trainer_1.2").unlink()  # a node's file missing
    (root / "trainer_0.5").write_bytes(b"")  # a save that never got its first record
    (root / "trainer_1.1").write_bytes(os.urandom(3000))
    cat = cv.open(str(root))
    df = cat.serials
    assert list(df.index) == [0, 1, 2, 3, 4, 5]
    assert list(df.index[df["complete"]]) == [0, 3]
    assert cat.latest == 3
    assert "trainer_1" in df.loc[2, "error"] and "trainer_1.4" in df.loc[4, "error"]
    assert "empty" in df.loc[5, "error"]
    assert df.loc[4, "nodes"] == ("trainer_0", "trainer_1")
    v = cat.variables
    assert len(v[(v["serial"] == 4) & (v["node"] == "trainer_0") & v["error"].isna()]) == 26
    # the records before the cut are kept and readable
    cut = v[(v["serial"] == 4) & (v["node"] == "trainer_1") & v["error"].isna()]
    assert 0 < len(cut) < 26
    for row in cut.itertuples():
        cat.read(row.name, serial=4, node="trainer_1")
    assert cat.read("val", serial=3, node="trainer_1").tolist() == list(range(10))


def list_bytes(data: bytes):
    """(variables, error message or None) for bytes given as a minidb file."""
    fs = fsspec.filesystem("memory")
    fs.pipe("/m/f.minidb", data)
    blob = Storage(fs).blob("/m/f.minidb")
    try:
        return CODEC.list_variables(blob, {}), None, blob
    except PartialRead as e:
        return e.variables, str(e), blob


def complete_blobs(records: list[dict], cut: int) -> set[str]:
    done, cut_off = set(), set()
    for r in records:
        name = r["key"].split("#%", 1)[0]
        (done if r["offset"] + 8 + r["key_len"] + r["value_len"] <= cut else cut_off).add(name)
    return done - cut_off


@pytest.mark.parametrize("rel", ["extra/edge_cases.minidb", "ckpt/trainer_0.4"])
def test_cut_at_every_offset(rel):
    data = corpus_path("caffe2", rel).read_bytes()
    records = truth()["files"][rel]["records"]
    boundaries = {r["offset"] for r in records}
    step = 1 if len(data) < 2000 else 37
    near = {b + d for b in boundaries for d in (-1, 0, 1, 3, 4, 5, 8, 9)}  # lengths, key, value
    for cut in sorted({*range(0, len(data), step), *near, len(data)} & set(range(len(data) + 1))):
        variables, error, blob = list_bytes(data[:cut])
        good = {v.name for v in variables if v.error is None}
        assert good == complete_blobs(records, cut), cut
        if cut == len(data):
            assert error is None
        elif cut not in boundaries or cut == 0:
            assert error, cut
        for v in variables:
            if v.error is None:
                CODEC.read(blob, v)


def test_record_boundary_cut_caught_by_blob_names():
    data = corpus_path("caffe2/ckpt/trainer_0.4").read_bytes()
    last = truth()["files"]["ckpt/trainer_0.4"]["records"][-1]
    assert not last["key"].startswith("blob_names")
    _, error, _ = list_bytes(data[: last["offset"]])
    assert "blob_names lists 1 blob" in error


# -- hand-made records ---------------------------------------------------------------------


def fld(number: int, payload: bytes | int) -> bytes:
    if isinstance(payload, int):
        return varint(number << 3) + varint(payload)
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def record(key: str, value: bytes) -> bytes:
    k = key.encode()
    return struct.pack("<ii", len(k), len(value)) + k + value


def tensor_record(name: str, dims, data_type: int, *fields: bytes, key=None, segment=None):
    body = b"".join(fld(1, d) for d in dims) + fld(2, data_type) + b"".join(fields)
    if segment is not None:
        body += fld(11, fld(1, segment[0]) + fld(2, segment[1]))
    blob = fld(1, name.encode()) + fld(2, b"Tensor") + fld(3, body)
    return record(key or f"{name}#%0", blob)


def test_hand_made_encodings():
    unpacked_floats = b"".join(b"\x1d" + struct.pack("<f", x) for x in (1.5, -2.0, 4.0))
    data = (
        tensor_record("unpacked_f32", [3], 1, unpacked_floats)
        + tensor_record("packed_dims", [], 10, fld(1, varint(2) + varint(2)),
                        fld(10, b"".join(varint(x) for x in (-1, 2, -3, 4))))
        + tensor_record("i32", [2], 2, fld(4, varint(-5) + varint(7)), key="i32")  # bare key
        + tensor_record("c", [4], 10, fld(10, varint(3) + varint(4)), key="c#%1", segment=(2, 4))
        + tensor_record("c", [4], 10, fld(10, varint(1) + varint(2)), key="c#%0", segment=(0, 2))
    )  # fmt: skip
    variables, error, blob = list_bytes(data)
    assert error is None
    got = {v.name: CODEC.read(blob, v) for v in variables}
    assert got["unpacked_f32"].tolist() == [1.5, -2.0, 4.0]
    assert got["packed_dims"].tolist() == [[-1, 2], [-3, 4]]
    assert got["i32"].dtype == np.int32 and got["i32"].tolist() == [-5, 7]
    assert got["c"].tolist() == [1, 2, 3, 4]


def test_chunk_missing_or_overlapping_is_an_error():
    one = tensor_record("c", [4], 10, fld(10, varint(3) + varint(4)), key="c#%1", segment=(2, 4))
    variables, error, _ = list_bytes(one)
    assert "chunks cover" in variables[0].error and "chunks cover" in error
    twice = one + one
    variables, error, _ = list_bytes(twice)
    assert variables[0].error and error


def test_hostile_lengths_give_error_rows_and_bounded_memory():
    good = tensor_record("ok", [2], 10, fld(10, varint(1) + varint(2)))
    huge_value = struct.pack("<ii", 4, 2**31 - 1) + b"k#%0" + b"\x0a" * 64
    huge_dims = tensor_record("huge", [1 << 20, 1 << 20], 1, fld(3, b"\x00" * 8))
    negative = struct.pack("<ii", -5, 10) + b"x" * 32
    tracemalloc.start()
    try:
        for tail, words in ((huge_value, "needs"), (huge_dims, "claim"), (negative, "corrupt")):
            variables, error, blob = list_bytes(good + tail)
            assert words in error, error
            assert variables[0].name == "ok" and CODEC.read(blob, variables[0]).tolist() == [1, 2]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20


def test_garbage_files(tmp_path):
    assert not sniff(b"")
    assert not sniff(os.urandom(16) + b"\xff" * 4096)
    root = copy_ckpt(tmp_path)
    (root / "random.minidb").write_bytes(os.urandom(5000))
    (root / "zero.minidb").write_bytes(b"")
    cat = cv.open(str(root / "random.minidb"))
    df = cat.variables
    assert len(df) == 1 and df["error"].iloc[0]
    cat = cv.open(str(root / "zero.minidb"))
    assert "empty" in cat.variables["error"].iloc[0]
    # an undecodable BlobProto inside a well-framed record: that record is an error, rest kept
    good = tensor_record("ok", [1], 10, fld(10, varint(9)))
    bad = record("bad#%0", b"\x0a\xff\xff\xff\xff\x0f")
    variables, error, _ = list_bytes(bad + good)
    assert "undecodable" in error and [v.name for v in variables if not v.error] == ["ok"]


def test_opaque_blobs_and_single_file_tree(tmp_path):
    qtensor = fld(1, varint(2)) + fld(2, 8) + fld(5, 1)
    q = record("q", fld(1, b"q") + fld(2, b"Int8TensorCPU") + fld(5, qtensor))
    s = record("s", fld(1, b"s") + fld(2, b"std::string") + fld(4, b"abc"))
    variables, error, blob = list_bytes(q + s)
    assert error is None
    by_name = {v.name: v for v in variables}
    assert by_name["q"].attrs["blob_type"] == "Int8TensorCPU" and by_name["q"].dtype == "object"
    assert CODEC.read(blob, by_name["q"])[()] == qtensor
    assert CODEC.read(blob, by_name["s"])[()] == b"abc" and by_name["s"].nbytes == 3
    cat = cv.open(str(corpus_path("caffe2/extra/edge_cases.minidb")))
    assert cat.read("edge/i64_scalar").tolist() == -42
    cat = cv.open(str(corpus_path("caffe2/ckpt/trainer_1.2")))
    assert list(cat.serials.index) == [2] and cat.latest == 2
