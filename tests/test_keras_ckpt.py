"""Trees written by the real Keras ``ModelCheckpoint`` (tests/data/keras_ckpt, see its README)
against Keras's own verdicts: serials are the epochs, the ``{val_loss:.2f}`` in the names are
the History's val_loss, every variable is listed and read bit-exactly as Keras's
``load_weights`` gives it, and a save of another run's shapes does not load (Keras refuses it).

Names: ckptview lists a Keras 3 file as written (``layers/<group>/vars/<i>``,
``optimizer/vars/<i>``; a ``.keras`` zip's ``model.weights.h5`` the same, unprefixed), Keras
names its variables by ``v.path`` (``mlp/hidden/kernel``, ``sgd/mlp_hidden_kernel_momentum``).
The file's group names (``dense``, ``dense_1``) are Keras's own class-based keys, not the layer
names, so the mapping goes through the group's ``name`` attribute, which ckptview shows as
``attrs["layer"]``: ``layers/<g>/vars/<i>`` with ``attrs["layer"] == L`` is the ``i``-th of
layer ``L``'s ``layer.weights``; ``optimizer/vars/<i>`` is ``optimizer.variables[i]``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import ckptview as cv
from ckptview.layouts.base import FILENAME_METRIC, parse_name

DATA = Path(__file__).parent / "data" / "keras_ckpt"
TRUTH = json.loads((DATA / "truth.json").read_text())
VALUES = np.load(DATA / "truth.npz")
RUNS = TRUTH["runs"]  # run_a: .weights.h5, run_b: .keras, run_c: run_a mixed, run_d: loss < 0


def files(run: str) -> dict[int, dict]:
    return {f["epoch"]: f for f in RUNS[run]["files"]}


def open_run(run: str) -> cv.Catalog:
    cat = cv.open(DATA / run, cache=False)
    assert cat.layout == "numbered"
    return cat


def keras_name(cat: cv.Catalog, name: str, serial: int, entry: dict) -> str:
    """The Keras ``v.path`` of ckptview's variable ``name`` (the mapping in the docstring)."""
    if m := re.fullmatch(r"optimizer/vars/(\d+)", name):
        return entry["optimizer_variables"][int(m[1])]["path"]
    m = re.fullmatch(r"layers/[^/]+/vars/(\d+)", name)
    assert m, name
    layer = cat.variable(name, serial=serial).attrs["layer"]
    (path,) = [w["path"] for w in entry["weights"]
               if w["layer"] == layer and w["index"] == int(m[1])]  # fmt: skip
    return path


@pytest.mark.parametrize("run", ["run_a", "run_b", "run_d"])
def test_serials_are_the_epochs(run):
    cat = open_run(run)
    s = cat.serials
    assert list(s.index) == sorted(files(run)) == [1, 2, 3, 4]
    assert s["epoch"].tolist() == [1, 2, 3, 4]
    assert s["complete"].all() and s["loadable"].all()  # Keras loads every one
    assert all(f["load_weights"]["ok"] for f in files(run).values())
    assert cat.latest == 4
    assert s.loc[4, "path"].endswith(files(run)[4]["file"])


@pytest.mark.parametrize("run", ["run_a", "run_b", "run_c", "run_d"])
def test_metrics_are_the_history_val_loss(run):
    """The name's decimal is Keras's History val_loss as ``{val_loss:.2f}`` wrote it (sign
    included: run_d's CosineSimilarity loss is below zero, ``weights.02--0.08``)."""
    m = open_run(run).metrics
    assert set(m["name"]) == {FILENAME_METRIC}  # the template writes no metric word
    got = m.set_index("serial")["value"]
    assert sorted(got.index) == [1, 2, 3, 4]
    for serial, f in files(run).items():
        written = float(f["val_loss_in_name"])
        assert got[serial] == written, (run, serial)
        assert np.signbit(got[serial]) == np.signbit(written), (run, serial)  # -0.00 too
        assert abs(got[serial] - f["val_loss"]) <= 0.005 + 1e-9
    if run != "run_c":  # run_c's serial 4 comes from the other run
        history = TRUTH["history"]["run_d_cosine_similarity" if run == "run_d" else
                                   "run_a_and_run_b"]["val_loss"]  # fmt: skip
        assert [got[e] for e in (1, 2, 3, 4)] == [float(f"{v:.2f}") for v in history]


