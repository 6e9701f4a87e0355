"""The CLI on experiments: ``ls DIR`` prints the runs table, ``retain DIR --budget``, and
``diff --match auto`` / ``--rename`` across layouts."""

from __future__ import annotations

import json

import pytest
from conftest import CORPUS, corpus_copy

import ckptview as cv
from ckptview.cli import main

RUNS = {"hf": "modern/hf", "torch": "modern/torch/run_A", "paddle": "paddle/fluid_ckpt",
        "tf": "modern/tf/run_ckpt", "orbax": "modern/orbax/run_best"}  # fmt: skip


def run(capsys, monkeypatch, *argv) -> tuple[int, str, str]:
    monkeypatch.setenv("COLUMNS", "80")
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def sweep(tmp_path):
    root = tmp_path / "a-rather-long-sweep-directory-name" / "sweep"
    for name, rel in RUNS.items():
        corpus_copy(rel, root / name)
    (root / "notes.md").write_text("stray")
    (root / "loose.safetensors").write_bytes(b"\0" * 16)  # a stray checkpoint file
    return root


def test_ls_on_an_experiment_prints_the_runs_table(sweep, capsys, monkeypatch):
    code, out, err = run(capsys, monkeypatch, "ls", sweep)
    assert code == 0
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert lines[0].startswith("5 runs in experiment")
    body = "\n".join(lines[2:])
    for name in RUNS:
        assert name in body
    assert "loose.safetensors" in err  # stray: said, never a run
    hf = next(line for line in lines if line.startswith("hf "))
    assert " 300 " in hf and " 100 " in hf  # latest and best


def test_ls_json_is_the_runs_table(sweep, capsys, monkeypatch):
    code, out, _ = run(capsys, monkeypatch, "ls", sweep, "--json")
    assert code == 0
    rows = {r["run"]: r for r in json.loads(out)}
    assert set(rows) == set(RUNS)
    own = cv.open(sweep / "orbax")
    assert rows["orbax"]["latest"] == own.latest
    assert rows["orbax"]["nbytes"] == int(own.serials["nbytes"].sum())
    assert rows["hf"]["layout"] == "hf-trainer" and rows["hf"]["best"] == 100


def test_ls_on_a_parent_of_runs_is_never_one_merged_run(capsys, monkeypatch):
    code, out, _ = run(capsys, monkeypatch, "ls", CORPUS / "modern" / "torch", "--json")
    assert code == 0
    rows = {r["run"]: r for r in json.loads(out)}
    assert set(rows) == {"run_A", "run_legacy"}
    # one tree still lists its serials
    code, out, _ = run(capsys, monkeypatch, "ls", CORPUS / "modern" / "torch" / "run_A", "--json")
    assert [r["serial"] for r in json.loads(out)] == [100, 200, 300]


def test_retain_budget_plans_then_applies(sweep, capsys, monkeypatch):
    exp = cv.open_experiment(sweep)
    total = int(exp.runs["nbytes"].sum())
    budget = total - 20_000
    code, out, err = run(capsys, monkeypatch, "retain", sweep, "--budget", budget, "--json")
    assert code == 0
    plan = json.loads(out)
    doomed = {(r["run"], r["serial"]) for r in plan if r["action"] == "delete"}
    assert doomed and "would delete" in err
    assert (sweep / "hf" / "checkpoint-100").exists()  # plan only
    code, out, err = run(capsys, monkeypatch, "retain", sweep, "--budget", budget)
    assert max(len(line) for line in out.splitlines()) <= 80
    code, out, err = run(capsys, monkeypatch, "retain", sweep, "--budget", budget,
                         "--apply", "--yes", "--json")  # fmt: skip
    assert code == 0
    done = json.loads(out)
    assert sum(len(r["deleted"]) for r in done["runs"].values()) == len(doomed)
    left = cv.open_experiment(sweep)
    assert int(left.runs["nbytes"].sum()) <= budget
    assert {(r, int(s)) for r, s in left.serials.index}.isdisjoint(doomed)


def test_retain_budget_needs_an_experiment(capsys, monkeypatch, tmp_path):
    corpus_copy("modern/hf", tmp_path / "hf")
    code, _, err = run(capsys, monkeypatch, "retain", tmp_path / "hf", "--budget", "1GB")
    assert code == 2 and "experiment" in err


def test_diff_match_auto_pairs_megatron_layouts(capsys, monkeypatch):
    legacy, dist = CORPUS / "llm" / "megatron_legacy", CORPUS / "llm" / "megatron_dist"
    code, out, err = run(capsys, monkeypatch, "diff", legacy, 15, 15, "--other", dist,
                         "--match", "auto", "--json")  # fmt: skip
    assert code == 0
    rows = json.loads(out)
    assert sum(r["status"] == "identical" for r in rows) == 63
    assert sum(r["status"] == "added" for r in rows) == 2
    assert "63 by logical name" in err and "model/" in err
    code, out, _ = run(capsys, monkeypatch, "diff", legacy, 15, 15, "--other", dist,
                       "--match", "exact", "--json")  # fmt: skip
    assert sum(r["status"] == "added" for r in json.loads(out)) == 65
    code, out, _ = run(capsys, monkeypatch, "diff", legacy, 15, 15, "--other", dist,
                       "--match", "exact", "--rename", "=model/", "--json")  # fmt: skip
    assert sum(r["status"] == "identical" for r in json.loads(out)) == 21  # the weights


def test_demo_experiment_writes_a_sweep(tmp_path, capsys, monkeypatch):
    code, out, _ = run(capsys, monkeypatch, "demo", tmp_path / "sweep", "--experiment")
    assert code == 0 and "4 runs" in out
    exp = cv.open_experiment(tmp_path / "sweep")
    runs = exp.runs
    assert runs["error"].isna().all()
    assert set(runs["layout"]) == {"numbered", "paddle-fluid"}
    assert len(set(runs["n_serials"])) >= 3  # runs of different lengths
    crashed = exp["paddle_fluid_crashed"].serials
    assert not crashed["complete"].iloc[-1] and runs.loc["paddle_fluid_crashed", "latest"] == 2
    diverged = exp["lr_1e-2_diverged"].stats(600)
    assert diverged["n_nan"].sum() > 0
    assert exp["lr_1e-3"].stats(100)["n_nan"].sum() == 0
    assert runs.loc["lr_1e-2_diverged", "best"] < runs.loc["lr_1e-2_diverged", "latest"]
    assert runs.loc["lr_1e-3", "metric_name"] == "loss"
