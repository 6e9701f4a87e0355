"""Header cache and live runs on local trees: a second open reads no header; ``refresh`` reads
only new or changed files; a deleted serial disappears; the on-disk cache serves another
process; the memory cache stays bounded.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import corpus_path

import ckptview as cv
from ckptview.io import Storage
from ckptview.scan.cache import RACY, HeaderCache


def backdate(root: Path, seconds: float = 60) -> None:
    """Files written just now are not cached (coarse mtimes); make them older, as a run's are."""
    when = time.time() - seconds
    for p in [root, *root.rglob("*")]:
        os.utime(p, (when, when))


def copy_tree(rel: str, dest: Path, only: tuple[str, ...] | None = None) -> Path:
    src = corpus_path(rel)
    names = only or tuple(sorted(p.name for p in src.iterdir()))
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        if (src / name).is_dir():
            shutil.copytree(src / name, dest / name)
        else:
            shutil.copy(src / name, dest / name)
        backdate(dest / name)
    return dest


class ReadLog:
    """Which paths one Storage read (a thin record around its own methods)."""

    def __init__(self, storage: Storage):
        self.paths: list[str] = []
        read_range, read_ranges = storage.read_range, storage.read_ranges

        def one(path, start, end):
            self.paths.append(path)
            return read_range(path, start, end)

        def many(path, ranges):
            self.paths.append(path)
            return read_ranges(path, ranges)

        storage.read_range, storage.read_ranges = one, many


def snapshot(cat: cv.Catalog) -> tuple[pd.DataFrame, pd.DataFrame]:
    v = cat.variables.drop(columns=["file"]).sort_values(["serial", "node", "name"])
    return cat.serials.drop(columns=["path"]), v.reset_index(drop=True)


def test_second_open_reads_no_header(tmp_path):
    root = copy_tree("paddle/fluid_ckpt", tmp_path / "t")
    cache = HeaderCache()
    first = cv.open(root, cache=cache)
    want = snapshot(first)
    assert first.storage.counters.bytes_read > 0
    second = cv.open(root, cache=cache)
    got = snapshot(second)
    assert second.storage.counters.bytes_read == 0 and second.storage.counters.requests == 0
    pd.testing.assert_frame_equal(got[0], want[0])
    pd.testing.assert_frame_equal(got[1], want[1])
    assert second.read("fc_0.w_0").size > 0  # values still read from the file


def test_process_wide_default_and_opt_out(tmp_path):
    root = copy_tree("paddle/fluid_ckpt", tmp_path / "t")
    assert cv.open(root).variables.shape[0] > 0
    assert cv.open(root).storage.counters.bytes_read == 0  # the default cache is shared
    private = cv.open(root, cache=False)
    assert len(private.variables)
    assert private.storage.counters.bytes_read > 0


def test_just_written_files_are_not_trusted(tmp_path):
    root = copy_tree("modern/hf", tmp_path / "t")
    now = time.time()
    for p in root.rglob("*"):
        os.utime(p, (now, now))
    cache = HeaderCache()
    assert len(cv.open(root, cache=cache).variables)
    again = cv.open(root, cache=cache)
    assert len(again.variables)
    assert again.storage.counters.bytes_read > 0  # within RACY seconds of a write: re-read
    assert RACY <= 5


