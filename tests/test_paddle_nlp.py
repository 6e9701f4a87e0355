"""The ``paddlenlp-trainer`` layout: PaddleNLP Trainer ``checkpoint-N/`` dirs of paddle.save
pickles (written here with plain ``pickle``, as ``paddle.save`` stores numpy arrays)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest

import ckptview as cv
from ckptview import registry

STEPS = (10, 20, 30)


def _state(step: int, **extra) -> dict:
    return {"global_step": step, "epoch": step / 10 + 0.5, "max_steps": 30,
            "log_history": [{"loss": 1.0 / step, "learning_rate": 1e-3, "step": step,
                             "epoch": step / 10}],
            "best_metric": 0.25, "best_model_checkpoint": "out/checkpoint-20",
            "consumed_samples": step * 8, **extra}  # fmt: skip


def write_checkpoint(d: Path, step: int, sharded: bool = False, extra: dict | None = None) -> Path:
    """One ``checkpoint-N/`` as PaddleNLP's Trainer writes it."""
    d.mkdir(parents=True, exist_ok=True)
    w = np.full((3, 4), step, np.float32)
    model = {"linear.weight": w, "linear.bias": np.arange(4, dtype=np.float32),
             "StructuredToParameterName@@": {"linear.weight": "linear_0.w_0",
                                             "linear.bias": "linear_0.b_0"}}  # fmt: skip
    if sharded:
        index = {"metadata": {"total_size": 64},
                 "weight_map": {"linear.weight": "model_state-00001-of-00002.pdparams",
                                "linear.bias": "model_state-00002-of-00002.pdparams"}}  # fmt: skip
        (d / "model_state.pdparams.index.json").write_text(json.dumps(index))
        (d / "model_state-00001-of-00002.pdparams").write_bytes(
            pickle.dumps({"linear.weight": w}, protocol=4))  # fmt: skip
        (d / "model_state-00002-of-00002.pdparams").write_bytes(
            pickle.dumps({"linear.bias": model["linear.bias"]}, protocol=4))  # fmt: skip
    else:
        (d / "model_state.pdparams").write_bytes(pickle.dumps(model, protocol=4))
    opt = {"linear_0.w_0_moment1_0": np.full((3, 4), -step, np.float32),
           "linear_0.w_0_beta1_pow_acc_0": np.array([0.9], np.float32),
           "LR_Scheduler": {"last_epoch": step, "last_lr": 1e-3}}  # fmt: skip
    (d / "optimizer.pdopt").write_bytes(pickle.dumps(opt, protocol=4))
    (d / "scheduler.pdparams").write_bytes(pickle.dumps({"last_epoch": step}, protocol=4))
    (d / "trainer_state.json").write_text(json.dumps(_state(step, **(extra or {}))))
    (d / "config.json").write_text(json.dumps({"hidden_size": 4}))
    (d / "training_args.bin").write_bytes(b"\x80\x04not read on resume")
    return d


def write_run(root: Path, steps=STEPS, **kw) -> Path:
    for step in steps:
        write_checkpoint(root / f"checkpoint-{step}", step, **kw)
    return root


def test_serials_latest_and_kinds(tmp_path):
    cat = cv.open(write_run(tmp_path / "out"), cache=False)
    assert cat.layout == "paddlenlp-trainer"
    s = cat.serials
    assert list(s.index) == list(STEPS)
    assert s["complete"].all() and s["loadable"].all(), s[["error", "warning"]]
    assert cat.latest == 30 and s["latest"].tolist() == [False, False, True]
    v = cat.variables.query("serial == 30").set_index("name")
    assert v.loc["model/linear.weight", "kind"] == "model"
    assert v.loc["optimizer/linear_0.w_0_moment1_0", "kind"] == "optimizer"
    assert v.loc["scheduler/last_epoch", "kind"] == "scheduler"
    np.testing.assert_array_equal(cat.read("model/linear.weight"), np.full((3, 4), 30, "f4"))
    np.testing.assert_array_equal(cat.read("optimizer/linear_0.w_0_moment1_0", serial=10),
                                  np.full((3, 4), -10, "f4"))  # fmt: skip


def test_step_epoch_and_metrics_from_trainer_state(tmp_path):
    cat = cv.open(write_run(tmp_path / "out"), cache=False)
    s = cat.serials
    assert s["step"].tolist() == [10, 20, 30]
    assert s["epoch"].tolist() == [1, 2, 3]  # floor of 1.5, 2.5, 3.5
    m = cat.metrics.set_index(["serial", "name"])["value"]
    assert m[(20, "loss")] == pytest.approx(0.05)
    assert m[(30, "learning_rate")] == pytest.approx(1e-3)
    assert cat.attrs["best_metric"] == 0.25 and cat.attrs["best_serial"] == 20


