"""A failure injected at EVERY mutating filesystem call of restore and retention.

Two failure models: ``crash`` (the k-th mutating call and every later one fail: the process
is gone, nothing can be cleaned up) and ``fault`` (only the k-th call fails: ckptview's own
error handling runs). After each, the tree is reopened and checked: the latest complete
serial is intact, no serial looks complete unless all its files are really there, and the
journal has an intent record for every change that reached the tree.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import fsspec
import pytest
from test_restore import copy_corpus, snapshot

import ckptview as cv
from ckptview import registry
from ckptview.catalog import Catalog
from ckptview.io import Storage
from ckptview.journal import read_journal
from ckptview.tree import Tree

RESULTS: dict[str, list[int]] = {}  # scenario -> [points injected, survived]


class InjectedFault(OSError):
    pass


class FaultyFS:
    """Wraps an fsspec filesystem; mutating call number ``fail_at`` (1-based) fails, and with
    ``crash`` every later one too. A failing write leaves half its bytes behind."""

    MUTATING = ("mv", "rm_file", "rmdir", "makedirs", "mkdir", "rm", "pipe_file", "cp_file")

    def __init__(self, fs, fail_at: int | None = None, crash: bool = True):
        self._fs = fs
        self.fail_at = fail_at
        self.crash = crash
        self.calls = 0
        self.failed: list[str] = []

    def _should_fail(self, what: str) -> bool:
        self.calls += 1
        hit = self.fail_at is not None and (
            self.calls == self.fail_at or (self.crash and self.calls > self.fail_at)
        )
        if hit:
            self.failed.append(what)
        return hit

    def __getattr__(self, name):
        attr = getattr(self._fs, name)
        if name not in self.MUTATING:
            return attr

        def call(*args, **kwargs):
            if self._should_fail(f"{name} {args[0] if args else ''}"):
                raise InjectedFault(f"injected failure in {name}{args}")
            return attr(*args, **kwargs)

        return call

    def open(self, path, mode="rb", **kwargs):
        if "r" in mode:
            return self._fs.open(path, mode, **kwargs)
        if self._should_fail(f"open {path}"):
            return _HalfFile(self._fs.open(path, mode, **kwargs))
        return self._fs.open(path, mode, **kwargs)


class _HalfFile:
    def __init__(self, f):
        self._f = f

    def write(self, data: bytes):
        self._f.write(data[: len(data) // 2])
        self._f.close()
        raise InjectedFault("injected failure while writing")

    def close(self):
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


def faulty_catalog(root: Path, fs: FaultyFS) -> Catalog:
    tree = Tree.at(Storage(fs), str(root))
    return Catalog(tree, registry.get_layout(cv.open(root).layout))


def files_under(snap: dict, prefix: str) -> dict:
    return {k[len(prefix) :]: v for k, v in snap.items() if k.startswith(prefix)}


def check_journal(root: Path, before: dict, fs: FaultyFS, crash: bool) -> None:
    """Every path that changed has an intent record; a handled fault is recorded."""
    events = read_journal(fsspec.filesystem("file"), f"{root}/.ckptview/journal.jsonl")
    now = snapshot(root)
    changed = {p for p in set(before) | set(now) if before.get(p) != now.get(p)}
    intents = [e["op"]["path"] for e in events if e["event"] == "intent"]
    for p in changed:
        assert any(p == i or p.startswith(i + "/") for i in intents), f"unjournaled {p}"
    journal_failed = any(".ckptview/journal" in f for f in fs.failed)
    if not crash and fs.failed and not journal_failed and intents:
        assert any(e["event"] == "failed" for e in events)


def run_points(name: str, setup: Callable[[Path], Path], act: Callable[[Catalog, Path], None],
               check: Callable[[Path, dict], None], tmp: Path) -> None:  # fmt: skip
    """Count the mutating calls of ``act``, then fail each one under both models."""
    base = setup(tmp / "count")
    counter = FaultyFS(fsspec.filesystem("file"))
    act(faulty_catalog(base, counter), base)
    total = counter.calls
    assert total > 5
    for crash in (True, False):
        key = f"{name}/{'crash' if crash else 'fault'}"
        RESULTS[key] = [0, 0]
        for k in range(1, total + 1):
            root = setup(tmp / f"{key.replace('/', '-')}-{k}")
            before = snapshot(root)
            fs = FaultyFS(fsspec.filesystem("file"), fail_at=k, crash=crash)
            with pytest.raises((InjectedFault, OSError)):
                act(faulty_catalog(root, fs), root)
            RESULTS[key][0] += 1
            check(root, before)
            check_journal(root, before, fs, crash)
            RESULTS[key][1] += 1
            shutil.rmtree(root)


# -- checks --------------------------------------------------------------------------------
def fluid_check(source: int | None, target: int | None):
    """Complete serials hold exactly their files (a restored one: the source's, markers aside)."""

    def check(root: Path, before: dict) -> None:
        cat = cv.open(root)
        now = snapshot(root)
        table = cat.serials
        latest_before = 2
        assert bool(table.loc[latest_before, "complete"])
        for s in table.index[table["complete"]]:
            got = files_under(now, f"checkpoint_{s}/")
            if s == target:
                want = files_under(before, f"checkpoint_{source}/")
                for rel, digest in want.items():
                    if not rel.endswith("_SUCCESS"):
                        assert got.get(rel) == digest, (s, rel)
                assert set(got) == set(want)
            else:
                assert got == files_under(before, f"checkpoint_{s}/"), s
        assert cat.latest in (latest_before, target)
        assert (cat.diff(latest_before, latest_before)["status"] == "identical").all()

    return check


def test_crash_during_fluid_promote(tmp_path):
    run_points("fluid-promote", lambda d: copy_corpus("paddle/fluid_ckpt", d),
               lambda cat, root: cat.restore(1), fluid_check(1, 4), tmp_path)  # fmt: skip


def test_crash_during_fluid_retention(tmp_path):
    def act(cat, root):
        cat.apply_retention(cat.plan_retention(keep_last=1))

    run_points("fluid-retention", lambda d: copy_corpus("paddle/fluid_ckpt", d), act,
               fluid_check(None, None), tmp_path)  # fmt: skip


def test_crash_during_restore_to_other_tree(tmp_path):
    source = copy_corpus("paddle/fluid_ckpt", tmp_path / "source")
    src_snap = snapshot(source)

    def setup(d: Path) -> Path:
        d.mkdir(parents=True)
        (d / "README.md").write_text("destination")
        return d

    def act(cat, root):  # the destination's filesystem is the faulty one
        storage = cat.storage
        src = cv.open(source)
        src.restore(2, to=str(root), storage_options=None) if storage is None else None
        from ckptview.restore import restore

        restore_to(src, root, storage.fs)

    def check(root: Path, before: dict) -> None:
        now = snapshot(root)
        try:
            cat = cv.open(root)
        except cv.UnknownTreeError:
            return
        if cat.layout != "paddle-fluid":
            return
        table = cat.serials
        for s in table.index[table["complete"]]:
            assert s == 2
            assert files_under(now, "checkpoint_2/") == files_under(src_snap, "checkpoint_2/")

    run_points("fluid-export", setup, act, check, tmp_path)


def restore_to(src: Catalog, root: Path, fs) -> None:
    """Restore through a faulty destination filesystem (a memory-free local stand-in)."""
    from ckptview.journal import Journal, OpRunner, TreeLock
    from ckptview.restore import managed, serial_info

    layout = managed(src._layout)
    ops = layout.export_ops(src.tree, src.scan, serial_info(src, 2))
    with TreeLock(fs, str(root), "restore 2"):
        journal = Journal(fs, str(root))
        journal.write("begin", action="restore", serial=2)
        OpRunner(fs, str(root), src_fs=src.storage.fs, journal=journal).run(ops, rollback=True)
        journal.write("end", action="restore")


def test_crash_during_tf_promote(tmp_path):
    def check(root: Path, before: dict) -> None:
        cat = cv.open(root)
        assert cat.latest in (300, 400)
        assert cat.serials["complete"].all()
        now = snapshot(root)
        assert {k: v for k, v in now.items() if k != "checkpoint"} == {
            k: v for k, v in before.items() if k != "checkpoint"
        }
        assert (root / "checkpoint").read_text().startswith("model_checkpoint_path")

    run_points("tf-promote", lambda d: copy_corpus("modern/tf/run_ckpt", d),
               lambda cat, root: cat.restore(300), check, tmp_path)  # fmt: skip


def test_crash_during_caffe2_promote(tmp_path):
    def check(root: Path, before: dict) -> None:
        cat = cv.open(root)
        table = cat.serials
        assert bool(table.loc[4, "complete"])
        now = snapshot(root)
        for s in table.index[table["complete"]]:
            if s == 5:
                for node in ("trainer_0", "trainer_1"):
                    assert now.get(f"{node}.5") == before[f"{node}.2"]
            else:
                assert now[f"trainer_0.{s}"] == before[f"trainer_0.{s}"]

    run_points("caffe2-promote", lambda d: copy_corpus("caffe2/ckpt", d),
               lambda cat, root: cat.restore(2), check, tmp_path)  # fmt: skip


def test_zz_report_counts():
    """Prints the injected/survived counts (run last in this module)."""
    assert RESULTS, "the crash tests did not run"
    for key, (injected, survived) in sorted(RESULTS.items()):
        print(f"{key}: {injected} failure points injected, {survived} survived")
        assert injected == survived > 0
