"""Experiments (DESIGN.md §3d): many runs side by side, made of copies of real corpus trees."""

from __future__ import annotations

import json
import math
import os
import time

import numpy as np
import pandas as pd
import pytest
from conftest import CORPUS, corpus_copy

import ckptview as cv
from ckptview.engine.diff import logical_name
from ckptview.experiment import find_runs, parse_bytes
from ckptview.scan.detect import list_tree

RUNS = {
    "hf": "modern/hf",
    "torch": "modern/torch/run_A",
    "paddle": "paddle/fluid_ckpt",
    "tf": "modern/tf/run_ckpt",
    "orbax": "modern/orbax/run_best",
}


def _age(root, rel: str, base: float) -> None:
    """Give every file of a copied run an mtime ``base`` + its serial's order (copies are new)."""
    for i, p in enumerate(sorted((root / rel).rglob("*"))):
        os.utime(p, (base + i, base + i))


@pytest.fixture
def sweep(tmp_path):
    """hf, torch, paddle, tf, orbax runs (copies), a broken run, and stray files."""
    root = tmp_path / "sweep"
    for name, rel in RUNS.items():
        corpus_copy(rel, root / name)
    broken = root / "broken"
    broken.mkdir()
    (broken / "checkpoint-5").mkdir()
    (broken / "checkpoint-5" / "trainer_state.json").write_text("{ not json")
    (broken / "checkpoint-5" / "model.safetensors").write_bytes(b"\xff" * 64)
    (root / "README.md").write_text("a sweep")
    (root / "sweep.yaml").write_text("lr: [1, 2]")
    return root


def test_runs_table_equals_each_runs_own_catalog(sweep):
    exp = cv.open_experiment(sweep)
    runs = exp.runs
    assert runs.index.name == "run"
    assert set(runs.index) == {*RUNS, "broken"}  # stray files are no runs
    for name in RUNS:
        own = cv.open(sweep / name)
        row = runs.loc[name]
        s = own.serials
        assert row["layout"] == own.layout
        assert row["n_serials"] == len(s)
        assert row["latest"] == own.latest
        assert row["nbytes"] == int(s["nbytes"].sum())
        assert row["first_write"] == s["timestamp"].min()
        assert row["last_write"] == s["timestamp"].max()
        assert pd.isna(row["error"])
        step = s.loc[own.latest, "step"]
        assert (pd.isna(row["latest_step"]) and pd.isna(step)) or row["latest_step"] == step
        assert exp[name].url == own.url
    # best: HF by its own record, orbax by its lowest loss, none where nothing is recorded
    hf = cv.open(sweep / "hf")
    assert runs.loc["hf", "best"] == hf.attrs["best_serial"]
    assert runs.loc["hf", "best_metric"] == pytest.approx(hf.attrs["best_metric"])
    assert runs.loc["hf", "metric_name"] == "eval_loss"
    m = cv.open(sweep / "orbax").metrics
    loss = m[m["name"] == "loss"].set_index("serial")["value"]
    assert runs.loc["orbax", "best"] == loss.idxmin()
    assert runs.loc["orbax", "best_metric"] == pytest.approx(loss.min())
    assert pd.isna(runs.loc["torch", "best"])


def test_a_run_that_fails_is_a_row_with_error(sweep, monkeypatch):
    from ckptview.scan.core import Scan

    real = Scan.metrics

    def failing(self):
        if self.url.endswith("/tf"):
            raise OSError("the store went away")
        return real.fget(self)

    monkeypatch.setattr(Scan, "metrics", property(failing))
    exp = cv.open_experiment(sweep)
    row = exp.runs.loc["tf"]
    assert "the store went away" in row["error"]
    assert exp.runs.drop(index="tf")["error"].isna().all()
    assert "tf" not in exp.serials.index.get_level_values("run")
    assert "tf" not in exp.usage().index
    # the broken run opens: a row without a loadable serial, not an error
    assert pd.isna(exp.runs.loc["broken", "latest"])


def test_serials_and_metrics_are_the_runs_stacked(sweep):
    exp = cv.open_experiment(sweep)
    serials = exp.serials
    assert serials.index.names == ["run", "serial"]
    pd.testing.assert_frame_equal(serials.loc["tf"], cv.open(sweep / "tf").serials,
                                  check_names=False)  # fmt: skip
    metrics = exp.metrics
    assert list(metrics.columns[:4]) == ["run", "serial", "name", "value"]
    own = cv.open(sweep / "hf").metrics
    assert len(metrics[metrics["run"] == "hf"]) == len(own)


