"""Directories of per-step files are trees with serials (the ``numbered`` layout): Paddle hapi
``N.pdparams`` + ``N.pdopt``, Keras ``ModelCheckpoint`` templates, ``*_step_N.gguf``,
``step_N.npz``, per-step safetensors; a single such file still opens as before."""

from __future__ import annotations

import pickle
import struct
import zipfile
from pathlib import Path

import h5py
import numpy as np
import pytest
from hostile_names import safetensors

import ckptview as cv
from ckptview.layouts.base import FILENAME_METRIC, parse_name


# -- writers (no framework) ------------------------------------------------------------------
def write_hapi(d: Path, epochs=(1, 2, 3), final: bool = True) -> Path:
    """``paddle.Model.fit(save_dir=d)``: ``{epoch}.pdparams`` + ``{epoch}.pdopt``, ``final.*``."""
    d.mkdir(parents=True, exist_ok=True)
    names = list(epochs) + (["final"] if final else [])
    for n in names:
        v = 99 if n == "final" else n
        model = {"linear.weight": np.full((2, 3), v, np.float32),
                 "StructuredToParameterName@@": {"linear.weight": "linear_0.w_0"}}  # fmt: skip
        opt = {"linear_0.w_0_moment1_0": np.full((2, 3), -v, np.float32),
               "LR_Scheduler": {"last_epoch": v}}  # fmt: skip
        (d / f"{n}.pdparams").write_bytes(pickle.dumps(model, protocol=4))
        (d / f"{n}.pdopt").write_bytes(pickle.dumps(opt, protocol=4))
    return d


def write_weights_h5(path: Path, value: float) -> Path:
    """A Keras 3 ``save_weights`` file (h5py): ``layers/<name>/vars/<i>``."""
    with h5py.File(path, "w") as f:
        f["layers/dense/vars/0"] = np.full((4, 2), value, np.float32)
        f["layers/dense/vars/1"] = np.zeros(2, np.float32)
        f["optimizer/vars/0"] = np.array(3, np.int64)
    return path


def write_gguf(path: Path, value: float) -> Path:
    """A GGUF v3 file of one F32 tensor ``w`` (4 values)."""

    def string(s: str) -> bytes:
        return struct.pack("<Q", len(s)) + s.encode()

    kv = string("general.architecture") + struct.pack("<I", 8) + string("llama")
    info = string("w") + struct.pack("<IQ", 1, 4) + struct.pack("<IQ", 0, 0)
    head = b"GGUF" + struct.pack("<IQQ", 3, 1, 1) + kv + info
    head += b"\0" * (-len(head) % 32)
    path.write_bytes(head + np.full(4, value, "<f4").tobytes())
    return path


# -- Paddle hapi -------------------------------------------------------------------------------
def test_hapi_serials_latest_kinds_and_final(tmp_path):
    cat = cv.open(write_hapi(tmp_path / "run"), cache=False)
    assert cat.layout == "numbered"
    s = cat.serials
    assert list(s.index) == [1, 2, 3] and s["loadable"].all()
    assert cat.latest == 3
    assert s["epoch"].tolist() == [1, 2, 3]  # hapi names its saves by epoch
    assert s.loc[3, "n_files"] == 2
    v = cat.variables.query("serial == 3").set_index("name")
    assert v.loc["linear.weight", "kind"] == "model"
    assert v.loc["optimizer/linear_0.w_0_moment1_0", "kind"] == "optimizer"
    np.testing.assert_array_equal(cat.read("linear.weight"), np.full((2, 3), 3, "f4"))
    np.testing.assert_array_equal(cat.read("optimizer/linear_0.w_0_moment1_0", serial=2),
                                  np.full((2, 3), -2, "f4"))  # fmt: skip
    assert sorted(cat.attrs["unnumbered_files"]) == ["final.pdopt", "final.pdparams"]


