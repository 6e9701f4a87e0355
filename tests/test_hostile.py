"""Hostile trees through ``ckptview.open``: pickles that would run ``os.system`` and headers
claiming terabytes. The hostile file becomes an error row naming what was refused, the rest
of the tree is catalogued, the latest serial is the newest loadable one, nothing runs."""

from __future__ import annotations

import shutil
import tracemalloc
from pathlib import Path

import hostile
import numpy as np
import pytest
from conftest import corpus_path

import ckptview as cv

REFUSED = ("system", "posix", "refused", "not allowed", "forbidden")


@pytest.fixture(autouse=True)
def no_pwned(tmp_path, monkeypatch):
    """Run in tmp_path; afterwards no PWNED file anywhere near it."""
    monkeypatch.chdir(tmp_path)
    yield
    assert not list(tmp_path.rglob("PWNED")), "a pickle was executed"
    assert not (tmp_path.parent / "PWNED").exists()


def _error_rows(cat, fname: str):
    df = cat.variables
    return df[df["file"].str.endswith(fname) & df["error"].notna()]


def _assert_refused(cat, fname: str, words=REFUSED) -> None:
    rows = _error_rows(cat, fname)
    assert len(rows), f"{fname}: no error row"
    msg = " ".join(rows["error"]).lower()
    assert any(w in msg for w in words), msg


def _numbered(tmp_path: Path, src: str, names: list[str]) -> Path:
    root = tmp_path / "run"
    root.mkdir()
    for n in names:
        shutil.copyfile(corpus_path(src), root / n)
    return root


@pytest.mark.parametrize("maker", [hostile.torch_zip, hostile.torch_legacy])
def test_torch_run_with_hostile_newest(tmp_path, maker):
    root = _numbered(tmp_path, "modern/torch/run_A/step_100.pt", ["step_100.pt", "step_200.pt"])
    (root / "step_300.pt").write_bytes(maker())
    cat = cv.open(str(root), cache=False)
    _assert_refused(cat, "step_300.pt")
    assert cat.latest == 200
    df = cat.variables
    ok, first = df[df["serial"] == 200], df[df["serial"] == 100]
    assert len(ok) == len(first) > 0 and ok["error"].isna().all()  # copies of one file


@pytest.mark.parametrize("victim", ["optimizer.pt", "training_args.bin", "rng_state.pth"])
def test_hf_checkpoint_with_hostile_file(tmp_path, victim):
    root = tmp_path / "hf"
    shutil.copytree(corpus_path("modern/hf"), root)
    (root / "checkpoint-300" / victim).write_bytes(hostile.torch_zip())
    cat = cv.open(str(root), cache=False)
    assert cat.layout == "hf-trainer"
    _assert_refused(cat, f"checkpoint-300/{victim}")
    s = cat.serials
    if victim == "training_args.bin":  # resume never reads it: a warning, not a blocker
        assert cat.latest == 300 and s.loc[300, "loadable"] and s.loc[300, "error"] is None
        assert "training_args.bin" in s.loc[300, "warning"]
    else:
        assert cat.latest == 200 and not s.loc[300, "loadable"]
        assert victim in s.loc[300, "error"] and s.loc[300, "warning"] is None
    assert cat.read(_first_model_var(cat, 200), 200).size


def _first_model_var(cat, serial: int) -> str:
    df = cat.variables
    df = df[(df["serial"] == serial) & df["error"].isna() & (df["dtype"] != "object")]
    return df["name"].iloc[0]


def test_lightning_hostile_ckpt(tmp_path):
    root = tmp_path / "lt"
    shutil.copytree(corpus_path("modern/lightning_real"), root)
    ck = root / "lightning_logs/version_0/checkpoints"
    (ck / "epoch=2-step=300.ckpt").write_bytes(hostile.torch_zip())
    (ck / "last.ckpt").unlink()
    cat = cv.open(str(root), cache=False)
    _assert_refused(cat, "epoch=2-step=300.ckpt")
    assert cat.latest == 100


