"""The ``hf-trainer`` layout on the real transformers 5.23 runs, and on edited copies."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
from conftest import corpus_path, ground_truth

import ckptview as cv

GT = "modern/ground_truth.json"


def index_tree(corpus_index: dict, root: str) -> dict:
    return next(t for t in corpus_index["trees"] if t["root"] == root)


@pytest.mark.parametrize("root", ["modern/hf", "modern/hf_limit"])
def test_serials_metrics_and_attrs(corpus_index, root):
    want = index_tree(corpus_index, root)
    cat = cv.open(corpus_path(root))
    assert cat.layout == "hf-trainer"
    s = cat.serials
    assert list(s.index) == want["serials"]
    assert sorted(s.index[s["complete"]]) == want["complete_serials"]
    assert cat.latest == want["latest_resumable_serial"]
    m = cat.metrics
    for per in want["per_serial"].values():
        n = per["serial"]
        assert s.loc[n, "step"] == per["global_step"]
        assert s.loc[n, "epoch"] == math.floor(per["epoch"])
        got = m[(m["serial"] == n) & (m["name"] == "eval_loss")]["value"]
        assert got.tolist() == [pytest.approx(per["eval_loss"])]
    assert cat.attrs["best_serial"] == want["best_serial"]
    assert cat.attrs["best_metric"] == pytest.approx(want["best_metric"]["eval_loss"])
    assert cat.attrs["save_total_limit"] == want["save_total_limit"]
    assert cat.attrs["training_args"]["metric_for_best_model"] == "eval_loss"


@pytest.mark.parametrize("root", ["modern/hf", "modern/hf_limit"])
def test_every_file_and_tensor(root):
    files = ground_truth(GT)["files"]
    family = root.split("/", 1)[1]
    cat = cv.open(corpus_path(root))
    v = cat.variables
    assert v["error"].isna().all()
    prefixes = {"model.safetensors": "model", "optimizer.pt": "optimizer",
                "scheduler.pt": "scheduler", "rng_state.pth": "rng_state",
                "training_args.bin": "training_args"}  # fmt: skip
    n_checked = 0
    for rel, entry in files.items():
        if not rel.startswith(family + "/checkpoint-") or "tensors" not in entry:
            continue
        ckpt, fname = rel.split("/")[1:]
        serial = int(ckpt.split("-")[1])
        rows = v[(v["serial"] == serial) & v["file"].str.endswith(f"{ckpt}/{fname}")]
        assert len(rows) or not entry["tensors"], rel
        for t in entry["tensors"]:
            name = f"{prefixes[fname]}/{t['key']}"
            row = rows[rows["name"] == name]
            assert len(row) == 1, name
            assert (row["dtype"].iloc[0], row["shape"].iloc[0]) == (t["dtype"], tuple(t["shape"]))
            arr = cat.read(name, serial=serial)
            assert float(np.asarray(arr, np.float64).sum()) == pytest.approx(t["sum"], rel=1e-6)
            n_checked += 1
    assert n_checked > 50
    kinds = v.groupby(v["name"].str.split("/").str[0])["kind"].unique()
    assert list(kinds["optimizer"]) == ["optimizer"] and list(kinds["rng_state"]) == ["rng"]


@pytest.fixture
def hf_copy(tmp_path):
    root = tmp_path / "out"
    shutil.copytree(corpus_path("modern/hf"), root)
    for p in root.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return root


def test_crashed_save_and_stale_tmp_dir(hf_copy):
    crashed = hf_copy / "checkpoint-400"
    shutil.copytree(hf_copy / "checkpoint-300", crashed)
    (crashed / "trainer_state.json").unlink()  # written last: the save died before it
    shutil.copytree(hf_copy / "checkpoint-300", hf_copy / "tmp-checkpoint-500")
    cat = cv.open(hf_copy)
    s = cat.serials
    assert list(s.index) == [100, 200, 300, 400, 500]
    assert s["complete"].tolist() == [True, True, True, False, False]
    # get_last_checkpoint would pick checkpoint-400 (no validity check); it is not loadable,
    # so the catalog falls back to the newest complete one and records the framework's pick
    assert cat.latest == 300 and cat.attrs["framework_latest"] == 400
    assert "trainer_state" in s.loc[400, "error"] and "tmp-checkpoint" in s.loc[500, "error"]


def test_step_mismatch_is_recorded_not_incomplete(hf_copy):
    # get_last_checkpoint resumes from the highest checkpoint-N whatever its global_step
    # (spec §6.3): a copy promoted to a new number keeps its global_step and is still loaded
    state = hf_copy / "checkpoint-300" / "trainer_state.json"
    data = json.loads(state.read_text())
    data["global_step"] = 299
    state.write_text(json.dumps(data))
    cat = cv.open(hf_copy)
    assert cat.serials.loc[300, "complete"] and cat.latest == 300
    assert cat.serials.loc[300, "step"] == 299 and cat.serials.loc[300, "error"] is None
    info = next(s for s in cat.scan.serials if s.serial == 300)
    assert info.attrs["global_step_mismatch"] == "global_step 299 != 300"


def test_sharded_weights_and_per_process_rng(hf_copy, tmp_path):
    ckpt = hf_copy / "checkpoint-300"
    shards = sorted(corpus_path("modern/safetensors/sharded").iterdir())
    (ckpt / "model.safetensors").unlink()
    for f in shards:
        (ckpt / f.name).write_bytes(f.read_bytes())
    rng = (ckpt / "rng_state.pth").read_bytes()
    (ckpt / "rng_state.pth").unlink()
    (ckpt / "rng_state_0.pth").write_bytes(rng)
    (ckpt / "rng_state_1.pth").write_bytes(rng)
    cat = cv.open(hf_copy)
    v = cat.variables.query("serial == 300")
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    model = sorted(n for n in v["name"] if n.startswith("model/"))
    assert model == sorted(f"model/{k}" for k in index["weight_map"])
    assert cat.serials.loc[300, "nodes"] == ("rank0", "rank1")
    gt = ground_truth(GT)["files"]["safetensors/sharded/model-00001-of-00002.safetensors"]
    t = gt["tensors"][0]
    assert float(cat.read(f"model/{t['key']}", serial=300).sum()) == pytest.approx(t["sum"])
    assert cat.read("rng_state/cpu", serial=300, node="rank1").dtype == np.uint8


def test_a_single_checkpoint_dir(corpus_index):
    cat = cv.open(corpus_path("modern/hf/checkpoint-200"))
    assert cat.layout == "hf-trainer"
    assert list(cat.serials.index) == [200] and cat.latest == 200
    assert cat.serials.loc[200, "complete"]
