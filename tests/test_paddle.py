"""Paddle binary streams, save_combine and the Paddle tree layouts (specs/paddle.md)."""

from __future__ import annotations

import json
import struct
import tracemalloc
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest
from conftest import corpus_path, ground_truth

import ckptview as cv
from ckptview.formats.paddle_desc import program_dtypes
from ckptview.formats.protobuf import encode_varint as varint
from ckptview.io import Storage
from ckptview.layouts.paddle import ctime_stamp

GT = "paddle/ground_truth.json"
STREAM_FORMATS = ("lod_tensor", "selected_rows", "save_combine")


# -- a tiny writer, byte for byte as spec §1/§3 ---------------------------------------------


def field(number: int, value) -> bytes:
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    return varint(number << 3 | 2) + varint(len(value)) + value


CODES = {"bool": 0, "int16": 1, "int32": 2, "int64": 3, "float16": 4, "float32": 5, "float64": 6}


def tensor_desc(code: int, dims) -> bytes:
    return field(1, code) + b"".join(field(2, d) for d in dims)


def tensor_body(arr: np.ndarray, dims=None) -> bytes:
    desc = tensor_desc(CODES[arr.dtype.name], arr.shape if dims is None else dims)
    return (
        struct.pack("<Ii", 0, len(desc)) + desc + arr.astype(arr.dtype.newbyteorder("<")).tobytes()
    )


def dense_stream(arr: np.ndarray, lod=(), dims=None) -> bytes:
    head = struct.pack("<IQ", 0, len(lod))
    for level in lod:
        head += struct.pack("<Q", 8 * len(level)) + np.asarray(level, "<u8").tobytes()
    return head + tensor_body(arr, dims)


def selected_rows_stream(rows, height: int, value: np.ndarray) -> bytes:
    rows = np.asarray(rows, "<i8")
    return (
        struct.pack("<IQ", 0, len(rows))
        + rows.tobytes()
        + struct.pack("<q", height)
        + (tensor_body(value))
    )


def program_desc(variables) -> bytes:
    """A ProgramDesc with block 0 holding (name, VarType code, persistable) vars."""
    vars_ = b""
    for name, vtype, persistable in variables:
        dense = field(3, field(1, tensor_desc(5, [2])) + field(2, 0))
        var = field(1, name.encode()) + field(2, field(1, vtype) + dense) + field(3, persistable)
        vars_ += field(3, var)
    block = field(1, 0) + field(2, -1) + vars_
    return field(1, block)


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


# -- the corpus against its ground truth ------------------------------------------------------
def _gt_files(tree: str) -> dict[str, dict]:
    files = ground_truth(GT)["files"]
    return {
        k: v for k, v in files.items() if k.startswith(tree + "/") and v["format"] in STREAM_FORMATS
    }


def _rows_of(cat, rel: str) -> list[dict]:
    rows = cat.variables.to_dict("records")
    return [r for r in rows if r["file"].endswith("/paddle/" + rel)]


def _check_values(cat, row: dict, entry: dict) -> None:
    assert row["error"] is None, row["error"]
    assert row["dtype"] == entry["dtype"], (row["name"], row["dtype"])
    assert tuple(row["shape"]) == tuple(entry["shape"]), row["name"]
    arr = cat.read(row["name"], serial=row["serial"], node=row["node"])
    assert arr.shape == tuple(entry["shape"])
    if np.iscomplexobj(arr):
        assert np.real(arr).astype(np.float64).sum() == pytest.approx(entry["sum"], rel=1e-6)
        assert np.imag(arr).astype(np.float64).sum() == pytest.approx(entry["sum_imag"], rel=1e-6)
    else:
        assert arr.astype(np.float64).sum() == pytest.approx(entry["sum"], rel=1e-6, abs=1e-9)


def _check_attrs(cat, row: dict, entry: dict) -> None:
    var = cat.variable(row["name"], serial=row["serial"], node=row["node"])
    if entry.get("kind") == "selected_rows":
        assert var.attrs["rows"] == entry["rows"]
        assert var.attrs["height"] == entry["height"]
    elif "lod" in entry:
        assert var.attrs["lod"] == entry["lod"]


