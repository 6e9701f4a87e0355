"""Bytes by role (``cat.usage``) and slimming: retention deleting a serial's optimizer state,
keeping its weights, never on the newest loadable serial, crash-safe like delete."""

from __future__ import annotations

import shutil
from pathlib import Path

import fsspec
import numpy as np
import pytest
from conftest import corpus_copy, corpus_path
from test_crash_safety import check_journal, faulty_catalog, snapshot

import ckptview as cv
from ckptview.cli import main
from ckptview.testing import FaultyFS, InjectedFault

VERL = "llm/fsdp_verl"
HF = "modern/hf"


def tree_copy(tmp_path: Path, rel: str, name: str = "tree") -> Path:
    return corpus_copy(rel, tmp_path / name)


@pytest.mark.parametrize("tree", [VERL, HF, "llm/deepspeed_zero", "llm/megatron_legacy"])
def test_usage_adds_up_to_the_serial_bytes(tree):
    cat = cv.open(corpus_path(tree))
    use = cat.usage()
    s = cat.serials
    assert list(use.index) == list(s.index)
    assert (use.sum(axis=1) >= s["nbytes"]).all() or (use.sum(axis=1) == s["nbytes"]).all()
    v = cat.variables
    for serial in s.index:
        want = v[(v["serial"] == serial) & (v["kind"] == "optimizer")]["nbytes"].sum()
        assert use.loc[serial, "optimizer"] == want
        assert use.loc[serial, "optimizer"] > use.loc[serial, "model"]  # Adam: 2 moments


def test_slim_plan_spares_the_newest_loadable_and_counts_what_it_frees(tmp_path):
    cat = cv.open(corpus_path(VERL))
    plan = cat.plan_retention(slim_older_than="0s")
    assert plan.loc[5, "action"] == "slim"
    assert plan.loc[15, "action"] == "keep" and "newest loadable" in plan.loc[15, "reason"]
    optim = [f for f in (corpus_path(VERL) / "global_step_5" / "actor").iterdir()
             if f.name.startswith("optim_")]  # fmt: skip
    assert len(optim) == 2
    assert plan.loc[5, "frees"] == sum(f.stat().st_size for f in optim)
    assert cat.plan_retention(slim_older_than="3650d").loc[5, "action"] == "keep"


@pytest.mark.parametrize("tree", [VERL, HF])
def test_slim_keeps_weights_readable_and_is_no_resume_point(tmp_path, tree):
    root = tree_copy(tmp_path, tree)
    cat = cv.open(root)
    old = int(cat.serials.index[0])
    latest = cat.latest
    model = cat.variables[(cat.variables["serial"] == old) & (cat.variables["kind"] == "model")]
    name, node = model.iloc[0]["name"], model.iloc[0]["node"]
    before = cat.read(name, serial=old, node=node)
    plan = cat.plan_retention(slim_older_than="0s")
    done = cat.apply_retention(plan).deleted
    assert list(done["action"]) == ["slim"] * len(done) and old in done.index
    assert done.loc[old, "nbytes"] == plan.loc[old, "frees"] > 0
    cat = cv.open(root)
    s = cat.serials
    assert not s.loc[old, "loadable"] and "slimmed" in s.loc[old, "warning"]
    assert cat.latest == latest
    np.testing.assert_array_equal(cat.read(name, serial=old, node=node), before)
    v = cat.variables
    assert not len(v[(v["serial"] == old) & (v["kind"] == "optimizer") & v["error"].isna()
                     & v["file"].str.contains("optim")])  # fmt: skip
    again = cat.plan_retention(slim_older_than="0s")
    assert again.loc[old, "action"] == "keep"  # already slimmed


def test_slim_a_serial_that_became_the_newest_loadable_is_refused(tmp_path):
    root = tree_copy(tmp_path, VERL)
    cat = cv.open(root)
    plan = cat.plan_retention(slim_older_than="0s")
    shutil.rmtree(root / "global_step_15")  # now 5 is the newest loadable
    with pytest.raises(RuntimeError, match="changed|protected"):
        cat.apply_retention(plan)
    assert (root / "global_step_5" / "actor" / "optim_world_size_2_rank_0.pt").exists()


def test_cli_retain_slim(tmp_path, capsys):
    root = tree_copy(tmp_path, VERL)
    assert main(["retain", str(root), "--slim-older-than", "0s", "--json"]) == 0
    out = capsys.readouterr().out
    assert '"slim"' in out
    assert (root / "global_step_5" / "actor" / "optim_world_size_2_rank_0.pt").exists()
    assert main(["retain", str(root), "--slim-older-than", "0s", "--apply", "--yes"]) == 0
    assert not (root / "global_step_5" / "actor" / "optim_world_size_2_rank_0.pt").exists()
    assert (root / "global_step_5" / "actor" / "model_world_size_2_rank_0.pt").exists()


def test_crash_sweep_during_slim(tmp_path):
    """Fail every mutating call of a slim, as a crash (nothing after it runs) and as a handled
    fault: serial 15 stays the loadable resume point; serial 5 is either untouched and
    loadable, or marked slimmed and not loadable, never loadable with its optimizer gone."""

    def act(fs: FaultyFS, root: Path) -> None:
        cat = faulty_catalog(root, fs, "fsdp-verl")
        cat.apply_retention(cat.plan_retention(slim_older_than="0s"))

    counter = FaultyFS(fsspec.filesystem("file"))
    act(counter, tree_copy(tmp_path, VERL, "count"))
    total = counter.calls
    assert total >= 4
    survived = 0
    for crash in (True, False):
        for k in range(1, total + 1):
            root = tree_copy(tmp_path, VERL, f"t-{crash}-{k}")
            before = snapshot(root)
            fs = FaultyFS(fsspec.filesystem("file"), fail_at=k, crash=crash)
            with pytest.raises((InjectedFault, OSError)):
                act(fs, root)
            cat = cv.open(root)
            s = cat.serials
            assert cat.latest == 15 and s.loc[15, "loadable"]
            optim = root / "global_step_5" / "actor"
            whole = all((optim / f"optim_world_size_2_rank_{r}.pt").exists() for r in (0, 1))
            assert whole or not s.loc[5, "loadable"], (crash, k)
            if s.loc[5, "loadable"]:
                assert "slimmed" not in (s.loc[5, "warning"] or "")
            check_journal(root, before, fs, crash)
            survived += 1
            shutil.rmtree(root)
    print(f"slim: {survived} failure points of {total} calls x 2 models survived")
    assert survived == 2 * total
