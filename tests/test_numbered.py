"""The ``numbered`` layout: directories of numbered checkpoint files (or numbered dirs)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from conftest import corpus_path, ground_truth

import ckptview as cv
from ckptview.layouts.base import parse_name


def index_tree(corpus_index: dict, root: str) -> dict:
    return next(t for t in corpus_index["trees"] if t["root"] == root)


@pytest.mark.parametrize("root", ["modern/torch/run_A", "modern/torch/run_legacy", "modern/npz"])
def test_corpus_serials(corpus_index, root):
    want = index_tree(corpus_index, root)
    cat = cv.open(corpus_path(root))
    assert cat.layout == "numbered"
    s = cat.serials
    assert list(s.index) == want["serials"]
    assert sorted(s.index[s["complete"]]) == want["complete_serials"]
    assert cat.latest == want["latest_resumable_serial"]
    for fname, per in want["per_serial"].items():
        assert s.loc[per["serial"], "step"] == per["step"], fname
    assert s["error"].isna().all()


@pytest.mark.parametrize("root", ["modern/torch/run_A", "modern/torch/run_legacy", "modern/npz"])
def test_corpus_tensors(root):
    gt = ground_truth("modern/ground_truth.json")["files"]
    cat = cv.open(corpus_path(root))
    v = cat.variables
    family = root.split("/", 1)[1]
    for rel, entry in gt.items():
        if not rel.startswith(family + "/"):
            continue
        rows = v[v["file"].str.endswith("/" + rel.rsplit("/", 1)[1])]
        names = rows["name"].tolist()
        for t in entry["tensors"]:
            hit = [n for n in names if n == t["key"] or n.endswith("/" + t["key"])]
            assert len(hit) == 1, (rel, t["key"])
            row = rows[rows["name"] == hit[0]].iloc[0]
            assert (row["dtype"], row["shape"]) == (t["dtype"], tuple(t["shape"])), t["key"]
            arr = cat.read(hit[0], serial=int(row["serial"]))
            assert float(np.asarray(arr, np.float64).sum()) == pytest.approx(t["sum"], rel=1e-6)


def test_second_template_is_prefixed():
    cat = cv.open(corpus_path("modern/npz"))
    names = set(cat.variables.query("serial == 300")["name"])
    assert "fc1/weight" in names and "compressed/fc1/weight" in names
    assert cat.serials.loc[300, "path"].endswith("step_300.npz")
    np.testing.assert_array_equal(cat.read("fc1/weight"), cat.read("compressed/fc1/weight"))


@pytest.mark.parametrize(
    ("stem", "serial", "step", "epoch"),
    [
        ("step_100", 100, 100, None),
        ("ckpt_000050", 50, None, None),
        ("epoch10", 10, None, 10),
        ("model_3", 3, None, None),
        ("step_300_compressed", 300, 300, None),
        ("epoch_3_step_300", 300, 300, 3),
        ("iter5000", 5000, 5000, None),
        ("resnet50_10", 10, None, None),
        ("checkpoint-7", 7, None, None),
    ],
)
def test_parse_name(stem, serial, step, epoch):
    p = parse_name(stem)
    assert (p.serial, p.step, p.epoch) == (serial, step, epoch)


@pytest.mark.parametrize(
    "stem",
    ["fc1_weight", "model_protocol2", "model-00001-of-00002", "last",
     # version digits name the writer, not a serial
     "mnist-cnn-pt1.9.1", "mnist-cnn-pt2.5.1", "model-v1.2", "weights-1.13.0", "bert_tf2.15"],
)  # fmt: skip
def test_names_without_a_serial(stem):
    assert parse_name(stem) is None


def test_version_digits_are_not_serials(tmp_path):
    """Two files differing by the framework version in their names are one tree of files, not
    serials 1 and 2 (``../shared/wild``'s ``mnist-cnn-pt1.9.1.pt``/``-pt2.5.1.pt``)."""
    np.save(tmp_path / "mnist-np1.26.4.npy", np.arange(3))
    np.save(tmp_path / "mnist-np2.0.1.npy", np.arange(4))
    cat = cv.open(tmp_path)
    assert cat.layout == "files" and list(cat.serials.index) == [0]
    assert sorted(cat.variables["shape"]) == [(3,), (4,)]


def test_mixed_names_and_unnumbered_files(tmp_path):
    for n in (1, 2):
        np.savez(tmp_path / f"model_{n}.npz", w=np.full(3, n))
        np.savez(tmp_path / f"optim_{n}.npz", m=np.full(2, -n))
    np.savez(tmp_path / "best.npz", w=np.zeros(3))
    cat = cv.open(tmp_path)
    assert cat.layout == "numbered" and list(cat.serials.index) == [1, 2]
    v = cat.variables.set_index(["serial", "name"])
    assert v.loc[(2, "model/w"), "kind"] == "model"
    assert v.loc[(2, "optim/m"), "kind"] == "optimizer"
    assert cat.read("optim/m").tolist() == [-2, -2]
    assert cat.attrs["unnumbered_files"] == ["best.npz"]


def test_numbered_dirs(tmp_path):
    """accelerate ``save_state`` style: ``checkpoint_N/`` dirs holding several files."""
    for n in (0, 1):
        d = tmp_path / f"checkpoint_{n}"
        d.mkdir()
        np.savez(d / "model.npz", w=np.full(4, n, dtype=np.float32))
        np.save(d / "random_states_0.npy", np.arange(3))
        (d / "notes.txt").write_text("hi")
    cat = cv.open(tmp_path)
    assert cat.layout == "numbered" and list(cat.serials.index) == [0, 1]
    assert cat.latest == 1 and cat.serials.loc[1, "n_files"] == 3
    assert cat.read("model/w").tolist() == [1.0] * 4
    v = cat.variables.query("serial == 1").set_index("name")
    assert v.loc["random_states_0", "kind"] == "rng"


def test_truncated_file_makes_its_serial_incomplete(tmp_path):
    for n in (10, 20):
        np.savez(tmp_path / f"step_{n}.npz", w=np.arange(5))
    data = (tmp_path / "step_20.npz").read_bytes()
    (tmp_path / "step_20.npz").write_bytes(data[: len(data) // 2])
    cat = cv.open(tmp_path)
    assert cat.serials["complete"].tolist() == [True, False]
    assert cat.latest == 10
    assert isinstance(cat.serials.loc[20, "error"], str)
    assert pd.isna(cat.serials.loc[10, "error"])


def test_names_are_parsed_once_per_listing(tmp_path, monkeypatch):
    """Detection and the scan share one parse of the tree's names; a rescan of a changed
    tree parses the new listing."""
    from ckptview.layouts import numbered

    calls: list[str] = []

    def counting(stem: str):
        calls.append(stem)
        return parse_name(stem)

    monkeypatch.setattr(numbered, "parse_name", counting)
    for n in (1, 2, 3):
        np.savez(tmp_path / f"step_{n}.npz", w=np.full(3, n))
    cat = cv.open(tmp_path, cache=False)
    assert cat.layout == "numbered" and list(cat.serials.index) == [1, 2, 3]
    assert sorted(calls) == ["step_1", "step_2", "step_3"]  # once each (was twice)
    np.savez(tmp_path / "step_4.npz", w=np.full(3, 4))
    calls.clear()
    assert list(cat.refresh().serials.index) == [1, 2, 3, 4]
    assert sorted(calls) == ["step_1", "step_2", "step_3", "step_4"]
