"""restore: copy a serial to another tree, or promote it in place, per layout; the lock."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
from pathlib import Path

import fsspec
import numpy as np
import pytest
from conftest import corpus_path

import ckptview as cv
from ckptview import registry
from ckptview.catalog import Catalog
from ckptview.changes.journal import read_journal
from ckptview.changes.lock import TreeLock, TreeLockedError
from ckptview.io import Storage
from ckptview.layouts.tf import format_state, parse_state
from ckptview.testing import FaultyFS, InjectedFault
from ckptview.tree import Tree


def copy_corpus(rel: str, dest: Path) -> Path:
    """A writable copy of a corpus tree."""
    shutil.copytree(corpus_path(rel), dest, copy_function=shutil.copyfile)
    for folder, _dirs, files in os.walk(dest):
        os.chmod(folder, 0o755)
        for f in files:
            os.chmod(os.path.join(folder, f), 0o644)
    return dest


def snapshot(root: Path) -> dict[str, str]:
    """rel path -> sha256 of every file outside .ckptview."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and not rel.startswith(".ckptview"):
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def journal_events(root: str, fs=None) -> list[dict]:
    fs = fs or fsspec.filesystem("file")
    return read_journal(fs, f"{root}/.ckptview/journal.jsonl")


def assert_same_values(cat_a, a: int, cat_b, b: int) -> None:
    df = cat_a.diff(a, b, other=cat_b)
    assert len(df) and (df["status"] == "identical").all(), df[df["status"] != "identical"]


# -- Paddle fluid ---------------------------------------------------------------------------
def test_fluid_promote_in_place(tmp_path):
    root = copy_corpus("paddle/fluid_ckpt", tmp_path / "fluid")
    before = snapshot(root)
    cat = cv.open(root)
    plan = cat.restore(1, dry_run=True)
    assert snapshot(root) == before and not (root / ".ckptview").exists()
    assert plan.new_serial == 4 and not plan.done
    assert plan.ops["note"].iloc[-1] == "marker"
    assert plan.ops["path"].iloc[-1] == "checkpoint_4/__model__/_SUCCESS"

    result = cat.restore(1)
    assert result.done and "did run" in str(result)
    after = snapshot(root)
    assert {k: v for k, v in after.items() if k in before} == before  # nothing touched
    assert cat.latest == 4 and bool(cat.serials.loc[4, "complete"])
    marker = (root / "checkpoint_4/__model__/_SUCCESS").read_text()
    assert len(marker) == 24  # time.ctime(), as fluid's _write_success records
    assert_same_values(cat, 1, cv.open(root), 4)
    events = [e["event"] for e in journal_events(str(root))]
    assert events[0] == "begin" and events[-1] == "end" and events.count("intent") == 30
    assert not (root / ".ckptview/lock").exists()


def test_fluid_restore_to_memory(tmp_path):
    cat = cv.open(corpus_path("paddle/fluid_ckpt"))
    url = "memory://restore-test/fluid"
    result = cat.restore(2, to=url)
    assert result.new_serial == 2 and result.target.startswith("memory://")
    out = cv.open(url)
    assert out.layout == "paddle-fluid" and list(out.serials.index) == [2] and out.latest == 2
    assert_same_values(cat, 2, out, 2)
    mem = fsspec.filesystem("memory")
    assert [e["event"] for e in journal_events("/restore-test/fluid", mem)][-1] == "end"
    with pytest.raises(FileExistsError):
        cat.restore(2, to=url)  # never overwrites
    mem.rm("/restore-test", recursive=True)


def test_restore_refuses_incomplete_and_noops_on_latest(tmp_path):
    root = copy_corpus("paddle/fluid_ckpt", tmp_path / "fluid")
    cat = cv.open(root)
    with pytest.raises(ValueError, match="incomplete"):
        cat.restore(3)
    same = cat.restore(2)
    assert len(same.ops) == 0 and "already" in same.message
    forced = cat.restore(3, force=True)
    assert forced.new_serial == 4
    table = cv.open(root).serials
    assert not table.loc[4, "complete"] and cv.open(root).latest == 2  # still no marker
    with pytest.raises(KeyError):
        cat.restore(99)