def test_depth_and_nesting(tmp_path):
    """Runs two levels down are found; a run's own subdirectories are not runs."""
    corpus_copy("modern/hf", tmp_path / "a" / "b" / "hf")
    corpus_copy("modern/torch", tmp_path / "a" / "torch")  # a parent of two runs itself
    found, _ = find_runs(list_tree(tmp_path))
    assert sorted(f.name for f in found) == ["a/b/hf", "a/torch/run_A", "a/torch/run_legacy"]
    corpus_copy("modern/npz", tmp_path / "x" / "y" / "z" / "w" / "npz")  # depth 5: too deep
    found, _ = find_runs(list_tree(tmp_path))
    assert not any(f.name.startswith("x/") for f in found)


def test_glob_list_and_dict(sweep):
    exp = cv.open_experiment(str(sweep) + "/*")
    assert set(exp.runs.index) >= set(RUNS)
    exp = cv.open_experiment({"first": sweep / "hf", "second": sweep / "tf", "gone": sweep / "nope"})
    assert list(exp.runs.index) == ["first", "second", "gone"]
    assert exp.runs.loc["second", "layout"] == "tf"
    assert "no such" in exp.runs.loc["gone", "error"]
    exp = cv.open_experiment([sweep / "hf", sweep / "orbax"])
    assert list(exp.runs.index) == ["hf", "orbax"]
    with pytest.raises(KeyError, match="no run"):
        exp["tf"]


def test_compare_at_latest_best_and_step(sweep):
    exp = cv.open_experiment(sweep)
    df = exp.compare(at="latest")
    assert df.index.name == "run" and df.loc["broken"].isna().all()  # no latest
    torch = cv.open(sweep / "torch")
    st = torch.stats(torch.latest)
    name = st["name"].iloc[0]
    assert df.loc["torch", name] == pytest.approx(st["l2"].iloc[0])
    assert df.attrs["serial"]["torch"] == torch.latest
    best = exp.compare(names=[name], at="best")
    assert best.attrs["serial"]["hf"] == exp.runs.loc["hf", "best"]
    # a step: the serial at or before it in each run
    at = exp.compare(names=[name], at=250)
    assert at.attrs["serial"]["torch"] == 200
    assert at.attrs["serial"]["hf"] == 200
    assert at.attrs["serial"]["orbax"] == 200
    assert math.isnan(at.loc["hf", name])  # the HF run has no such variable
    with pytest.raises(ValueError, match="stat"):
        exp.compare(stat="median")


def test_diff_across_runs_defaults_to_each_latest(sweep, tmp_path):
    corpus_copy("modern/torch/run_legacy", sweep / "legacy")
    exp = cv.open_experiment(sweep)
    df = exp.diff("torch", "legacy")
    assert df.attrs["a"] == exp.runs.loc["torch", "latest"]
    assert df.attrs["b"] == exp.runs.loc["legacy", "latest"]
    own = cv.open(sweep / "torch").diff(300, 100, cv.open(sweep / "legacy"))
    pd.testing.assert_frame_equal(df.drop(columns=[]), own, check_like=True)


def test_match_auto_pairs_megatron_layouts():
    legacy = cv.open(CORPUS / "llm" / "megatron_legacy")
    dist = cv.open(CORPUS / "llm" / "megatron_dist")
    exact = legacy.diff(15, 15, dist, match="exact")
    assert (exact["status"] == "added").sum() == 65  # nothing pairs by name
    auto = legacy.diff(15, 15, dist, match="auto")
    counts = auto["status"].value_counts()
    assert counts.get("identical", 0) == 63  # 21 weights + 42 Adam moments, same values
    assert counts.get("added", 0) == 2  # the rng ShardedObjects only
    pairing = auto.attrs["pairing"]
    assert pairing["logical"] == 63 and "model/" in pairing["stripped_a"]
    assert pairing["renamed"]["model/output_layer.weight"] == "output_layer.weight"
    # the same through an experiment of the two runs
    exp = cv.open_experiment({"legacy": legacy.url, "dist": dist.url})
    assert (exp.diff("legacy", "dist")["status"] == "identical").sum() == 63


