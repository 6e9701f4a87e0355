"""The columnar listing path (issue 13): safetensors headers parsed into columns give the same
records, tables and reads as the general path; the tree's prefix index and the local walk
give what a scan of every entry and fsspec's ``find`` give."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import fsspec
import numpy as np
import pandas as pd
import pytest

import ckptview as cv
from ckptview.codecs.safetensors import SafetensorsCodec
from ckptview.io import Storage, local_find, normalize_info
from ckptview.model import VarColumns
from ckptview.scan.tables import variables_table
from ckptview.tree import Tree


def write_safetensors(path: Path, tensors: dict[str, np.ndarray], meta=None) -> None:
    header, blobs, offset = {}, [], 0
    if meta is not None:
        header["__metadata__"] = meta
    codes = {"float32": "F32", "int64": "I64", "float16": "F16", "uint8": "U8"}
    for name, arr in tensors.items():
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": codes[arr.dtype.name], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}  # fmt: skip
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def tensors(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "model.embed.weight": rng.standard_normal((4, 3)).astype("float32"),
        "model.layer.0.bias": rng.standard_normal(3).astype("float16"),
        "optimizer.state.0.exp_avg": rng.standard_normal((2, 2)).astype("float32"),
        "step": np.array(7, dtype="int64"),
        "empty": np.zeros((0, 5), dtype="float32"),
        "bytes": np.arange(5, dtype="uint8"),
    }


@pytest.fixture
def run(tmp_path) -> Path:
    root = tmp_path / "run"
    root.mkdir()
    for s in (1, 2, 3):
        write_safetensors(root / f"step_{s}.safetensors", tensors(s), {"format": "pt"})
    return root


def test_columns_give_the_records_of_the_general_path(run):
    storage, _ = Storage.from_url(str(run))
    blob = storage.blob(str(run / "step_2.safetensors"))
    got = SafetensorsCodec().list_variables(blob, {})
    assert isinstance(got, VarColumns) and got.materialized is None and len(got) == 6
    raw = blob.read(8, struct.unpack("<Q", blob.read(0, 8))[0])
    general = SafetensorsCodec._variables(blob, json.loads(raw), 8 + len(raw))
    assert list(got) == general  # records made on first access, field for field
    assert got.materialized is not None and got[0] is got.records()[0]  # made once, kept
    assert got[0].attrs == {"safetensors_dtype": "F32", "metadata": {"format": "pt"}}


def test_unusual_headers_take_the_general_path(tmp_path):
    path = tmp_path / "odd.safetensors"
    write_safetensors(path, tensors(0))
    text = json.loads(path.read_bytes()[8 : 8 + struct.unpack("<Q", path.read_bytes()[:8])[0]])
    text["step"]["dtype"] = "Q9"  # unknown dtype code: listed as opaque bytes
    raw = json.dumps(text).encode()
    raw += b" " * (-len(raw) % 8)
    data = path.read_bytes()
    old = struct.unpack("<Q", data[:8])[0]
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + old :])
    storage, _ = Storage.from_url(str(tmp_path))
    got = SafetensorsCodec().list_variables(storage.blob(str(path)), {})
    assert isinstance(got, list)
    assert {v.name: v.dtype for v in got}["step"] == "object"


def test_catalog_tables_from_columns_match_records(run):
    cat = cv.open(str(run), cache=False)
    v = cat.variables
    results = cat._scan.logical().results
    assert all(isinstance(r.variables, VarColumns) for r in results)
    assert all(r.variables.materialized is None for r in results)  # tables made no records
    for r in results:  # the same table from records
        r.variables.records()
    again = variables_table(cat.tree, results)
    pd.testing.assert_frame_equal(v, again)
    assert v["kind"].tolist()[:6] == ["model", "model", "optimizer", "trainer", "model", "model"]
    assert v.loc[v["name"] == "empty", "shape"].iloc[0] == (0, 5)
    assert v.loc[v["name"] == "step", "numel"].iloc[0] == 1
    assert v["error"].map(lambda e: e is None).all() and v["quant"].map(lambda q: q is None).all()
    assert cat.serials["loadable"].all() and cat.latest == 3


def test_reads_from_columns(run):
    cat = cv.open(str(run), cache=False)
    want = tensors(2)
    for name, arr in want.items():
        got = cat.read(name, serial=2)
        assert got.dtype == arr.dtype and got.shape == arr.shape
        assert np.array_equal(got, arr)
    shards = cat.shards
    row = shards[(shards["serial"] == 1) & (shards["name"] == "model.embed.weight")].iloc[0]
    assert row["offsets"] == (0, 0) and row["shape"] == (4, 3) and row["nbytes"] == 48
    d = cat.diff(1, 2)
    assert set(d["name"]) == set(want)


def test_truncated_file_is_a_partial_read(run):
    path = run / "step_3.safetensors"
    path.write_bytes(path.read_bytes()[:-4])  # the last tensor loses its tail
    cat = cv.open(str(run), cache=False)
    s = cat.serials
    assert not s.loc[3, "loadable"] and s.loc[2, "loadable"]
    assert "truncated" in cat.files.set_index("path").loc[str(path), "error"]


@pytest.mark.parametrize("under, depth", [("", None), ("", 1), ("a", None), ("a", 1),
                                          ("a/b", 2), ("a/", 1), ("zz", None)])  # fmt: skip
def test_tree_prefix_index_matches_a_full_scan(tmp_path, under, depth):
    for rel in ["a/b/c.bin", "a/b/d.bin", "a/e.bin", "a-b/f.bin", "ab/g.bin", "h.bin", "a/b/i/j"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"x")
    storage, root = Storage.from_url(str(tmp_path))
    tree = Tree(storage, root)

    def scan(kind: str) -> list[str]:
        prefix = under.rstrip("/") + "/" if under else ""
        return sorted(rel for rel, inf in tree.entries.items() if inf["type"] == kind
                      and rel.startswith(prefix)
                      and (depth is None or rel[len(prefix):].count("/") < depth))  # fmt: skip

    assert tree.files(under, depth) == scan("file")
    assert tree.dirs(under, depth) == scan("directory")
    tree.entries["a/new.bin"] = {"name": "a/new.bin", "size": 1, "type": "file"}  # added late
    assert "a/new.bin" in tree.files("a")


def test_local_walk_matches_fsspec_find(tmp_path):
    (tmp_path / "d" / "e").mkdir(parents=True)
    (tmp_path / "d" / "e" / "f.bin").write_bytes(b"12345")
    (tmp_path / "g.txt").write_text("hi")
    (tmp_path / "link").symlink_to(tmp_path / "d")  # listed, not walked into
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    fs = fsspec.filesystem("file")
    want = {p: normalize_info(i) for p, i in fs.find(str(tmp_path), withdirs=True,
                                                     detail=True).items()}  # fmt: skip
    want.pop(str(tmp_path), None)
    got = local_find(str(tmp_path))
    assert got == want and list(got) == list(want)


# -- the small-header loop against the column-wise pass -----------------------------------------
def _headers() -> list[tuple[str, dict, int, int]]:
    """(name, header, data start, file size) of every safetensors file of the corpus and the
    wild whose header parses."""
    from conftest import CORPUS, WILD

    out = []
    for path in sorted(p for root in (CORPUS, WILD) for p in root.rglob("*.safetensors")):
        data = path.read_bytes()
        if len(data) < 8:
            continue
        n = struct.unpack("<Q", data[:8])[0]
        try:
            header = json.loads(data[8 : 8 + n])
        except ValueError:
            continue
        if isinstance(header, dict):
            out.append((path.name, header, 8 + n, len(data)))
    assert len(out) >= 20, len(out)  # not vacuous: the corpus and the wild hold dozens
    return out


def _mutations(header: dict, rng) -> list[dict]:
    """Copies of a header with one entry changed the ways a header can be wrong or unusual."""
    names = [k for k in header if k != "__metadata__"]
    if not names:
        return []
    out = []
    bad_values = [
        ("dtype", "Q9"), ("dtype", ["F32"]), ("dtype", None), ("shape", [-1]), ("shape", [True]),
        ("shape", [2.0]), ("shape", "2"), ("shape", [2**70]), ("data_offsets", [8, 0]),
        ("data_offsets", [0]), ("data_offsets", [0, 4, 8]), ("data_offsets", [-4, 0]),
        ("data_offsets", [2**64, 2**64 + 4]), ("data_offsets", [False, 4]),
        ("data_offsets", (0, 4)), ("data_offsets", [0, 10**12]), ("shape", []),
    ]  # fmt: skip
    for field, value in bad_values:
        h = json.loads(json.dumps(header))
        h[rng.choice(names)][field] = value
        out.append(h)
    h = json.loads(json.dumps(header))
    del h[rng.choice(names)]["shape"]
    out.append(h)
    h = json.loads(json.dumps(header))
    h[rng.choice(names)] = [1, 2]
    out.append(h)
    if len(names) > 1:  # two tensors on the same bytes
        h = json.loads(json.dumps(header))
        a, b = rng.sample(names, 2)
        h[b] = dict(h[a])
        out.append(h)
    sized = [k for k in names if _span_length(header[k]) > 0]
    if len(names) > 1 and sized:  # one tensor moved one byte into another
        h = json.loads(json.dumps(header))
        a = rng.choice(sized)
        b = rng.choice([k for k in names if k != a])
        at = h[a]["data_offsets"][1] - 1
        h[b]["data_offsets"] = [at, at + _span_length(h[b])]
        out.append(h)
    h = json.loads(json.dumps(header))  # a zero-size tensor at a shared offset is fine
    first = h[names[0]]
    h["zero.size"] = {"dtype": "F32", "shape": [0, 3], "data_offsets": [first["data_offsets"][0]] * 2}
    out.append(h)
    return out


def _span_length(entry) -> int:
    try:
        begin, end = entry["data_offsets"]
        return end - begin
    except (KeyError, TypeError, ValueError):
        return 0


def test_small_headers_give_the_columns_of_the_column_wise_pass(monkeypatch):
    """Every corpus and wild header, and mutated copies of each: the one-loop path for small
    headers gives None exactly where the numpy pass does, else the same columns."""
    import random

    from ckptview.codecs import safetensors as st

    rng = random.Random(13)

    class Blob:
        path = "x.safetensors"

        def __init__(self, size: int):
            self.size = size

    checked = taken = 0
    for _name, header, start, size in _headers():
        for h in [header, *_mutations(header, rng)]:
            for room in (size, size - 1, start):  # as it is, a byte short, cut after its header
                monkeypatch.setattr(st, "SMALL_HEADER", 10**9)
                small = st._columns(Blob(room), h, start)
                monkeypatch.setattr(st, "SMALL_HEADER", -1)
                wide = st._columns(Blob(room), h, start)
                checked += 1
                assert (small is None) == (wide is None), (_name, h)
                if small is None:
                    continue
                taken += 1
                for field in ("names", "dtypes", "shapes", "disks", "codes", "meta"):
                    assert getattr(small, field) == getattr(wide, field), field
                for field in ("numels", "nbytes", "offsets"):
                    a, b = getattr(small, field), getattr(wide, field)
                    assert a.dtype == b.dtype == np.int64 and np.array_equal(a, b), field
    assert taken >= 30 and checked - taken >= 1000, (checked, taken)  # both answers seen
