"""A failure injected at EVERY mutating filesystem call of restore and retention.

Two failure models: ``crash`` (the k-th mutating call and every later one fail: the process
is gone, nothing can be cleaned up) and ``fault`` (only the k-th call fails: ckptview's own
error handling runs). After each, the tree is reopened and checked: the latest complete
serial is intact, no serial looks complete unless all its files are really there, and the
journal has an intent record for every change that reached the tree.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

import fsspec
import numpy as np
import pytest
from test_deepspeed import write_tag
from test_paddle import _incubate_tree
from test_restore import copy_corpus, snapshot
from test_stats_diff import write_lod

import ckptview as cv
from ckptview import registry
from ckptview.catalog import Catalog
from ckptview.changes.journal import read_journal
from ckptview.engine.restore import export_to
from ckptview.io import Storage
from ckptview.testing import FaultyFS, InjectedFault
from ckptview.tree import Tree

RESULTS: dict[str, list[int]] = {}  # scenario -> [points injected, survived]
TOTALS: dict[str, int] = {}  # scenario -> mutating calls the change makes


def faulty_catalog(root: Path, fs: FaultyFS, layout: str) -> Catalog:
    return Catalog(Tree.at(Storage(fs), str(root)), registry.get_layout(layout))


def files_under(snap: dict, prefix: str) -> dict:
    return {k[len(prefix) :]: v for k, v in snap.items() if k.startswith(prefix)}


def check_journal(root: Path, before: dict, fs: FaultyFS, crash: bool) -> None:
    """Every path that changed has an intent record; a handled fault is recorded."""
    events = read_journal(fsspec.filesystem("file"), f"{root}/.ckptview/journal.jsonl")
    now = snapshot(root)
    changed = {p for p in set(before) | set(now) if before.get(p) != now.get(p)}
    ops = [e["op"] for e in events if e["event"] == "intent"]
    intents = [o["path"] for o in ops] + [o["src"] for o in ops if o["kind"] == "rename"]
    for p in changed:
        assert any(p == i or p.startswith(i + "/") for i in intents), f"unjournaled {p}"
    bookkeeping = ("/.ckptview/journal", "/.ckptview/lock")
    on_data = [
        f
        for f in fs.failed
        if not f.endswith("/.ckptview") and not any(b in f for b in bookkeeping)
    ]
    if not crash and on_data:
        assert any(e["event"] == "failed" for e in events)


def run_points(name: str, setup: Callable[[Path], Path], act: Callable[[FaultyFS, Path], None],
               check: Callable[[Path, dict], None], tmp: Path, stride: int = 1) -> None:  # fmt: skip
    """Count the mutating calls of ``act``, then fail each one under both models (every
    ``stride``-th one, offset per model so the two together cover more points, and always
    the first and the last)."""
    base = setup(tmp / "count")
    counter = FaultyFS(fsspec.filesystem("file"))
    act(counter, base)
    total = counter.calls
    assert total > 5
    for offset, crash in enumerate((True, False)):
        key = f"{name}/{'crash' if crash else 'fault'}"
        RESULTS[key] = [0, 0]
        start = 1 + (offset * stride // 2)
        points = sorted({1, total, *range(start, total + 1, stride)})
        TOTALS[key] = total
        for k in points:
            root = setup(tmp / f"{key.replace('/', '-')}-{k}")
            before = snapshot(root)
            fs = FaultyFS(fsspec.filesystem("file"), fail_at=k, crash=crash)
            with pytest.raises((InjectedFault, OSError)):
                act(fs, root)
            RESULTS[key][0] += 1
            check(root, before)
            check_journal(root, before, fs, crash)
            RESULTS[key][1] += 1
            shutil.rmtree(root)


def small_fluid(root: Path) -> Path:
    """A V3 fluid tree (__model__ + trainer_0, each with _SUCCESS); serial 3 crashed."""
    rng = np.random.default_rng(0)
    for n in range(4):
        model = {"w": rng.standard_normal((4, 3)).astype(np.float32), "b": np.arange(3.0)}
        for name, arr in model.items():
            write_lod(root / f"checkpoint_{n}/__model__/{name}", arr)
        trainer = root / f"checkpoint_{n}/trainer_0"
        trainer.mkdir()
        (trainer / "epoch_id").write_text(str(n))
        (trainer / "step_id").write_text("0")
        (trainer / "_SUCCESS").write_text(time.ctime())
        if n < 3:
            (root / f"checkpoint_{n}/__model__/_SUCCESS").write_text(time.ctime())
    return root


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

    return check


@pytest.mark.slow
def test_crash_during_fluid_promote(tmp_path):
    run_points("fluid-promote", small_fluid,
               lambda fs, root: faulty_catalog(root, fs, "paddle-fluid").restore(1), fluid_check(1, 4), tmp_path)  # fmt: skip


def test_crash_during_fluid_retention(tmp_path):
    def act(fs, root):
        cat = faulty_catalog(root, fs, "paddle-fluid")
        cat.apply_retention(cat.plan_retention(keep_last=1))

    run_points("fluid-retention", small_fluid, act,
               fluid_check(None, None), tmp_path)  # fmt: skip


def test_crash_during_restore_to_other_tree(tmp_path):
    source = cv.open(small_fluid(tmp_path / "source"))
    src_snap = snapshot(Path(source.tree.root))

    def setup(d: Path) -> Path:
        d.mkdir(parents=True)
        return d

    def check(root: Path, before: dict) -> None:
        now = snapshot(root)
        if not now:
            return
        cat = cv.open(root)
        assert cat.layout == "paddle-fluid"
        table = cat.serials
        for s in table.index[table["complete"]]:
            assert s == 2
            assert files_under(now, "checkpoint_2/") == files_under(src_snap, "checkpoint_2/")

    run_points("fluid-export", setup, lambda fs, root: export_to(source._scan, 2, fs, str(root)),
               check, tmp_path)  # fmt: skip


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
               lambda fs, root: faulty_catalog(root, fs, "tf").restore(300), check, tmp_path)  # fmt: skip


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
               lambda fs, root: faulty_catalog(root, fs, "caffe2").restore(2), check, tmp_path)  # fmt: skip


# -- the other families: one promote and one retention each ---------------------------------
def tree_check(layout: str, latest: int, source: int | None = None, target: int | None = None):
    """The tree still opens with ``layout``; ``latest`` is untouched and still the resume
    point, or the promoted ``target`` is (a pointer move: DeepSpeed's newer tags then stay
    complete, just not the resume point); every complete serial holds exactly its own files (the
    target: exactly the source's)."""

    def check(root: Path, before: dict) -> None:
        cat = cv.open(root)
        assert cat.layout == layout
        table, now = cat.serials, snapshot(root)
        assert cat.latest in (latest, target)
        assert cat.latest == target or bool(table.loc[latest, "complete"])
        rel = cat.tree.rel(table.loc[latest, "path"])
        assert files_under(now, rel + "/") == files_under(before, rel + "/")
        origin = {}
        for s in table.index:  # where each serial's files were before the change
            rel = cat.tree.rel(table.loc[s, "path"])
            origin[s] = rel.replace(str(target), str(source)) if s == target else rel
        for s in table.index[table["complete"]]:
            rel = cat.tree.rel(table.loc[s, "path"])
            assert files_under(now, rel + "/") == files_under(before, origin[s] + "/"), s

    return check


def small_orbax(d: Path) -> Path:
    return copy_corpus("tf_orbax/orbax/run3_noocdbt", d)


def small_hf(d: Path) -> Path:
    root = copy_corpus("modern/hf", d)
    for n in (100, 200, 300):  # the model weights only: enough files, a fast sweep
        for f in (root / f"checkpoint-{n}").iterdir():
            if f.name not in ("model.safetensors", "config.json", "trainer_state.json"):
                f.unlink()
    return root


def small_deepspeed(d: Path) -> Path:
    for step in (10, 20):
        write_tag(d, step)
    (d / "latest").write_text("global_step20")
    return d


def small_incubate(d: Path) -> Path:
    _incubate_tree(d)
    return d


def promote(layout: str, serial: int):
    return lambda fs, root: faulty_catalog(root, fs, layout).restore(serial)


def retain(layout: str):
    def act(fs, root):
        cat = faulty_catalog(root, fs, layout)
        cat.apply_retention(cat.plan_retention(keep_last=1))

    return act


def _npz(path: Path, seed: int, **shapes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    np.savez(path, **{k: rng.standard_normal(v).astype(np.float32) for k, v in shapes.items()})


def numbered_dirs(d: Path) -> Path:
    """``step_N/model.npz`` + ``step_N/opt.npz``: numbered dirs, no commit marker."""
    for n in (100, 200, 300):
        _npz(d / f"step_{n}/model.npz", n, w=(4, 3), b=(3,))
        _npz(d / f"step_{n}/opt.npz", n + 1, m=(4, 3))
    return d


def numbered_files(d: Path) -> Path:
    """``step_N.npz`` + ``optim_step_N.npz``: two files per serial, no commit marker."""
    for n in (100, 200, 300):
        _npz(d / f"step_{n}.npz", n, w=(4, 3), b=(3,))
        _npz(d / f"optim_step_{n}.npz", n + 1, m=(4, 3))
    return d


def numbered_check(latest: int, source: int | None = None, target: int | None = None):
    """Every complete serial holds exactly its own files (the target: the source's,
    renumbered); ``latest`` is untouched and the resume point unless the target is."""

    def check(root: Path, before: dict) -> None:
        cat = cv.open(root)
        assert cat.layout == "numbered"
        table, now = cat.serials, snapshot(root)
        assert cat.latest in (latest, target) and bool(table.loc[latest, "complete"])
        wanted = {}  # serial -> its files before the change
        for rel in before:
            n = int(rel.replace(".", "_").split("_")[-2] if "/" not in rel else
                    rel.split("/")[0].split("_")[-1])  # fmt: skip
            wanted.setdefault(n, set()).add(rel)
        for info in cat.scan.serials:
            if not bool(table.loc[info.serial, "complete"]):
                continue
            files = cat._scan.layout.serial_files(cat.tree, info)
            if info.serial == target:
                origin = {f: f.replace(str(target), str(source)) for f in files}
                assert set(origin.values()) == wanted[source]
                assert all(now[f] == before[o] for f, o in origin.items())
            else:
                assert set(files) == wanted[info.serial], info.serial
                assert all(now[f] == before[f] for f in files)

    return check


NUMBERED = {"numbered-dirs": numbered_dirs, "numbered-files": numbered_files}


@pytest.mark.parametrize("family", NUMBERED)
def test_crash_during_numbered_promote(family, tmp_path):
    run_points(f"{family}-promote", NUMBERED[family], promote("numbered", 100),
               numbered_check(300, 100, 301), tmp_path)  # fmt: skip


@pytest.mark.parametrize("family", NUMBERED)
def test_crash_during_numbered_retention(family, tmp_path):
    run_points(f"{family}-retention", NUMBERED[family], retain("numbered"),
               numbered_check(300), tmp_path)  # fmt: skip


FAMILIES = {  # name: (setup, layout, latest, source, target, stride)
    "orbax": (small_orbax, "orbax", 3, 2, 4, 4),
    "hf-trainer": (small_hf, "hf-trainer", 300, 100, 301, 2),
    "deepspeed": (small_deepspeed, "deepspeed", 20, 10, 10, 1),
    "paddle-incubate": (small_incubate, "paddle-incubate", 1, 0, 3, 2),
}


SWEEPS = [pytest.param(f, marks=pytest.mark.slow) if f == "orbax" else f for f in FAMILIES]


@pytest.mark.parametrize("family", SWEEPS)
def test_crash_during_promote(family, tmp_path):
    setup, layout, latest, source, target, stride = FAMILIES[family]
    check = tree_check(layout, latest, source, target)
    run_points(f"{family}-promote", setup, promote(layout, source), check, tmp_path, stride)


@pytest.mark.parametrize("family", SWEEPS)
def test_crash_during_retention(family, tmp_path):
    setup, layout, latest, _source, _target, stride = FAMILIES[family]
    run_points(f"{family}-retention", setup, retain(layout), tree_check(layout, latest),
               tmp_path, stride)  # fmt: skip


def test_zz_report_counts():
    """Prints the injected/survived counts (run last in this module)."""
    assert RESULTS, "the crash tests did not run"
    for key, (injected, survived) in sorted(RESULTS.items()):
        print(f"{key}: {injected} of {TOTALS[key]} failure points injected, {survived} survived")
        assert injected == survived > 0
