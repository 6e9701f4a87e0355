"""Restore a serial: as a copy in another tree, or in place so the framework resumes from it.

Each layout says *what* its framework needs as Op lists (``Layout.export_ops`` /
``promote_ops``, built from its management hooks); this module checks, journals, locks and
runs them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from ..changes.journal import Journal
from ..changes.lock import TreeLock
from ..changes.ops import OpRunner, describe, ops_frame
from ..changes.result import ChangeResult
from ..io import Storage
from ..model import Op
from ..scan.core import Scan


@dataclass(kw_only=True)
class RestoreResult(ChangeResult):
    """What a restore did (or, with ``dry_run``, would do): a :class:`ChangeResult` with the
    restored ``serial`` and the ``new_serial`` it has in the target tree."""

    action: ClassVar[str] = "restore"
    serial: int
    new_serial: int | None

    def headline(self) -> str:
        return self._with_message(
            f"restore serial {self.serial} -> {self.target}: {self.verb} {len(self.ops)} steps"
        )


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
        return RestoreResult(serial=serial, target=scan.url, new_serial=serial, dry_run=dry_run,
                             done=not dry_run,
                             message="already the serial the framework resumes from"), []  # fmt: skip
    layout, info = scan.layout, scan.serial_info(serial)
    ops = layout.promote_ops(scan.tree, scan.tree_scan, info)
    new_serial = layout.promoted_serial(scan.tree, scan.tree_scan, info)
    return RestoreResult(serial=serial, target=scan.url, new_serial=new_serial,
                         ops=ops_frame(ops), dry_run=dry_run, done=False), ops  # fmt: skip


def export_to(scan: Scan, serial: int, fs: Any, root: str, dry_run: bool = False,
              force: bool = False,
              progress: Callable[[int], None] | None = None) -> RestoreResult:  # fmt: skip
    """Copy ``serial`` into the tree at ``root`` of filesystem ``fs`` (checked for clashes
    under that tree's lock)."""
    serial = _checked(scan, serial, force)
    ops = scan.layout.export_ops(scan.tree, scan.tree_scan, scan.serial_info(serial))
    url = Storage(fs).url(root)
    result = RestoreResult(serial=serial, target=url, new_serial=serial, ops=ops_frame(ops),
                           dry_run=dry_run, done=False)  # fmt: skip
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