@pytest.mark.parametrize(
    "tree, layout",
    [
        ("fluid_ckpt", "paddle-fluid"),
        ("fluid_ckpt_flat_2018", "paddle-fluid"),
        ("static_vars", "paddle-static"),
        ("static_vars_pir", "paddle-static"),
        ("static_inference", "paddle-static"),
    ],
)
def test_named_trees_match_ground_truth(tree, layout):
    cat = cv.open(corpus_path("paddle", tree))
    assert cat.layout == layout
    gt = _gt_files(tree)
    assert gt
    for rel, info in gt.items():
        rows = _rows_of(cat, rel)
        assert len(rows) == len(info["entries"]), rel
        for entry in info["entries"]:
            hit = [r for r in rows if r["name"] == entry["name"]]
            assert len(hit) == 1, (rel, entry["name"], [r["name"] for r in rows])
            _check_values(cat, hit[0], entry)
            _check_attrs(cat, hit[0], entry)


@pytest.mark.parametrize("tree", ["static_combined", "static_combined_pir"])
def test_combined_without_program_is_named_by_position(tree):
    cat = cv.open(corpus_path("paddle", tree))
    assert cat.layout == "paddle-static"
    (rel, info), *_ = _gt_files(tree).items()
    entries = info["entries"]
    assert [e["name"] for e in entries] == sorted(e["name"] for e in entries)  # spec §2
    rows = sorted(_rows_of(cat, rel), key=lambda r: int(r["name"]))
    assert [r["name"] for r in rows] == [str(i) for i in range(len(entries))]
    for row, entry in zip(rows, entries):
        _check_values(cat, row, entry)
        _check_attrs(cat, row, entry)
    var = cat.variable("0")
    assert "no program" in var.attrs["name_source"]


@pytest.mark.parametrize("tree", ["selected_rows", "dygraph"])
def test_loose_binary_format_files_via_files_layout(tree):
    cat = cv.open(corpus_path("paddle", tree))
    for rel, info in _gt_files(tree).items():
        (row,) = _rows_of(cat, rel)
        assert row["name"] == Path(rel).name
        _check_values(cat, row, info["entries"][0])
        _check_attrs(cat, row, info["entries"][0])


def test_fluid_nested_serials_match_index(corpus_index):
    tree = next(t for t in corpus_index["trees"] if t["root"] == "paddle/fluid_ckpt")
    cat = cv.open(corpus_path("paddle", "fluid_ckpt"))
    s = cat.serials
    assert list(s.index) == tree["serials"]
    assert list(s.index[s["complete"]]) == tree["complete_serials"]
    assert cat.latest == tree["latest_resumable_serial"]
    assert s["latest"].sum() == 1
    files = ground_truth(GT)["files"]
    for name, want in tree["per_serial"].items():
        n = int(name.split("_")[1])
        assert bool(s.loc[n, "complete"]) is want["complete"]
        assert s.loc[n, "epoch"] == want["epoch_id"] and s.loc[n, "step"] == want["step_id"]
        prefix = f"fluid_ckpt/{name}/"
        trainers = {k.split("/")[2] for k in files if k.startswith(prefix + "trainer_")}
        shards = {k.rsplit("_", 1)[1] for k in files if k.startswith(prefix + "__lookup_table__")}
        assert set(s.loc[n, "nodes"]) == trainers | {f"pserver_{i}" for i in shards}
        if want["complete"]:
            text = corpus_path("paddle", "fluid_ckpt", name, "__model__", "_SUCCESS").read_text()
            stamp = datetime.strptime(" ".join(text[-24:].split()), "%a %b %d %H:%M:%S %Y")
            assert s.loc[n, "timestamp"] == stamp.replace(tzinfo=timezone.utc)
    v = cat.variables
    assert (v[v["node"].str.startswith("pserver")]["kind"] == "lookup_table").all()
    assert set(v[v["name"].str.contains("moment|pow_acc")]["kind"]) == {"optimizer"}
    epoch = v[(v["name"] == "epoch_id") & (v["serial"] == 1)]
    assert set(epoch["node"]) == {"trainer_0", "trainer_1"}
    assert set(epoch["kind"]) == {"trainer"}
    assert cat.read("step_id", serial=1, node="trainer_1") == 10