def test_paddle_pickles(tmp_path):
    root = tmp_path / "dygraph"
    shutil.copytree(corpus_path("paddle/dygraph"), root)
    (root / "model.pdparams").write_bytes(hostile.reduce_pickle())
    (root / "evil.pdopt").write_bytes(hostile.reduce_pickle("builtins", "eval", "1"))
    cat = cv.open(str(root), cache=False)
    _assert_refused(cat, "model.pdparams")
    _assert_refused(cat, "evil.pdopt", ("eval", "refused", "builtins"))
    good = cat.variables[cat.variables["file"].str.endswith("model.pdopt")]
    assert len(good) > 5 and good["error"].isna().all()


def test_dcp_metadata_hostile(tmp_path):
    root = tmp_path / "dcp"
    shutil.copytree(corpus_path("modern/dcp"), root)
    (root / "step_2" / ".metadata").write_bytes(hostile.reduce_pickle())
    cat = cv.open(str(root), cache=False)
    _assert_refused(cat, "step_2/.metadata")
    assert cat.latest == 1


def test_npz_with_object_member(tmp_path):
    root = _numbered(tmp_path, "modern/npz/step_100.npz", ["step_100.npz"])
    w = hostile.npy("<f4", (4,), np.arange(4, dtype="<f4").tobytes())
    (root / "step_200.npz").write_bytes(hostile.npz({"w.npy": w, "evil.npy": hostile.npy_object()}))
    cat = cv.open(str(root), cache=False)
    rows = cat.variables[cat.variables["serial"] == 200]
    evil = rows[rows["name"].str.contains("evil")]
    assert len(evil) == 1 and (evil["error"].notna().all() or (evil["dtype"] == "object").all())
    if evil["error"].isna().all():  # listed as an object row: reading it must refuse
        with pytest.raises((ValueError, KeyError, OSError)):
            cat.read(evil["name"].iloc[0], 200)
    np.testing.assert_array_equal(cat.read("w", 200), np.arange(4, dtype="<f4"))


def test_npy_object_file(tmp_path):
    (tmp_path / "evil.npy").write_bytes(hostile.npy_object())
    cat = cv.open(str(tmp_path / "evil.npy"), cache=False)
    df = cat.variables
    assert len(df) == 1
    if df["error"].isna().all():
        assert df["dtype"].iloc[0] == "object"
        with pytest.raises((ValueError, KeyError, OSError)):
            cat.read(df["name"].iloc[0], 0)


HUGE = {
    "big_header.safetensors": hostile.safetensors_huge_header,
    "big_tensor.safetensors": hostile.safetensors_huge_tensor,
    "big.npy": hostile.npy_huge,
    "big_member.npz": hostile.zip_huge_member,
    "big.pdiparams": hostile.paddle_tensor_huge,
    "big.minidb": hostile.caffe2_huge_record,
}


def test_terabyte_headers(tmp_path):
    """Every binary format with a length field claiming terabytes: an error row each, no
    large allocation, and the good file beside them catalogued."""
    root = tmp_path / "files"
    root.mkdir()
    for name, make in HUGE.items():
        (root / name).write_bytes(make())
    shutil.copyfile(corpus_path("modern/safetensors/single/model.safetensors"),
                    root / "model.safetensors")  # fmt: skip
    tracemalloc.start()
    try:
        cat = cv.open(str(root), cache=False)
        df = cat.variables
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, peak
    for name in HUGE:
        rows = df[df["file"].str.endswith(name)]
        bad = rows["error"].notna().any()
        assert bad, f"{name}: listed without an error: {rows[['name', 'shape']].values.tolist()}"
    good = df[df["file"].str.endswith("/model.safetensors")]
    assert len(good) == 11 and good["error"].isna().all()


def test_tf_index_huge_block_handle(tmp_path):
    """A TF index whose footer points at a block far past the end of the file."""
    root = tmp_path / "tf"
    shutil.copytree(corpus_path("modern/tf/run_ckpt"), root)
    index = root / "ckpt-400.index"
    data = index.read_bytes()
    # footer: metaindex handle, index handle (varints), zero padding to 40 bytes, magic
    handles = b"\x00\x08" + b"\xff" * 8 + b"\x7f" + b"\x0f"  # index block at ~2**63
    index.write_bytes(data[:-48] + handles.ljust(40, b"\0") + data[-8:])
    cat = cv.open(str(root), cache=False)
    rows = _error_rows(cat, "ckpt-400.index")
    assert len(rows)
    assert cat.latest == 300
