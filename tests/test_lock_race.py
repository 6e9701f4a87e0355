"""Real processes racing for one tree: for its lock (locally and on S3 through moto), and two
in-place restores or two retention applies started at the same instant.

Lock races: N forked processes wait on a barrier, then each takes the lock ``ROUNDS`` times
(retrying while it is refused), holding it a few milliseconds; every holder records when it
entered and left (``time.monotonic_ns``, one clock for all processes). An overlap is a moment
with two holders. With ``stale`` the tree starts with the lock of a process killed with
SIGKILL while holding it. A crash is any exception other than ``TreeLockedError``.

Change races: two worker processes each open the same (copied) corpus tree and plan their
change, then get "go" together; each records when it held the lock (an overlap: both at
once); every other trial starts with a stale lock. Afterwards: a false-complete serial is one
marked complete whose files are not exactly those of one serial that was there before
(commit markers aside) or that does not load; a crash is an exception other than a refusal
(the lock held, the tree changed since the plan).

The interleaving behind overlapping holders (a breaker acting on a judgement made before
someone else broke the stale lock) is also forced deterministically, locally and on S3.

The counts are printed at the end (``pytest -s``) and kept in ``RACES``;
``CKPTVIEW_RACE_TRIALS`` scales the number of trials.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import fsspec
import pytest
from conftest import corpus_copy
from test_restore import snapshot

import ckptview as cv
from ckptview.changes import lock as lock_module
from ckptview.changes.lock import GRACE, TreeLock, TreeLockedError
from ckptview.changes.lockstore import LocalStore, S3Store, store_for
from ckptview.testing import races
from ckptview.testing.races import filesystem, max_holders

TRIALS = int(os.environ.get("CKPTVIEW_RACE_TRIALS", "20"))
PROCS = 4
CHANGE_TRIALS = max(2, TRIALS * 3 // 5)
ROUNDS = 3  # each process takes the lock this many times per trial
#: scenario -> {"trials", "overlaps" (trials with two holders at once), "max_holders",
#: "crashes", "false_complete", ...}
RACES: dict[str, dict] = {}
#: children forked from a single-threaded server that imported the contenders' module once
#: (a fork of the multi-threaded pytest process could inherit locks held by its threads)
FORK = multiprocessing.get_context("forkserver")
FORK.set_forkserver_preload([races.__name__, "s3fs"])


# -- lock races ----------------------------------------------------------------------------
def lock_race(prefix: str, root: str, options: dict | None, stale: list[bool],
              rounds: int = ROUNDS) -> None:  # fmt: skip
    """``PROCS`` contenders, one trial per item of ``stale`` (True: the trial starts with the
    lock of a process killed while holding it); counts in ``RACES[f"{prefix} stale|fresh"]``."""
    fs = filesystem(options)
    barrier, results = FORK.Barrier(PROCS + 1), FORK.Queue()
    procs = [FORK.Process(target=races.contender, args=(root, options, len(stale), rounds, barrier,
                                                   results)) for _ in range(PROCS)]  # fmt: skip
    for p in procs:
        p.start()
    try:
        for killed in stale:
            stats = RACES.setdefault(f"{prefix} {'stale' if killed else 'fresh'}",
                                     {"trials": 0, "overlaps": 0, "max_holders": 0,
                                      "crashes": 0, "holds": 0})  # fmt: skip
            if killed:
                victim = FORK.Process(target=races.killed_holder, args=(root, options))
                victim.start()
                victim.join()
                assert victim.exitcode == -signal.SIGKILL
                fs.invalidate_cache()
                assert fs.exists(root + "/.ckptview/lock")
            barrier.wait(60)
            got = [results.get(timeout=60) for _ in procs]
            intervals = [iv for held, _ in got for iv in held]
            most = max_holders(intervals)
            stats["trials"] += 1
            stats["holds"] += len(intervals)
            stats["overlaps"] += most > 1
            stats["max_holders"] = max(stats["max_holders"], most)
            stats["crashes"] += sum(len(c) for _, c in got)
            stats["starved"] = stats.get("starved", 0) + (len(intervals) < PROCS * rounds)
            stats.setdefault("errors", set()).update(c for _, cs in got for c in cs)
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    fs.invalidate_cache()
    assert not fs.exists(root + "/.ckptview/lock")
    for key in (f"{prefix} stale", f"{prefix} fresh"):
        stats = RACES[key]
        assert stats["overlaps"] == 0 and stats["crashes"] == 0, (key, stats)
        assert stats["starved"] == 0, (key, stats)  # every contender got its turns


def test_processes_racing_for_the_lock(tmp_path):
    root = str(tmp_path / "tree")
    os.makedirs(root)
    lock_race("lock local", root, None, [t % 2 == 0 for t in range(2 * TRIALS)])


@pytest.mark.s3
def test_processes_racing_for_the_lock_on_s3(s3_endpoint):
    from s3server import storage_options

    options = storage_options(s3_endpoint)
    fs = filesystem(options)
    fs.call_s3("create_bucket", Bucket="race")
    trials = max(2, TRIALS // 6)
    lock_race("lock s3", "race/tree", options, [t % 2 == 0 for t in range(2 * trials)], 1)


def test_an_unreadable_lock_is_held_until_it_is_old(tmp_path):
    """An empty lock (one being written by a non-atomic writer) is never judged stale while
    young; after ``GRACE`` seconds it is, and is broken."""
    root = tmp_path / "tree"
    (root / ".ckptview").mkdir(parents=True)
    lock = root / ".ckptview/lock"
    lock.write_bytes(b"")
    fs = fsspec.filesystem("file")
    with pytest.raises(TreeLockedError, match="cannot be read yet"):
        TreeLock(fs, str(root)).acquire()
    assert lock.read_bytes() == b""
    old = time.time() - GRACE - 5
    os.utime(lock, (old, old))
    with TreeLock(fs, str(root)) as taken:
        assert taken.broken is not None and taken.broken["unreadable"]
        assert json.loads(lock.read_bytes())["token"] == taken.token
    assert not lock.exists()


@pytest.mark.parametrize("where", ["local", pytest.param("s3", marks=pytest.mark.s3)])
def test_lock_store_compare_and_swap(where, tmp_path, request):
    """The store's swap and remove act only on the very lock that was read."""
    if where == "s3":
        from s3server import storage_options

        fs = filesystem(storage_options(request.getfixturevalue("s3_endpoint")))
        fs.call_s3("create_bucket", Bucket="cas")
        path, kind = "cas/tree/.ckptview/lock", S3Store
    else:
        fs, kind = fsspec.filesystem("file"), LocalStore
        path = str(tmp_path / "tree/.ckptview/lock")
        fs.makedirs(os.path.dirname(path), exist_ok=True)
    store = store_for(fs)
    assert type(store) is kind
    assert store.create(path, b"A") and not store.create(path, b"B")
    seen = store.read(path)
    assert seen is not None and seen.raw == b"A"
    assert store.swap(path, seen, b"C")  # unchanged since read: swapped
    assert not store.swap(path, seen, b"D")  # changed since read: refused
    assert not store.remove(path, seen)
    now = store.read(path)
    assert now is not None and now.raw == b"C"
    assert store.remove(path, now) and store.read(path) is None
    assert not store.swap(path, seen, b"E") and store.read(path) is None  # gone: not made