@pytest.mark.parametrize("gone", ["3.pdopt", "3.pdparams"])
def test_hapi_missing_partner_is_not_loadable(tmp_path, gone):
    root = write_hapi(tmp_path / "run")
    (root / gone).unlink()
    cat = cv.open(root, cache=False)
    row = cat.serials.loc[3]
    assert not row["complete"] and not row["loadable"]
    assert repr(gone) in row["error"]
    assert cat.latest == 2


def test_hapi_truncated_file_moves_latest(tmp_path):
    root = write_hapi(tmp_path / "run")
    data = (root / "3.pdopt").read_bytes()
    (root / "3.pdopt").write_bytes(data[:-1])
    cat = cv.open(root, cache=False)
    assert cat.serials["loadable"].tolist() == [True, True, False]
    assert cat.latest == 2


def test_hapi_retention_keeps_the_newest_loadable(tmp_path):
    root = write_hapi(tmp_path / "run", epochs=(1, 2, 3, 4))
    (root / "4.pdparams").unlink()
    cat = cv.open(root, cache=False)
    plan = cat.plan_retention(keep_last=1)
    assert plan.loc[3, "action"] == "keep" and plan.loc[1, "action"] == "delete"
    cat.apply_retention(plan)
    assert not (root / "1.pdparams").exists() and not (root / "1.pdopt").exists()
    assert (root / "3.pdparams").exists() and (root / "final.pdparams").exists()
    assert cv.open(root, cache=False).latest == 3


def test_hapi_promote_copies_both_files(tmp_path):
    root = write_hapi(tmp_path / "run", final=False)
    cv.open(root, cache=False).restore(2)
    assert (root / "4.pdparams").exists() and (root / "4.pdopt").exists()
    after = cv.open(root, cache=False)
    assert after.latest == 4
    np.testing.assert_array_equal(after.read("linear.weight"), np.full((2, 3), 2, "f4"))


def test_a_single_file_opens_as_before(tmp_path):
    root = write_hapi(tmp_path / "run")
    write_weights_h5(tmp_path / "mlp_step_100.weights.h5", 1.0)
    write_gguf(tmp_path / "model_step_100.gguf", 1.0)
    for path in (root / "3.pdparams", root / "3.pdopt", tmp_path / "mlp_step_100.weights.h5",
                 tmp_path / "model_step_100.gguf"):  # fmt: skip
        cat = cv.open(path, cache=False)
        assert cat.layout == "files" and list(cat.serials.index) == [0], path
        assert cat.latest == 0 and cat.serials.loc[0, "loadable"], path
    assert "linear.weight" in set(cv.open(root / "3.pdparams", cache=False).variables["name"])


# -- Keras ModelCheckpoint templates ----------------------------------------------------------
@pytest.mark.parametrize("template", ["mlp_step_{}.weights.h5", "ckpt_step_{}.weights.h5"])
def test_keras_step_templates(tmp_path, template):
    for step in (100, 200, 300):
        write_weights_h5(tmp_path / template.format(step), step)
    cat = cv.open(tmp_path, cache=False)
    assert cat.layout == "numbered" and list(cat.serials.index) == [100, 200, 300]
    assert cat.serials["step"].tolist() == [100, 200, 300] and cat.latest == 300
    np.testing.assert_array_equal(cat.read("layers/dense/vars/0"), np.full((4, 2), 300, "f4"))
    assert cat.variables.set_index(["serial", "name"]).loc[(300, "optimizer/vars/0"), "kind"] \
        == "optimizer"  # fmt: skip


def test_keras_epoch_and_metric_template(tmp_path):
    """``weights.{epoch:02d}-{val_loss:.2f}.weights.h5``: serial = epoch, the loss a metric."""
    losses = {1: 0.93, 2: 0.61, 7: 0.41}
    for epoch, loss in losses.items():
        write_weights_h5(tmp_path / f"weights.{epoch:02d}-{loss:.2f}.weights.h5", epoch)
    cat = cv.open(tmp_path, cache=False)
    assert list(cat.serials.index) == [1, 2, 7] and cat.latest == 7
    assert cat.serials["epoch"].tolist() == [1, 2, 7]
    m = cat.metrics.set_index(["serial", "name"])["value"]
    assert {s: m[(s, FILENAME_METRIC)] for s in losses} == pytest.approx(losses)


