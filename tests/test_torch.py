"""The torch codec against real torch.save files (zip + legacy) and hostile or broken ones."""

from __future__ import annotations

import os
import pickle
import struct
import zipfile

import numpy as np
import pytest
from conftest import corpus_path, ground_truth
from test_deepspeed import Obj, torch_zip

import ckptview as cv
from ckptview.formats.torch_pickle import LEGACY_MAGIC

GT = ground_truth("modern/ground_truth.json")["files"]
TORCH_FILES = sorted(
    k for k, v in GT.items() if v.get("format") in ("torch_zip", "torch_legacy_pickle")
)


def _rows(cat) -> dict:
    return {row.name: row for row in cat.variables.itertuples()}


def _find(rows: dict, t: dict):
    """The row for a ground-truth tensor. The ground truth rewrote absolute paths stored inside
    keys (Lightning ``best_k_models``) relative to the corpus, so those match on the parent
    path plus the last path component."""
    if t["key"] in rows:
        return rows[t["key"]]
    parent = "/".join(str(p) for p in t["path"][:-1]) + "/"
    last = str(t["path"][-1])
    hits = [r for n, r in rows.items() if n.startswith(parent) and n.endswith("/" + last)]
    assert len(hits) == 1, t["key"]
    return hits[0]


@pytest.mark.parametrize("rel", TORCH_FILES)
def test_every_corpus_tensor_matches_ground_truth(rel):
    cat = cv.open(str(corpus_path("modern", rel)))
    rows = _rows(cat)
    errors = cat.files["error"].dropna().tolist()
    if rel.endswith("training_args.bin"):  # a pickled TrainingArguments: listed, not loadable
        assert len(errors) == 1 and "weights_only=True) refuses global" in errors[0], errors
    else:
        assert not errors, errors
    for t in GT[rel]["tensors"]:
        row = _find(rows, t)
        assert row.dtype == t["dtype"], t["key"]
        assert row.shape == tuple(t["shape"]), t["key"]
        assert row.nbytes == t["nbytes"], t["key"]
        arr = cat.read(row.name)
        assert arr.shape == tuple(t["shape"])
        assert float(np.asarray(arr, dtype=np.float64).sum()) == pytest.approx(t["sum"], rel=1e-6)


def test_shared_storage_views_and_scalars():
    rel = "torch/run_A/step_100.pt"
    cat = cv.open(str(corpus_path("modern", rel)))
    base = cat.read("extra/base")
    np.testing.assert_array_equal(cat.read("extra/base_rows_2_5"), base[2:5])
    np.testing.assert_array_equal(cat.read("extra/base_T"), base.T)
    info = cat.variable("extra/base_rows_2_5")
    want = {t["key"]: t for t in GT[rel]["tensors"]}["extra/base_rows_2_5"]
    assert info.attrs["storage_offset"] == want["storage_offset"]
    assert info.attrs["storage_nbytes"] == want["storage_nbytes"]
    rows = _rows(cat)
    for s in GT[rel]["scalars"]:
        if s["type"] in ("int", "float") and s["key"] in rows:
            assert cat.read(s["key"]).item() == pytest.approx(s["value"])
    assert rows["epoch"].dtype == "int64"


def test_hf_objects_are_browsable():
    cat = cv.open(str(corpus_path("modern", "hf/checkpoint-100/training_args.bin")))
    rows = _rows(cat)
    assert cat.read("learning_rate").item() == pytest.approx(0.005)
    assert "output_dir" in rows and rows["output_dir"].dtype == "object"


def test_catalog_scan_reads_headers_only():
    path = corpus_path("modern", "hf/checkpoint-100/optimizer.pt")
    cat = cv.open(str(path))
    cat.storage.counters.reset()
    assert len(cat.variables) > 40
    assert cat.storage.counters.bytes_read < os.path.getsize(path) // 4


def _hostile_payload(marker) -> bytes:
    class Evil:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    return pickle.dumps({"w": Evil()}, protocol=2)


