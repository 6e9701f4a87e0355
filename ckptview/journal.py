"""Changing a tree safely: the journal, the tree lock, and the journaled runner of Ops.

Every change ckptview makes to a tree lives under ``<root>/.ckptview/`` (invisible to
layouts): ``journal.jsonl`` (one JSON record per line: an ``intent`` before each step, its
``done`` or ``failed`` after), ``lock`` while a change runs, and ``tmp/`` for files being
written (renamed into place when complete, so no file is ever seen half-written).

Lock: created with exclusive create (``open(..., "xb")``) holding pid, host, time and a
token. A lock is *stale* when its host is this host and its pid is gone; a stale lock is
broken (and journaled). A lock from another host or a live pid refuses the change with
:class:`TreeLockedError`; ``break_lock`` (CLI ``--break-lock``) removes it by hand.

Recovery (:func:`recover`, CLI ``ckptview journal URL --recover --yes``): an operation with a
``begin`` and no ``end`` was cut short (a crash, a kill, a failure whose own clean-up did
not finish). Each ``begin`` carries the whole plan, so recovery knows every path the
operation meant to touch: an interrupted restore is rolled back (the files it created are
removed; restore never overwrites, so nothing that existed before is touched, and never a
file of a complete serial other than the one being restored) unless its last step (the
commit: final marker, rename into place, pointer) took effect, in which case it is finished
and kept; an interrupted retention finishes deleting the serial it had started on (already
incomplete, its markers went first) and leaves a serial it had not touched yet. Leftovers in
``.ckptview/tmp/`` are removed. What recovery does is journaled like any change.
:func:`status` summarizes the journal per operation.

Object stores (S3, GCS, Azure, memory://) - what is and is not atomic there:

* A single object PUT is atomic: an object is never seen half-written, so files written
  whole (journal rewrites, markers, pointer/state files, ``.ckptview/tmp`` copies) are safe.
* Rename is *not* atomic: fsspec's ``mv`` is copy-then-delete per object, so a directory
  "rename into place" can be seen half-done. Layouts whose frameworks rely on rename (Orbax
  on GCS) switch staging off there (``Layout.staging_for``) and write commit markers last
  instead; a crash mid-``mv`` leaves objects in both places, which :func:`recover` cleans up.
* Append is not supported: each journal record rewrites the journal object (read, then
  write). Two writers could lose a record - the lock keeps writers apart.
* The lock: s3fs (>= 2024.12, botocore > 1.35.20) implements ``"xb"`` as a conditional PUT
  (``If-None-Match: *``), which AWS S3 (and moto) honor: taking the lock is then atomic; a
  lost race comes back as HTTP 412 (an ``OSError``) which we report as the lock being held.
  Stores or versions without exclusive create raise ``NotImplementedError``/``ValueError``
  for ``"xb"``: we fall back to check-then-write, which is *not* atomic (two processes
  starting within the same round trip may both believe they hold the lock; the token in the
  lock file lets each detect the loss only at release). Run one writer per tree there.
* Staleness uses pid + host; on an object store a lock from another host is never judged
  stale: remove it with ``--break-lock`` once you know its process is gone.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import uuid
from collections.abc import Callable, Iterable
from datetime import datetime, timezone

from .layouts.base import Op

META_DIR = ".ckptview"
COPY_BLOCK = 8 << 20


class TreeLockedError(RuntimeError):
    """Another ckptview process holds the tree's lock."""


def _join(root: str, rel: str) -> str:
    if not rel:
        return root
    return root.rstrip("/") + "/" + rel if root not in ("", "/") else "/" + rel


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


class Journal:
    """Append-only JSON lines at ``<root>/.ckptview/journal.jsonl``."""

    def __init__(self, fs, root: str):
        self.fs = fs
        self.path = _join(root, f"{META_DIR}/journal.jsonl")
        self.op_id = uuid.uuid4().hex[:12]
        self._dir_made = False
        self._check_tail = True  # a torn last line (a crash mid-append) gets a newline first

    def write(self, event: str, **fields) -> None:
        record = {"time": _now(), "op_id": self.op_id, "event": event, **fields}
        line = (json.dumps(record, default=str) + "\n").encode()
        if not self._dir_made:
            self.fs.makedirs(self.path.rsplit("/", 1)[0], exist_ok=True)
            self._dir_made = True
        if self._check_tail:
            line = self._after_torn_line() + line
        self._check_tail = True
        try:
            with self.fs.open(self.path, "ab") as f:
                f.write(line)
        except (NotImplementedError, ValueError):  # stores without append: rewrite
            old = self.fs.cat_file(self.path) if self.fs.exists(self.path) else b""
            with self.fs.open(self.path, "wb") as f:
                f.write(old + line)
        self._check_tail = False

    def _after_torn_line(self) -> bytes:
        try:
            size = self.fs.size(self.path)
            if not size:
                return b""
            last = self.fs.cat_file(self.path, start=size - 1, end=size)
        except (FileNotFoundError, OSError):
            return b""
        return b"" if last == b"\n" else b"\n"

    def records(self) -> list[dict]:
        return read_journal(self.fs, self.path)