def test_fluid_flat_v2_restore(tmp_path):
    root = copy_corpus("paddle/fluid_ckpt_flat_2018", tmp_path / "flat")
    cat = cv.open(root)
    cat.restore(0)
    new = cv.open(root)
    assert new.latest == 3 and (root / "checkpoint_3/_SUCCESS").read_text()
    assert_same_values(new, 0, new, 3)


# -- other layouts ------------------------------------------------------------------------
def test_caffe2_promote_copies_every_node(tmp_path):
    root = copy_corpus("caffe2/ckpt", tmp_path / "c2")
    cat = cv.open(root)
    result = cat.restore(2)
    assert result.new_serial == 5
    assert (root / "trainer_0.5").exists() and (root / "trainer_1.5").exists()
    new = cv.open(root)
    assert new.latest == 5
    assert_same_values(new, 2, new, 5)


def test_tf_promote_rewrites_state_file(tmp_path):
    root = copy_corpus("modern/tf/run_ckpt", tmp_path / "tf")
    before = snapshot(root)
    cat = cv.open(root)
    assert cat.latest == 400
    result = cat.restore(300)
    assert list(result.ops["kind"]) == ["write"] and result.ops["path"].iloc[0] == "checkpoint"
    state = parse_state((root / "checkpoint").read_text())
    assert state["model_checkpoint_path"] == ["ckpt-300"]
    assert state["all_model_checkpoint_paths"] == ["ckpt-400", "ckpt-300"]
    assert len(state["all_model_checkpoint_timestamps"]) == 2
    assert cv.open(root).latest == 300
    after = snapshot(root)
    assert {k: v for k, v in after.items() if k != "checkpoint"} == {
        k: v for k, v in before.items() if k != "checkpoint"
    }


def test_tf_restore_to_other_tree(tmp_path):
    cat = cv.open(corpus_path("modern/tf/run_ckpt"))
    cat.restore(300, to=tmp_path / "out")
    out = cv.open(tmp_path / "out")
    assert out.layout == "tf" and list(out.serials.index) == [300] and out.latest == 300
    assert_same_values(cat, 300, out, 300)


def test_tf_state_roundtrip():
    text = corpus_path("modern/tf/run_ckpt/checkpoint").read_text()
    state = parse_state(text)
    assert state["model_checkpoint_path"] == ["ckpt-400"]
    assert len(state["all_model_checkpoint_paths"]) == 2
    assert parse_state(format_state(state)) == state
    odd = {"model_checkpoint_path": ['a "quoted" \\ path'], "all_model_checkpoint_paths": []}
    assert parse_state(format_state(odd)) == {"model_checkpoint_path": odd["model_checkpoint_path"]}


def test_orbax_promote_and_export_are_staged(tmp_path):
    root = copy_corpus("tf_orbax/orbax/run3_noocdbt", tmp_path / "orbax")
    cat = cv.open(root)
    plan = cat.restore(2, dry_run=True)
    assert plan.ops["kind"].iloc[-1] == "rename"
    assert plan.ops["path"].iloc[-1] == "4"
    assert all(p.startswith("4.orbax-checkpoint-tmp/") for p in plan.ops["path"].iloc[:-1])
    cat.restore(2)
    new = cv.open(root)
    assert new.latest == 4 and not (root / "4.orbax-checkpoint-tmp").exists()
    assert_same_values(new, 2, new, 4)
    cat.restore(3, to=tmp_path / "exported")
    assert cv.open(tmp_path / "exported").latest == 3


# -- lock -----------------------------------------------------------------------------------
def _plant_lock(root: Path, pid: int, host: str) -> None:
    (root / ".ckptview").mkdir(exist_ok=True)
    info = {"pid": pid, "host": host, "time": "then", "what": "test", "token": "x"}
    (root / ".ckptview/lock").write_text(json.dumps(info))


def test_live_lock_refuses_and_stale_lock_is_broken(tmp_path):
    root = copy_corpus("paddle/fluid_ckpt", tmp_path / "fluid")
    cat = cv.open(root)
    _plant_lock(root, os.getpid(), socket.gethostname())  # a live holder
    before = snapshot(root)
    with pytest.raises(TreeLockedError, match="locked by pid"):
        cat.restore(1)
    _plant_lock(root, 4, "some-other-host")  # another host: never presumed dead
    with pytest.raises(TreeLockedError):
        cat.restore(1)
    assert snapshot(root) == before
    dead = max(2**22, os.getpid() + 100000)
    _plant_lock(root, dead, socket.gethostname())  # a dead pid on this host: stale
    cat.restore(1)
    assert cv.open(root).latest == 4 and not (root / ".ckptview/lock").exists()