def test_logical_names():
    assert logical_name("model/fc.weight")[0] == "fc.weight"
    assert logical_name("module._orig_mod.fc.weight")[0] == "fc.weight"
    assert logical_name("model.layers.0.w") == ("layers.0.w", "model.")
    assert logical_name("optimizer.state.exp_avg.model.fc.w")[0] == "optimizer:exp_avg:fc.w"
    assert logical_name("optimizer/fc.w/exp_avg")[0] == "optimizer:exp_avg:fc.w"
    assert logical_name("model/")[0] == "model/"


def test_usage_adds_up_to_each_run(sweep):
    exp = cv.open_experiment(sweep)
    use = exp.usage()
    for name in RUNS:
        assert use.loc[name].sum() == exp.runs.loc[name, "nbytes"]
    assert use.loc["hf", "optimizer"] > 0


def test_parse_bytes():
    assert parse_bytes("2TB") == 2 * 10**12
    assert parse_bytes("1.5 GiB") == int(1.5 * 2**30)
    assert parse_bytes(4096) == 4096
    with pytest.raises(ValueError):
        parse_bytes("lots")


def test_budget_plan_keeps_latest_and_best_frees_oldest_first(sweep):
    base = time.time() - 10**6
    for i, name in enumerate(["tf", "paddle", "torch", "orbax", "hf"]):
        _age(sweep, name, base + i * 1000)
    exp = cv.open_experiment(sweep)
    runs = exp.runs
    total = int(runs["nbytes"].sum())
    assert exp.plan_retention()["action"].eq("keep").all()  # no budget, no policy: all kept
    budget = total - 20_000
    plan = exp.plan_retention(budget=budget)
    assert plan.attrs["total"] == total and plan.attrs["fits"]
    assert plan.attrs["after"] <= budget
    doomed = plan[plan["action"] == "delete"]
    assert len(doomed) and doomed["reason"].str.contains("budget").all()
    for name in RUNS:
        assert plan.loc[(name, int(runs.loc[name, "latest"])), "action"] == "keep"
        if not pd.isna(runs.loc[name, "best"]):
            assert plan.loc[(name, int(runs.loc[name, "best"])), "action"] == "keep"
    # oldest first: nothing deleted is newer than something deletable kept
    kept = plan[(plan["action"] == "keep") & (plan["reason"] == "no retention policy")]
    if len(kept):
        assert doomed["timestamp"].max() <= kept["timestamp"].min()
    # the minimum deletions: without the newest deleted, the budget is not met
    assert plan.attrs["after"] + int(doomed.sort_values("timestamp")["nbytes"].iloc[-1]) > budget
    # a budget nothing can meet: everything deletable goes, and the plan says so
    tight = exp.plan_retention(budget="1KB")
    assert not tight.attrs["fits"]
    for name in RUNS:
        assert tight.loc[(name, int(runs.loc[name, "latest"])), "action"] == "keep"
    # pins hold
    pinned = exp.plan_retention(budget="1KB", pinned={"torch": [100]})
    assert pinned.loc[("torch", 100), "action"] == "keep"
    assert "pinned" in pinned.loc[("torch", 100), "reason"]


def test_apply_deletes_exactly_the_plan_journaled(sweep):
    exp = cv.open_experiment(sweep)
    total = int(exp.runs["nbytes"].sum())
    plan = exp.plan_retention(budget=total - 20_000)
    doomed = {(r, int(s)) for r, s in plan.index[plan["action"] == "delete"]}
    assert doomed
    before = {(r, int(s)): p for (r, s), p in exp.serials["path"].items()}
    result = exp.apply_retention(plan)
    assert not result.errors
    assert set(map(tuple, result.deleted.index)) == doomed
    assert result.nbytes == int(plan["frees"].sum())
    after = cv.open_experiment(sweep)
    now = {(r, int(s)) for r, s in after.serials.index}
    assert now == set(before) - doomed
    for run in {r for r, _ in doomed}:
        lines = (sweep / run / ".ckptview" / "journal.jsonl").read_text().splitlines()
        events = [json.loads(line) for line in lines]
        begin = next(e for e in events if e["event"] == "begin" and e["action"] == "retention")
        assert sorted(begin["delete"]) == sorted(s for r, s in doomed if r == run)
        assert events[-1]["event"] == "end"
    # the runs outside the plan were not touched
    untouched = set(RUNS) - {r for r, _ in doomed}
    for run in untouched:
        assert not (sweep / run / ".ckptview" / "journal.jsonl").exists()