def test_refresh_reads_only_new_changed_and_forgets_deleted(tmp_path):
    root = copy_tree("modern/hf", tmp_path / "t", only=("checkpoint-100", "checkpoint-200"))
    cat = cv.open(root, cache=False)
    assert list(cat.serials.index) == [100, 200]
    log = ReadLog(cat.storage)

    copy_tree("modern/hf", root, only=("checkpoint-300",))  # the running job saves again
    cat.refresh()
    assert list(cat.serials.index) == [100, 200, 300] and cat.latest == 300
    assert log.paths and all("/checkpoint-300/" in p for p in log.paths)
    fresh = cv.open(root, cache=False)
    pd.testing.assert_frame_equal(snapshot(cat)[1], snapshot(fresh)[1])

    log.paths.clear()  # a changed file (new size and mtime) is read again, alone
    changed = root / "checkpoint-200" / "scheduler.pt"
    shutil.copy(corpus_path("modern/hf/checkpoint-300/scheduler.pt"), changed)
    os.utime(changed, (time.time() - 30, time.time() - 30))
    cat.refresh()
    assert len(cat.variables)
    assert set(log.paths) == {str(changed)}

    log.paths.clear()  # a deleted serial disappears; nothing is read
    shutil.rmtree(root / "checkpoint-100")
    cat.refresh()
    assert list(cat.serials.index) == [200, 300]
    assert len(cat.variables) and log.paths == []


def test_private_cache_keys_its_first_listing_later(tmp_path, monkeypatch):
    """``cache=False``: the catalog's own cache holds nothing before its first listing, so that
    listing makes no keys (no lookups, no mtime stamps); its ``refresh`` keys them then, from
    the listing of that time, and reads no header again."""
    from ckptview.scan import listing

    root = copy_tree("paddle/fluid_ckpt", tmp_path / "t")
    made = []
    real = listing.listing_key
    monkeypatch.setattr(listing, "listing_key", lambda *a, **k: made.append(a) or real(*a, **k))
    cat = cv.open(root, cache=False)
    want = snapshot(cat)
    assert cat.cache.private and made == []
    log = ReadLog(cat.storage)
    cat.refresh()
    got = snapshot(cat)
    assert made and log.paths == []
    pd.testing.assert_frame_equal(got[1], want[1])
    assert len(cv.open(root, cache=False).cache) > 0  # counting flushes the deferred keys


def test_private_cache_later_keys_keep_the_racy_rule(tmp_path, monkeypatch):
    """Keys made after the listing judge mtimes at the listing's time: files written just
    before it are re-read on refresh even when the refresh comes later."""
    import ckptview.scan.cache as cache_mod

    root = copy_tree("paddle/fluid_ckpt", tmp_path / "t")
    now = time.time()
    for p in root.rglob("*"):
        os.utime(p, (now, now))
    cat = cv.open(root, cache=False)
    assert len(cat.variables)
    later = now + 60
    monkeypatch.setattr(cache_mod.time, "time", lambda: later)
    log = ReadLog(cat.storage)
    cat.refresh()
    assert len(cat.variables) and log.paths  # racy at listing time: read again


def test_disk_cache_serves_another_process(tmp_path):
    root = copy_tree("paddle/fluid_ckpt", tmp_path / "t")
    where = tmp_path / "cache"
    first = cv.open(root, cache=where)
    n = len(first.variables)
    assert any(where.rglob("*.pkl"))
    script = (
        "import json, sys, ckptview as cv\n"
        "cat = cv.open(sys.argv[1], cache=sys.argv[2])\n"
        "v = cat.variables\n"
        "print(json.dumps({'rows': len(v), 'bytes': cat.storage.counters.bytes_read,"
        " 'value': float(cat.read('fc_0.w_0').sum())}))\n"
    )
    out = subprocess.run([sys.executable, "-c", script, str(root), str(where)],
                         capture_output=True, text=True, check=True, timeout=60)  # fmt: skip
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["rows"] == n and r["bytes"] == 0
    assert r["value"] == pytest.approx(float(first.read("fc_0.w_0").sum()))


def test_memory_cache_is_bounded():
    cache = HeaderCache(max_weight=10)
    info = {"size": 1, "mtime": None, "etag": "x", "type": "file"}
    keys = [cache.key("listing", f"/f{i}", info) for i in range(30)]
    for k in keys:
        cache.put(k, ("safetensors", [object()] * 2, None))  # weight 3 each
    assert len(cache) == 3 and cache.get(keys[-1]) is not None and cache.get(keys[0]) is None