def test_fluid_flat_2018_serials_match_index(corpus_index):
    tree = next(t for t in corpus_index["trees"] if t["root"] == "paddle/fluid_ckpt_flat_2018")
    cat = cv.open(corpus_path("paddle", "fluid_ckpt_flat_2018"))
    s = cat.serials
    assert cat.layout == "paddle-fluid"
    assert list(s.index) == tree["serials"]
    assert list(s.index[s["complete"]]) == tree["complete_serials"]
    assert cat.latest == tree["latest_resumable_serial"]
    assert s["epoch"].isna().all() and s["step"].isna().all()
    assert all(nodes == () for nodes in s["nodes"])


def test_static_save_references_pickles_and_program():
    cat = cv.open(corpus_path("paddle", "static_save"))
    assert cat.layout == "paddle-static"
    refs = {Path(r.path).name: r for r in cat.scan.serials[0].files}
    assert set(refs) == {"model.pdparams", "model.pdopt"}
    assert all(r.codec is None and r.hints.program.endswith("model.pdmodel") for r in refs.values())
    assert cat.latest == 0


def test_ctime_stamp_takes_the_last_appended_stamp():
    text = "Sun Jun 10 12:34:56 2018Mon Jun  3 01:02:03 2019"
    assert ctime_stamp(text) == datetime(2019, 6, 3, 1, 2, 3, tzinfo=timezone.utc)
    assert ctime_stamp("") is None


# -- trees built here ------------------------------------------------------------------------
def test_fluid_rules_success_file_and_trainer_marker(tmp_path):
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    for n in range(3):
        write(tmp_path / f"checkpoint_{n}/__model__/fc_0.w_0", dense_stream(w + n))
        write(tmp_path / f"checkpoint_{n}/trainer_0/_SUCCESS", b"Sun Jun 10 12:34:56 2018")
        write(tmp_path / f"checkpoint_{n}/trainer_0/epoch_id", str(n).encode())
    write(tmp_path / "checkpoint_0/__model__/_SUCCESS", b"Sun Jun 10 12:34:56 2018")
    (tmp_path / "checkpoint_1/__model__/_SUCCESS").mkdir()  # a directory is no marker
    # serial 2: trainer marker only -> incomplete
    cat = cv.open(tmp_path)
    s = cat.serials
    assert cat.layout == "paddle-fluid"
    assert list(s["complete"]) == [True, False, False]
    assert cat.latest == 0
    assert list(s["epoch"]) == [0, 1, 2]
    assert s.loc[0, "timestamp"] == datetime(2018, 6, 10, 12, 34, 56, tzinfo=timezone.utc)
    np.testing.assert_array_equal(cat.read("fc_0.w_0", serial=2), w + 2)


def _incubate_tree(root: Path) -> None:
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    for n in range(2):
        d = root / f"__paddle_checkpoint__.{n}"
        write(d / "fc_0.w_0", dense_stream(w * (n + 1)))
        write(d / "fc_0.w_0_moment1_0", dense_stream(w * 0))
        write(d / "learning_rate_0", dense_stream(np.array(0.5, np.float32)))
        status = {"epoch_no": 3 + n, "key": "k", "hash_key": "h", "checkpoint_path": str(root),
                  "exe_name": "exe", "program_name": "main", "checkpoint_no": n}  # fmt: skip
        write(d / "exe_train_status", json.dumps(status).encode())
    tmp = root / "__paddle_checkpoint__.2.tmp"
    write(tmp / "fc_0.w_0", dense_stream(w)[:-5])  # the save was cut mid-data


