"""The torch codec against real torch.save files (zip + legacy) and hostile or broken ones."""

from __future__ import annotations

import os
import pickle
import struct
import zipfile

import numpy as np
import pytest
from conftest import corpus_path, ground_truth

import ckptview as cv
from ckptview.codecs.torch import LEGACY_MAGIC

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
    assert cat.files["error"].isna().all(), cat.files["error"].tolist()
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