@pytest.mark.parametrize("where", ["local", pytest.param("s3", marks=pytest.mark.s3)])
def test_a_late_breaker_cannot_take_a_lock_broken_meanwhile(where, tmp_path, request,
                                                             monkeypatch):  # fmt: skip
    """The interleaving behind overlapping holders, made deterministic: B judges the lock of
    a killed process stale, then A breaks it and holds the lock, then B acts on its judgement.
    B must be refused (its compare-and-swap sees a changed lock), never take A's lock away."""
    if where == "s3":
        from s3server import storage_options

        options: dict | None = storage_options(request.getfixturevalue("s3_endpoint"))
        filesystem(options).call_s3("create_bucket", Bucket="late")
        root = "late/tree"
    else:
        options, root = None, str(tmp_path / "tree")
        os.makedirs(root)
    victim = FORK.Process(target=races.killed_holder, args=(root, options))
    victim.start()
    victim.join()
    judged, proceed = threading.Event(), threading.Event()
    real_is_stale = lock_module.is_stale

    def is_stale(held: dict) -> bool:
        stale = real_is_stale(held)
        if threading.current_thread().name == "late" and not judged.is_set():
            judged.set()  # B has judged the killed process's lock stale; A goes now
            proceed.wait(30)
        return stale

    monkeypatch.setattr(lock_module, "is_stale", is_stale)
    outcome = []

    def late() -> None:
        try:
            TreeLock(filesystem(options), root, "late").acquire()
            outcome.append("held")
        except TreeLockedError:
            outcome.append("refused")

    thread = threading.Thread(target=late, name="late")
    thread.start()
    assert judged.wait(30)
    first = TreeLock(filesystem(options), root, "first").acquire()
    assert first.broken is not None and first.broken["what"] == "killed"
    proceed.set()
    thread.join(30)
    assert outcome == ["refused"]
    assert first.holder()["token"] == first.token  # A still holds it
    first.release()
    assert first.holder() is None