def test_incubate_tmp_is_uncommitted(tmp_path):
    _incubate_tree(tmp_path)
    cat = cv.open(tmp_path)
    assert cat.layout == "paddle-incubate"
    s = cat.serials
    assert list(s.index) == [0, 1, 2]
    assert list(s["complete"]) == [True, True, False]
    assert cat.latest == 1
    assert list(s["epoch"][:2]) == [3, 4] and s["step"].isna().all()
    assert s.loc[2, "error"] and "uncommitted" in s.loc[2, "error"]
    v = cat.variables
    assert set(v[v["serial"] == 1]["name"]) == {"fc_0.w_0", "fc_0.w_0_moment1_0", "learning_rate_0"}
    assert v.set_index("name").loc["fc_0.w_0_moment1_0", "kind"].tolist() == ["optimizer"] * 2
    np.testing.assert_array_equal(
        cat.read("fc_0.w_0", serial=1), np.arange(12, dtype=np.float32).reshape(3, 4) * 2
    )
    assert cat.read("learning_rate_0").shape == ()


def test_combined_named_by_program_desc_and_pir_json(tmp_path):
    arrays = {"b_0": np.ones(2, np.float32), "a.w_0": np.arange(4, dtype=np.int64),
              "c_moment1_0": np.full((2, 2), 3.0)}  # fmt: skip
    data = b"".join(dense_stream(arrays[k]) for k in sorted(arrays))
    legacy = tmp_path / "legacy"
    write(legacy / "__params__", data)
    desc = [("feed", 9, 1), ("fetch", 10, 1), ("tmp_0", 7, 0), ("emb", 8, 1)]
    write(legacy / "__model__", program_desc(desc + [(k, 7, 1) for k in arrays]))
    cat = cv.open(legacy)
    assert cat.layout == "paddle-static"
    assert sorted(cat.variables["name"]) == sorted(arrays)
    for name, arr in arrays.items():
        np.testing.assert_array_equal(cat.read(name), arr)
    assert cat.variables.set_index("name").loc["c_moment1_0", "kind"] == "optimizer"

    pir = tmp_path / "pir"
    write(pir / "model.pdiparams", data)
    ops = [{"#": "p", "A": [0, 1, 1, k], "O": {}} for k in arrays if k != "c_moment1_0"]
    ops.append({"#": "1.data", "A": [{"AT": {"#": "0.a_str", "D": "c_moment1_0"}, "N": "name"}],
                "OA": [{"AT": {"#": "0.a_array", "D": [{"#": "0.a_bool", "D": True}]},
                        "N": "persistable"}]})  # fmt: skip
    ops.append({"#": "1.fetch", "A": [{"AT": {"#": "0.a_str", "D": "out"}, "N": "name"}],
                "OA": [{"AT": {"#": "0.a_array", "D": [{"#": "0.a_bool", "D": True}]},
                        "N": "persistable"}]})  # fmt: skip
    doc = {"base_code": {"magic": "pir", "version": 1},
           "program": {"regions": [{"blocks": [{"ops": ops}]}]}}  # fmt: skip
    write(pir / "model.json", json.dumps(doc).encode())
    cat = cv.open(pir)
    assert sorted(cat.variables["name"]) == sorted(arrays)
    np.testing.assert_array_equal(cat.read("a.w_0"), arrays["a.w_0"])


def test_combined_program_count_mismatch_falls_back_to_positions(tmp_path):
    write(tmp_path / "model.pdiparams", dense_stream(np.ones(2, np.float32)) * 2)
    write(tmp_path / "model.pdmodel", program_desc([("only_one", 7, 1)]))
    cat = cv.open(tmp_path)
    assert sorted(cat.variables["name"]) == ["0", "1"]
    assert "names 1 variables, file has 2" in cat.variable("1").attrs["name_source"]


