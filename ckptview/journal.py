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

import errno
import hashlib
import json
import os
import socket
import uuid
from collections.abc import Callable, Iterable
from datetime import datetime, timezone

from .model import META_DIR, Op

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
        except OSError as e:  # s3fs: a conditional PUT that lost the race: HTTP 412, EINVAL
            if e.errno != errno.EINVAL:
                raise
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


# -- reading the journal back: status and recovery ------------------------------------------
STATUS_COLUMNS = ["op_id", "action", "serial", "started", "ended", "status", "steps", "detail"]
RECOVERABLE = ("restore", "retention", "recover")


def journal_path(root: str) -> str:
    return _join(root, f"{META_DIR}/journal.jsonl")


def operations(records: list[dict]) -> list[dict]:
    """Journal records grouped per operation (``op_id``), oldest first; each has ``records``,
    ``begin`` (its begin record or None) and ``recovered`` (the recovery's outcome or None)."""
    ops: dict[str, dict] = {}
    recovered: dict[str, str] = {}
    for r in records:
        op = ops.setdefault(r.get("op_id"), {"op_id": r.get("op_id"), "records": []})
        op["records"].append(r)
        if r.get("event") == "recovered":
            recovered[r.get("of")] = r.get("outcome")
    for op in ops.values():
        op["begin"] = next((r for r in op["records"] if r.get("event") == "begin"), None)
        op["recovered"] = recovered.get(op["op_id"])
    return list(ops.values())


def needs_recovery(op: dict) -> bool:
    """An operation that began and neither ended nor was recovered."""
    begin = op["begin"]
    if begin is None or begin.get("action") not in RECOVERABLE or op["recovered"]:
        return False
    return not any(r.get("event") == "end" for r in op["records"])


def _summary(op: dict) -> tuple:
    recs, begin = op["records"], op["begin"]
    events = [r.get("event") for r in recs]
    action = begin.get("action") if begin else ("write" if "intent" in events else events[0])
    serial = begin.get("serial") if begin else None
    if action == "retention" and begin:
        serial = ",".join(map(str, begin.get("delete") or [])) or None
    done = events.count("done")
    total = (begin or {}).get("steps")
    if action == "retention":
        total = sum(r.get("steps", 0) for r in recs if r.get("event") == "serial") or None
    end = next((r for r in recs if r.get("event") == "end"), None)
    failed = next((r for r in recs if r.get("event") == "failed"), None)
    detail = ""
    if end is not None:
        status = "finished"
    elif op["recovered"]:
        status, detail = "recovered", op["recovered"]
    elif begin is None:
        status = "failed" if failed else "done"
    else:
        status = "failed" if failed else "interrupted"
    if failed and not detail:
        detail = f"step {failed.get('step')}: {failed.get('error', '')}"[:200]
    if action == "recover" and end is not None:
        detail = "; ".join(f"{r.get('of')}: {r.get('outcome')}" for r in recs
                           if r.get("event") == "recovered")  # fmt: skip
    if action == "lock_broken":
        detail = f"holder {recs[0].get('holder')}"
    steps = f"{done}/{total}" if total is not None else str(done)
    return (op["op_id"], action, None if serial is None else str(serial), recs[0].get("time"),
            end.get("time") if end else None, status, steps, detail)  # fmt: skip


def status(url, storage_options: dict | None = None, last: int | None = None):
    """The journal of the tree at ``url``, one row per operation (newest last): ``status`` is
    finished, interrupted (cut short: run :func:`recover`), failed (its own clean-up ran but
    may be partial: :func:`recover`), recovered, or running (the lock is held by a live
    process); ``steps`` counts done steps of the planned ones."""
    import pandas as pd

    fs, root = _open_root(url, storage_options)
    ops = operations(read_journal(fs, journal_path(root)))
    rows = [_summary(op) for op in ops]
    held = TreeLock(fs, root).holder()
    if held and not is_stale(held):
        for i in range(len(rows) - 1, -1, -1):
            if needs_recovery(ops[i]):
                rows[i] = (*rows[i][:5], "running", rows[i][6],
                           f"lock held by pid {held.get('pid')} on {held.get('host')}")  # fmt: skip
                break
    df = pd.DataFrame(rows, columns=STATUS_COLUMNS)
    if last is not None:
        df = df.tail(last)
    df.attrs["lock"] = held
    df.attrs["pending"] = [op["op_id"] for op in ops if needs_recovery(op)]
    return df


