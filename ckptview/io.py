"""All storage access: an fsspec filesystem with byte/request counters, files as ranged blobs.

Every read of the library goes through :class:`Storage`, so tests (and the benchmarks) can
count the bytes and requests a catalog scan costs, on local disk and on S3 alike.
"""

from __future__ import annotations

import asyncio
import io
import os
import posixpath
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, TypeVar

import fsspec
import numpy as np
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

HEAD_BLOCK = 4096  # the first block of every file is cached: magic bytes and small headers
#: on network (async) filesystems, ranges of one file this close are fetched as one request
REMOTE_MERGE_GAP = 32 << 10
#: on async filesystems the first read of a file is this long (speculative): most headers,
#: and whole small files, come in one GET (docs/remote.md)
SPECULATIVE_BLOCK = 64 << 10
#: requests in flight at once on an async filesystem, unless ``storage_options`` caps it
DEFAULT_CONCURRENCY = 64
#: the ``storage_options`` entry (ckptview's own, not passed to fsspec) capping it
CONCURRENCY_OPTION = "ckptview_max_concurrency"
#: the most bytes of prefetched first blocks kept at once (per Storage)
PREFETCH_BUDGET = 256 << 20
#: bytes one Storage's concurrent reads hold at once (in flight, fetched and not yet used, and
#: the working memory callers declare): what bounds verify/stats/diff/reads on remote stores
READ_BUDGET = 256 << 20
#: read-ahead of one stream of ranges (one variable's chunks) at most, beyond the one in use
STREAM_AHEAD = 64 << 20
#: a file at most this large that an operation reads (mostly) whole comes in one GET
WHOLE_FILE = 16 << 20

T = TypeVar("T")
R = TypeVar("R")


class TruncatedError(ValueError):
    """A header points beyond the end of its file."""


@dataclass
class Counters:
    """Bytes and requests read through one Storage."""

    bytes_read: int = 0
    requests: int = 0
    #: of ``requests``, those made in other processes (an executor's workers)
    remote_requests: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, nbytes: int) -> None:
        with self.lock:
            self.bytes_read += nbytes
            self.requests += 1

    def reset(self) -> None:
        with self.lock:
            self.bytes_read = self.requests = self.remote_requests = 0

    def __getstate__(self) -> dict:  # picklable for process executors (Dask)
        return {"bytes_read": self.bytes_read, "requests": self.requests,
                "remote_requests": self.remote_requests}  # fmt: skip

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, lock=threading.Lock())


class MissingDependencyError(ImportError):
    """An optional dependency is missing; the message names what to install (one line)."""


#: protocols whose filesystem comes with an extra of ckptview (else: the fsspec package)
_FS_EXTRAS = {"s3": "s3", "s3a": "s3"}
_FS_PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs",
                "abfs": "adlfs", "hdfs": "pyarrow", "ssh": "paramiko", "sftp": "paramiko"}  # fmt: skip


def _missing_filesystem(url: str, error: ImportError) -> str:
    protocol = url.split("://", 1)[0] if "://" in url else "file"
    package = _FS_PACKAGES.get(protocol) or error.name or "its fsspec filesystem"
    extra = _FS_EXTRAS.get(protocol)
    install = f"pip install 'ckptview[{extra}]'" if extra else f"pip install {package}"
    return f"{protocol}:// URLs need {package}: {install}"


#: reads on local disk at least this large go straight into numpy memory (``arrays=True``)
ARRAY_READ = 1 << 20


def _read_local_arrays(requests: Iterable[tuple[str, int, int]],
                       counters: Counters) -> Iterator[Any]:  # fmt: skip
    """Local ranged reads, one open file per run of requests to it; a range of at least
    :data:`ARRAY_READ` bytes is read into a fresh ``uint8`` array (``readinto``), smaller
    ones as bytes."""
    fh: io.FileIO | None = None
    current = None
    try:
        for path, start, end in requests:
            if end <= start:
                yield b""
                continue
            if fh is None or path != current:
                if fh is not None:
                    fh.close()
                fh, current = open(path, "rb", buffering=0), path  # noqa: SIM115 - kept open across requests
            fh.seek(start)
            if end - start >= ARRAY_READ:
                buf = np.empty(end - start, np.uint8)
                view = memoryview(buf.data)
                got = fh.readinto(view) or 0
                while got < buf.size:
                    more = fh.readinto(view[got:])
                    if not more:
                        break
                    got += more
                data: Any = buf[:got]
            else:
                data = fh.read(end - start)
            counters.add(len(data))
            yield data
    finally:
        if fh is not None:
            fh.close()