def test_bad_files_become_error_rows_with_bounded_memory(tmp_path):
    good = dense_stream(np.arange(8, dtype=np.float32).reshape(2, 4))
    write(tmp_path / "fc_0.w_0", good)
    write(tmp_path / "cut_header", good[:16])
    write(tmp_path / "cut_data", good[:-3])
    write(tmp_path / "zero", b"")
    write(tmp_path / "noise", np.random.default_rng(0).bytes(3000))
    tb = dense_stream(np.zeros(0, np.float32), dims=[1 << 20, 1 << 20, 1 << 20])
    write(tmp_path / "terabytes", tb + b"\0" * 64)
    huge_lod = struct.pack("<IQQ", 0, 1, 1 << 50) + b"\0" * 40
    write(tmp_path / "huge_lod", huge_lod)
    combined = b"".join(dense_stream(np.full(3, i, np.int32)) for i in range(3))
    write(tmp_path / "__params__", combined[:-6])
    tracemalloc.start()
    cat = cv.open(tmp_path, layout="paddle-static")
    v = cat.variables
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 20 << 20
    errors = v.dropna(subset=["error"]).set_index("name")["error"]
    assert set(errors.index) == {
        "cut_header", "cut_data", "zero", "noise", "terabytes", "huge_lod", "__params__"
    }  # fmt: skip
    assert "needs" in errors["cut_data"] and "file has" in errors["cut_data"]
    assert "empty" in errors["zero"]
    assert "1099511627776" in errors["terabytes"] or "needs" in errors["terabytes"]
    assert "save_combine" in errors["__params__"]
    np.testing.assert_array_equal(
        cat.read("fc_0.w_0"), np.arange(8, dtype=np.float32).reshape(2, 4)
    )
    ok = v[v["error"].isna()]
    # the combined streams before the cut; prefixed as per-variable files share the directory
    assert sorted(ok["name"]) == ["__params__/0", "__params__/1", "fc_0.w_0"]
    assert cat.read("__params__/1").tolist() == [1, 1, 1]
    assert cat.serials.loc[0, "complete"] == False  # noqa: E712


def test_codec_guess_rejects_non_paddle_bytes(tmp_path):
    write(tmp_path / "a.bin", np.ones(600, np.float64).tobytes())
    write(tmp_path / "b.bin", b"\0" * 100)
    write(tmp_path / "c.bin", selected_rows_stream([1, 5], 10, np.ones((2, 3), np.float32)))
    cat = cv.open(tmp_path)
    assert cat.layout == "files"
    v = cat.variables.set_index("name")
    assert list(v.index) == ["a.bin", "b.bin", "c.bin"]  # every file accounted for
    assert v.loc["a.bin", "error"] == v.loc["b.bin", "error"] == "no codec recognizes this file"
    assert v.loc["c.bin", "error"] is None
    var = cat.variable("c.bin")
    assert (var.attrs["rows"], var.attrs["height"]) == ([1, 5], 10)
    np.testing.assert_array_equal(cat.read("c.bin"), np.ones((2, 3), np.float32))


def test_scan_reads_headers_only_and_read_reads_one_variable(tmp_path):
    rng = np.random.default_rng(1)
    sizes = {"fc_0.w_0": (512, 1024), "fc_1.w_0": (1024, 1024), "emb_0.w_0": (256, 1024)}
    for n in range(2):
        for name, shape in sizes.items():
            arr = rng.standard_normal(shape).astype(np.float32)
            write(tmp_path / f"checkpoint_{n}/__model__/{name}", dense_stream(arr))
        write(tmp_path / f"checkpoint_{n}/__model__/_SUCCESS", b"Sun Jun 10 12:34:56 2018")
    total = sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())
    cat = cv.open(tmp_path)
    cat.storage.counters.reset()
    assert len(cat.variables) == 6 and cat.latest == 1
    assert cat.storage.counters.bytes_read < total / 100
    cat.storage.counters.reset()
    arr = cat.read("fc_1.w_0", serial=0)
    assert arr.shape == (1024, 1024)
    assert 4 << 20 <= cat.storage.counters.bytes_read <= (4 << 20) + 4096
    chunks = list(cat.iter_chunks("fc_0.w_0", max_bytes=1 << 20))
    assert sum(c.size for c in chunks) == 512 * 1024 and len(chunks) == 2