def _open_root(url, storage_options):
    from .io import Storage

    storage, path = Storage.from_url(os.fspath(url), storage_options)
    if not storage.fs.exists(path):
        raise FileNotFoundError(f"no such checkpoint tree: {url}")
    try:
        if storage.fs.isfile(path):
            path = path.rstrip("/").rsplit("/", 1)[0] or "/"
    except OSError:
        pass
    return storage.fs, path.rstrip("/") or "/"


class _Fixer:
    """Works out the Ops that undo or finish the interrupted operations of one tree."""

    def __init__(self, fs, root: str, url: str):
        self.fs, self.root, self.url = fs, root, url
        self.doomed: dict[str, None] = {}  # absolute file paths to delete, in order
        self.dirs: set[str] = set()  # absolute dirs to remove once emptied
        self.replay: list[Op] = []  # retention ops to finish
        self.outcomes: list[tuple[str, str]] = []  # (op_id, outcome)
        self._cat = None
        self._cat_done = False

    def abs(self, rel: str) -> str:
        return _join(self.root, rel)

    def rel(self, path: str) -> str:
        return path[len(self.root.rstrip("/")) + 1 :]

    def exists(self, rel: str) -> bool:
        return self.fs.exists(self.abs(rel))

    def catalog(self):
        """The tree as it is now, or None when no layout recognizes it (an emptied target)."""
        if not self._cat_done:
            self._cat_done = True
            try:
                from .api import open as cv_open

                self._cat = cv_open(self.url, cache=False)
                self._cat.serials  # noqa: B018 - scan now: unreadable trees count as None
            except Exception:  # noqa: BLE001 - recovery works on the files alone then
                self._cat = None
        return self._cat

    def complete_serials(self, exclude: int | None) -> list[tuple[int, str, set[str]]]:
        """(serial, dir or main path, absolute file paths) of every complete serial."""
        cat = self.catalog()
        if cat is None:
            return []
        out = []
        for info in cat.scan.serials:
            if info.serial == exclude or not bool(cat.serials.loc[info.serial, "complete"]):
                continue
            files = {cat.tree.abs(f) for f in cat._layout.serial_files(cat.tree, info)}
            out.append((info.serial, cat.tree.abs(cat.tree.rel(info.path)), files))
        return out

    def doom(self, path: str) -> None:
        """A file or a whole directory (absolute) to delete; its parent dirs too once empty
        (a step may have made them before it failed)."""
        parent = path.rstrip("/").rsplit("/", 1)[0]
        while len(parent) > len(self.root.rstrip("/")) and parent.startswith(self.root):
            self.dirs.add(parent)
            parent = parent.rsplit("/", 1)[0]
        if not self.fs.exists(path):
            return
        if self.fs.isdir(path):
            for f, inf in sorted(self.fs.find(path, withdirs=True, detail=True).items()):
                if inf["type"] == "directory":
                    self.dirs.add(f.rstrip("/"))
                else:
                    self.doomed[f] = None
            self.dirs.add(path.rstrip("/"))
        else:
            self.doomed[path] = None

    # -- restore
    def restore(self, op: dict) -> None:
        begin, recs = op["begin"], op["records"]
        plan = begin.get("plan")
        if plan is None:
            self.outcomes.append((op["op_id"], "no plan journaled: only leftovers removed"))
            return
        reached = sorted({r["step"] for r in recs if r.get("event") == "intent"})
        refused = {r["step"] for r in recs if r.get("event") == "failed"
                   and "FileExistsError" in str(r.get("error"))}  # fmt: skip
        if plan and reached and reached[-1] == len(plan) - 1 and self._took_effect(plan[-1]):
            self.outcomes.append((op["op_id"], f"finished (its last step, {plan[-1]['kind']} "
                                  f"{plan[-1]['path']}, had taken effect)"))  # fmt: skip
            return
        kept = []
        for i in reversed(reached):  # newest first: commit markers go before the data
            step = plan[i]
            if i in refused or step.get("replace"):
                if step.get("replace") and i != len(plan) - 1:
                    kept.append(step["path"])
                continue
            if step["kind"] in ("copy", "write", "rename"):
                self.doom(self.abs(step["path"]))
            if step["kind"] == "rename" and step.get("src"):
                self.doom(self.abs(step["src"]))
        for i, step in enumerate(plan):  # a staging dir made by a step never reached
            src = step.get("src") or ""
            if i not in reached and step["kind"] == "rename" and src:  # noqa: SIM102
                if not src.startswith(META_DIR + "/") and self.exists(src):
                    self.doom(self.abs(src))
        spared = self._spare(begin.get("new_serial"))
        what = f"rolled back ({len(reached)} of {len(plan)} steps had started)"
        if spared:
            what += f"; left {len(spared)} file(s) of complete serials"
        if kept:
            what += f"; state files left as written: {', '.join(kept)}"
        self.outcomes.append((op["op_id"], what))

    def _took_effect(self, step: dict) -> bool:
        path = self.abs(step["path"])
        if step["kind"] == "rename":
            return self.fs.exists(path) and not (step.get("src") and self.exists(step["src"]))
        if step["kind"] == "copy":
            return self.fs.exists(path) and self.fs.size(path) == step.get("nbytes", 0)
        if step["kind"] == "write":
            if not self.fs.exists(path):
                return False
            digest = hashlib.sha256(self.fs.cat_file(path)).hexdigest()
            return step.get("sha256") in (None, digest)
        return True

    def _spare(self, own: int | None) -> list[str]:
        """Never touch a complete serial (other than the one the restore was creating)."""
        if not self.doomed and not self.dirs:
            return []
        spared = []
        for _serial, base, files in self.complete_serials(own):
            for f in list(self.doomed):
                if f in files or f.startswith(base.rstrip("/") + "/"):
                    del self.doomed[f]
                    spared.append(f)
            self.dirs -= {d for d in self.dirs if d == base or d.startswith(base + "/")
                          or any(f.startswith(d + "/") for f in files)}  # fmt: skip
        return spared

    # -- retention
    def retention(self, op: dict) -> None:
        begin, recs = op["begin"], op["records"]
        started = [r for r in recs if r.get("event") == "serial"]
        todo = [int(s) for s in begin.get("delete") or []]
        if not started:
            self.outcomes.append((op["op_id"], "nothing deleted yet; plan again"))
            return
        cur = started[-1]
        serial, plan = int(cur["serial"]), cur.get("plan")
        rest = todo[todo.index(serial) + 1 :] if serial in todo else []
        note = f"; not started: {rest} (plan again)" if rest else ""
        if any(s == serial for s, _, _ in self.complete_serials(None)):
            self.outcomes.append((op["op_id"], f"serial {serial} untouched (still complete)"
                                  + note))  # fmt: skip
            return
        if plan is None:
            self.outcomes.append((op["op_id"], "no plan journaled: only leftovers removed"))
            return
        for step in plan:
            if step["kind"] == "rename":
                if self.exists(step["src"]) and not self.exists(step["path"]):
                    self.replay.append(Op("rename", step["path"], src=step["src"],
                                          note=step.get("note", "")))  # fmt: skip
            elif step["kind"] in ("delete", "rmdir"):
                self.replay.append(Op(step["kind"], step["path"], note=step.get("note", "")))
        self.outcomes.append((op["op_id"], f"finished deleting serial {serial}" + note))

    # -- leftovers
    def tmp(self) -> None:
        tmp = self.abs(f"{META_DIR}/tmp")
        if self.fs.exists(tmp) and self.fs.ls(tmp):  # an empty tmp dir is no leftover
            self.doom(tmp)
            self.dirs.discard(self.abs(META_DIR))

    def ops(self) -> list[Op]:
        out = [Op("delete", self.rel(f), nbytes=self._size(f), note="recover")
               for f in self.doomed]  # fmt: skip
        emptied = self._emptied()
        out += [Op("rmdir", self.rel(d), note="recover")
                for d in sorted(emptied, key=lambda d: (-d.count("/"), d))]  # fmt: skip
        replay = [o for o in self.replay if self.abs(o.path) not in self.doomed]
        return replay + out

    def _size(self, path: str) -> int:
        try:
            return int(self.fs.size(path) or 0)
        except (FileNotFoundError, OSError):
            return 0

    def _emptied(self) -> set[str]:
        """The dirs in ``self.dirs`` left empty once the doomed files are gone."""
        out: set[str] = set()
        for d in sorted(self.dirs, key=lambda d: -d.count("/")):
            if not self.fs.exists(d) or d.rstrip("/") == self.root.rstrip("/"):
                continue
            if d == self.abs(META_DIR):
                continue
            entries = self.fs.find(d, withdirs=True, detail=True)
            if all(p.rstrip("/") in out or p in self.doomed or p.rstrip("/") == d.rstrip("/")
                   for p in entries):  # fmt: skip
                out.add(d.rstrip("/"))
        return out