def test_apply_refuses_a_run_changed_since_the_plan(sweep):
    exp = cv.open_experiment(sweep)
    plan = exp.plan_retention(budget="1KB")
    victim = next(r for r, _ in plan.index[plan["action"] == "delete"])
    serial = next(int(s) for r, s in plan.index[plan["action"] == "delete"] if r == victim)
    path = exp[victim].serials.loc[serial, "path"]
    target = next(p for p in sorted(_files(path)))
    with open(target, "ab") as fh:
        fh.write(b"x")
    result = exp.apply_retention(plan)
    assert victim in result.errors and "changed" in result.errors[victim]
    assert victim not in result.results
    assert result.results  # the other runs were applied


def _files(path: str):
    from pathlib import Path

    p = Path(path)
    return [p] if p.is_file() else [f for f in p.rglob("*") if f.is_file()]


def test_repr_and_html(sweep):
    exp = cv.open_experiment(sweep)
    text = repr(exp)
    assert "6 run(s)" in text and "hf: hf-trainer, 3 serials, latest 300, best 100" in text
    html = exp._repr_html_()
    assert "<table" in html and "hf-trainer" in html


def test_opening_is_concurrent_and_bounded(sweep):
    seen = []
    exp = cv.open_experiment(sweep, progress=lambda d, t: seen.append((d, t)))
    assert seen[-1] == (len(exp), len(exp))
    assert np.diff([d for d, _ in seen]).min() == 1


def test_runs_in_flight_local_one_by_one_remote_on_the_pool(sweep, monkeypatch):
    """Local runs are opened one after another (Python work threads cannot overlap); a
    remote store (here memory://) or an executor gets the pool."""
    from concurrent.futures import ThreadPoolExecutor

    from ckptview.experiment import opening as E

    assert E.runs_in_flight([str(sweep / "hf"), str(sweep / "tf")], None, None) == 1
    assert E.runs_in_flight([str(sweep / "hf"), "memory://sweep/x"], None, None) == E.RUN_WORKERS
    with ThreadPoolExecutor(2) as pool:
        assert E.runs_in_flight([str(sweep / "hf")], None, pool) == E.RUN_WORKERS
    threads = set()
    real = E._open_one

    def spy(*args):
        import threading

        threads.add(threading.current_thread().name)
        return real(*args)

    monkeypatch.setattr(E, "_open_one", spy)
    seen = []
    exp = cv.open_experiment(sweep, progress=lambda d, t: seen.append((d, t)))
    assert threads == {"MainThread"} and seen == [(i, len(exp)) for i in range(1, len(exp) + 1)]
    threads.clear()
    exp = cv.open_experiment({n: sweep / n for n in RUNS})
    assert threads == {"MainThread"} and len(exp) == len(RUNS)


def test_health_over_an_experiment_names_each_runs_first_anomaly(tmp_path):
    """DESIGN.md §3e over §3d: the demo sweep's diverged run (NaN weights from its fourth
    save) has its divergence and rollback point; the healthy runs roll back to their latest."""
    from ckptview.demo import SWEEP, SWEEP_STEP, write_sweep

    write_sweep(tmp_path / "sweep")
    exp = cv.open_experiment(tmp_path / "sweep")
    h = exp.health()
    assert set(h.index) == set(exp.runs.index)
    for name, _fmt, _n, _lr, diverges in SWEEP:
        row = h.loc[name]
        if diverges:  # its loss (in the file names) climbs before the NaNs of its 4th save
            summary = exp[name].health_summary()
            bad = [int(s) for s in summary.index[summary["status"] != "ok"]]
            assert not row["healthy"] and row["divergence"] == bad[0] <= 4 * SWEEP_STEP
            assert row["first_anomaly"] == summary.loc[bad[0], "findings"]
            assert row["rollback_point"] == bad[0] - SWEEP_STEP
        else:
            assert row["healthy"] and row["rollback_point"] == row["latest"]
