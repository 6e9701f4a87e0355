"""TensorFlow tensor bundles (codec ``tf``) and checkpoint directories (layout ``tf``)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import tracemalloc
from datetime import datetime, timezone
from pathlib import Path

import cramjam
import numpy as np
import pandas as pd
import pytest
from conftest import corpus_path, ground_truth

import ckptview as cv
from ckptview.codecs import tf as tfc
from ckptview.formats import sstable, tf_bundle
from ckptview.formats.protobuf import encode_varint as _varint
from ckptview.io import Storage
from ckptview.scan.checks import SMALL_CHECK

TF_GT = "tf_orbax/tf/ground_truth.json"
MODERN_GT = "modern/ground_truth.json"
GT_DTYPE = {"string": "object"}


def _index_trees() -> list[dict]:
    index = json.loads(corpus_path("INDEX.json").read_text())
    return [t for t in index["trees"] if t["family"] == "tf" and not t.get("hostile")]


def _gt_bundles() -> dict[str, list[dict]]:
    """corpus-relative .index path -> ground-truth tensors."""
    out = {f"tf_orbax/tf/{p}.index": es for p, es in ground_truth(TF_GT)["checkpoints"].items()}
    for rel, entry in ground_truth(MODERN_GT)["files"].items():
        if entry.get("format") == "tf_bundle_index":
            out[f"modern/{rel}"] = entry["tensors"]
    return out


def _copy(tree: str, tmp_path: Path) -> Path:
    dst = tmp_path / Path(tree).name
    shutil.copytree(corpus_path(tree), dst)
    for p in [dst, *dst.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    return dst


# -- corpus: serials and every tensor ----------------------------------------------------------
@pytest.mark.parametrize("tree", _index_trees(), ids=lambda t: t["root"])
def test_serials_match_index(tree):
    cat = cv.open(corpus_path(tree["root"]))
    assert cat.layout == "tf"
    df = cat.serials
    assert sorted(df.index) == sorted(tree["serials"])
    assert sorted(df.index[df["complete"]]) == sorted(tree["complete_serials"])
    assert cat.latest == tree["latest_resumable_serial"]
    assert df["error"].isna().all()


@pytest.mark.parametrize("rel", sorted(_gt_bundles()))
def test_every_ground_truth_tensor(rel):
    tensors = _gt_bundles()[rel]
    index = corpus_path(rel)
    cat = cv.open(index.parent)
    serial = int(index.name[len("ckpt-") : -len(".index")])
    rows = cat.variables[cat.variables["serial"] == serial].set_index("name")
    assert set(rows.index) == {t["key"] for t in tensors}
    assert rows["error"].isna().all()
    assert (rows["file"] == str(index)).all()
    for t in tensors:
        row = rows.loc[t["key"]]
        assert row["dtype"] == GT_DTYPE.get(t["dtype"], t["dtype"]), t["key"]
        assert row["shape"] == tuple(t["shape"]), t["key"]
        value = cat.read(t["key"], serial=serial)
        assert value.shape == tuple(t["shape"])
        if t.get("sum") is not None:
            assert float(np.asarray(value, dtype=np.float64).sum()) == pytest.approx(t["sum"])
            assert row["nbytes"] == t["nbytes"]
        for i, digest in enumerate(t.get("string_sha256", [])):
            assert hashlib.sha256(value.reshape(-1)[i]).hexdigest() == digest
        if "values" in t:
            assert [v.decode() for v in value.reshape(-1)] == t["values"]


def test_timestamps_from_state_file():
    states = ground_truth(TF_GT)["checkpoint_states"]
    for run, state in states.items():
        cat = cv.open(corpus_path("tf_orbax/tf", run))
        for path, stamp in zip(
            state["all_model_checkpoint_paths"], state["all_model_checkpoint_timestamps"]
        ):
            serial = int(path.rsplit("-", 1)[1])
            got = cat.serials.loc[serial, "timestamp"]
            assert got == datetime.fromtimestamp(stamp, tz=timezone.utc)


def test_partitioned_tensors_reassembled():
    cat = cv.open(corpus_path("tf_orbax/tf/run2_sharded"))
    var = cat.variable("m/a/.ATTRIBUTES/VARIABLE_VALUE")
    assert var.attrs["partitioned"] == 4 and var.span is None
    a = cat.read("m/a/.ATTRIBUTES/VARIABLE_VALUE")
    # the ground-truth sum 4498500 is sum(range(3000)): the generator wrote arange(3000)
    assert np.array_equal(a, np.arange(3000, dtype=np.float32).reshape(30, 100))
    c = cat.read("m/c/.ATTRIBUTES/VARIABLE_VALUE")  # slices spread over shards 3 and 4
    assert np.array_equal(c, np.arange(500))
    chunks = list(cat.iter_chunks("m/b/.ATTRIBUTES/VARIABLE_VALUE", max_bytes=1024))
    assert np.concatenate(chunks).sum() == 2000.0


def test_object_graph_names():
    """With ``object_graph=True`` the readable names land in attrs (off by default)."""
    storage, _ = Storage.from_url("/")
    expected = ground_truth(TF_GT)["object_graph_attributes"]
    for prefix, attrs in expected.items():
        blob = storage.blob(str(corpus_path("tf_orbax/tf", prefix + ".index")))
        plain = {v.name: v for v in tfc.TFBundleCodec().list_variables(blob, {})}
        assert all("full_name" not in v.attrs for v in plain.values())
        named = {
            v.name: v for v in tfc.TFBundleCodec().list_variables(blob, {"object_graph": True})
        }
        for a in attrs:
            assert named[a["checkpoint_key"]].attrs["full_name"] == a["full_name"]
    cat = cv.open(corpus_path("tf_orbax/tf/run1"))
    df = cat.variables
    kinds = df[df["serial"] == 5].set_index("name")["kind"]
    assert kinds["optimizer/_trainable_variables/0/.ATTRIBUTES/VARIABLE_VALUE"] == "model"
    assert kinds["optimizer/_variables/2/.ATTRIBUTES/VARIABLE_VALUE"] == "optimizer"
    assert kinds["save_counter/.ATTRIBUTES/VARIABLE_VALUE"] == "trainer"


def test_catalog_reads_the_index_and_only_the_object_graph(monkeypatch):
    seen: list[tuple[str, int]] = []
    original = Storage.read_range

    def spy(self, path, start, end):
        data = original(self, path, start, end)
        seen.append((path, len(data)))
        return data

    monkeypatch.setattr(Storage, "read_range", spy)
    root = corpus_path("tf_orbax/tf/run2_sharded")
    cat = cv.open(root, cache=False)
    assert len(cat.variables) == 7
    listed = list(seen)
    index = root / "ckpt-7.index"
    # from the data shards: one read, of exactly the object graph's bytes (readable names)
    graph = cat.variable("_CHECKPOINTABLE_OBJECT_GRAPH").locator.span  # a string tensor
    assert [(p, n) for p, n in listed if ".data-" in p] == [(graph.path, graph.length)]
    assert [n for p, n in listed if p == str(index)] == [index.stat().st_size]  # one request
    assert {p for p, _ in listed if ".data-" not in p} == {str(index), str(root / "checkpoint")}
    # the verdict: TF's reader checks every entry's crc32c, and these shards are small
    # (scan.checks.SMALL_CHECK), so each entry's bytes are read once for it, nothing else
    assert len(cat.serials) == 1 and cat.serials["loadable"].all()
    shards = {p for p, _ in seen[len(listed) :]}
    assert shards and all(".data-" in p and Path(p).stat().st_size <= SMALL_CHECK for p in shards)
    entries = [length for r in cat._scan.file_results() for v in r.variables
               for length in _entry_lengths(v)]  # fmt: skip
    assert sum(n for _, n in seen[len(listed) :]) == sum(entries)


def _entry_lengths(var) -> list[int]:
    """The bytes of each bundle entry a catalog variable stands for (a sliced variable: its
    slices')."""
    if var.span is not None:
        return [var.span.length]
    pieces = getattr(var.locator, "pieces", None)
    if pieces is not None:
        return [n for _, piece in pieces for n in _entry_lengths(piece)]
    return [var.locator.span.length]


# -- a hand-built bundle: SSTable writer for odd and hostile input -------------------------------


def _mask(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _block(entries: list[tuple[bytes, bytes]]) -> bytes:
    body = b"".join(_varint(0) + _varint(len(k)) + _varint(len(v)) + k + v for k, v in entries)
    return body + struct.pack("<II", 0, 1)


def _table(entries: list[tuple[bytes, bytes]], snappy: bool = False) -> bytes:
    out = bytearray()

    def put(block: bytes, compress: bool = False) -> bytes:
        kind = 0
        if compress:
            block, kind = bytes(cramjam.snappy.compress_raw(block)), 1
        handle = _varint(len(out)) + _varint(len(block))
        out.extend(block + bytes([kind]))
        out.extend(struct.pack("<I", _mask(sstable.crc32c(block + bytes([kind])))))
        return handle

    data = put(_block(entries), snappy)
    meta = put(_block([]))
    index = put(_block([(entries[-1][0] + b"\xff", data)]))
    footer = (meta + index).ljust(40, b"\0") + struct.pack("<Q", sstable.TABLE_MAGIC)
    return bytes(out + footer)


def _shape(*dims: int) -> bytes:
    return b"".join(b"\x12" + _varint(len(d)) + d for d in (b"\x08" + _varint(n) for n in dims))


def _entry(dtype: int, dims: tuple, offset: int, size: int, shard: int = 0, slices=()) -> bytes:
    shape = _shape(*dims)
    out = b"\x08" + _varint(dtype) + b"\x12" + _varint(len(shape)) + shape
    out += b"\x18" + _varint(shard) + b"\x20" + _varint(offset) + b"\x28" + _varint(size)
    for sl in slices:
        ext = b"".join(
            b"\x0a" + _varint(len(e)) + e
            for e in (
                b"\x08" + _varint(s) + (b"\x10" + _varint(n) if n >= 0 else b"") for s, n in sl
            )
        )
        out += b"\x3a" + _varint(len(ext)) + ext
    return out


def _signed(v: int) -> bytes:  # OrderedCode for small values, done by hand: 0x80 ^ v
    assert -64 <= v < 64
    return bytes([(0x80 ^ v) & 0xFF])


def _slice_key(name: bytes, extents) -> bytes:
    escaped = b"".join({0: b"\x00\xff", 255: b"\xff\x00"}.get(c, bytes([c])) for c in name)
    key = b"\x00" + escaped + b"\x00\x01"
    key += bytes([1, len(extents)]) if extents else b"\x00"
    return key + b"".join(_signed(s) + _signed(n) for s, n in extents)


def _write_bundle(root: Path, prefix: str, entries, data: bytes | list[bytes], **kw) -> Path:
    shards = data if isinstance(data, list) else [data]
    header = b"\x08" + _varint(len(shards))
    (root / f"{prefix}.index").write_bytes(_table([(b"", header), *sorted(entries)], **kw))
    for i, blob in enumerate(shards):
        (root / f"{prefix}.data-{i:05d}-of-{len(shards):05d}").write_bytes(blob)
    return root / f"{prefix}.index"


def test_ordered_code_by_hand():
    assert tf_bundle.signed_num_increasing(b"\x85", 0) == (5, 1)
    assert tf_bundle.signed_num_increasing(b"\x7f", 0) == (-1, 1)
    assert tf_bundle.signed_num_increasing(b"\xc0\x64", 0) == (100, 2)  # len 2: 0xc000 ^ 100
    assert tf_bundle.signed_num_increasing(b"\x3f\x9b", 0) == (-101, 2)  # ~(-101) = 100, inverted
    assert tf_bundle.decode_slice_key(_slice_key(b"a\x00b", [(2, 3), (0, -1)])) == (
        "a\x00b",
        ((2, 3), (0, -1)),
    )


def test_synthetic_partitioned_strings_and_snappy(tmp_path):
    """A 4x2 float tensor in two row slices on two shards, a string vector, snappy blocks."""
    top = np.arange(4, dtype="<f4").tobytes()  # rows 0..1
    bottom = np.arange(4, 8, dtype="<f4").tobytes()  # rows 2..3
    words = [b"hi", b"", b"tensor"]
    strings = b"".join(_varint(len(w)) for w in words) + b"\0\0\0\0" + b"".join(words)
    entries = [
        (b"w", _entry(1, (4, 2), 0, 0, slices=[[(0, 2), (0, -1)], [(2, 2), (0, -1)]])),
        (_slice_key(b"w", [(0, 2), (0, -1)]), _entry(1, (2, 2), 0, 16, shard=0)),
        (_slice_key(b"w", [(2, 2), (0, -1)]), _entry(1, (2, 2), 0, 16, shard=1)),
        (b"s", _entry(7, (3,), 16, len(strings), shard=0)),
    ]
    _write_bundle(tmp_path, "ckpt-1", entries, [top + strings, bottom], snappy=True)
    cat = cv.open(tmp_path)
    assert cat.layout == "tf" and cat.latest == 1  # no state file: newest complete
    assert np.array_equal(cat.read("w"), np.arange(8, dtype=np.float32).reshape(4, 2))
    assert list(cat.read("s")) == words
    assert cat.variables.set_index("name").loc["s", "dtype"] == "object"


def test_entry_beyond_data_file_is_an_error_row(tmp_path):
    entries = [
        (b"ok", _entry(1, (2,), 0, 8)),
        (b"huge", _entry(1, (1 << 38,), 0, 1 << 40)),
        (b"past_end", _entry(1, (4,), 4, 16)),
        (b"bad_shard", _entry(1, (2,), 0, 8, shard=3)),
    ]
    _write_bundle(tmp_path, "ckpt-2", entries, np.ones(2, "<f4").tobytes())
    tracemalloc.start()
    cat = cv.open(tmp_path)
    rows = cat.variables.set_index("name")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 20 << 20
    assert pd.isna(rows.loc["ok", "error"]) and cat.read("ok").sum() == 2.0
    for name in ("huge", "past_end", "bad_shard"):
        assert rows.loc[name, "error"], name
        with pytest.raises(ValueError):
            cat.read(name)


def _tree_with_index(tmp_path: Path, mutate) -> cv.Catalog:
    root = _copy("tf_orbax/tf/run1", tmp_path)
    index = root / "ckpt-5.index"
    index.write_bytes(mutate(index.read_bytes()))
    return cv.open(root)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda b: b[: len(b) // 2],  # truncated
        lambda b: b[:-8] + b"\0" * 8,  # garbage footer magic
        lambda b: b"",  # zero bytes
        lambda b: os.urandom(len(b)),  # random bytes
        lambda b: b[:-48] + (b"\0\x08\0" + _varint(1 << 42)).ljust(40, b"\0") + b[-8:],
        lambda b: b[:100] + bytes([b[100] ^ 0xFF]) + b[101:],  # corrupt data block (crc)
    ],
    ids=["truncated", "footer", "empty", "random", "terabyte-handle", "crc"],
)
def test_bad_index_is_an_error_row(tmp_path, mutate):
    cat = _tree_with_index(tmp_path, mutate)
    df = cat.serials
    assert not df.loc[5, "complete"] and df.loc[5, "error"]
    assert df.loc[[3, 4], "complete"].all()
    errors = cat.variables[cat.variables["serial"] == 5]
    assert len(errors) == 1 and errors["error"].iloc[0]
    # the state file points at 5 (what TF would try); the newest loadable serial is 4
    assert cat.latest == 4
    assert cat.attrs["framework_latest"] == 5


def test_untracked_missing_and_inflight_serials(tmp_path):
    root = _copy("tf_orbax/tf/run1", tmp_path)
    for suffix in (".index", ".data-00000-of-00001"):  # a preserved (untracked) checkpoint
        shutil.copy(root / f"ckpt-3{suffix}", root / f"ckpt-1{suffix}")
    (root / "ckpt-4.data-00000-of-00001").unlink()  # a shard lost
    (root / "ckpt-6_temp").mkdir()  # a save in flight
    (root / "ckpt-6_temp" / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"x")
    cat = cv.open(root)
    df = cat.serials
    assert list(df.index) == [1, 3, 4, 5, 6]
    assert df["complete"].tolist() == [True, True, False, True, False]
    assert cat.latest == 5
    scan = {s.serial: s for s in cat.scan.serials}
    assert scan[1].attrs["tracked"] is False and scan[5].attrs["tracked"] is True
    rows = cat.variables[cat.variables["serial"] == 4]
    assert rows["error"].str.contains("data file missing").all()
    # the state file points at a lost serial: fall back to the newest complete one
    (root / "ckpt-5.data-00000-of-00001").unlink()
    assert cv.open(root).latest == 3


def test_tf1_names_and_absolute_state_paths(tmp_path):
    data = np.ones(3, "<f4").tobytes()
    for n in (10, 20):
        _write_bundle(
            tmp_path, f"model.ckpt-{n}", [(b"dense/kernel", _entry(1, (3,), 0, 12))], data
        )
    (tmp_path / "model.ckpt-20.meta").write_bytes(b"graph")
    (tmp_path / "checkpoint").write_text(
        'model_checkpoint_path: "/elsewhere/model.ckpt-10"\n'
        'all_model_checkpoint_paths: "/elsewhere/model.ckpt-10"\n'
        'all_model_checkpoint_paths: "/elsewhere/model.ckpt-20"\n'
    )
    cat = cv.open(tmp_path)
    assert list(cat.serials.index) == [10, 20] and cat.latest == 10
    assert cat.serials.loc[20, "n_files"] == 3  # index, data, meta
    assert cat.read("dense/kernel").sum() == 3.0


def test_single_index_file(tmp_path):
    index = _write_bundle(
        tmp_path, "ckpt-9", [(b"v", _entry(9, (2,), 0, 16))], np.arange(2).tobytes()
    )
    cat = cv.open(index)
    assert list(cat.serials.index) == [9] and bool(cat.serials.loc[9, "complete"])
    assert cat.read("v").tolist() == [0, 1]