# -- change races --------------------------------------------------------------------------
WORKER = r"""
import json, sys, time
import ckptview as cv
from ckptview.changes import lock as lock_module
from ckptview.changes.lock import TreeLock, TreeLockedError
from ckptview.engine.retention import TreeChangedError
HELD = []  # [entered, left] of each time this process held the lock (monotonic ns)
take, give = TreeLock.acquire, TreeLock.release
def acquire(self):
    taken = take(self)
    HELD.append([time.monotonic_ns(), None])
    return taken
def release(self):
    HELD[-1][1] = time.monotonic_ns()
    give(self)
TreeLock.acquire, TreeLock.release = acquire, release
while line := sys.stdin.readline():
    HELD.clear()
    job = json.loads(line)
    cat = cv.open(job["root"], cache=False)
    cat.serials
    plan = cat.plan_retention(keep_last=1) if job["what"] == "retention" else None
    print("ready", flush=True)
    sys.stdin.readline()
    try:
        if plan is not None:
            out = {"done": list(cat.apply_retention(plan).deleted.index)}
        else:
            out = {"done": cat.restore(job["serial"]).new_serial}
    except (TreeLockedError, TreeChangedError) as e:
        out = {"refused": repr(e)[:300]}
    except Exception as e:
        out = {"crash": repr(e)[:300]}
    print(json.dumps({**out, "held": HELD}), flush=True)
"""


class Workers:
    """Two long-lived worker processes (imports paid once), started together per trial."""

    def __init__(self, n: int = 2):
        self.procs = [subprocess.Popen([sys.executable, "-c", WORKER], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, text=True)
                      for _ in range(n)]  # fmt: skip

    def race(self, jobs: list[dict]) -> list[dict]:
        for p, job in zip(self.procs, jobs):
            p.stdin.write(json.dumps(job) + "\n")
            p.stdin.flush()
        for p in self.procs:
            assert p.stdout.readline().strip() == "ready"
        for p in self.procs:  # "go", as close together as two pipe writes
            p.stdin.write("go\n")
        for p in self.procs:
            p.stdin.flush()
        return [json.loads(p.stdout.readline()) for p in self.procs]

    def close(self) -> None:
        for p in self.procs:
            p.stdin.close()
            p.wait(30)


@pytest.fixture(scope="module")
def s3_endpoint():
    from s3server import MotoServer

    server = MotoServer()
    yield server.endpoint
    server.stop()