class Storage:
    """An fsspec filesystem plus counters; paths are the filesystem's own (protocol stripped)."""

    def __init__(self, fs: fsspec.AbstractFileSystem, concurrency: int = DEFAULT_CONCURRENCY):
        self.fs = fs
        self.counters = Counters()
        #: an fsspec async filesystem (s3, gs, az, http, hf …): reads batch on its event loop
        self.async_fs = bool(getattr(fs, "async_impl", False))
        self.merge_gap = REMOTE_MERGE_GAP if self.async_fs else 0
        self.concurrency = max(1, int(concurrency))
        #: path -> (first bytes, file size): prefetched first blocks, served to every read
        #: inside them (dropped after a scan's listings and when the file changes)
        self.heads: dict[str, tuple[bytes, int]] = {}
        #: path -> the identity (size, mtime, etag) a listing last showed
        self.seen: dict[str, tuple] = {}
        #: fsspec's own local filesystem (not a subclass or wrapper): ranged reads and the
        #: tree walk go straight to the OS, skipping fsspec's per-call path handling
        self.plain_local = type(fs) is LocalFileSystem
        self._init_concurrent()

    def _init_concurrent(self) -> None:
        #: path -> a whole file fetched for the work items using it (see :meth:`map_window`)
        self.staged: dict[str, _Staged] = {}
        self._stage_lock = threading.Lock()
        self.gate = _Gate(self.concurrency, READ_BUDGET)
        self._remote = not self.local

    @classmethod
    def from_url(cls, url: str, storage_options: dict | None = None) -> tuple[Storage, str]:
        options = dict(storage_options or {})
        limit = int(options.pop(CONCURRENCY_OPTION, DEFAULT_CONCURRENCY))
        protocol = url.split("://", 1)[0] if "://" in str(url) else "file"
        if protocol in ("s3", "s3a"):  # botocore's pool holds 10 connections unless told
            config = dict(options.get("config_kwargs") or {})
            config.setdefault("max_pool_connections", max(10, limit))
            options["config_kwargs"] = config
        try:
            fs, path = url_to_fs(url, **options)
        except ImportError as e:  # fsspec's "Install s3fs to access S3", as one line
            raise MissingDependencyError(_missing_filesystem(url, e)) from None
        return cls(fs, limit), path.rstrip("/") or "/"

    def __getstate__(self) -> dict:  # prefetched blocks stay here (a worker reads its own)
        state = {**self.__dict__, "heads": {}}
        for key in ("staged", "_stage_lock", "gate", "_remote"):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict) -> None:
        state.setdefault("async_fs", bool(getattr(state["fs"], "async_impl", False)))
        state.setdefault("concurrency", DEFAULT_CONCURRENCY)
        state.setdefault("heads", {})
        state.setdefault("seen", {})
        self.__dict__.update(state)
        self._init_concurrent()

    # -- concurrent first blocks (async filesystems) ------------------------------------------
    def prefetch(self, files: list[tuple[str, int]], length: int = SPECULATIVE_BLOCK) -> int:
        """Fetch the first ``min(size, length)`` bytes of every ``(path, size)`` not held yet,
        ``concurrency`` requests in flight at once through the filesystem's async API (one
        ranged GET per file); later reads inside them cost nothing. A file that fails is
        left out (its own read raises then). Returns how many were fetched."""
        todo = [(p, n) for p, n in files if n > 0 and p not in self.heads]
        if not todo or not self.async_fs:
            return 0
        from fsspec.asyn import sync

        got = sync(self.fs.loop, self.fs._cat_ranges, [p for p, _ in todo], [0] * len(todo),
                   [min(n, length) for _, n in todo], batch_size=self.concurrency,
                   on_error="return")  # fmt: skip
        fetched = 0
        for (path, size), data in zip(todo, got):
            if isinstance(data, (bytes, bytearray)):
                self.heads[path] = (bytes(data), size)
                self.counters.add(len(data))
                fetched += 1
            else:
                self.counters.add(0)
        return fetched

    def drop_heads(self, paths: list[str] | None = None) -> None:
        """Forget prefetched first blocks (of ``paths``, else all)."""
        if paths is None:
            self.heads.clear()
        else:
            for p in paths:
                self.heads.pop(p, None)

    def note_listing(self, found: dict[str, dict], root: str | None = None) -> list[tuple[str, int]]:
        """Record a listing's file identities; the ``(path, size)`` of files new or changed
        since the last listing (their held first blocks, now stale, are dropped). ``root``:
        the listing was all of it (files seen below it before and absent now are forgotten)."""
        if root is not None and self.seen:
            below = root.rstrip("/") + "/"
            for path in [p for p in self.seen if p.startswith(below) and p not in found]:
                del self.seen[path]
                self.heads.pop(path, None)
        fresh = []
        for path, inf in found.items():
            if inf["type"] != "file":
                continue
            ident = (inf["size"], inf["mtime"], inf["etag"])
            if self.seen.get(path) != ident:
                self.seen[path] = ident
                self.heads.pop(path, None)
                fresh.append((path, inf["size"]))
        return fresh

    def held(self, path: str) -> tuple[bytes, int] | None:
        """The prefetched first block of a file (or the whole file, staged) and its size, if
        held."""
        if self.staged:
            data = self._staged(path)
            if data is not None:
                return data, len(data)
        return self.heads.get(path) if self.heads else None

    @property
    def local(self) -> bool:
        """True for a local (or in-memory) filesystem: reads cost no round trip, so header
        parsing is CPU work that threads would only contend for (the GIL)."""
        protocols = self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)
        return bool({"file", "local", "memory"} & set(protocols))

    def url(self, path: str) -> str:
        """A URL for a path, with the protocol for non-local filesystems."""
        fs = self.fs
        if getattr(self, "_url_fs", None) is not fs:  # the protocols looked at once per fs
            protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
            self._url_plain = "file" in protocols or "local" in protocols
            self._url_fs = fs
        return path if self._url_plain else fs.unstrip_protocol(path)

    def read_range(self, path: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of a file; one request."""
        if end <= start:
            return b""
        held = self.held(path) if self.heads or self.staged else None
        if held is not None and end <= len(held[0]):
            return held[0][start:end]
        if self.plain_local:
            with open(path, "rb") as fh:
                if start:
                    fh.seek(start)
                data = fh.read(end - start)
        else:
            data = self.fs.cat_file(path, start=start, end=end)
        self.counters.add(len(data))
        return data

    def find(self, root: str) -> dict[str, dict]:
        """Every file and directory below ``root`` (recursively), normalized (see
        :func:`normalize_info`), sorted by path; what ``fs.find(withdirs=True)`` gives."""
        if self.plain_local:
            return local_find(root)
        found = self.fs.find(root, withdirs=True, detail=True)
        return {path: normalize_info(inf) for path, inf in found.items()}

    def read_ranges(self, path: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        """Several ranges of one file (concurrently where the filesystem is async)."""
        if not ranges:
            return []
        spans, where = merge_ranges(ranges, getattr(self, "merge_gap", 0))
        held = self.held(path) if self.heads or self.staged else None
        if len(spans) == 1 or (held is not None and spans[-1][1] <= len(held[0])):
            got = [self.read_range(path, a, b) for a, b in spans]
        else:
            n = len(spans)
            got = self.fs.cat_ranges([path] * n, [a for a, _ in spans], [b for _, b in spans])
            for chunk in got:
                if isinstance(chunk, Exception):
                    raise chunk
                self.counters.add(len(chunk))
        return [got[i][a - spans[i][0] : b - spans[i][0]] for (a, b), i in zip(ranges, where)]

    def read_all(self, path: str) -> bytes:
        held = self.held(path) if self.heads or self.staged else None
        if held is not None and len(held[0]) >= held[1]:
            return held[0]
        data = self.fs.cat_file(path)
        self.counters.add(len(data))
        return data

    def info(self, path: str) -> dict:
        return normalize_info(self.fs.info(path))

    def blob(self, path: str, size: int | None = None) -> Blob:
        """A file read by ranges; its size, when not given, is the last listing's (on async
        filesystems: no HEAD request), else asked for when needed."""
        if size is None and self.seen:
            ident = self.seen.get(path)
            if ident is not None:
                size = ident[0]
        return Blob(self, path, size)

    # -- many reads at once (verify --deep, stats, diff, pieces of a tensor) -------------------
    @property
    def remote(self) -> bool:
        """Reads cost a round trip (not local disk or memory): worth keeping many in flight."""
        return self._remote

    def _fetch(self, path: str, start: int, end: int) -> Future:
        """One ranged read, started now: on an async filesystem's event loop (no thread
        waits on it), else on a thread of its own; counted when it completes."""
        fut: Future
        if self.async_fs:
            fut = asyncio.run_coroutine_threadsafe(self._cat_counted(path, start, end), self.fs.loop)
        else:
            fut = _fetch_pool().submit(self._cat_file_counted, path, start, end)
        return fut

    # counted before the result is handed over (a done-callback runs after waiters wake: a
    # caller could see the bytes before the counters do)
    async def _cat_counted(self, path: str, start: int, end: int) -> bytes:
        data = await self.fs._cat_file(path, start=start, end=end)
        self.counters.add(len(data))
        return data

    def _cat_file_counted(self, path: str, start: int, end: int) -> bytes:
        data = self.fs.cat_file(path, start=start, end=end)
        self.counters.add(len(data))
        return data

    def read_many(self, requests: Iterable[tuple[str, int, int]], window: int | None = None,
                  ahead: int = STREAM_AHEAD, arrays: bool = False) -> Iterator[bytes]:  # fmt: skip
        """The bytes of each ``(path, start, end)``, in order. On remote storage the next
        requests are in flight while one is used: up to ``window`` (default: the
        concurrency), ``ahead`` bytes beyond the one in use and within the Storage's budget
        (:data:`READ_BUDGET`, shared by every concurrent read; a stream with nothing in
        flight always gets one). On local disk each is read when asked for; with ``arrays``
        large ones straight into fresh numpy memory (``uint8`` arrays: no copy into
        ``bytes``, and numpy asks the kernel for huge pages, so a read of 64 MB takes a
        hundred page faults instead of 16,000)."""
        if not self.remote:
            if arrays and self.plain_local and not (self.heads or self.staged):
                yield from _read_local_arrays(requests, self.counters)
                return
            for path, start, end in requests:
                yield self.read_range(path, start, end)
            return

        def start_one(req: tuple[str, int, int]) -> Future:
            path, start, end = req
            held = self.held(path) if self.heads or self.staged else None
            if end <= start or (held is not None and end <= len(held[0])):
                done: Future = Future()
                done.set_result(held[0][start:end] if held is not None else b"")
                return done
            return self._fetch(path, start, end)

        def cost(req: tuple[str, int, int]) -> int:
            return max(0, req[2] - req[1])

        for _req, fut in self._window(requests, start_one, cost, window, ahead, _cancel):
            yield fut.result()

    def map_window(self, fn: Callable[[T], R], items: Iterable[T],
                   cost: Callable[[T], int] | None = None,
                   files: Callable[[T], Iterable[tuple[Storage, str, int]]] | None = None,
                   window: int | None = None,
                   inline: Callable[[T], bool] | None = None) -> Iterator[R]:  # fmt: skip
        """``fn(item)`` for each item, results in order. On local storage one after another
        in this thread. On remote storage on threads of this call: up to ``window`` (default:
        the concurrency) running while the caller uses earlier results, their declared
        working memory (``cost(item)`` bytes) within the Storage's budget (one at a time at
        least). ``files(item)``: the ``(storage, path, size)`` of files it reads (mostly)
        whole, each fetched in one request as the item starts (:meth:`stage`), shared by the
        items using it and dropped after the last. ``inline(item)``: it reads nothing but
        those files, so it runs in this thread when its turn comes (its fetches were in
        flight meanwhile: no thread to wake, no GIL handed around)."""
        if not self.remote or (isinstance(items, (list, tuple, range)) and len(items) <= 1):
            for item in items:
                yield fn(item)
            return
        limit = max(1, min(window or self.concurrency, self.concurrency))
        pool = ThreadPoolExecutor(max_workers=limit, thread_name_prefix="ckptview-map")
        files_of = files or (lambda item: ())

        def start_one(item: T) -> tuple[Future | None, list[tuple[Storage, str]]]:
            taken = []
            for storage, path, size in files_of(item):
                if storage.remote and 0 < size <= WHOLE_FILE:
                    storage.stage(path, size)
                    taken.append((storage, path))
            if inline is not None and taken and inline(item):
                return None, taken
            return pool.submit(fn, item), taken

        def item_cost(item: T) -> int:
            new = sum(size for storage, path, size in files_of(item)
                      if storage.remote and 0 < size <= WHOLE_FILE and path not in storage.staged)  # fmt: skip
            return (cost(item) if cost else 0) + new

        # an item's files are released once the next items started (and took them too)
        done: list[tuple[Storage, str]] = []
        try:
            for item, (fut, taken) in self._window(items, start_one, item_cost, limit,
                                                   READ_BUDGET, _abandon):  # fmt: skip
                _unstage(done)
                done = taken
                yield fn(item) if fut is None else fut.result()
        finally:
            _unstage(done)
            pool.shutdown(wait=False, cancel_futures=True)

    def _window(self, items: Iterable[T], start: Callable[[T], Any], cost: Callable[[T], int],
                window: int | None, ahead: int, drop: Callable[[Any], None]
                ) -> Iterator[tuple[T, Any]]:  # fmt: skip
        """``(item, start(item))`` in order, items started ahead of the one yielded: at most
        ``window`` (default: the concurrency) and ``ahead`` bytes (``cost``) started, and the
        Storage's gate allowing; with nothing started, one always goes. Each item's share of
        the gate is given back when the caller asks for the next; ``drop(handle)`` for the
        handles left when the caller stops early."""
        limit = max(1, window or self.concurrency)
        gate = self.gate
        pending: deque[tuple[T, Any, int]] = deque()
        it = iter(items)
        upcoming: Any = _NONE
        held = 0
        try:
            while True:
                while len(pending) < limit:
                    if upcoming is _NONE:
                        upcoming = next(it, _NONE)
                        if upcoming is _NONE:
                            break
                    n = cost(upcoming)
                    if pending and (held + n > ahead or not gate.take(n)):
                        break
                    if not pending:
                        gate.take(n, force=True)
                    try:
                        handle = start(upcoming)
                    except BaseException:
                        gate.give(n)
                        raise
                    pending.append((upcoming, handle, n))
                    held += n
                    upcoming = _NONE
                if not pending:
                    return
                item, handle, n = pending.popleft()
                try:
                    yield item, handle
                finally:
                    held -= n
                    gate.give(n)
        finally:
            for _item, handle, n in pending:
                drop(handle)
                gate.give(n)

    # -- whole files held for the work using them ------------------------------------------
    def stage(self, path: str, size: int) -> None:
        """Fetch a whole file (one request, started now) and serve every read inside it from
        memory until :meth:`unstage` was called as often; a read asking before it arrives
        waits for it. (A fetch that fails, or a file of another size, is not served: reads
        go to the store as usual.)"""
        with self._stage_lock:
            st = self.staged.get(path)
            if st is None:
                st = self.staged[path] = _Staged(self._fetch(path, 0, size), size)
            st.refs += 1

    def unstage(self, path: str) -> None:
        with self._stage_lock:
            st = self.staged.get(path)
            if st is None:
                return
            st.refs -= 1
            if st.refs <= 0:  # a fetch still under way completes unused (no torn connection)
                del self.staged[path]

    def _staged(self, path: str) -> bytes | None:
        st = self.staged.get(path)
        if st is None:
            return None
        try:
            data = st.future.result()
        except (Exception, CancelledError):  # noqa: BLE001 - the read goes to the store instead
            return None
        return data if len(data) == st.size else None


@dataclass
class _Staged:
    future: Future
    size: int
    refs: int = 0


class _Gate:
    """The work in flight on one Storage: at most ``count`` items (requests, or work items
    reading) and ``nbytes`` bytes; ``force`` lets in a caller with nothing in flight (it can
    never wait on itself, so nested or interleaved readers cannot deadlock)."""

    def __init__(self, count: int, nbytes: int):
        self.count, self.nbytes = count, nbytes
        self.items = self.bytes = 0
        self.lock = threading.Lock()

    def take(self, n: int, force: bool = False) -> bool:
        with self.lock:
            if not force and (self.items + 1 > self.count or self.bytes + n > self.nbytes):
                return False
            self.items += 1
            self.bytes += n
            return True

    def give(self, n: int) -> None:
        with self.lock:
            self.items -= 1
            self.bytes -= n


_NONE: Any = object()
_FETCH_POOL: ThreadPoolExecutor | None = None
_FETCH_LOCK = threading.Lock()


def _fetch_pool() -> ThreadPoolExecutor:
    """Threads for the reads of synchronous remote filesystems (sftp, hdfs …); they wait on
    nothing else, so work items waiting on them cannot deadlock."""
    global _FETCH_POOL
    with _FETCH_LOCK:
        if _FETCH_POOL is None:
            _FETCH_POOL = ThreadPoolExecutor(max_workers=DEFAULT_CONCURRENCY,
                                             thread_name_prefix="ckptview-fetch")  # fmt: skip
        return _FETCH_POOL


def _cancel(fut: Future) -> None:
    fut.cancel()


def _unstage(taken: list[tuple[Storage, str]]) -> None:
    for storage, path in taken:
        storage.unstage(path)


def _abandon(handle: tuple[Future | None, list[tuple[Storage, str]]]) -> None:
    """A work item the caller no longer wants: not started, or its files released when done."""
    fut, taken = handle
    if fut is None or fut.cancel() or fut.done():
        _unstage(taken)
    else:
        fut.add_done_callback(lambda _f: _unstage(taken))


def merge_ranges(
    ranges: list[tuple[int, int]], gap: int
) -> tuple[list[tuple[int, int]], list[int]]:
    """Coalesce ranges that overlap or lie within ``gap`` bytes of each other.

    Returns the merged spans (sorted) and, per input range, the index of its span.
    """
    order = sorted(range(len(ranges)), key=lambda i: ranges[i][0])
    spans: list[list[int]] = []
    where = [0] * len(ranges)
    for i in order:
        a, b = ranges[i]
        b = max(a, b)
        if spans and a <= spans[-1][1] + gap:
            spans[-1][1] = max(spans[-1][1], b)
        else:
            spans.append([a, b])
        where[i] = len(spans) - 1
    return [(a, b) for a, b in spans], where


def local_find(root: str) -> dict[str, dict]:
    """``LocalFileSystem.find(root, withdirs=True, detail=True)`` normalized, from
    ``os.scandir``: the same entries (a symlink is listed, with its target's size, and not
    walked into; unreadable directories are skipped) at a fraction of the calls."""
    out: dict[str, dict] = {}
    stack = [root.rstrip("/") or "/"]
    while stack:
        top = stack.pop()
        try:
            it = os.scandir(top)
        except OSError:
            continue
        with it:
            for e in it:
                try:
                    st = e.stat(follow_symlinks=False)
                    if e.is_dir(follow_symlinks=False):
                        kind = "directory"
                        stack.append(e.path)
                    else:
                        kind = "file"
                    size = st.st_size
                    if e.is_symlink():
                        try:
                            size = e.stat(follow_symlinks=True).st_size
                        except OSError:
                            size = 0
                except FileNotFoundError:
                    continue
                out[e.path] = {"name": e.path, "size": int(size), "type": kind,
                               "mtime": st.st_mtime, "etag": None}  # fmt: skip
    return dict(sorted(out.items()))


def normalize_info(info: dict) -> dict:
    """name, size, type ('file'/'directory') and mtime (POSIX seconds, a float, or None: a
    listing of a million files keeps numbers; :func:`utc_time` makes one a datetime)."""
    mtime = None
    for key in ("mtime", "LastModified", "last_modified", "updated", "modified", "created"):
        v = info.get(key)
        if v is None:
            continue
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            mtime = float(v)
        elif isinstance(v, datetime):
            mtime = (v if v.tzinfo else v.replace(tzinfo=timezone.utc)).timestamp()
        elif isinstance(v, str):
            try:
                t = datetime.fromisoformat(v.replace("Z", "+00:00"))
            except ValueError:
                continue
            mtime = (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).timestamp()
        if mtime is not None:
            break
    kind = info.get("type", "file")
    return {
        "name": info["name"].rstrip("/"),
        "size": int(info.get("size") or 0),
        "type": "directory" if kind in ("directory", "dir") else "file",
        "mtime": mtime,
        "etag": info.get("ETag") or info.get("etag"),
    }


def utc_time(mtime: float | None) -> datetime | None:
    """A listing's mtime (POSIX seconds) as a UTC datetime."""
    return None if mtime is None else datetime.fromtimestamp(mtime, tz=timezone.utc)


