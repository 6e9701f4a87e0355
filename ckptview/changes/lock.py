"""The tree's change lock: ``<root>/.ckptview/lock``, a small JSON file (pid, host, time,
what, a random token) that exists exactly while a change runs.

The protocol (each step atomic on local disks and S3; :mod:`.lockstore` says how):

1. **Take**: create the lock *with its payload* in one step that fails if it exists
   (locally: a temp file hard-linked into place; S3: ``PutObject`` with
   ``If-None-Match: *``). Nobody ever reads an empty or half-written lock of ours.
2. **Look**: it exists - read it. Gone meanwhile: back to 1. A live holder (another host,
   or a pid that still runs here) refuses with :class:`TreeLockedError`. An unreadable lock
   (written by something else, or torn) counts as held while younger than :data:`GRACE`
   seconds, stale after.
3. **Break** a stale lock (its host is this one and its pid is gone): replace it with ours
   *only if it is still byte for byte the lock judged stale* (compare-and-swap: locally a
   rename over it under an ``flock`` that every breaker and releaser takes; S3: ``PutObject``
   with ``If-Match: <ETag read>``). Another breaker got there first: back to 1. The break is
   journaled (``lock_broken``). At most :data:`ATTEMPTS` rounds, then refuse.
4. **Release**: delete the lock only if it still holds our token (compare-and-delete).

So two processes never both hold a tree's lock: creation is exclusive, and a lock is only
ever replaced by one breaker, after its holder is gone. A lock from another host is never
judged stale: remove it with :func:`break_lock` (CLI ``--break-lock``) once you know its
process is gone. Stores other than local disks and S3 (GCS, Azure, memory://): creation is
exclusive where fsspec offers ``"xb"`` (check-then-write otherwise), breaking and releasing
are check-then-act - run one writer per tree there.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from typing import Any

from ..model import META_DIR
from .journal import Journal, join_path, now
from .lockstore import Seen, store_for

#: seconds an unreadable lock counts as held (someone may be writing it non-atomically)
GRACE = 30.0
#: rounds of take / look / break before giving up (each lost round means the lock changed)
ATTEMPTS = 6


class TreeLockedError(RuntimeError):
    """Another ckptview process holds the tree's lock."""


class TreeLock:
    """The tree's change lock (see the module docstring); a context manager."""

    def __init__(self, fs: Any, root: str, what: str = "change", journal: Journal | None = None):
        self.fs = fs
        self.journal = journal  # where a broken stale lock is journaled (default: its own op)
        self.root = root
        self.path = join_path(root, f"{META_DIR}/lock")
        self.what = what
        self.token = uuid.uuid4().hex
        self.broken: dict | None = None  # the stale lock this one replaced
        self.store = store_for(fs)

    def _payload(self) -> bytes:
        info = {"pid": os.getpid(), "host": socket.gethostname(), "time": now(),
                "what": self.what, "token": self.token}  # fmt: skip
        return json.dumps(info).encode()

    def holder(self) -> dict | None:
        """What the lock says (``unreadable``/``age`` when it cannot be parsed), or None."""
        seen = self.store.read(self.path)
        return None if seen is None else parse(seen)

    def acquire(self) -> TreeLock:
        if self.store.needs_dirs:
            self.fs.makedirs(self.path.rsplit("/", 1)[0], exist_ok=True)
        payload = self._payload()
        for _ in range(ATTEMPTS):
            if self.store.create(self.path, payload):
                return self
            seen = self.store.read(self.path)
            if seen is None:
                continue  # released meanwhile
            held = parse(seen)
            if not is_stale(held):
                raise TreeLockedError(_refusal(held, self.path))
            if self.store.swap(self.path, seen, payload):
                self.broken = held
                (self.journal or Journal(self.fs, self.root)).write("lock_broken", holder=held)
                return self
        raise TreeLockedError(f"could not take the lock {self.path}: it kept changing hands")

    def release(self) -> None:
        seen = self.store.read(self.path)
        if seen is not None and parse(seen).get("token") == self.token:
            self.store.remove(self.path, seen)

    def __enter__(self) -> TreeLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def parse(seen: Seen) -> dict:
    """A lock's payload; ``{"unreadable": True, "age": …}`` when it is not one."""
    try:
        held = json.loads(seen.raw)
        if isinstance(held, dict) and "token" in held:
            return held
    except ValueError:
        pass
    return {"pid": None, "host": None, "time": None, "unreadable": True, "age": seen.age}


def _refusal(held: dict, path: str) -> str:
    if held.get("unreadable"):
        age = held.get("age")
        since = f"{age:.0f} s ago" if age is not None else "at an unknown time"
        return (f"tree locked: {path} was written {since} and cannot be read yet (held for "
                f"{GRACE:.0f} s); if no change runs, remove it (ckptview ... --break-lock)")  # fmt: skip
    return (f"tree locked by pid {held.get('pid')} on {held.get('host')} since "
            f"{held.get('time')} ({held.get('what')}); if that process is gone, "
            f"remove {path} (ckptview ... --break-lock)")  # fmt: skip


def is_stale(held: dict) -> bool:
    """A lock whose process is gone (same host, the pid no longer runs), or one that has
    been unreadable for longer than :data:`GRACE` seconds."""
    if held.get("unreadable"):
        age = held.get("age")
        return age is not None and age > GRACE
    if held.get("host") != socket.gethostname() or not held.get("pid"):
        return False
    try:
        import psutil  # an optional dependency (the tests'): os.kill below otherwise

        return not psutil.pid_exists(int(held["pid"]))
    except ImportError:  # pragma: no cover - psutil is a test dependency
        try:
            os.kill(int(held["pid"]), 0)
        except ProcessLookupError:
            return True
        except OSError:  # EPERM: it runs, as another user
            return False
        return False


def break_lock(fs: Any, root: str) -> dict | None:
    """Remove a tree's lock whoever holds it; returns what it said."""
    lock = TreeLock(fs, root)
    held = lock.holder()
    if held is not None:
        fs.rm_file(lock.path)
        Journal(fs, root).write("lock_broken", holder=held)
    return held
