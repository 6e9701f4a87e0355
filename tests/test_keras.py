"""Keras weight files (codec ``keras``): ``.weights.h5`` and ``.keras`` zips, via h5py."""

from __future__ import annotations

import os
import sys
import zipfile
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest
from conftest import corpus_path, ground_truth

import ckptview as cv
from ckptview.codecs.keras import KerasCodec
from ckptview.io import Storage

GT = "tf_orbax/tf/ground_truth.json"
KERAS = "tf_orbax/tf/keras"


def _one_file(path: Path) -> cv.Catalog:
    cat = cv.open(path)
    assert cat.layout == "files"
    return cat


@pytest.mark.parametrize(
    "filename, gt_key",
    [("w.weights.h5", "keras_weights_h5"), ("m.keras", "keras_zip_model_weights_h5")],
)
def test_every_ground_truth_dataset(filename, gt_key):
    expected = ground_truth(GT)[gt_key]
    cat = _one_file(corpus_path(KERAS, filename))
    rows = cat.variables.set_index("name")
    assert set(rows.index) == {d["path"] for d in expected}
    assert rows["error"].isna().all()
    for d in expected:
        row = rows.loc[d["path"]]
        assert (row["dtype"], row["shape"]) == (d["dtype"], tuple(d["shape"]))
        assert float(cat.read(d["path"]).astype(np.float64).sum()) == pytest.approx(d["sum"])
        assert cat.variable(d["path"]).span is not None  # contiguous: read without h5py


def test_tree_of_keras_files():
    cat = cv.open(corpus_path(KERAS))
    names = set(cat.variables["name"])
    assert "m.keras/layers/dense/vars/0" in names and "w.weights.h5/layers/dense_1/vars/1" in names
    var = cat.variable("w.weights.h5/layers/dense/vars/0")
    assert var.attrs["layer"] == "d1"  # Keras 3 keeps the layer name as a group attribute
    assert np.array_equal(
        cat.read("m.keras/layers/dense/vars/0"), cat.read("w.weights.h5/layers/dense/vars/0")
    )


def test_span_and_h5py_reads_agree():
    storage, _ = Storage.from_url("/")
    codec = KerasCodec()
    for name in ("w.weights.h5", "m.keras"):
        blob = storage.blob(str(corpus_path(KERAS, name)))
        for var in codec.list_variables(blob, {}):
            via_span = codec.read(blob, var)
            var.span = None
            assert np.array_equal(via_span, codec.read(blob, var))


def test_deflated_keras_zip(tmp_path):
    src = corpus_path(KERAS, "m.keras")
    dst = tmp_path / "deflated.keras"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info.filename))
    expected = {d["path"]: d for d in ground_truth(GT)["keras_zip_model_weights_h5"]}
    cat = _one_file(dst)
    for name, d in expected.items():
        assert cat.variable(name).span is None
        assert float(cat.read(name).astype(np.float64).sum()) == pytest.approx(d["sum"])


def test_hand_made_h5_dtypes_and_members(tmp_path):
    path = tmp_path / "x.weights.h5"
    with h5py.File(path, "w") as f:
        f["layers/emb/vars/0"] = np.array([0x3F80, 0xC000], dtype="<u2")  # bfloat16 1.0, -2.0
        f["layers/emb/vars/0"].attrs["dtype"] = "bfloat16"
        f["layers/big/vars/0"] = np.arange(6, dtype=">i4").reshape(2, 3)
        f.create_dataset("optimizer/vars/0", data=np.full(100, 0.5, "<f8"), compression="gzip")
    cat = _one_file(path)
    rows = cat.variables.set_index("name")
    assert rows.loc["layers/emb/vars/0", "dtype"] == "bfloat16"
    assert cat.read("layers/emb/vars/0").astype(np.float32).tolist() == [1.0, -2.0]
    assert rows.loc["layers/big/vars/0", "dtype"] == "int32"
    assert cat.read("layers/big/vars/0").tolist() == [[0, 1, 2], [3, 4, 5]]
    assert rows.loc["optimizer/vars/0", "kind"] == "optimizer"
    assert cat.read("optimizer/vars/0").sum() == 50.0
    # a .keras holding two weight files: names are prefixed by the member
    two = tmp_path / "two.keras"
    with zipfile.ZipFile(two, "w") as z:
        z.write(path, "model.weights.h5")
        z.write(path, "extra.weights.h5")
        z.writestr("config.json", "{}")
    names = set(_one_file(two).variables["name"])
    assert (
        "extra.weights.h5/layers/big/vars/0" in names
        and "model.weights.h5/optimizer/vars/0" in names
    )