def test_save_combine_with_large_tensors_reads_windows_only(tmp_path):
    arrays = [np.full((256, 1024), i, np.float32) for i in range(4)]
    write(tmp_path / "__params__", b"".join(dense_stream(a) for a in arrays))
    cat = cv.open(tmp_path)
    cat.storage.counters.reset()
    assert len(cat.variables) == 4
    assert cat.storage.counters.bytes_read < 5 * 4096
    assert cat.read("3").mean() == 3.0


def test_lookup_table_shards_beyond_the_first_block(tmp_path):
    rows = np.arange(1, 2001, 2)
    value = np.ones((len(rows), 4), np.float32)
    serial = tmp_path / "checkpoint_0"
    write(serial / "__lookup_table__/emb_table_1", selected_rows_stream(rows, 4000, value))
    write(serial / "__model__/_SUCCESS", b"Sun Jun 10 12:34:56 2018")
    write(serial / "trainer_0/epoch_id", b"7")
    cat = cv.open(tmp_path)
    (row,) = cat.variables[cat.variables["node"] == "pserver_1"].to_dict("records")
    assert (row["name"], row["kind"], row["shape"]) == ("emb_table", "lookup_table", (1000, 4))
    var = cat.variable("emb_table", node="pserver_1")
    assert var.attrs["rows"] == rows.tolist() and var.attrs["height"] == 4000
    assert cat.serials.loc[0, "nodes"] == ("trainer_0", "pserver_1")
    assert cat.serials.loc[0, "epoch"] == 7 and cat.latest == 0


def test_program_dtypes_tell_bfloat16_from_uint16():
    files = ground_truth(GT)["files"]
    for tree, program in [("static_save", "model.pdmodel")]:
        path = str(corpus_path("paddle", tree, program))
        dtypes = program_dtypes(Storage.from_url(path)[0], path)
        entries = [
            e for k, v in files.items() if k.startswith(tree + "/") for e in v.get("entries", [])
        ]
        for entry in entries:
            assert dtypes[entry["name"]] == entry["dtype"]
    path = str(corpus_path("paddle", "static_inference", "model.pdmodel"))
    names = files["static_inference/model.pdmodel"]["persistable_vars_sorted"]
    assert sorted(program_dtypes(Storage.from_url(path)[0], path)) == names


def test_lookup_table_listing_reads_the_row_count_not_the_rows(tmp_path):
    """Spec §3: the header after the rows is at 12 + 8N; listing never reads the N row ids."""
    rows = np.arange(0, 300_000, 3)  # 100,000 rows: 800,000 bytes of row ids
    value = np.arange(len(rows) * 2, dtype=np.float32).reshape(-1, 2)
    serial = tmp_path / "checkpoint_0"
    shard = write(
        serial / "__lookup_table__/emb_table_0", selected_rows_stream(rows, 300_000, value)
    )
    write(serial / "__model__/_SUCCESS", b"Sun Jun 10 12:34:56 2018")
    cat = cv.open(tmp_path, cache=False)
    counters = cat.storage.counters
    (row,) = cat.variables[cat.variables["kind"] == "lookup_table"].to_dict("records")
    assert row["error"] is None and row["shape"] == (len(rows), 2)
    shard_reads = counters.bytes_read - len(b"Sun Jun 10 12:34:56 2018")
    assert shard_reads <= 4096 + 256, shard_reads  # the first block + the header at 12 + 8N
    assert counters.requests <= 3
    var = cat.variable("emb_table", node="pserver_0")
    assert var.attrs["height"] == 300_000 and var.attrs["rows_span"] == (12, len(rows))
    index = var.attrs["rows"]
    before = counters.bytes_read
    assert len(index) == len(rows) and not index.loaded and "not read" in repr(index)
    assert counters.bytes_read == before  # len() and repr() need no read
    np.testing.assert_array_equal(index.array(), rows)  # on demand: one ranged read of 8N bytes
    assert counters.bytes_read - before == 8 * len(rows)
    assert index == rows.tolist() and index[:3] == [0, 3, 6] and index[-1] == rows[-1]
    assert counters.bytes_read - before == 8 * len(rows)  # read once
    before = counters.bytes_read
    np.testing.assert_array_equal(cat.read("emb_table", node="pserver_0"), value)
    assert counters.bytes_read - before == value.nbytes
    assert shard.stat().st_size > 800_000


