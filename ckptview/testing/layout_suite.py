"""``LayoutSuite``: the checks every layout must pass, for a layout's tests to subclass.

A subclass names the layout and makes trees of it (two loadable serials or more for the crash
sweep); every ``test_*`` method then runs on them::

    class TestToyRuns(LayoutSuite):
        layout = "toy-run"
        def make_trees(self, directory):
            return [write_toy_run(directory / "run")]
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import ClassVar

import fsspec
import numpy as np

from .. import registry
from ..api import open as open_tree
from ..catalog import Catalog
from ..io import Storage
from ..tree import Tree
from .contract import check_files, check_serials, check_variables
from .faults import FaultyFS, InjectedFault

PEEK = 4096  # what a layout may read on top of the codecs (a head, a small marker)


def snapshot(root: Path) -> dict[str, str]:
    """rel path -> sha256 of every file outside ``.ckptview``."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.relative_to(root).as_posix().startswith(".ckptview")
    }


class LayoutSuite:
    """Detection, the table contract, every file accounted for, header-only scans, reading
    the resume point, and a crash at every mutating call of a retention run."""

    #: the layout's registered name
    layout: ClassVar[str] = ""
    #: tree roots (absolute paths); or override :meth:`make_trees`
    trees: ClassVar[tuple[str, ...]] = ()
    #: at most this many failure points of the crash sweep (spread over all the calls)
    crash_points: ClassVar[int] = 12

    def make_trees(self, directory: Path) -> list[Path]:
        """Trees of the layout (``directory``: a fresh temporary directory)."""
        return [Path(p) for p in self.trees]

    def _trees(self, tmp_path: Path) -> list[Path]:
        made = self.make_trees(tmp_path / "trees")
        assert made, f"{type(self).__name__}: no trees"
        return made

    # -- the checks -------------------------------------------------------------------------
    def test_registered(self) -> None:
        assert registry.get_layout(self.layout).name == self.layout

    def test_detected(self, tmp_path: Path) -> None:
        for root in self._trees(tmp_path):
            assert open_tree(root, cache=False).layout == self.layout, root

    def test_tables_follow_the_contract(self, tmp_path: Path) -> None:
        for root in self._trees(tmp_path):
            cat = open_tree(root, cache=False)
            check_serials(cat.serials)
            check_variables(cat.variables, cat.serials)
            on_disk = [str(p) for p in Path(root).rglob("*") if p.is_file()]
            check_files(cat.files, on_disk)

    def test_scan_reads_each_byte_at_most_once(self, tmp_path: Path) -> None:
        for root in self._trees(tmp_path):
            total = sum(p.stat().st_size for p in Path(root).rglob("*") if p.is_file())
            cat = open_tree(root, cache=False)
            cat.variables  # noqa: B018 - the scan
            got = cat.storage.counters.bytes_read
            assert got <= total + PEEK, f"{root}: read {got} bytes of {total}"

    def test_resume_point_reads(self, tmp_path: Path) -> None:
        for root in self._trees(tmp_path):
            cat = open_tree(root, cache=False)
            if cat.latest is None:
                continue
            v = cat.variables
            rows = v[(v["serial"] == cat.latest) & v["error"].isna() & (v["dtype"] != "object")]
            assert len(rows), f"{root}: the resume point has no readable variable"
            for row in rows.head(20).itertuples():
                arr = cat.read(row.name, serial=row.serial, node=row.node)
                assert isinstance(arr, np.ndarray) and arr.shape == row.shape, row.name

    def test_crash_at_every_step_of_retention(self, tmp_path: Path) -> None:
        """Keep only the newest serial, failing the k-th mutating call (and every later one):
        afterwards the newest loadable serial is intact and reads, and no serial looks
        loadable whose files changed."""
        for i, root in enumerate(self._trees(tmp_path)):
            before_cat = open_tree(root, cache=False)
            loadable = list(before_cat.serials.index[before_cat.serials["loadable"]])
            if len(loadable) < 2:
                continue
            count = tmp_path / f"count{i}"
            shutil.copytree(root, count)
            counter = FaultyFS(fsspec.filesystem("file"))
            _retain(count, counter, self.layout)
            total = counter.calls
            assert total > 0, "retention changed nothing"
            step = max(1, total // self.crash_points)
            for k in sorted({1, total, *range(1, total + 1, step)}):
                work = tmp_path / f"crash{i}-{k}"
                shutil.copytree(root, work)
                before = snapshot(work)
                try:
                    _retain(work, FaultyFS(fsspec.filesystem("file"), fail_at=k), self.layout)
                except (InjectedFault, OSError):
                    pass
                _check_after_crash(work, before, int(max(loadable)))
                shutil.rmtree(work)


def _retain(root: Path, fs: FaultyFS, layout: str) -> None:
    cat = Catalog(Tree.at(Storage(fs), str(root)), registry.get_layout(layout))
    cat.apply_retention(cat.plan_retention(keep_last=1))


def _check_after_crash(root: Path, before: dict[str, str], newest: int) -> None:
    cat = open_tree(root, cache=False)
    serials, now = cat.serials, snapshot(root)
    assert newest in serials.index and serials.loc[newest, "loadable"], f"lost {newest}"
    assert cat.latest == newest
    tree = cat.tree
    for s in serials.index[serials["loadable"]]:
        rel = tree.rel(serials.loc[s, "path"])
        mine = {p: h for p, h in now.items() if p == rel or p.startswith(rel + "/")}
        was = {p: h for p, h in before.items() if p == rel or p.startswith(rel + "/")}
        assert mine == was, f"serial {s} shows loadable with changed files"
    v = cat.variables
    row = v[(v["serial"] == newest) & v["error"].isna() & (v["dtype"] != "object")].iloc[0]
    cat.read(row["name"], serial=newest, node=row["node"])