def recover(url, dry_run: bool = False, storage_options: dict | None = None):
    """Roll back or finish the interrupted operations of the tree at ``url`` and remove the
    leftovers in ``.ckptview/tmp/`` (see the module docstring). Takes the tree's lock (a stale
    one, left by a dead process, is broken and journaled; a live one refuses). Returns a
    ``RecoverResult``; with ``dry_run`` nothing is changed."""
    from .io import Storage
    from .restore import ops_frame

    fs, root = _open_root(url, storage_options)
    url = Storage(fs).url(root)

    def work() -> tuple[_Fixer, list[dict]]:
        pending = [op for op in operations(read_journal(fs, journal_path(root)))
                   if needs_recovery(op)]  # fmt: skip
        fixer = _Fixer(fs, root, url)
        for op in pending:
            action = op["begin"].get("action")
            if action == "restore":
                fixer.restore(op)
            elif action == "retention":
                fixer.retention(op)
            else:
                fixer.outcomes.append((op["op_id"], "superseded by this recovery"))
        fixer.tmp()
        return fixer, pending

    if dry_run:
        fixer, _ = work()
        return RecoverResult(url, ops_frame(fixer.ops()), fixer.outcomes, True, False,
                             TreeLock(fs, root).holder())  # fmt: skip
    with TreeLock(fs, root, "recover") as lock:
        journal = Journal(fs, root)
        if lock.broken:
            journal.write("lock_broken", holder=lock.broken)
        fixer, _ = work()
        ops = fixer.ops()
        if not ops and not fixer.outcomes and not lock.broken:
            return RecoverResult(url, ops_frame([]), [], False, True, None)
        journal.write("begin", action="recover", recovers=[o for o, _ in fixer.outcomes],
                      steps=len(ops), plan=[describe(o) for o in ops])  # fmt: skip
        OpRunner(fs, root, journal=journal).run(ops)
        for op_id, outcome in fixer.outcomes:
            journal.write("recovered", of=op_id, outcome=outcome)
        journal.write("end", action="recover")
    return RecoverResult(url, ops_frame(ops), fixer.outcomes, False, True, lock.broken)


class RecoverResult:
    """What :func:`recover` did (or, with ``dry_run``, would do)."""

    def __init__(self, target: str, ops, outcomes: list[tuple[str, str]], dry_run: bool,
                 done: bool, lock: dict | None):  # fmt: skip
        self.target, self.ops, self.outcomes = target, ops, outcomes
        self.dry_run, self.done, self.lock = dry_run, done, lock

    def __str__(self) -> str:
        verb = "would run" if self.dry_run else "ran"
        lines = [f"recover {self.target}: {verb} {len(self.ops)} steps"]
        if self.lock:
            held = f"pid {self.lock.get('pid')} on {self.lock.get('host')}"
            if not self.dry_run:
                lines.append(f"broke a stale lock of {held}")
            else:
                stale = is_stale(self.lock)
                lines.append(("stale lock of " if stale else "lock held by ") + held
                             + (" (will be broken)" if stale else ""))  # fmt: skip
        lines += [f"  {op_id}: {outcome}" for op_id, outcome in self.outcomes]
        if not self.outcomes and not len(self.ops):
            lines.append("  nothing to recover")
        return "\n".join(lines)