class Blob:
    """One file, read by ranges; the first block is cached so detection and headers share it."""

    def __init__(self, storage: Storage, path: str, size: int | None = None):
        self.storage = storage
        self.path = path
        self._size = size
        self._head: bytes | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:  # picklable (locators hold blobs; Dask ships them)
        return {"storage": self.storage, "path": self.path, "_size": self._size, "_head": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.Lock())

    @property
    def size(self) -> int:
        if self._size is None:
            self._size = self.storage.info(self.path)["size"]
        return self._size

    @property
    def name(self) -> str:
        return posixpath.basename(self.path)

    @property
    def url(self) -> str:
        return self.storage.url(self.path)

    def head(self, n: int = HEAD_BLOCK) -> bytes:
        """Up to ``n`` first bytes (at most one request for the cached first block: on an
        async filesystem, of a file larger than SPECULATIVE_BLOCK, that block, so most
        headers come in one GET; or the block prefetched)."""
        head = self._head
        if head is None:
            held = self.storage.held(self.path)
            if held is not None:
                head = self._head = held[0]
        if head is not None and (n <= len(head) or len(head) >= self.size):
            return head[:n]
        if n <= HEAD_BLOCK:
            # speculative on async filesystems, but never a small file's payload with it
            first = (
                SPECULATIVE_BLOCK
                if self.storage.async_fs and self.size > SPECULATIVE_BLOCK
                else HEAD_BLOCK
            )
            with self._lock:
                if self._head is None:
                    self._head = self.storage.read_range(self.path, 0, min(first, self.size))
            return self._head[:n]
        return self.read(0, min(n, self.size))

    def read(self, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes at ``offset``; TruncatedError if the file is shorter."""
        if offset < 0 or length < 0:
            raise TruncatedError(f"{self.name}: negative offset or length ({offset}, {length})")
        end = offset + length
        if end > self.size:
            raise TruncatedError(
                f"{self.name}: needs bytes {offset}..{end} but the file has {self.size}"
            )
        head = self._head
        if head is not None and end <= len(head):
            return head[offset:end]
        if end <= HEAD_BLOCK and (head is not None or self.size <= HEAD_BLOCK):
            return self.head(HEAD_BLOCK)[offset:end]
        return self.storage.read_range(self.path, offset, end)

    def read_upto(self, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes at ``offset`` (shorter at the end of the file)."""
        return self.read(offset, max(0, min(length, self.size - offset)))

    def read_ranges(self, ranges: list[tuple[int, int]]) -> list[bytes]:
        """The bytes of several ``(start, end)`` ranges, fetched concurrently."""
        return self.storage.read_ranges(self.path, ranges)

    def read_many(self, pieces: Iterable[tuple[int, int]]) -> Iterator[bytes]:
        """Exactly ``length`` bytes at each ``(offset, length)``, in order; on remote storage
        the next ones are read ahead while one is used (:meth:`Storage.read_many`), else
        each is :meth:`read` when asked for."""
        if not self.storage.remote:
            for offset, length in pieces:
                yield self.read(offset, length)
            return
        pieces = list(pieces)
        for offset, length in pieces:
            if offset < 0 or length < 0 or offset + length > self.size:
                self.read(offset, length)  # raises TruncatedError, as a read of it would
        requests = self._requests(pieces)
        for (_p, a, b), data in zip(requests, self.storage.read_many(requests)):
            if len(data) != b - a:
                raise TruncatedError(f"{self.name}: bytes {a}..{b} came {len(data)} long")
            yield data

    def _requests(self, pieces: list[tuple[int, int]]) -> list[tuple[str, int, int]]:
        """``(path, start, end)`` of pieces checked to lie inside."""
        return [(self.path, offset, offset + length) for offset, length in pieces]

    def slice(self, offset: int, length: int) -> BlobSlice:
        """The bytes ``[offset, offset + length)`` as a Blob of their own (offset 0 = the
        first of them): a record inside a container file read by a parser of whole files."""
        if offset < 0 or length < 0 or offset + length > self.size:
            raise TruncatedError(
                f"{self.name}: slice {offset}+{length} beyond the file's {self.size} bytes"
            )
        return BlobSlice(self, offset, length)

    def open(self, **kwargs: Any):
        """A seekable file object (for zipfile/h5py); reads are counted. A file whose
        bytes are all held (prefetched) opens from memory."""
        held = self.storage.held(self.path)
        if held is not None and len(held[0]) >= held[1] and not kwargs:
            return io.BytesIO(held[0])
        return CountingFile(self.storage, self.storage.fs.open(self.path, "rb", **kwargs))


class BlobSlice(Blob):
    """A byte range of a Blob read as a file: offsets are relative to its start and no read
    leaves it. ``path`` stays the container's (spans and errors name the real file)."""

    def __init__(self, parent: Blob, offset: int, length: int):
        super().__init__(parent.storage, parent.path, length)
        self.base = offset
        self.parent = parent

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "base": self.base, "parent": self.parent}

    def head(self, n: int = HEAD_BLOCK) -> bytes:
        if n <= HEAD_BLOCK:
            with self._lock:
                if self._head is None:
                    self._head = self.parent.read(self.base, min(HEAD_BLOCK, self.size))
            return self._head[:n]
        return self.read(0, min(n, self.size))

    def read(self, offset: int, length: int) -> bytes:
        end = offset + length
        if offset < 0 or length < 0 or end > self.size:
            raise TruncatedError(
                f"{self.name}@{self.base}: needs bytes {offset}..{end} of a {self.size}-byte record"
            )
        if end <= HEAD_BLOCK and (self._head is not None or self.size <= HEAD_BLOCK):
            return self.head(HEAD_BLOCK)[offset:end]
        return self.parent.read(self.base + offset, length)

    def read_ranges(self, ranges: list[tuple[int, int]]) -> list[bytes]:
        for a, b in ranges:
            if a < 0 or b < a or b > self.size:
                raise TruncatedError(f"{self.name}@{self.base}: range {a}..{b} outside the record")
        return self.parent.read_ranges([(a + self.base, b + self.base) for a, b in ranges])

    def _requests(self, pieces: list[tuple[int, int]]) -> list[tuple[str, int, int]]:
        return self.parent._requests([(self.base + offset, length) for offset, length in pieces])

    def open(self, **kwargs: Any):
        raise NotImplementedError("a Blob slice has no file object; read it by ranges")


class CountingFile:
    """A file-object proxy that counts bytes read into the Storage counters."""

    def __init__(self, storage: Storage, f):
        self._storage = storage
        self._f = f

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        self._storage.counters.add(len(data))
        return data

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def __getattr__(self, name: str):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._f.close()

    def __iter__(self):
        return iter(self._f)