@pytest.mark.parametrize(("run", "serial"),
                         [(r, e) for r in ("run_a", "run_b", "run_d") for e in (1, 2, 3, 4)]
                         + [("run_c", e) for e in (1, 2, 3)])  # fmt: skip
def test_every_variable_read_as_keras_loads_it(run, serial):
    entry = files(run)[serial]
    assert entry["load_weights"]["ok"]
    cat = open_run(run)
    rows = cat.variables.query("serial == @serial")
    assert rows["error"].isna().all()
    mapped = {keras_name(cat, n, serial, entry): n for n in rows["name"]}
    want = [w["path"] for w in entry["weights"]] + [o["path"] for o in
                                                    entry["optimizer_variables"]]  # fmt: skip
    assert len(mapped) == len(rows) and sorted(mapped) == sorted(want)  # all, none twice
    shapes = {w["path"]: w for w in entry["weights"] + entry["optimizer_variables"]}
    by_name = rows.set_index("name")
    for path, name in mapped.items():
        assert by_name.loc[name, "dtype"] == shapes[path]["dtype"], name
        assert tuple(by_name.loc[name, "shape"]) == tuple(shapes[path]["shape"]), name
        expected = VALUES[f"{entry['values']}/{path}"]
        got = np.asarray(cat.read(name, serial=serial))
        assert got.dtype == expected.dtype and got.shape == expected.shape, name
        assert got.tobytes() == expected.tobytes(), (run, serial, name, path)  # bit-exact


def test_other_runs_save_does_not_load():
    """run_c = run_a with its newest save replaced by a hidden-10 run's: Keras's
    ``load_weights`` into the run's model refuses it, and so does ckptview's rule."""
    verdict = files("run_c")[4]["load_weights"]
    assert not verdict["ok"] and verdict["error_type"] == "ValueError"
    m = re.search(r"variable\.shape=\((\d+), (\d+)\), Received: value\.shape=\((\d+), (\d+)\)",
                  verdict["error"])  # fmt: skip
    assert m, verdict["error"]
    want, have = [int(m[1]), int(m[2])], [int(m[3]), int(m[4])]
    assert (want, have) == ([8, 6], [8, 10])
    cat = open_run("run_c")
    s = cat.serials
    assert list(s.index) == [1, 2, 3, 4]
    assert s["loadable"].tolist() == [True, True, True, False]
    assert s.loc[4, "path"].endswith(files("run_c")[4]["file"])
    error = s.loc[4, "error"]
    assert "do not fit" in error
    # the same mismatch Keras names: the hidden kernel, 8x10 in the file vs 8x6 in the model
    assert f"layers/dense/vars/0 {have} vs {want}" in error, error
    assert cat.latest == 3
    shapes = cat.variables.set_index(["serial", "name"])["shape"]
    assert tuple(shapes[(4, "layers/dense/vars/0")]) == (8, 10)
    assert tuple(shapes[(3, "layers/dense/vars/0")]) == (8, 6)


def test_loadable_agrees_with_keras_everywhere():
    for run in RUNS:
        s = open_run(run).serials
        assert {e: f["load_weights"]["ok"] for e, f in files(run).items()} == \
            s["loadable"].to_dict(), run  # fmt: skip


@pytest.mark.parametrize(
    ("stem", "serial", "metric"),
    [
        ("weights.07-0.41", 7, 0.41),
        ("weights.01--0.64", 1, -0.64),  # a loss below zero: ``{val_loss:.2f}`` of -0.64
        ("model.03--1.50e-03", 3, -1.5e-3),
        ("weights.05-nan", 5, float("nan")),  # a diverged run
        ("model.06-inf", 6, float("inf")),
        ("weights.08--inf", 8, float("-inf")),
    ],
)
def test_keras_template_values(stem, serial, metric):
    p = parse_name(stem)
    assert (p.serial, p.epoch, p.label) == (serial, serial, stem.split(".")[0])
    assert p.metrics.keys() == {FILENAME_METRIC}
    np.testing.assert_equal(p.metrics[FILENAME_METRIC], metric)