@pytest.fixture(scope="module")
def workers():
    w = Workers()
    yield w
    w.close()


def serial_files(snap: dict[str, str], serial_dir: str) -> dict[str, str]:
    """A serial directory's files (relative) -> sha256, fluid ``_SUCCESS`` markers aside (a
    promotion writes fresh ones)."""
    return {p[len(serial_dir) :]: h for p, h in snap.items()
            if p.startswith(serial_dir) and not p.endswith("_SUCCESS")}  # fmt: skip


def false_complete(root: Path, before: dict[str, str]) -> int:
    """Serials marked complete whose files are not those of one serial there before (fluid
    ``_SUCCESS`` markers aside: a promotion writes fresh ones), or that do not load."""
    cat = cv.open(root, cache=False)
    now = snapshot(root)
    origins = [serial_files(before, d + "/") for d in {p.split("/", 1)[0] for p in before}]
    bad = 0
    for s in cat.serials.index[cat.serials["complete"]]:
        mine = serial_files(now, cat.tree.rel(cat.serials.loc[s, "path"]) + "/")
        bad += mine not in origins or not bool(cat.serials.loc[s, "loadable"])
    return bad


def plant_stale_lock(root: str) -> None:
    """The lock of a process killed (SIGKILL) while it held it."""
    victim = FORK.Process(target=races.killed_holder, args=(root, None))
    victim.start()
    victim.join()
    assert victim.exitcode == -signal.SIGKILL and os.path.exists(f"{root}/.ckptview/lock")


def change_race(name: str, workers: Workers, tmp_path: Path, jobs: list[dict]) -> dict:
    """Every other trial starts with a stale lock (left by a killed process)."""
    stats = RACES.setdefault(name, {"trials": 0, "overlaps": 0, "both_done": 0, "crashes": 0,
                                    "false_complete": 0, "wrong_files": 0})  # fmt: skip
    for trial in range(CHANGE_TRIALS):
        root = corpus_copy("paddle/fluid_ckpt", tmp_path / f"{name.split()[0]}-{trial}")
        before = snapshot(root)
        if trial % 2 == 0:
            plant_stale_lock(str(root))
        out = workers.race([{**job, "root": str(root)} for job in jobs])
        stats["trials"] += 1
        stats["overlaps"] += max_holders([tuple(iv) for o in out for iv in o["held"]]) > 1
        stats["both_done"] += all("done" in o for o in out)
        stats["crashes"] += sum("crash" in o for o in out)
        stats.setdefault("errors", set()).update(o["crash"] for o in out if "crash" in o)
        stats["false_complete"] += false_complete(root, before)
        if name.startswith("restore"):  # each restored serial holds its source's files
            now = snapshot(root)
            for job, o in zip(jobs, out):
                if "done" in o:
                    got = serial_files(now, f"checkpoint_{o['done']}/")
                    stats["wrong_files"] += got != serial_files(before, f"checkpoint_{job['serial']}/")
    return stats


def test_simultaneous_in_place_restores(workers, tmp_path):
    jobs = [{"what": "restore", "serial": 0}, {"what": "restore", "serial": 1}]
    stats = change_race("restore x2", workers, tmp_path, jobs)
    assert stats["false_complete"] == 0 and stats["crashes"] == 0, stats
    assert stats["overlaps"] == 0 and stats["wrong_files"] == 0, stats


def test_simultaneous_retention_applies(workers, tmp_path):
    jobs = [{"what": "retention"}, {"what": "retention"}]
    stats = change_race("retention x2", workers, tmp_path, jobs)
    assert stats["false_complete"] == 0 and stats["crashes"] == 0, stats
    assert stats["overlaps"] == 0, stats


def test_zz_report_races():
    for name, stats in RACES.items():
        shown = {k: v for k, v in stats.items() if k != "errors"}
        print(f"race {name}: {shown}")
        for err in sorted(stats.get("errors", ()))[:5]:
            print(f"    {err}")
    assert RACES