def test_sharded_weights_with_their_index(tmp_path):
    cat = cv.open(write_run(tmp_path / "out", sharded=True), cache=False)
    assert cat.serials["loadable"].all()
    np.testing.assert_array_equal(cat.read("model/linear.bias"), np.arange(4, dtype="f4"))
    (tmp_path / "out/checkpoint-30/model_state-00002-of-00002.pdparams").unlink()
    cat = cv.open(tmp_path / "out", cache=False)
    assert not cat.serials.loc[30, "loadable"]
    assert "model_state-00002-of-00002.pdparams" in cat.serials.loc[30, "error"]
    assert cat.latest == 20


def test_an_unknown_trainer_state_key_is_not_loadable(tmp_path):
    root = write_run(tmp_path / "out")
    write_checkpoint(root / "checkpoint-30", 30, extra={"lkg_history": []})
    cat = cv.open(root, cache=False)
    row = cat.serials.loc[30]
    assert not row["loadable"] and "lkg_history" in row["error"]
    assert "TrainerState" in row["error"]
    assert cat.latest == 20 and cat.attrs["framework_latest"] == 30


def test_paddlenlp_only_keys_are_accepted(tmp_path):
    """``consumed_samples``/``trained_samples`` are PaddleNLP TrainerState fields."""
    root = write_run(tmp_path / "out", extra={"trained_samples": 5})
    assert cv.open(root, cache=False).serials["loadable"].all()


@pytest.mark.parametrize("gone", ["optimizer.pdopt", "trainer_state.json", "model_state.pdparams",
                                  "scheduler.pdparams"])  # fmt: skip
def test_a_missing_file_makes_the_serial_not_loadable(tmp_path, gone):
    root = write_run(tmp_path / "out")
    (root / "checkpoint-30" / gone).unlink()
    cat = cv.open(root, cache=False)
    row = cat.serials.loc[30]
    assert not row["loadable"] and gone in row["error"]
    assert cat.latest == 20
    assert cat.serials.loc[[10, 20], "loadable"].all()


def test_truncated_or_unparsable_files(tmp_path):
    root = write_run(tmp_path / "out")
    opt = root / "checkpoint-30/optimizer.pdopt"
    opt.write_bytes(opt.read_bytes()[:-1])
    (root / "checkpoint-20/trainer_state.json").write_bytes(b'{"global_step": 2\xff0}')
    cat = cv.open(root, cache=False)
    assert cat.serials["loadable"].tolist() == [True, False, False]
    assert cat.latest == 10


def test_files_the_resume_does_not_read_do_not_block(tmp_path):
    root = write_run(tmp_path / "out")
    (root / "checkpoint-30/training_args.bin").unlink()
    (root / "checkpoint-30/rng_state_1.pth").write_bytes(b"\x80\x04broken")
    cat = cv.open(root, cache=False)
    row = cat.serials.loc[30]
    assert row["loadable"] and "rng_state_1.pth" in row["warning"]


def test_retention_keeps_the_newest_loadable(tmp_path):
    root = write_run(tmp_path / "out", steps=(10, 20, 30, 40))
    (root / "checkpoint-40/optimizer.pdopt").unlink()
    cat = cv.open(root, cache=False)
    assert cat.latest == 30
    plan = cat.plan_retention(keep_last=1)
    assert plan.loc[30, "action"] == "keep"
    assert plan.loc[10, "action"] == "delete"
    cat.apply_retention(plan)
    after = cv.open(root, cache=False)
    assert 10 not in after.serials.index and after.latest == 30
    assert not (root / "checkpoint-10").exists()


def test_promote_copies_as_the_next_checkpoint(tmp_path):
    root = write_run(tmp_path / "out")
    cat = cv.open(root, cache=False)
    cat.restore(20)
    after = cv.open(root, cache=False)
    assert list(after.serials.index) == [10, 20, 30, 31]
    assert after.latest == 31 and after.serials.loc[31, "loadable"]
    np.testing.assert_array_equal(after.read("model/linear.weight"), np.full((3, 4), 20, "f4"))


def test_optimizer_files_and_commit_marker(tmp_path):
    cat = cv.open(write_run(tmp_path / "out"), cache=False)
    layout = registry.get_layout("paddlenlp-trainer")
    info = layout.scan(cat.tree).serials[0]
    assert layout.optimizer_files(cat.tree, info) == ["checkpoint-10/optimizer.pdopt"]
    assert layout.commit_markers(cat.tree, info) == ["checkpoint-10/trainer_state.json"]


def test_one_checkpoint_dir_as_the_root(tmp_path):
    d = write_checkpoint(tmp_path / "checkpoint-7", 7)
    cat = cv.open(d, cache=False)
    assert cat.layout == "paddlenlp-trainer" and list(cat.serials.index) == [7]
    assert cat.latest == 7


def test_hf_trainer_dirs_stay_hf(tmp_path):
    d = tmp_path / "out/checkpoint-5"
    d.mkdir(parents=True)
    (d / "trainer_state.json").write_text(json.dumps({"global_step": 5}))
    np.savez(d / "extra.npz", w=np.ones(2))
    assert cv.open(tmp_path / "out", cache=False).layout == "hf-trainer"