def test_hostile_zip_and_legacy_are_refused(tmp_path):
    marker = tmp_path / "PWNED"
    zpath = tmp_path / "evil.pt"
    with zipfile.ZipFile(zpath, "w", zipfile.ZIP_STORED) as z:
        z.writestr("evil/data.pkl", _hostile_payload(marker))
        z.writestr("evil/version", "3\n")
    lpath = tmp_path / "legacy.pt"
    lpath.write_bytes(
        LEGACY_MAGIC + pickle.dumps(1001, 2) + pickle.dumps({"little_endian": True}, 2)
        + _hostile_payload(marker)
    )  # fmt: skip
    for path in (zpath, lpath):
        cat = cv.open(str(path))
        err = cat.variables["error"].dropna().tolist()
        assert len(err) == 1 and "refused global posix.system" in err[0], err
    assert not marker.exists()


def test_truncated_and_junk_files_become_error_rows(tmp_path):
    good = corpus_path("modern", "torch/run_A/step_100.pt").read_bytes()
    legacy = corpus_path("modern", "torch/run_legacy/step_100.pt").read_bytes()
    cases = {
        "cut.pt": good[: len(good) // 2],
        "head.pt": good[:100],
        "zero.pt": b"",
        "junk.pt": b"PK\x03\x04" + os.urandom(5000),
        "legacy_cut.pt": legacy[: len(legacy) - 50],
        "legacy_head.pt": legacy[:200],
    }
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        cat = cv.open(str(tmp_path / name))
        assert cat.variables["error"].notna().any(), name
    # the legacy file cut inside its storage table keeps its pickled structure
    cat = cv.open(str(tmp_path / "legacy_cut.pt"))
    assert len(cat.variables) > 10


def test_header_claiming_terabytes(tmp_path):
    good = bytearray(corpus_path("modern", "torch/run_A/step_100.pt").read_bytes())
    eocd = good.rfind(b"PK\x05\x06")
    good[eocd + 12 : eocd + 16] = struct.pack("<I", 0xFFFFFFF0)  # central directory size
    (tmp_path / "huge.pt").write_bytes(bytes(good))
    cat = cv.open(str(tmp_path / "huge.pt"))
    assert cat.variables["error"].notna().all()
    assert cat.storage.counters.bytes_read < len(good) * 2


def test_view_beyond_its_storage_is_an_error_row(tmp_path):
    raw = np.arange(6, dtype="<f4").tobytes()
    pkl = (
        b"\x80\x02}X\x01\x00\x00\x00wctorch._utils\n_rebuild_tensor_v2\n("
        b"(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x06tQ"
        b"K\x04K\x02K\x03\x86K\x03K\x01\x86\x89)tRs."
    )
    with zipfile.ZipFile(tmp_path / "v.pt", "w") as z:
        z.writestr("v/data.pkl", pkl)
        z.writestr("v/data/0", raw)
    cat = cv.open(str(tmp_path / "v.pt"))
    assert "beyond storage" in cat.variables.set_index("name").loc["w", "error"]


def test_legacy_listing_reads_each_byte_once():
    """The unpickler reuses the cached head and its read-ahead (the storage table too)."""
    path = corpus_path("modern", "torch/run_legacy/step_100.pt")
    cat = cv.open(str(path), cache=False)
    assert cat.variables["error"].isna().all()
    assert cat.storage.counters.bytes_read <= path.stat().st_size


# -- requests per zip file: payload offsets predicted from the central directory --------------
def _torch_pickle(n: int) -> bytes:
    """A protocol-2 state dict of ``n`` float32 tensors of 3 elements, storage ``i`` each."""
    out = [b"\x80\x02}q\x00("]
    for i in range(n):
        key, sk = f"w{i}".encode(), str(i).encode()
        out += [
            b"X" + struct.pack("<I", len(key)) + key,
            b"ctorch._utils\n_rebuild_tensor_v2\n(",
            b"(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX" + struct.pack("<I", len(sk)),
            sk + b"X\x03\x00\x00\x00cpuK\x03tQK\x00K\x03\x85K\x01\x85\x89)tR",
        ]
    return b"".join(out) + b"u."


def _aligned_zip(records: dict[str, bytes], alignment: int = 64, lie: str = "") -> bytes:
    """An archive laid out as PyTorchStreamWriter writes it: each payload at a multiple of
    ``alignment`` (``FB`` padding in the local extra field), a data descriptor after it.
    ``lie``: that record's local extra field is 16 bytes longer than the writer's and it has
    no descriptor, so the central directory still looks torch-written."""
    out, central = bytearray(), bytearray()
    for name, data in records.items():
        raw = name.encode()
        at = len(out)
        start = at + 30 + len(raw) + 4
        pad = -start % alignment + (16 if name == lie else 0)
        extra = b"FB" + struct.pack("<H", pad) + b"Z" * pad
        crc = zipfile.crc32(data)
        flags = 0x808 if data else 0x800
        out += struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 0, flags, 0, 0, 0, 0, 0, 0,
                           len(raw), len(extra)) + raw + extra  # fmt: skip
        assert name == lie or len(out) % alignment == 0
        out += data
        if flags & 8 and name != lie:
            out += struct.pack("<4sIII", b"PK\x07\x08", crc, len(data), len(data))
        central += struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 0, 0, flags, 0, 0, 0, crc,
                               len(data), len(data), len(raw), 0, 0, 0, 0, 0, at) + raw  # fmt: skip
    cd_at = len(out)
    out += central
    n = len(records)
    out += struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, n, n, len(central), cd_at, 0)
    return bytes(out)