def test_shape_claiming_terabytes_is_refused(tmp_path):
    path = tmp_path / "huge.weights.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("layers/x/vars/0", shape=(1 << 40,), dtype="<f4", chunks=(1024,))
    assert path.stat().st_size < 1 << 20
    cat = _one_file(path)
    assert cat.variables.loc[0, "shape"] == (1 << 40,)
    with pytest.raises(ValueError, match="claims"):
        cat.read("layers/x/vars/0")


@pytest.mark.parametrize(
    "name, content",
    [
        ("trunc.weights.h5", lambda: corpus_path(KERAS, "w.weights.h5").read_bytes()[:3000]),
        ("empty.weights.h5", lambda: b""),
        ("random.weights.h5", lambda: os.urandom(5000)),
        ("random.keras", lambda: b"PK\x03\x04" + os.urandom(5000)),
        ("trunc.keras", lambda: corpus_path(KERAS, "m.keras").read_bytes()[:9000]),
    ],
)
def test_bad_files_are_error_rows(tmp_path, name, content):
    (tmp_path / name).write_bytes(content())
    (tmp_path / "ok.weights.h5").write_bytes(corpus_path(KERAS, "w.weights.h5").read_bytes())
    cat = cv.open(tmp_path)
    df = cat.variables
    bad = df[df["file"].str.endswith(name)]
    good = df[df["file"].str.endswith("ok.weights.h5")]
    assert len(good) == 4 and good["error"].isna().all()
    if name.startswith("empty"):  # zero bytes: no codec claims it, the files layout skips it
        assert bad.empty or bad["error"].notna().all()
    else:
        assert len(bad) == 1 and pd.notna(bad["error"].iloc[0])


def test_keras_zip_without_weights(tmp_path):
    path = tmp_path / "none.keras"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("config.json", "{}")
    df = _one_file(path).variables
    assert len(df) == 1 and "without a weights" in df.loc[0, "error"]


def test_missing_h5py_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "h5py", None)
    df = _one_file(corpus_path(KERAS, "w.weights.h5")).variables
    assert len(df) == 1 and "ckptview[keras]" in df.loc[0, "error"]


CRASH_SCRIPT = """
import fsspec
from ckptview.scan.listing import list_file
from ckptview.io import Storage
from ckptview.model import FileRef
res = list_file(Storage(fsspec.filesystem("file")), 0, FileRef({path!r}))
print("ERROR:", res.error)
"""


def test_libhdf5_crash_becomes_an_error_row(tmp_path):
    """A mutation that crashes libhdf5 2.0.0 (h5py 3.16) in H5Aread: h5py runs in a child
    process, so the file is an error row and the scan (this process) goes on."""
    import subprocess

    buf = bytearray(corpus_path(KERAS, "w.weights.h5").read_bytes())
    for pos, value in ((10603, 87), (2762, 116), (201, 102), (8841, 118)):
        buf[pos] = value
    path = tmp_path / "w.weights.h5"
    path.write_bytes(bytes(buf))
    proc = subprocess.run([sys.executable, "-c", CRASH_SCRIPT.format(path=str(path))],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert "ERROR: " in proc.stdout and "ERROR: None" not in proc.stdout
    # and in this process: the error row, then a fresh child serves the next file
    (tmp_path / "ok.weights.h5").write_bytes(corpus_path(KERAS, "w.weights.h5").read_bytes())
    df = cv.open(tmp_path, cache=False).variables
    bad = df[df["file"].str.endswith("/w.weights.h5")]
    good = df[df["file"].str.endswith("ok.weights.h5")]
    assert len(bad) == 1 and "HDF5 library crashed reading this file" in bad["error"].iloc[0]
    assert len(good) == 4 and good["error"].isna().all()
    assert cv.open(tmp_path / "ok.weights.h5").read("layers/dense/vars/0").shape == (4, 8)


def test_hdf5_child_serves_reads_through_the_blob(tmp_path):
    """Compressed datasets are read by the child; its reads are counted in this process."""
    path = tmp_path / "z.weights.h5"
    values = np.arange(5000, dtype="<f4")
    with h5py.File(path, "w") as f:
        f.create_dataset("layers/z/vars/0", data=values, compression="gzip")
    cat = cv.open(path, cache=False)
    assert cat.variable("layers/z/vars/0").span is None
    listed = cat.storage.counters.bytes_read
    assert 0 < listed <= path.stat().st_size
    np.testing.assert_array_equal(cat.read("layers/z/vars/0"), values)
    assert cat.storage.counters.bytes_read > listed
