"""The ``lightning`` layout: the corpus runs (plain-torch rebuild and real Lightning 2.6.6) and
hand-built ModelCheckpoint dirs (``-v1`` versions, custom names, a ``last.ckpt`` of its own)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import corpus_path, ground_truth
from test_deepspeed import torch_zip

import ckptview as cv

ROOTS = ["modern/lightning", "modern/lightning_real"]
MC_KEY = (
    "ModelCheckpoint{'monitor': 'val_loss', 'mode': 'min', 'every_n_train_steps': 0, "
    "'every_n_epochs': 1, 'train_time_interval': None}"
)


def index_tree(corpus_index: dict, root: str) -> dict:
    return next(t for t in corpus_index["trees"] if t["root"] == root)


@pytest.mark.parametrize("root", ROOTS)
def test_serials_latest_alias_and_best(corpus_index, root):
    want = index_tree(corpus_index, root)
    cat = cv.open(corpus_path(root))
    assert cat.layout == "lightning"
    s = cat.serials
    assert list(s.index) == want["serials"]
    assert sorted(s.index[s["complete"]]) == want["complete_serials"]
    assert cat.latest == want["latest_resumable_serial"]
    for fname, per in want["per_serial"].items():
        n = per["serial"]
        assert (s.loc[n, "epoch"], s.loc[n, "step"]) == (per["epoch"], per["global_step"])
        assert s.loc[n, "path"].endswith(fname)
    last = want["files_global_step"]["last.ckpt"]
    info = next(i for i in cat.scan.serials if i.serial == last)
    assert any(a.endswith("/last.ckpt") for a in info.aliases)
    assert cat.attrs["best_model_score"] == pytest.approx(want["best_model_score"])
    assert cat.attrs["best_model_path"].endswith(want["best_file"])
    assert cat.attrs["monitor"] == want["monitor"]
    m = cat.metrics
    best = s.index[s["path"].str.endswith(want["best_file"])][0]
    got = m[(m["serial"] == best) & (m["name"] == want["monitor"])]["value"]
    assert got.tolist() == [pytest.approx(want["best_model_score"])]
    assert cat.attrs["hparams"] == {"hidden": 8, "lr": 0.01}


def test_metrics_csv_rows_map_to_global_steps(corpus_index):
    want = index_tree(corpus_index, "modern/lightning_real")
    m = cv.open(corpus_path("modern/lightning_real")).metrics
    val = m[m["name"] == "val_loss"].set_index("serial")["value"]
    # the note records epoch 1's val_loss 1.1034 for the deleted step-200 checkpoint
    assert want["deleted_serials"] == [200] and val[200] == pytest.approx(1.1034, abs=1e-4)
    assert val[100] == pytest.approx(want["best_model_score"])
    assert sorted(val.index) == [100, 200, 300]


@pytest.mark.parametrize("root", ROOTS)
def test_every_tensor(root):
    files = ground_truth("modern/ground_truth.json")["files"]
    family = root.split("/", 1)[1]
    cat = cv.open(corpus_path(root))
    v = cat.variables
    checked = 0
    for rel, entry in files.items():
        if not rel.startswith(family + "/") or not rel.endswith(".ckpt") or "last" in rel:
            continue
        rows = v[v["file"].str.endswith(rel.rsplit("/", 1)[1])]
        for t in entry["tensors"]:
            key = t["key"]
            if "best_k_models/" in key:  # keyed by a path the ground truth made relative
                head, tail = key.split("best_k_models/", 1)
                hit = rows[[n.startswith(head) and n.endswith("/" + tail) for n in rows["name"]]]
            else:
                hit = rows[rows["name"] == key]
            assert len(hit) == 1, t["key"]
            row = hit.iloc[0]
            assert (row["dtype"], row["shape"]) == (t["dtype"], tuple(t["shape"]))
            arr = np.asarray(cat.read(row["name"], serial=int(row["serial"])), np.float64)
            assert arr.sum() == pytest.approx(t["sum"], rel=1e-6)
            checked += 1
    assert checked > 40


# -- hand-built trees --------------------------------------------------------------------------
def ckpt(epoch: int, step: int, score: float, best: dict | None = None) -> bytes:
    state = {
        "monitor": "val_loss",
        "best_model_score": np.array(min((best or {"": score}).values()), np.float32),
        "best_model_path": "",
        "current_score": np.array(score, np.float32),
        "best_k_models": {k: np.array(v, np.float32) for k, v in (best or {}).items()},
    }
    return torch_zip(
        {
            "epoch": epoch,
            "global_step": step,
            "pytorch-lightning_version": "2.6.6",
            "state_dict": {"w": np.full(2, step, np.float32)},
            "callbacks": {MC_KEY: state},
        }
    )


def test_versions_custom_names_and_own_last(tmp_path):
    d = tmp_path / "checkpoints"
    d.mkdir()
    (d / "epoch=0-step=10.ckpt").write_bytes(ckpt(0, 10, 0.9))
    (d / "epoch=0-step=10-v1.ckpt").write_bytes(ckpt(0, 10, 0.8))
    (d / "epoch=1-val_loss=0.50.ckpt").write_bytes(ckpt(1, 20, 0.5))  # no step in the name
    best = {"/elsewhere/epoch=1-val_loss=0.50.ckpt": 0.5, "epoch=0-step=10-v1.ckpt": 0.8}
    (d / "last.ckpt").write_bytes(ckpt(2, 30, 0.7, best))  # step 30 has no file of its own
    cat = cv.open(tmp_path)
    s = cat.serials
    assert list(s.index) == [10, 20, 30]
    assert s.loc[10, "path"].endswith("epoch=0-step=10-v1.ckpt")  # the newer version
    assert s.loc[20, "step"] == 20 and s.loc[20, "epoch"] == 1
    assert s.loc[30, "path"].endswith("last.ckpt") and cat.latest == 30
    assert cat.read("state_dict/w", serial=20).tolist() == [20.0, 20.0]
    m = cat.metrics.set_index("serial")["value"]
    assert m[20] == pytest.approx(0.5) and m[10] == pytest.approx(0.8)
    assert cat.attrs["best_model_score"] == pytest.approx(0.5)


def test_without_last_latest_is_the_largest_step(tmp_path):
    for e, step in enumerate((5, 15)):
        (tmp_path / f"epoch={e}-step={step}.ckpt").write_bytes(ckpt(e, step, 1.0))
    cat = cv.open(tmp_path)
    assert cat.layout == "lightning" and cat.latest == 15


def test_truncated_ckpt(tmp_path):
    (tmp_path / "epoch=0-step=5.ckpt").write_bytes(ckpt(0, 5, 1.0))
    good = ckpt(1, 15, 1.0)
    (tmp_path / "epoch=1-step=15.ckpt").write_bytes(good[: len(good) // 2])
    cat = cv.open(tmp_path)
    assert cat.serials["complete"].tolist() == [True, False]
    assert cat.latest == 5
    bad = cat.variables.query("serial == 15")
    assert len(bad) == 1 and isinstance(bad["error"].iloc[0], str)