def _torch_records(n: int) -> dict[str, bytes]:
    recs = {"m/data.pkl": _torch_pickle(n), "m/.format_version": b"1",
            "m/.storage_alignment": b"64", "m/byteorder": b"little"}  # fmt: skip
    recs.update({f"m/data/{i}": (np.arange(3, dtype="<f4") + i).tobytes() for i in range(n)})
    recs.update({"m/version": b"3\n", "m/.data/serialization_id": b"0" * 40})
    return recs


def _open(path):
    from ckptview.codecs.torch import TorchCodec
    from ckptview.io import Storage

    storage, p = Storage.from_url(str(path))
    return storage, storage.blob(p), TorchCodec()


def _check_values(blob, codec, variables, n):
    by = {v.name: v for v in variables}
    assert sorted(by) == sorted(f"w{i}" for i in range(n))
    for i in range(n):
        want = np.arange(3, dtype="<f4") + i
        assert np.array_equal(codec.read(blob, by[f"w{i}"]), want), i
        pieces = list(codec.iter_chunks(blob, by[f"w{i}"], 4))  # one element per piece
        assert np.array_equal(np.concatenate(pieces), want), i


def test_aligned_zip_lists_in_constant_requests(tmp_path):
    """200 storages: the tail, the directory and data.pkl, not one read per local header."""
    path = tmp_path / "aligned.pt"
    path.write_bytes(_aligned_zip(_torch_records(200)))
    storage, blob, codec = _open(path)
    variables = codec.list_variables(blob, {})
    assert storage.counters.requests <= 4, storage.counters.requests  # the head included
    assert len(variables) == 200 and all(v.span is not None for v in variables)
    storage.counters.reset()
    v = next(v for v in variables if v.name == "w150")
    assert np.array_equal(codec.read(blob, v), np.arange(3, dtype="<f4") + 150)
    assert storage.counters.requests == 1  # the local header comes with the values
    assert v.span.offset % 64 == 0
    _check_values(blob, codec, variables, 200)


def test_wrong_prediction_is_caught_when_reading(tmp_path):
    """A record whose local header disagrees with the prediction (the directory looking
    torch-written) reads its values from the exact offset."""
    path = tmp_path / "lying.pt"
    path.write_bytes(_aligned_zip(_torch_records(200), lie="m/data/150"))
    storage, blob, codec = _open(path)
    variables = codec.list_variables(blob, {})
    v = next(v for v in variables if v.name == "w150")
    assert v.locator[0] == "check"  # listed at the predicted offset ...
    storage.counters.reset()
    assert np.array_equal(codec.read(blob, v), np.arange(3, dtype="<f4") + 150)
    assert storage.counters.requests == 2  # ... which the read finds wrong: read again
    _check_values(blob, codec, variables, 200)


def test_other_zip_writers_read_correct_values(tmp_path):
    """Python's zipfile (no padding, no alignment): the local headers are read instead."""
    path = tmp_path / "plain.pt"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for name, data in _torch_records(30).items():
            z.writestr(name, data)
    storage, blob, codec = _open(path)
    variables = codec.list_variables(blob, {})
    assert all(v.locator is None for v in variables)  # exact offsets: nothing left to check
    _check_values(blob, codec, variables, 30)