def test_keras_zip_template_with_a_named_metric(tmp_path):
    for epoch, loss in ((3, 0.5), (4, 0.25)):
        h5 = write_weights_h5(tmp_path / "w.h5", epoch)
        with zipfile.ZipFile(tmp_path / f"model-{epoch:02d}-val_loss_{loss:.2f}.keras", "w") as z:
            z.write(h5, "model.weights.h5")
        h5.unlink()
    cat = cv.open(tmp_path, cache=False)
    assert list(cat.serials.index) == [3, 4] and cat.latest == 4
    assert cat.metrics.set_index(["serial", "name"])["value"][(4, "val_loss")] == 0.25


def test_keras_truncated_newest(tmp_path):
    for step in (1, 2):
        write_weights_h5(tmp_path / f"ckpt_step_{step}.weights.h5", step)
    path = tmp_path / "ckpt_step_2.weights.h5"
    path.write_bytes(path.read_bytes()[:600])
    cat = cv.open(tmp_path, cache=False)
    assert cat.serials["loadable"].tolist() == [True, False] and cat.latest == 1


# -- GGUF, npz, safetensors ------------------------------------------------------------------
@pytest.mark.parametrize("template", ["model_step_{}.gguf", "mlp_iter_{}.gguf"])
def test_gguf_per_step(tmp_path, template):
    for step in (10, 20):
        write_gguf(tmp_path / template.format(step), step)
    cat = cv.open(tmp_path, cache=False)
    assert cat.layout == "numbered" and list(cat.serials.index) == [10, 20]
    assert cat.latest == 20 and cat.serials["step"].tolist() == [10, 20]
    np.testing.assert_array_equal(cat.read("w"), np.full(4, 20, "f4"))
    (tmp_path / template.format(20)).write_bytes(b"GGUF\x03\0\0")
    assert cv.open(tmp_path, cache=False).latest == 10


def test_gguf_quantization_tags_are_not_serials():
    assert parse_name("llama-7b.Q4_K_M") is None
    assert parse_name("model_step_30.Q8_0").serial == 30


def test_npz_and_safetensors_per_step(tmp_path):
    for step in (5, 6):
        np.savez(tmp_path / f"step_{step}.npz", w=np.full(3, step))
        (tmp_path / f"model_step_{step}.safetensors").write_bytes(
            safetensors({"w": np.full(2, step, "f4")}))  # fmt: skip
    cat = cv.open(tmp_path, cache=False)
    assert cat.layout == "numbered" and list(cat.serials.index) == [5, 6]
    assert cat.serials["n_files"].tolist() == [2, 2] and cat.latest == 6
    (tmp_path / "model_step_6.safetensors").unlink()
    cat = cv.open(tmp_path, cache=False)
    assert not cat.serials.loc[6, "loadable"] and cat.latest == 5


@pytest.mark.parametrize(
    ("stem", "serial", "epoch", "metrics"),
    [
        ("weights.07-0.41", 7, 7, {FILENAME_METRIC: 0.41}),
        ("weights-improvement-05-0.87", 5, 5, {FILENAME_METRIC: 0.87}),
        ("ckpt_epoch3_loss0.25", 3, 3, {"loss": 0.25}),
        ("model_step_100_val_loss=1.5", 100, None, {"val_loss": 1.5}),
        ("100", 100, None, {}),
    ],
)
def test_parse_name_metrics(stem, serial, epoch, metrics):
    p = parse_name(stem)
    assert (p.serial, p.epoch, p.metrics) == (serial, epoch, metrics)