def test_lock_is_exclusive_on_memory_fs():
    fs = fsspec.filesystem("memory")
    with TreeLock(fs, "/locktest") as first:
        assert fs.exists(first.path)
        with pytest.raises(TreeLockedError):
            TreeLock(fs, "/locktest").acquire()
    assert not fs.exists("/locktest/.ckptview/lock")
    fs.rm("/locktest", recursive=True)


def test_restore_plans_under_the_lock(tmp_path):
    """A catalog read before another restore ran: its restore is planned from the tree as it
    is once it holds the lock (the next free serial), not from its stale view."""
    root = copy_corpus("paddle/fluid_ckpt", tmp_path / "fluid")
    first, second = cv.open(root), cv.open(root)
    assert list(second.serials.index) == [0, 1, 2, 3]  # read before the first restore
    assert first.restore(0).new_serial == 4
    result = second.restore(1)
    assert result.done and result.new_serial == 5
    assert result.ops["path"].str.startswith("checkpoint_5/").all()
    now = cv.open(root)
    assert now.latest == 5 and now.serials.loc[[4, 5], "complete"].all()
    assert_same_values(now, 0, now, 4)
    assert_same_values(now, 1, now, 5)


class _Intruder(FaultyFS):
    """Records every mutating call; call ``fail_at`` fails (once) right after another writer
    put a file of its own into the directory being restored."""

    def __init__(self, fs, fail_at=None, intrude=None):
        super().__init__(fs, fail_at, crash=False)
        self.intrude, self.calls_seen = intrude, []

    def _should_fail(self, what: str) -> bool:
        self.calls_seen.append(what)
        hit = super()._should_fail(what)
        if hit and self.intrude is not None:
            self.intrude.parent.mkdir(parents=True, exist_ok=True)
            self.intrude.write_bytes(b"another writer's file")
        return hit


def test_rollback_removes_only_what_the_run_wrote(tmp_path):
    """A restore that fails removes the files it wrote and the directories it made only once
    empty: a file another writer put there meanwhile survives."""
    layout = registry.get_layout("paddle-fluid")
    count = copy_corpus("paddle/fluid_ckpt", tmp_path / "count")
    counter = _Intruder(fsspec.filesystem("file"))
    Catalog(Tree.at(Storage(counter), str(count)), layout).restore(1)
    last_marker = max(i for i, what in enumerate(counter.calls_seen)
                      if what.startswith("open ") and "/.ckptview/tmp/" in what)  # fmt: skip
    root = copy_corpus("paddle/fluid_ckpt", tmp_path / "fluid")
    before = snapshot(root)
    foreign = root / "checkpoint_4/__model__/written_by_someone_else"
    fs = _Intruder(fsspec.filesystem("file"), fail_at=last_marker + 1, intrude=foreign)
    with pytest.raises(InjectedFault):
        Catalog(Tree.at(Storage(fs), str(root)), layout).restore(1)
    assert foreign.read_bytes() == b"another writer's file"
    now = snapshot(root)
    del now["checkpoint_4/__model__/written_by_someone_else"]
    assert now == before  # every file the run wrote is gone
    assert not any((root / "checkpoint_4").glob("**/_SUCCESS"))
    events = journal_events(str(root))
    kept = [e["path"] for e in events if e["event"] == "rollback" and e.get("kept")]
    assert kept == [str(root / "checkpoint_4/__model__"), str(root / "checkpoint_4")]
    assert not (root / "checkpoint_4/trainer_0").exists()  # made by the run, emptied: removed
    assert not cv.open(root).serials.loc[4, "complete"]


def test_values_survive_roundtrip_via_numpy(tmp_path):
    root = copy_corpus("paddle/fluid_ckpt", tmp_path / "fluid")
    cat = cv.open(root)
    want = cat.read("fc_0.w_0", 0)
    cat.restore(0)
    got = cv.open(root).read("fc_0.w_0", 4)
    assert np.array_equal(want, got)
