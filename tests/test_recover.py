"""Recovery after a real crash: ``ckptview.changes.recover.recover`` and ``ckptview journal``.

A restore is cut short at every mutating filesystem call (the ``crash`` model: that call and
every later one fail, the process is gone; the ``fault`` model: only that call fails and
ckptview's own clean-up runs). The "process" then dies (its lock's pid is made a dead one)
and a fresh one runs ``recover``. Afterwards no leftover remains (no ``.ckptview/tmp``
content, no lock, nothing pending in the journal) and the tree equals, file by file and in
its catalog, either the tree before the restore or the tree a clean restore produces.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import fsspec
import pytest
from test_crash_safety import (
    FaultyFS,
    InjectedFault,
    faulty_catalog,
    numbered_dirs,
    numbered_files,
    small_deepspeed,
    small_fluid,
    small_incubate,
)
from test_restore import snapshot

import ckptview as cv
from ckptview.changes.journal import read_journal
from ckptview.changes.lock import GRACE, TreeLock, TreeLockedError
from ckptview.changes.recover import recover
from ckptview.changes.status import status
from ckptview.cli import main
from ckptview.engine.restore import export_to

RESULTS: dict[str, list[int]] = {}  # scenario -> [points, recovered to before, to finished]
FACTS = ["complete", "latest", "n_files", "n_variables", "nbytes"]


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def die(root: Path) -> None:
    """The crashed process is gone: its lock (if left) now names a dead pid."""
    lock = root / ".ckptview/lock"
    if lock.exists():
        try:
            held = json.loads(lock.read_text())
        except ValueError:  # unreadable: stale once older than GRACE
            old = time.time() - GRACE - 1
            os.utime(lock, (old, old))
            return
        held["pid"] = dead_pid()
        lock.write_text(json.dumps(held))


def state(root: Path) -> tuple[dict, list]:
    """(files -> sha256, fluid markers reduced to their presence; the serials' facts)."""
    files = {k: ("marker" if k.endswith("_SUCCESS") else v) for k, v in snapshot(root).items()}
    if not files:
        return files, []
    cat = cv.open(root, cache=False)
    return files, cat.serials[FACTS].reset_index().to_dict("records")


def leftovers(root: Path) -> list[str]:
    meta = root / ".ckptview"
    out = (
        [p.relative_to(root).as_posix() for p in (meta / "tmp").rglob("*")] if meta.exists() else []
    )
    if (meta / "lock").exists():
        out.append(".ckptview/lock")
    return out


def promote_act(layout: str, serial: int):
    return lambda fs, root: faulty_catalog(root, fs, layout).restore(serial)


SCENARIOS = {  # name: (setup, act); act(fs, root) runs the restore on ``fs``
    "fluid-promote": (small_fluid, promote_act("paddle-fluid", 1)),
    "numbered-dirs-promote": (numbered_dirs, promote_act("numbered", 100)),
    "numbered-files-promote": (numbered_files, promote_act("numbered", 100)),
    "incubate-promote": (small_incubate, promote_act("paddle-incubate", 0)),
    "deepspeed-export": (None, None),  # set below: a copy into another tree
}


def _deepspeed_export(tmp: Path):
    source = cv.open(small_deepspeed(tmp / "ds-source"))

    def setup(d: Path) -> Path:
        d.mkdir(parents=True)
        return d

    return setup, lambda fs, root: export_to(source._scan, 10, fs, str(root))


@pytest.mark.parametrize("name", SCENARIOS)
def test_recover_after_crash_in_restore(name, tmp_path):
    setup, act = SCENARIOS[name]
    if setup is None:
        setup, act = _deepspeed_export(tmp_path)
    counter = FaultyFS(fsspec.filesystem("file"))
    act(counter, setup(tmp_path / "count"))
    total = counter.calls
    assert total >= 6
    for crash in (True, False):
        key = f"{name}/{'crash' if crash else 'fault'}"
        RESULTS[key] = [0, 0, 0]
        for k in range(1, total + 1):
            root = setup(tmp_path / f"{key.replace('/', '-')}-{k}")
            before = state(root)
            clean = root.with_name(root.name + "-clean")  # the same tree, restored cleanly
            shutil.copytree(root, clean)
            act(fsspec.filesystem("file"), clean)
            finished = state(clean)
            assert finished != before
            shutil.rmtree(clean)
            fs = FaultyFS(fsspec.filesystem("file"), fail_at=k, crash=crash)
            with pytest.raises((InjectedFault, OSError)):
                act(fs, root)
            die(root)
            result = recover(root)
            assert result.done
            assert leftovers(root) == [], (k, leftovers(root))
            assert status(root).attrs["pending"] == []
            after = state(root)
            assert after in (before, finished), (key, k, result)
            RESULTS[key][0] += 1
            RESULTS[key][1 if after == before else 2] += 1
            again = recover(root)  # idempotent: nothing left to do
            assert len(again.ops) == 0 and not again.outcomes
            shutil.rmtree(root)
        assert RESULTS[key][0] == total


def test_recover_retention_finishes_the_started_serial(tmp_path):
    """A crash inside one serial's deletion: recovery finishes deleting that serial (already
    incomplete) and never touches a complete one."""
    root = numbered_dirs(tmp_path / "run")
    before = snapshot(root)
    fs = FaultyFS(fsspec.filesystem("file"), fail_at=11, crash=True)  # after the lock: 4 calls
    cat = faulty_catalog(root, fs, "numbered")
    plan = cat.plan_retention(keep_last=1)
    assert plan["action"].tolist() == ["delete", "delete", "keep"]
    with pytest.raises(InjectedFault):
        cat.apply_retention(plan)
    die(root)
    assert leftovers(root)  # the renamed-away step_100 sits in .ckptview/tmp
    st = status(root)
    assert st["status"].iloc[-1] == "interrupted" and st["action"].iloc[-1] == "retention"
    result = recover(root)
    assert leftovers(root) == []
    now = snapshot(root)
    assert not any(k.startswith("step_100/") for k in now)
    assert {k: v for k, v in before.items() if not k.startswith("step_100/")} == now
    cat = cv.open(root)
    assert list(cat.serials.index) == [200, 300] and cat.latest == 300
    outcome = dict(result.outcomes)
    assert any("serial 100" in o for o in outcome.values()), outcome
    st = status(root)
    assert st["status"].tolist() == ["recovered", "finished"]
    assert st["action"].tolist() == ["retention", "recover"]
    assert "serial 100" in st["detail"].iloc[0] and "serial 100" in st["detail"].iloc[1]
    events = [e["event"] for e in read_journal(fsspec.filesystem("file"),
                                                 f"{root}/.ckptview/journal.jsonl")]  # fmt: skip
    assert "lock_broken" in events  # the dead process's lock, broken and journaled


def test_recover_refuses_while_a_live_process_holds_the_lock(tmp_path):
    root = numbered_files(tmp_path / "run")
    with TreeLock(fsspec.filesystem("file"), str(root), "restore 100"):
        with pytest.raises(TreeLockedError):
            recover(root)
        dry = recover(root, dry_run=True)  # a plan may be looked at meanwhile
        assert dry.lock["pid"] is not None and "lock held" in str(dry)


def test_recover_never_removes_a_complete_serial(tmp_path):
    """A journal naming paths of a complete serial (e.g. hand-edited, or a stale record)
    never makes recovery delete them."""
    root = numbered_dirs(tmp_path / "run")
    before = snapshot(root)
    plan = [{"kind": "copy", "path": "step_200/model.npz", "src": "x", "nbytes": 1},
            {"kind": "rename", "path": "step_999", "src": ".ckptview/tmp/x-step_999"}]  # fmt: skip
    records = [
        {"op_id": "feedbeef0000", "event": "begin", "action": "restore", "serial": 100,
         "new_serial": 301, "steps": 2, "plan": plan, "time": "t"},
        {"op_id": "feedbeef0000", "event": "intent", "step": 0, "time": "t"},
    ]  # fmt: skip
    (root / ".ckptview").mkdir()
    (root / ".ckptview/journal.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    result = recover(root)
    assert snapshot(root) == before
    assert "left 1 file(s) of complete serials" in dict(result.outcomes)["feedbeef0000"]


def test_journal_torn_line_does_not_swallow_the_next_record(tmp_path):
    root = numbered_files(tmp_path / "run")
    cat = cv.open(root)
    cat.restore(100)
    path = root / ".ckptview/journal.jsonl"
    path.write_bytes(path.read_bytes() + b'{"op_id": "torn", "ev')  # a crash mid-append
    cat.restore(200, to=tmp_path / "copy")
    cat.set_retention(keep_last=2)
    events = read_journal(fsspec.filesystem("file"), str(path))
    assert [e["event"] for e in events][-2:] == ["intent", "done"]  # set_retention's write


def test_cli_journal_and_recover(tmp_path, capsys):
    root = numbered_dirs(tmp_path / "run")
    assert main(["restore", str(root), "200", "--yes", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["journal", str(root), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["action"], r["serial"], r["status"], r["steps"]) for r in rows] == [
        ("restore", 200, "finished", "3/3")
    ]
    fs = FaultyFS(fsspec.filesystem("file"), fail_at=7, crash=True)  # mid-copy
    with pytest.raises(InjectedFault):
        faulty_catalog(root, fs, "numbered").restore(100)
    die(root)
    assert main(["journal", str(root)]) == 0
    out, err = capsys.readouterr()
    print(out, err)
    assert "interrupted" in out and "--recover --yes" in err
    assert main(["journal", str(root), "--recover"]) == 0  # plan only
    out, err = capsys.readouterr()
    print(out, err)
    out = " ".join(out.split())  # the headline may wrap at the terminal's width
    assert "would run" in out and "rolled back" in out and leftovers(root)
    assert main(["journal", str(root), "--recover", "--yes"]) == 0
    out, _ = capsys.readouterr()
    print(out)
    out = " ".join(out.split())
    assert "ran" in out and "broke a stale lock" in out and leftovers(root) == []
    assert list(cv.open(root).serials.index) == [100, 200, 300, 301]
    assert main(["journal", str(root), "--recover", "--yes"]) == 0
    assert "nothing to recover" in capsys.readouterr().out
    assert main(["journal", str(tmp_path / "nope")]) == 1


def test_s3_lock_uses_a_conditional_put(tmp_path):
    """On S3 (moto) the lock is an exclusive create: ``If-None-Match: *`` on PutObject."""
    from s3server import MotoServer, s3fs_client

    server = MotoServer()
    try:
        fs = s3fs_client(server.endpoint)
        fs.call_s3("create_bucket", Bucket="locks")
        root = "locks/tree"
        with TreeLock(fs, root, "first"):
            with pytest.raises(OSError), fs.open(f"{root}/.ckptview/lock", "xb") as f:
                f.write(b"{}")  # the store itself refuses a second create
            with pytest.raises(TreeLockedError, match="tree locked by pid"):
                TreeLock(fs, root, "second").acquire()
        assert not fs.exists(f"{root}/.ckptview/lock")
        with TreeLock(fs, root, "third") as lock:
            assert json.loads(fs.cat_file(f"{root}/.ckptview/lock"))["token"] == lock.token
    finally:
        server.stop()


def test_zz_report_recover_counts():
    assert RESULTS, "the recovery sweeps did not run"
    for key, (points, to_before, to_finished) in sorted(RESULTS.items()):
        print(f"{key}: {points} crash points recovered: {to_before} to the tree before, "
              f"{to_finished} to the finished restore")  # fmt: skip
        assert points == to_before + to_finished > 0
