"""The tree's change lock: ``<root>/.ckptview/lock``.

Created with exclusive create (``open(..., "xb")``) holding pid, host, time and a token. A
lock is *stale* when its host is this host and its pid is gone; a stale lock is broken (and
journaled). A lock from another host or a live pid refuses the change with
:class:`TreeLockedError`; :func:`break_lock` (CLI ``--break-lock``) removes it by hand.

On object stores: s3fs (>= 2024.12, botocore > 1.35.20) implements ``"xb"`` as a conditional
PUT (``If-None-Match: *``), which AWS S3 (and moto) honor: taking the lock is then atomic; a
lost race comes back as HTTP 412 (an ``OSError``) which we report as the lock being held.
Stores or versions without exclusive create raise ``NotImplementedError``/``ValueError`` for
``"xb"``: we fall back to check-then-write, which is *not* atomic (two processes starting
within the same round trip may both believe they hold the lock; the token in the lock file
lets each detect the loss only at release). Run one writer per tree there. Staleness uses
pid + host; on an object store a lock from another host is never judged stale: remove it
with ``--break-lock`` once you know its process is gone.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import uuid
from typing import Any

from ..model import META_DIR
from .journal import Journal, join_path, now


class TreeLockedError(RuntimeError):
    """Another ckptview process holds the tree's lock."""


class TreeLock:
    """The tree's change lock (see the module docstring); a context manager."""

    def __init__(self, fs: Any, root: str, what: str = "change"):
        self.fs = fs
        self.path = join_path(root, f"{META_DIR}/lock")
        self.what = what
        self.token = uuid.uuid4().hex
        self.broken: dict | None = None  # the stale lock this one replaced

    def _payload(self) -> bytes:
        info = {"pid": os.getpid(), "host": socket.gethostname(), "time": now(),
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

    def __exit__(self, *exc: object) -> None:
        self.release()


def is_stale(held: dict) -> bool:
    """A lock whose process is gone: same host and the pid no longer runs."""
    if held.get("host") != socket.gethostname() or not held.get("pid"):
        return held.get("pid") is None and held.get("host") is None  # unreadable lock
    try:
        import psutil  # an optional dependency (the tests'): os.kill below otherwise

        return not psutil.pid_exists(int(held["pid"]))
    except ImportError:  # pragma: no cover - psutil is a test dependency
        try:
            os.kill(int(held["pid"]), 0)
            return False
        except OSError:
            return True


def break_lock(fs: Any, root: str) -> dict | None:
    """Remove a tree's lock whoever holds it; returns what it said."""
    lock = TreeLock(fs, root)
    held = lock.holder()
    if held is not None:
        fs.rm_file(lock.path)
        Journal(fs, root).write("lock_broken", holder=held)
    return held