# -- a whole pickled module (torch.save(model)) -------------------------------------------------
def _module(cls: str, params: dict, children: dict | None = None, buffers: dict | None = None,
            transient: tuple = ()) -> Obj:  # fmt: skip
    """What ``torch.save(model)`` pickles for one ``nn.Module``: its class and its __dict__."""
    state = {
        "training": True,
        "_parameters": params,
        "_buffers": buffers or {},
        "_non_persistent_buffers_set": list(transient),
        "_modules": children or {},
    }
    return Obj(*cls.rsplit(".", 1), state)


def test_whole_pickled_module_lists_its_state_dict(tmp_path):
    """``torch.save(model)``: the model's classes stand in as inert records (nothing imported
    or run), its tensors are named as ``model.state_dict()`` names them, and each row names the
    class it belonged to. Non-persistent buffers are not part of the state dict."""
    w1, b1 = np.arange(6, dtype=np.float32).reshape(3, 2), np.ones(3, np.float32)
    w2 = np.full((2, 3), 0.5, np.float32)
    stats = np.arange(3, dtype=np.float32)
    model = _module("my_project.models.Net", {}, {
        "fc1": _module("torch.nn.modules.linear.Linear", {"weight": w1, "bias": b1}),
        "act": _module("torch.nn.modules.activation.ReLU", {}),
        "fc2": _module("torch.nn.modules.linear.Linear", {"weight": w2, "bias": None},
                       buffers={"stats": stats, "scratch": stats}, transient=("scratch",)),
    })  # fmt: skip
    (tmp_path / "model.pt").write_bytes(torch_zip(model))
    cat = cv.open(tmp_path / "model.pt")
    v = cat.variables.set_index("name")
    # torch.load(weights_only=True) refuses the classes: one error row says so, the
    # tensors are listed and read all the same
    assert list(v.index) == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.stats", "model.pt"]
    assert v["error"].iloc[:4].isna().all()
    assert "refuses global my_project.models.Net" in v.loc["model.pt", "error"]
    assert not cat.serials["loadable"].any()
    assert v.loc["fc1.weight", "shape"] == (3, 2) and v.loc["fc2.stats", "dtype"] == "float32"
    np.testing.assert_array_equal(cat.read("fc1.weight"), w1)
    np.testing.assert_array_equal(cat.read("fc2.weight"), w2)
    assert cat.variable("fc2.weight").attrs["module_class"] == "torch.nn.modules.linear.Linear"


def test_functions_stay_refused_in_a_pickled_module(tmp_path):
    """The inert-class policy is for class names only: a function global is still refused."""
    evil = _module("my_project.models.Net", {"w": Obj("os", "system", "echo pwned")})
    (tmp_path / "evil.pt").write_bytes(torch_zip(evil))
    v = cv.open(tmp_path / "evil.pt").variables
    assert len(v) == 1 and "refused global os.system" in v["error"].iloc[0]


def test_torchscript_archive_lists_its_tensors(tmp_path):
    """``torch.jit.save``: data.pkl pickles ``__torch__.*`` module objects whose attributes are
    their tensors and submodules, beside constants.pkl and code/; listed by state_dict names."""
    from test_deepspeed import _Emitter

    w, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(2, np.float32)
    model = Obj("__torch__", "Net", {
        "training": False,
        "fc": Obj("__torch__.torch.nn.modules.linear", "Linear", {"training": False, "weight": w, "bias": b}),
        "scale": 2,
    })  # fmt: skip
    em = _Emitter()
    pkl = em.dump(model)
    path = tmp_path / "scripted.pt"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("scripted/data.pkl", pkl)
        z.writestr("scripted/constants.pkl", b"\x80\x02).")
        z.writestr("scripted/code/__torch__.py", "class Net(Module):\n  pass\n")
        z.writestr("scripted/byteorder", b"little")
        for i, arr in enumerate(em.storages):
            z.writestr(f"scripted/data/{i}", arr.tobytes())
    cat = cv.open(path, cache=False)
    v = cat.variables.set_index("name")
    assert list(v.index) == ["fc.weight", "fc.bias"] and v["error"].isna().all()
    np.testing.assert_array_equal(cat.read("fc.weight"), w)
    assert (
        cat.variable("fc.bias").attrs["module_class"] == "__torch__.torch.nn.modules.linear.Linear"
    )
