"""The four atomic steps the tree lock (:mod:`.lock`) needs from a store, per kind of store.

* ``create(path, data)``: make ``path`` holding ``data`` in one step that fails when it
  exists (False then); nobody ever sees it empty or half-written.
* ``read(path)``: its bytes with a version tag and age (a :class:`Seen`), or None.
* ``swap(path, seen, data)``: replace it with ``data`` only if it is still what was ``seen``
  (compare-and-swap; False when it changed or is gone). The path never goes missing.
* ``remove(path, seen)``: delete it only if it is still what was ``seen``.

:class:`LocalStore` (local disks): a temp file with the payload hard-linked into place
(``link`` refuses an existing target); swap and remove re-read and act under an ``flock`` on
the lock's directory, which every swapper and remover takes (the swap is a rename over the
lock). :class:`S3Store` (s3fs): conditional requests - ``PutObject`` with ``If-None-Match: *``
to create, with ``If-Match: <ETag>`` to swap, ``DeleteObject`` with ``If-Match`` to remove.
:class:`FsspecStore` (any other store): ``"xb"`` where the store has it, else check-then-write;
swap and remove are check-then-act there - *not* atomic (run one writer per tree).
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from fsspec.asyn import sync

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no flock, swaps are check-then-act
    fcntl = None  # type: ignore[assignment]

#: the suffix of a local lock's temp file (``lock.<random>.new``) before it is linked
TEMP_SUFFIX = ".new"


@dataclass(frozen=True)
class Seen:
    """A lock file as read: its bytes, the store's version tag (S3 ETag), its age (s)."""

    raw: bytes
    tag: str | None = None
    age: float | None = None


class FsspecStore:
    """Any fsspec store: exclusive create where it has ``"xb"``; check-then-act otherwise."""

    #: whether the lock's directory must be made before the lock is created in it
    needs_dirs = True

    def __init__(self, fs: Any):
        self.fs = fs

    def create(self, path: str, data: bytes) -> bool:
        try:
            with self.fs.open(path, "xb") as f:
                f.write(data)
            return True
        except FileExistsError:
            return False
        except (NotImplementedError, ValueError):  # no exclusive create: check, then write
            if self._exists(path):
                return False
            with self.fs.open(path, "wb") as f:
                f.write(data)
            return True
        except OSError:  # a store refusing the exclusive create by an HTTP error
            if self._exists(path):
                return False
            raise

    def _exists(self, path: str) -> bool:
        self.fs.invalidate_cache(path)
        return bool(self.fs.exists(path))

    def read(self, path: str) -> Seen | None:
        try:
            raw = self.fs.cat_file(path)
        except FileNotFoundError:
            return None
        return Seen(raw, None, self._age(path))

    def _age(self, path: str) -> float | None:
        try:
            info = self.fs.info(path)
        except (FileNotFoundError, OSError):
            return None
        stamp = info.get("mtime") or info.get("LastModified") or info.get("created")
        if isinstance(stamp, datetime):
            stamp = stamp.replace(tzinfo=stamp.tzinfo or timezone.utc).timestamp()
        return time.time() - float(stamp) if isinstance(stamp, (int, float)) else None

    def swap(self, path: str, seen: Seen, data: bytes) -> bool:
        if not self._same(path, seen):
            return False
        try:
            self.fs.rm_file(path)
        except FileNotFoundError:
            return False
        return self.create(path, data)

    def remove(self, path: str, seen: Seen) -> bool:
        if not self._same(path, seen):
            return False
        try:
            self.fs.rm_file(path)
        except FileNotFoundError:
            return False
        return True

    def _same(self, path: str, seen: Seen) -> bool:
        now = self.read(path)
        return now is not None and now.raw == seen.raw


class LocalStore(FsspecStore):
    """A local disk: create by hard link, swap and remove under an flock (module docstring)."""

    def create(self, path: str, data: bytes) -> bool:
        temp = f"{path}.{uuid.uuid4().hex[:12]}{TEMP_SUFFIX}"
        with self.fs.open(temp, "wb") as f:
            f.write(data)
        try:
            self.fs.link(temp, path)
            return True
        except FileExistsError:
            return False
        except FileNotFoundError:  # the temp file was cleaned away (a recovery): look again
            return False
        finally:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(temp)

    def swap(self, path: str, seen: Seen, data: bytes) -> bool:
        with self._guard(path):
            if not self._same(path, seen):
                return False
            temp = f"{path}.{uuid.uuid4().hex[:12]}{TEMP_SUFFIX}"
            with self.fs.open(temp, "wb") as f:
                f.write(data)
            self.fs.mv(temp, path)  # a rename over the lock: atomic, never missing
            return True

    def remove(self, path: str, seen: Seen) -> bool:
        with self._guard(path):
            return super().remove(path, seen)

    @contextlib.contextmanager
    def _guard(self, path: str) -> Iterator[None]:
        """An exclusive flock on the lock's directory (released by the kernel if we die)."""
        if fcntl is None:  # pragma: no cover
            yield
            return
        fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the last descriptor drops the flock


class S3Store(FsspecStore):
    """S3 through s3fs: conditional PutObject / DeleteObject (module docstring)."""

    needs_dirs = False  # keys need no directories (s3fs's makedirs costs a request)

    def create(self, path: str, data: bytes) -> bool:
        try:
            self.fs.pipe_file(path, data, mode="create")  # If-None-Match: *
            return True
        except FileExistsError:
            return False
        except OSError:  # 412 or 409 (a concurrent conditional write): look again
            if self._exists(path):
                return False
            raise

    def read(self, path: str) -> Seen | None:
        """One GET: the bytes and the ETag of the same version."""
        bucket, key, _ = self.fs.split_path(path)
        try:
            resp = self.fs.call_s3("get_object", Bucket=bucket, Key=key)
        except FileNotFoundError:
            return None
        try:
            raw = sync(self.fs.loop, resp["Body"].read)
        finally:
            resp["Body"].close()
        stamp = resp.get("LastModified")
        age = (datetime.now(timezone.utc) - stamp).total_seconds() if stamp else None
        return Seen(raw, resp.get("ETag"), age)

    def swap(self, path: str, seen: Seen, data: bytes) -> bool:
        if seen.tag is None:
            return False
        try:
            self.fs.pipe_file(path, data, IfMatch=seen.tag)
            return True
        except OSError:  # 412 (changed), 404 (gone), 409 (a concurrent conditional write)
            return False
        finally:
            self.fs.invalidate_cache(path)

    def remove(self, path: str, seen: Seen) -> bool:
        if seen.tag is None:
            return False
        bucket, key, _ = self.fs.split_path(path)
        try:
            self.fs.call_s3("delete_object", Bucket=bucket, Key=key, IfMatch=seen.tag)
            return True
        except OSError:
            return False
        finally:
            self.fs.invalidate_cache(path)


def store_for(fs: Any) -> FsspecStore:
    """The store class for ``fs`` (local, S3 through s3fs, or any other fsspec store)."""
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    if {"file", "local"} & set(protocols) and callable(getattr(fs, "link", None)):
        return LocalStore(fs)
    if "s3" in protocols and callable(getattr(fs, "call_s3", None)):
        return S3Store(fs)
    return FsspecStore(fs)