def test_row_index_pickles_without_its_values(tmp_path):
    import pickle

    from ckptview.formats.paddle_stream import RowIndex

    rows = np.arange(5000)
    path = write(
        tmp_path / "t.bin", selected_rows_stream(rows, 5000, np.ones((5000, 1), np.float32))
    )
    storage, p = Storage.from_url(str(path))
    index = RowIndex(storage, p, 12, len(rows))
    assert index.tolist() == rows.tolist()
    copy = pickle.loads(pickle.dumps(index))
    assert not copy.loaded and copy == index and copy.loaded
    small = RowIndex(storage, p, 12, 3, rows[:3].astype("<i8").tobytes())
    assert pickle.loads(pickle.dumps(small)).loaded and small != [0, 1] and small == [0, 1, 2]


def test_loose_selected_rows_file_beyond_the_first_block_is_detected(tmp_path):
    """Without a Paddle layout the codec is not forced: a row index filling the first block
    costs one small read at 12 + 8N to recognize the file."""
    rows = np.arange(1, 4001, 2)  # 2,000 rows: the header starts at byte 16,012
    value = np.ones((len(rows), 4), np.float32)
    write(tmp_path / "emb.bin", selected_rows_stream(rows, 4001, value))
    write(
        tmp_path / "ints.bin", struct.pack("<IQ", 0, 2000) + np.arange(2000, dtype="<i8").tobytes()
    )
    cat = cv.open(tmp_path, cache=False)
    v = cat.variables.set_index("name")
    assert v.loc["emb.bin", "error"] is None and v.loc["emb.bin", "shape"] == (2000, 4)
    # a look-alike prefix with no valid header after it: not taken for Paddle, still listed
    assert v.loc["ints.bin", "error"] == "no codec recognizes this file"
    assert cat.storage.counters.bytes_read <= 2 * 4096 + 2 * 256 + 256
    var = cat.variable("emb.bin")
    assert var.attrs["rows"] == rows and var.attrs["height"] == 4001
    np.testing.assert_array_equal(cat.read("emb.bin"), value)


def test_plain_desc_agrees_with_the_general_decoder():
    """The inline TensorDesc decoder of ``plain_dense`` answers only where the general one
    gives the same (code, dims); random, cut and flipped descs included."""
    import random

    from ckptview.formats import protobuf as pb
    from ckptview.formats.paddle_stream import FormatError, _plain_desc, parse_tensor_desc

    rng = random.Random(13)
    samples = [b"\x08\x05\x10\x10", b"\x08\x05", b"\x08\x05\x12\x01\x10", b"\x10\x02\x08\x05",
               b"\x08\x05\x10" + b"\xff" * 9 + b"\x01", b"\x08\x05\x10" + b"\xff" * 8 + b"\x7f"]
    for _ in range(3000):
        dims = [rng.choice([0, 1, 3, 127, 128, 300, 1 << 40]) for _ in range(rng.randint(0, 4))]
        buf = b"\x08" + bytes([rng.choice([2, 3, 5, 6, 22, 99])])
        buf += b"".join(b"\x10" + pb.encode_varint(d) for d in dims)
        samples.append(buf)
        cut = bytearray(buf[: rng.randint(0, len(buf))])
        samples.append(bytes(cut))
        if buf:
            flipped = bytearray(buf)
            flipped[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
            samples.append(bytes(flipped))
    answered = 0
    for buf in samples:
        fast = _plain_desc(buf, 0, len(buf))
        if fast is None:
            continue
        answered += 1
        try:
            assert parse_tensor_desc(buf) == fast, buf
        except (FormatError, pb.DecodeError):
            raise AssertionError(f"fast path accepted {buf!r}") from None
    assert answered > 1000
