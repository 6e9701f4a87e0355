"""Running a change: each ``Op`` journaled (intent, then done or failed), writes staged under
``.ckptview/tmp/`` and renamed into place, optionally rolled back on failure."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import pandas as pd

from ..model import META_DIR, Op
from .journal import Journal, join_path

COPY_BLOCK = 8 << 20
OP_COLUMNS = ["kind", "path", "src", "nbytes", "note"]


def ops_frame(ops: list[Op]) -> pd.DataFrame:
    """Ops as a table (index: step), as plans and results show them."""
    df = pd.DataFrame([(o.kind, o.path, o.src, o.nbytes, o.note) for o in ops], columns=OP_COLUMNS)
    df.index.name = "step"
    return df.astype({"nbytes": "int64"})


def describe(op: Op) -> dict:
    """An Op as a journal record (a write's data as its sha256)."""
    out: dict[str, Any] = {"kind": op.kind, "path": op.path}
    if op.src:
        out["src"] = op.src
    if op.nbytes:
        out["nbytes"] = op.nbytes
    if op.note:
        out["note"] = op.note
    if op.replace:
        out["replace"] = True
    if op.kind == "write":  # lets recovery tell whether the write took effect
        out["sha256"] = hashlib.sha256(op.data or b"").hexdigest()
    return out


class OpRunner:
    """Runs Ops against ``fs`` at ``root`` (sources read from ``src_fs``), journaling each.

    ``rollback=True`` (restore): after a failure the files *this run wrote* are removed
    again, newest first (commit markers were written last, so they go first), then the
    directories it created, deepest first, each only once empty - never a directory wholesale,
    which could hold files someone else wrote. Each removal is journaled (``rollback``).
    Files replaced in place (``replace``: state files) and deletions are not rolled back.
    """

    def __init__(self, fs: Any, root: str, src_fs: Any = None, journal: Journal | None = None,
                 progress: Callable[[int], None] | None = None):  # fmt: skip
        self.fs = fs
        self.root = root
        self.src_fs = src_fs or fs
        self.journal = journal or Journal(fs, root)
        self.progress = progress
        self.written: list[str] = []  # absolute paths of files this run wrote, oldest first
        self.made: list[str] = []  # absolute paths of directories this run created
        self._tmp_made = False

    def abs(self, rel: str) -> str:
        return join_path(self.root, rel)

    def run(self, ops: Iterable[Op], rollback: bool = False) -> None:
        ops = list(ops)
        for i, op in enumerate(ops):
            self.journal.write("intent", step=i, of=len(ops), op=describe(op))
            try:
                self._do(op)
                self.journal.write("done", step=i)
            except BaseException as e:
                try:
                    self.journal.write("failed", step=i, op=describe(op), error=repr(e)[:500])
                finally:
                    if rollback:
                        self._rollback()
                raise

    def _parents(self, path: str) -> None:
        parent = path.rsplit("/", 1)[0]
        if parent and not self.fs.exists(parent):
            missing = []
            while parent and parent != self.root and not self.fs.exists(parent):
                missing.append(parent)
                parent = parent.rsplit("/", 1)[0]
            self.fs.makedirs(missing[0], exist_ok=True)
            self.made += reversed(missing)

    def _tmp(self, rel: str) -> str:
        name = rel.rsplit("/", 1)[-1]
        return self.abs(f"{META_DIR}/tmp/{uuid.uuid4().hex[:8]}-{name}")

    def _do(self, op: Op) -> None:
        dest = self.abs(op.path)
        if op.kind in ("copy", "write"):
            existed = self.fs.exists(dest)
            if existed and not op.replace:
                raise FileExistsError(f"refusing to overwrite {dest}")
            self._parents(dest)
            atomic = op.atomic or existed
            target = self._tmp(op.path) if atomic else dest
            if atomic and not self._tmp_made:
                self.fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
                self._tmp_made = True
            self.written.append(target)
            self._write(op, target)
            if atomic:
                self.fs.mv(target, dest)
                self.written.pop()
                if not existed:
                    self.written.append(dest)
        elif op.kind == "rename":
            src = self.abs(op.src or "")
            replace = self.fs.exists(dest)
            if replace and self.fs.isdir(dest):
                raise FileExistsError(f"refusing to replace directory {dest}")
            self._parents(dest)
            moved_dir = self.fs.isdir(src)
            self.fs.mv(src, dest, recursive=moved_dir)
            if not replace:
                self._moved(src, dest, moved_dir)
        elif op.kind == "delete":
            if self.fs.exists(dest):
                self.fs.rm_file(dest)
        elif op.kind == "rmdir":
            if self.fs.exists(dest) and self.fs.isdir(dest) and not self.fs.ls(dest):
                self.fs.rmdir(dest)
        else:
            raise ValueError(f"unknown op {op.kind!r}")

    def _write(self, op: Op, target: str) -> None:
        with self.fs.open(target, "wb") as out:
            if op.kind == "write":
                out.write(op.data or b"")
                if self.progress:
                    self.progress(len(op.data or b""))
                return
            with self.src_fs.open(op.src, "rb") as src:
                while block := src.read(COPY_BLOCK):
                    out.write(block)
                    if self.progress:
                        self.progress(len(block))

    def _moved(self, src: str, dest: str, moved_dir: bool) -> None:
        """What this run wrote or made under ``src`` is now under ``dest``."""

        def move(path: str) -> str:
            if path == src:
                return dest
            return dest + path[len(src) :] if moved_dir and path.startswith(src + "/") else path

        self.written = [move(p) for p in self.written]
        made = [move(p) for p in self.made]
        self.made = made + ([dest] if moved_dir and dest not in made else [])

    def _rollback(self) -> None:
        for path in reversed(self.written):
            self._undo("file", path)
        for path in sorted(set(self.made), key=lambda p: -p.count("/")):
            self._undo("dir", path)
        self.written, self.made = [], []

    def _undo(self, kind: str, path: str) -> None:
        """Remove a file this run wrote, or a directory it made if nothing is left in it."""
        try:
            if not self.fs.exists(path):
                return
            if kind == "dir" and self.fs.ls(path):
                self.journal.write("rollback", path=path, kind=kind, kept="not empty")
                return
            self.journal.write("rollback", path=path, kind=kind)
            if kind == "file":
                self.fs.rm_file(path)
            else:
                self.fs.rmdir(path)
        except Exception:  # noqa: BLE001 - best effort: the journal shows what is left
            return
