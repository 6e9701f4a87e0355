"""Restore a serial: as a copy in another tree, or in place so the framework resumes from it.

Each layout says *what* its framework needs as Op lists (``Layout.export_ops`` /
``promote_ops``, built from its management hooks); this module checks, journals, locks and
runs them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

from .io import Storage
from .journal import Journal, OpRunner, TreeLock, describe
from .model import Op, SerialInfo

OP_COLUMNS = ["kind", "path", "src", "nbytes", "note"]


def ops_frame(ops: list[Op]) -> pd.DataFrame:
    df = pd.DataFrame([(o.kind, o.path, o.src, o.nbytes, o.note) for o in ops], columns=OP_COLUMNS)
    df.index.name = "step"
    return df.astype({"nbytes": "int64"})


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


# -- restore -------------------------------------------------------------------------------
def serial_info(cat, serial: int) -> SerialInfo:
    for s in cat.scan.serials:
        if s.serial == serial:
            return s
    raise KeyError(f"no serial {serial}; serials: {sorted(s.serial for s in cat.scan.serials)}")


def restore(cat, serial: int, to: str | os.PathLike | None = None, dry_run: bool = False,
            storage_options: dict | None = None, force: bool = False,
            progress: Callable[[int], None] | None = None) -> RestoreResult:  # fmt: skip
    """Copy ``serial`` to ``to`` as a resumable tree, or promote it in place (never deletes)."""
    if to is not None:
        dest, root = Storage.from_url(os.fspath(to), storage_options)
        return export_to(cat, serial, dest.fs, root, dry_run, force, progress)
    serial = _checked(cat, serial, force)
    if cat.latest == serial:
        return RestoreResult(serial, cat.url, serial, ops_frame([]), dry_run, not dry_run,
                             "already the serial the framework resumes from")  # fmt: skip
    layout = cat._layout
    ops = layout.promote_ops(cat.tree, cat.scan, serial_info(cat, serial))
    new_serial = layout.promoted_serial(cat.tree, cat.scan, serial_info(cat, serial))
    result = RestoreResult(serial, cat.url, new_serial, ops_frame(ops), dry_run, False)
    if not dry_run:
        run_change(cat, cat.storage.fs, cat.tree.root, ops, result, progress)
        cat.refresh()
    return result


def export_to(cat, serial: int, fs, root: str, dry_run: bool = False, force: bool = False,
              progress: Callable[[int], None] | None = None) -> RestoreResult:  # fmt: skip
    """Copy ``serial`` into the tree at ``root`` of filesystem ``fs``."""
    serial = _checked(cat, serial, force)
    ops = cat._layout.export_ops(cat.tree, cat.scan, serial_info(cat, serial))
    clash = [o.path for o in ops if not o.replace and fs.exists(_join(root, o.path))]
    if clash:
        raise FileExistsError(f"{root} already holds {clash[0]} (restore never overwrites)")
    url = Storage(fs).url(root)
    result = RestoreResult(serial, url, serial, ops_frame(ops), dry_run, False)
    if not dry_run:
        run_change(cat, fs, root, ops, result, progress)
    return result


def _checked(cat, serial: int, force: bool) -> int:
    serial = int(serial)
    serial_info(cat, serial)
    if not bool(cat.serials.loc[serial, "complete"]) and not force:
        raise ValueError(f"serial {serial} is incomplete; restoring it needs force=True")
    return serial


def run_change(cat, fs, root: str, ops: list[Op], result: RestoreResult,
               progress: Callable[[int], None] | None) -> None:  # fmt: skip
    """Run a restore's ops under the target tree's lock, journaled, rolled back on failure."""
    journal = Journal(fs, root)
    with TreeLock(fs, root, f"restore {result.serial}"):
        journal.write("begin", action="restore", serial=result.serial, source=cat.url,
                      target=result.target, new_serial=result.new_serial, steps=len(ops),
                      plan=[describe(o) for o in ops])  # fmt: skip
        runner = OpRunner(fs, root, src_fs=cat.storage.fs, journal=journal, progress=progress)
        runner.run(ops, rollback=True)
        journal.write("end", action="restore", serial=result.serial, new_serial=result.new_serial)
    result.done = True


def _join(root: str, rel: str) -> str:
    return root.rstrip("/") + "/" + rel if root not in ("", "/") else "/" + rel
