"""Restore a serial: as a copy in another tree, or in place so the framework resumes from it.

Each layout says *what* its framework needs as Op lists (``Layout.export_ops`` /
``promote_ops``, built from its management hooks); this module checks, journals, locks and
runs them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ..changes.journal import Journal
from ..changes.lock import TreeLock
from ..changes.ops import OpRunner, describe, ops_frame
from ..io import Storage
from ..model import Op
from ..scan.core import Scan


@dataclass
class RestoreResult:
    """What a restore did (or, with ``dry_run``, would do)."""

    serial: int
    target: str  # URL of the tree that changes
    new_serial: int | None  # the serial number the restored copy has there
    ops: pd.DataFrame = field(repr=False)
    dry_run: bool
    done: bool
    message: str = ""

    def __str__(self) -> str:
        verb = "would" if self.dry_run else ("did" if self.done else "did not")
        head = f"restore serial {self.serial} -> {self.target}: {verb} run {len(self.ops)} steps"
        if self.message:
            head += f" ({self.message})"
        with pd.option_context("display.max_colwidth", 80, "display.width", 200):
            return head + ("\n" + self.ops.to_string() if len(self.ops) else "")

    def _repr_html_(self) -> str:
        return f"<p>{str(self).splitlines()[0]}</p>" + self.ops.to_html()


def restore(scan: Scan, serial: int, to: str | os.PathLike | None = None, dry_run: bool = False,
            storage_options: dict | None = None, force: bool = False,
            progress: Callable[[int], None] | None = None) -> RestoreResult:  # fmt: skip
    """Copy ``serial`` to ``to``, or promote it in place (never deletes). The plan that runs
    is made under the tree's lock from the tree as it is then (another change may have
    finished since ``scan`` was read)."""
    if to is not None:
        dest, root = Storage.from_url(os.fspath(to), storage_options)
        return export_to(scan, serial, dest.fs, root, dry_run, force, progress)
    serial = _checked(scan, serial, force)
    if dry_run:
        return _promotion(scan, serial, dry_run=True)[0]
    fs, root = scan.storage.fs, scan.tree.root
    journal = Journal(fs, root)
    with TreeLock(fs, root, f"restore {serial}", journal):
        scan.refresh()  # plan from the tree as it is now that no other change can run
        try:
            result, ops = _promotion(scan, _checked(scan, serial, force), dry_run=False)
            if not result.done:
                _run(scan, journal, root, ops, result, progress)
        finally:
            scan.refresh()
    return result


def _promotion(scan: Scan, serial: int, dry_run: bool) -> tuple[RestoreResult, list[Op]]:
    """The plan promoting ``serial`` in place (done already when it is the resume point)."""
    if scan.latest == serial:
        return RestoreResult(serial, scan.url, serial, ops_frame([]), dry_run, not dry_run,
                             "already the serial the framework resumes from"), []  # fmt: skip
    layout, info = scan.layout, scan.serial_info(serial)
    ops = layout.promote_ops(scan.tree, scan.tree_scan, info)
    new_serial = layout.promoted_serial(scan.tree, scan.tree_scan, info)
    return RestoreResult(serial, scan.url, new_serial, ops_frame(ops), dry_run, False), ops


def export_to(scan: Scan, serial: int, fs: Any, root: str, dry_run: bool = False,
              force: bool = False,
              progress: Callable[[int], None] | None = None) -> RestoreResult:  # fmt: skip
    """Copy ``serial`` into the tree at ``root`` of filesystem ``fs`` (checked for clashes
    under that tree's lock)."""
    serial = _checked(scan, serial, force)
    ops = scan.layout.export_ops(scan.tree, scan.tree_scan, scan.serial_info(serial))
    url = Storage(fs).url(root)
    result = RestoreResult(serial, url, serial, ops_frame(ops), dry_run, False)
    if dry_run:
        _refuse_clash(fs, root, ops)
        return result
    journal = Journal(fs, root)
    with TreeLock(fs, root, f"restore {serial}", journal):
        _refuse_clash(fs, root, ops)
        _run(scan, journal, root, ops, result, progress)
    return result


def _refuse_clash(fs: Any, root: str, ops: list[Op]) -> None:
    clash = [o.path for o in ops if not o.replace and fs.exists(_join(root, o.path))]
    if clash:
        raise FileExistsError(f"{root} already holds {clash[0]} (restore never overwrites)")


def _checked(scan: Scan, serial: int, force: bool) -> int:
    serial = int(serial)
    scan.serial_info(serial)
    row = scan.serials.loc[serial]
    if not bool(row["complete"]) and not force:
        raise ValueError(f"serial {serial} is incomplete; restoring it needs force=True")
    if not bool(row["loadable"]) and not force:
        raise ValueError(
            f"serial {serial} does not load ({row['error']}); restoring it needs force=True"
        )
    return serial


def _run(scan: Scan, journal: Journal, root: str, ops: list[Op], result: RestoreResult,
         progress: Callable[[int], None] | None) -> None:  # fmt: skip
    """Run a restore's ops (the caller holds the target tree's lock), journaled, rolled back
    on failure (only what this run wrote: :class:`~ckptview.changes.ops.OpRunner`)."""
    fs = journal.fs
    journal.write("begin", action="restore", serial=result.serial, source=scan.url,
                  target=result.target, new_serial=result.new_serial, steps=len(ops),
                  plan=[describe(o) for o in ops])  # fmt: skip
    runner = OpRunner(fs, root, src_fs=scan.storage.fs, journal=journal, progress=progress)
    runner.run(ops, rollback=True)
    journal.write("end", action="restore", serial=result.serial, new_serial=result.new_serial)
    result.done = True


def _join(root: str, rel: str) -> str:
    return root.rstrip("/") + "/" + rel if root not in ("", "/") else "/" + rel