def read_journal(fs, path: str) -> list[dict]:
    """The records of a journal file (a torn last line is skipped)."""
    if not fs.exists(path):
        return []
    out = []
    for line in fs.cat_file(path).decode("utf-8", "replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


class TreeLock:
    """The tree's change lock (see the module docstring); a context manager."""

    def __init__(self, fs, root: str, what: str = "change"):
        self.fs = fs
        self.path = _join(root, f"{META_DIR}/lock")
        self.what = what
        self.token = uuid.uuid4().hex
        self.broken: dict | None = None  # the stale lock this one replaced

    def _payload(self) -> bytes:
        info = {"pid": os.getpid(), "host": socket.gethostname(), "time": _now(),
                "what": self.what, "token": self.token}  # fmt: skip
        return json.dumps(info).encode()

    def holder(self) -> dict | None:
        try:
            return json.loads(self.fs.cat_file(self.path))
        except FileNotFoundError:
            return None
        except ValueError:
            return {"pid": None, "host": None, "time": None}

    def acquire(self) -> TreeLock:
        self.fs.makedirs(self.path.rsplit("/", 1)[0], exist_ok=True)
        for _ in range(2):
            try:
                self._create()
                return self
            except FileExistsError:
                held = self.holder()
                if held is None:
                    continue
                if not is_stale(held):
                    raise TreeLockedError(
                        f"tree locked by pid {held.get('pid')} on {held.get('host')} since "
                        f"{held.get('time')} ({held.get('what')}); if that process is gone, "
                        f"remove {self.path} (ckptview ... --break-lock)"
                    ) from None
                self.broken = held
                self.fs.rm_file(self.path)
        raise TreeLockedError(f"could not take the lock {self.path}")

    def _create(self) -> None:
        try:
            with self.fs.open(self.path, "xb") as f:
                f.write(self._payload())
        except FileExistsError:
            raise
        except OSError:  # s3fs: a conditional PUT that lost the race fails with HTTP 412
            self.fs.invalidate_cache(self.path)
            if self.fs.exists(self.path):
                raise FileExistsError(self.path) from None
            raise
        except (NotImplementedError, ValueError):  # no exclusive create: check, then write
            if self.fs.exists(self.path):
                raise FileExistsError(self.path) from None
            with self.fs.open(self.path, "wb") as f:
                f.write(self._payload())

    def release(self) -> None:
        held = self.holder()
        if held and held.get("token") == self.token:
            self.fs.rm_file(self.path)

    def __enter__(self) -> TreeLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def is_stale(held: dict) -> bool:
    """A lock whose process is gone: same host and the pid no longer runs."""
    if held.get("host") != socket.gethostname() or not held.get("pid"):
        return held.get("pid") is None and held.get("host") is None  # unreadable lock
    try:
        import psutil

        return not psutil.pid_exists(int(held["pid"]))
    except ImportError:  # pragma: no cover - psutil is a test dependency
        try:
            os.kill(int(held["pid"]), 0)
            return False
        except OSError:
            return True


def break_lock(fs, root: str) -> dict | None:
    """Remove a tree's lock whoever holds it; returns what it said."""
    lock = TreeLock(fs, root)
    held = lock.holder()
    if held is not None:
        fs.rm_file(lock.path)
        Journal(fs, root).write("lock_broken", holder=held)
    return held


def describe(op: Op) -> dict:
    out = {"kind": op.kind, "path": op.path}
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

    ``rollback=True`` (restore): after a failure the files and dirs it created are removed
    again, newest first (commit markers were written last, so they go first). Deletions are
    never rolled back.
    """

    def __init__(self, fs, root: str, src_fs=None, journal: Journal | None = None,
                 progress: Callable[[int], None] | None = None):  # fmt: skip
        self.fs = fs
        self.root = root
        self.src_fs = src_fs or fs
        self.journal = journal or Journal(fs, root)
        self.progress = progress
        self.created: list[tuple[str, str]] = []  # (kind, absolute path)
        self._tmp_made = False

    def abs(self, rel: str) -> str:
        return _join(self.root, rel)

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
            self.created += [("dir", p) for p in reversed(missing)]

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
            self._write(op, target)
            if atomic:
                self.fs.mv(target, dest)
            if not existed:
                self.created.append(("file", dest))
        elif op.kind == "rename":
            src = self.abs(op.src)
            replace = self.fs.exists(dest)
            if replace and self.fs.isdir(dest):
                raise FileExistsError(f"refusing to replace directory {dest}")
            self._parents(dest)
            self.fs.mv(src, dest, recursive=self.fs.isdir(src))
            if not replace:
                self.created.append(("dir" if self.fs.isdir(dest) else "file", dest))
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

    def _rollback(self) -> None:
        for kind, path in reversed(self.created):
            try:
                self.journal.write("rollback", path=path)
                if kind == "file":
                    self.fs.rm_file(path)
                elif not self.fs.ls(path):
                    self.fs.rmdir(path)
                else:
                    self.fs.rm(path, recursive=True)
            except Exception:  # noqa: BLE001 - best effort: the journal shows what is left
                continue
        self.created = []
