"""The change journal of a tree, and where it lives.

Every change ckptview makes to a tree lives under ``<root>/.ckptview/`` (invisible to
layouts): ``journal.jsonl`` (one JSON record per line: an ``intent`` before each step, its
``done`` or ``failed`` after), ``lock`` while a change runs (:mod:`.lock`), and ``tmp/`` for
files being written (renamed into place when complete, so no file is ever seen half-written:
:mod:`.ops`). :mod:`.recover` rolls back or finishes what a crash cut short; :mod:`.status`
summarizes the journal per operation.

Object stores (S3, GCS, Azure, memory://) - what is and is not atomic there:

* A single object PUT is atomic: an object is never seen half-written, so files written
  whole (journal rewrites, markers, pointer/state files, ``.ckptview/tmp`` copies) are safe.
* Rename is *not* atomic: fsspec's ``mv`` is copy-then-delete per object, so a directory
  "rename into place" can be seen half-done. Layouts whose frameworks rely on rename (Orbax
  on GCS) switch staging off there (``Layout.staging_for``) and write commit markers last
  instead; a crash mid-``mv`` leaves objects in both places, which recovery cleans up.
* Append is not supported: each journal record rewrites the journal object (read, then
  write). Two writers could lose a record - the lock keeps writers apart.
* The lock: see :mod:`.lock` (atomic on local disks and S3: exclusive create with the
  payload in one step, compare-and-swap to break a stale lock).
"""

from __future__ import annotations

import json
import os
import uuid
from datetime import datetime, timezone
from typing import Any

from ..io import Storage
from ..model import META_DIR


def join_path(root: str, rel: str) -> str:
    """``root/rel`` ('/'-separated; ``root`` itself for an empty ``rel``)."""
    if not rel:
        return root
    return root.rstrip("/") + "/" + rel if root not in ("", "/") else "/" + rel


def now() -> str:
    return datetime.now(timezone.utc).isoformat()


def journal_path(root: str) -> str:
    return join_path(root, f"{META_DIR}/journal.jsonl")


class Journal:
    """Append-only JSON lines at ``<root>/.ckptview/journal.jsonl``."""

    def __init__(self, fs: Any, root: str):
        self.fs = fs
        self.path = journal_path(root)
        self.op_id = uuid.uuid4().hex[:12]
        self._dir_made = False
        self._check_tail = True  # a torn last line (a crash mid-append) gets a newline first

    def write(self, event: str, **fields: Any) -> None:
        record = {"time": now(), "op_id": self.op_id, "event": event, **fields}
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


def read_journal(fs: Any, path: str) -> list[dict]:
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


def open_root(url: str | os.PathLike, storage_options: dict | None) -> tuple[Any, str]:
    """The filesystem and root path of the tree at ``url`` (a file's directory for a file)."""
    storage, path = Storage.from_url(os.fspath(url), storage_options)
    if not storage.fs.exists(path):
        raise FileNotFoundError(f"no such checkpoint tree: {url}")
    try:
        if storage.fs.isfile(path):
            path = path.rstrip("/").rsplit("/", 1)[0] or "/"
    except OSError:
        pass
    return storage.fs, path.rstrip("/") or "/"
