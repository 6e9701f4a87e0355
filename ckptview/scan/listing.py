"""Listing data files: detect each file's codec and list its variables (headers only),
through the header cache, the misses fanned out on an executor."""

from __future__ import annotations

import gc
import os
import posixpath
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

from .. import registry
from ..codecs.base import Codec, PartialRead
from ..io import Blob, Storage
from ..model import FileRef, VarColumns, VarInfo
from ..tree import Tree
from .cache import CacheKey, HeaderCache, listing_key

NO_CODEC = "no codec recognizes this file"
_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def default_executor() -> Executor:
    """A shared thread pool for header reads (I/O bound)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=16, thread_name_prefix="ckptview")
        return _POOL


@dataclass
class FileResult:
    """The outcome of listing one file."""

    serial: int
    ref: FileRef
    codec: str | None
    variables: list[VarInfo]
    error: str | None = None


class _PausedGC:
    """The cyclic garbage collector paused while any thread lists a file: a header of a
    million records allocates millions of acyclic objects, and the collections that would
    trigger (each walking every live object) cost more than the listing itself."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.depth = 0
        self.was_enabled = False

    def __enter__(self) -> None:
        with self.lock:
            if self.depth == 0:
                self.was_enabled = gc.isenabled()
                gc.disable()
            self.depth += 1

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.depth -= 1
            if self.depth == 0 and self.was_enabled:
                gc.enable()


paused_gc = _PausedGC()


def list_file(storage: Storage, serial: int, ref: FileRef) -> FileResult:
    """Detect the codec of one file and list its variables; never raises."""
    with paused_gc:
        return _list_file(storage, serial, ref)


def _list_file(storage: Storage, serial: int, ref: FileRef,
               named: dict[str, Codec] | None = None) -> FileResult:  # fmt: skip
    """``list_file`` without pausing the collector; ``named``: the codecs forced by name so
    far in this run (a layout names one codec for thousands of files)."""
    blob = storage.blob(ref.path, ref.size)
    codec: Codec | None = None
    try:
        if ref.codec:
            codec = named.get(ref.codec) if named is not None else None
            if codec is None:
                codec = registry.get_codec(ref.codec)
                if named is not None:
                    named[ref.codec] = codec
        else:
            head = blob.head() if blob.size else b""
            codec = registry.detect_codec(posixpath.basename(ref.path), head, blob)
        if codec is None:
            return FileResult(serial, ref, None, [], NO_CODEC)
        variables = codec.list_variables(blob, ref.hints)
        return FileResult(serial, ref, codec.name, beyond_file(variables, blob))
    except PartialRead as e:
        variables = beyond_file(e.variables, blob) if codec else e.variables
        return FileResult(serial, ref, codec.name if codec else None, variables, str(e))
    except Exception as e:  # noqa: BLE001 - a bad file becomes an error row, never a crash
        return FileResult(serial, ref, codec.name if codec else None, [], _message(e))


def beyond_file(variables: list[VarInfo], blob: Blob) -> list[VarInfo]:
    """Mark variables whose values would lie past the end of their file (a header that
    promises more than the file holds): they cannot load. Columns are checked by their
    codec (a variable past the end keeps a file off the columnar path)."""
    if type(variables) is not list and isinstance(variables, VarColumns):
        return variables
    for var in variables:
        span = var.span
        if span is None or var.error or span.path != blob.path:
            continue
        if span.offset < 0 or span.offset + span.length > blob.size:
            var.error = (
                f"values at bytes {span.offset}..{span.offset + span.length} lie beyond the "
                f"file's {blob.size} bytes"
            )
    return variables


def _message(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return f"{type(e).__name__}: {text}"[:500]


def _origin() -> tuple[str, int]:
    return (os.uname().nodename, os.getpid())


def list_job(storage: Storage, serial: int, ref: FileRef,
             origin: tuple[str, int]) -> tuple[FileResult, tuple[int, int] | None]:  # fmt: skip
    """``list_file`` for an executor: in another process the Storage is a copy, so the bytes and
    requests it counted come back with the result (added to the caller's counters)."""
    remote = _origin() != origin
    if remote:
        storage.counters.reset()
    res = list_file(storage, serial, ref)
    delta = (storage.counters.bytes_read, storage.counters.requests) if remote else None
    return res, delta


def run_listings(storage: Storage, tree: Tree, jobs: list[tuple[int, FileRef]],
                 executor: Executor | None, cache: HeaderCache | None,
                 progress: Callable[[int, int], None] | None = None) -> list[FileResult]:  # fmt: skip
    """``FileResult`` per ``(serial, FileRef)`` job: cached ones from ``cache``, the rest listed
    concurrently on ``executor`` (any ``concurrent.futures.Executor``, Dask's included).
    ``progress(done, total)`` is called once per file listed (cache hits included)."""
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, len(jobs))

    out: list = [None] * len(jobs)
    keys: list[CacheKey | None] = [None] * len(jobs)
    todo = []
    # a private cache before its first listing holds none: no lookups, keys made later
    lazy = cache is not None and cache.private and not cache.listed
    for i, (serial, ref) in enumerate(jobs):
        if cache is not None and not lazy:
            keys[i] = listing_key(cache, tree, ref)
            hit = cache.get(keys[i])
            if hit is not None:
                out[i] = FileResult(serial, ref, *hit)
                tick()
                continue
        todo.append(i)
    isolated = getattr(executor, "isolates", False)
    if todo and storage.async_fs and not isolated:
        _run_async(storage, jobs, todo, executor, out, tick)
    elif (len(todo) == 1 and not isolated) or (todo and executor is None):
        named: dict[str, Codec] = {}
        with paused_gc:
            for i in todo:
                out[i] = _list_file(storage, *jobs[i], named)
                tick()
    elif todo and executor is not None:
        origin = _origin()
        futures = [(i, executor.submit(list_job, storage, *jobs[i], origin)) for i in todo]
        for i, fut in futures:
            try:
                res, delta = fut.result()
            except Exception as e:  # noqa: BLE001 - a worker died: this file alone, again
                res, delta = _alone(executor, storage, jobs[i], origin, e)
            res.ref = jobs[i][1]
            if delta is not None:
                with storage.counters.lock:
                    storage.counters.bytes_read += delta[0]
                    storage.counters.requests += delta[1]
            out[i] = res
            tick()
    if cache is not None and lazy:
        cache.defer(partial(_store, cache, tree, tree.entries, time.time(), jobs, out, None))
    elif cache is not None:
        _store(cache, tree, None, None, jobs, out, keys, todo)
    if cache is not None:
        cache.listed = True
    return out


def list_concurrent(storage: Storage, jobs: list[tuple[int, FileRef]],
                    done: Callable[[int, FileResult], None] | None = None) -> list[FileResult]:  # fmt: skip
    """List files on an async filesystem, ``storage.concurrency`` at once: each parser runs
    on a thread of :func:`io_pool` and its reads wait on fsspec's event loop, where they
    overlap (a first read is a speculative block: most headers come in one GET).
    ``done(i, result)`` per file, in order."""
    named: dict[str, Codec] = {}

    def one(i: int) -> FileResult:
        with paused_gc:
            return _list_file(storage, *jobs[i], named)

    if len(jobs) == 1:
        results: Any = [one(0)]
    else:
        results = io_pool(storage.concurrency).map(one, range(len(jobs)))
    out = []
    for i, res in enumerate(results):
        out.append(res)
        if done is not None:
            done(i, res)
    return out


_IO_POOLS: dict[int, ThreadPoolExecutor] = {}


def io_pool(n: int) -> ThreadPoolExecutor:
    """A shared pool of ``n`` threads for reads on async filesystems: each waits on one
    request (the GIL is free meanwhile), so ``n`` requests are in flight."""
    with _POOL_LOCK:
        pool = _IO_POOLS.get(n)
        if pool is None:
            pool = _IO_POOLS[n] = ThreadPoolExecutor(
                max_workers=n, thread_name_prefix="ckptview-io"
            )
        return pool


def list_batch(storage: Storage, jobs: list[tuple[int, FileRef]], held: dict[str, tuple[bytes, int]],
               origin: tuple[str, int]) -> tuple[list[FileResult], tuple[int, int] | None]:  # fmt: skip
    """:func:`list_concurrent` for an executor (a Dask worker lists its share concurrently):
    ``held``, the first blocks the caller already has; in another process the bytes and
    requests counted come back with the results."""
    remote = _origin() != origin
    if remote:
        storage.counters.reset()
    storage.heads.update(held)
    try:
        res = list_concurrent(storage, jobs)
    finally:
        storage.drop_heads([ref.path for _, ref in jobs])
    delta = (storage.counters.bytes_read, storage.counters.requests) if remote else None
    return res, delta


def _run_async(
    storage: Storage,
    jobs: list[tuple[int, FileRef]],
    todo: list[int],
    executor: Executor | None,
    out: list,
    tick: Callable[[], None],
) -> None:
    """The misses ``todo`` of an async filesystem, listed concurrently: here (on the shared
    thread pool, or the thread pool given) or, on any other executor (Dask's), in batches
    that each worker lists concurrently."""
    if executor is None or isinstance(executor, ThreadPoolExecutor):

        def done(k: int, res: FileResult) -> None:
            out[todo[k]] = res
            tick()

        list_concurrent(storage, [jobs[i] for i in todo], done)
        storage.drop_heads()
        return
    n = max(16, min(4 * storage.concurrency, -(-len(todo) // 8)))
    origin = _origin()
    batches = [todo[a : a + n] for a in range(0, len(todo), n)]
    futures = []
    for batch in batches:
        held = {jobs[i][1].path: storage.heads[jobs[i][1].path]
                for i in batch if jobs[i][1].path in storage.heads}  # fmt: skip
        futures.append(executor.submit(list_batch, storage, [jobs[i] for i in batch], held, origin))
    storage.drop_heads()
    for batch, fut in zip(batches, futures):
        try:
            results, delta = fut.result()
        except Exception as e:  # noqa: BLE001 - a worker died: each file alone, again
            for i in batch:
                res, d = _alone(executor, storage, jobs[i], origin, e)
                _land(storage, jobs, out, i, res, d)
                tick()
            continue
        for i, res in zip(batch, results):
            _land(storage, jobs, out, i, res, None)
            tick()
        _land_counts(storage, delta)


def _land(storage: Storage, jobs: list[tuple[int, FileRef]], out: list, i: int,
          res: FileResult, delta: tuple[int, int] | None) -> None:  # fmt: skip
    res.ref = jobs[i][1]
    out[i] = res
    _land_counts(storage, delta)


def _land_counts(storage: Storage, delta: tuple[int, int] | None) -> None:
    if delta is not None:
        with storage.counters.lock:
            storage.counters.bytes_read += delta[0]
            storage.counters.requests += delta[1]
            storage.counters.remote_requests += delta[1]


def _store(cache: HeaderCache, tree: Tree, entries: dict | None, now: float | None,
           jobs: list[tuple[int, FileRef]], out: list[FileResult],
           keys: list[CacheKey | None] | None, todo: list[int] | None = None) -> None:  # fmt: skip
    """Put the listings of ``todo`` (all jobs when None) in the cache, keyed by ``keys`` or
    from ``entries``, the tree's listing at time ``now``."""
    for i in range(len(jobs)) if todo is None else todo:
        res = out[i]
        if not transient(res.error):
            key = (
                keys[i] if keys is not None else listing_key(cache, tree, jobs[i][1], entries, now)
            )
            cache.put(key, (res.codec, res.variables, res.error))


def _alone(executor: Executor, storage: Storage, job: tuple[int, FileRef], origin: tuple[str, int],
           error: Exception) -> tuple[FileResult, tuple[int, int] | None]:  # fmt: skip
    """A job whose worker died (with others, perhaps): run alone in a fresh worker; if that
    dies too, the file is an error row naming how."""
    rerun = getattr(executor, "rerun", None)
    if rerun is not None:
        try:
            return rerun(list_job, storage, *job, origin)
        except Exception as e:  # noqa: BLE001
            error = e
    return FileResult(job[0], job[1], None, [], f"{WORKER_DIED}: {_message(error)}"), None


WORKER_DIED = "listing this file killed its worker process"

#: errors of reaching the storage, not of the file: never cached (a retry may succeed)
TRANSIENT = ("OSError", "IOError", "PermissionError", "FileNotFoundError", "ConnectionError",
             "TimeoutError", "ClientError", "ClientPayloadError", "ServerTimeoutError",
             "ReadTimeoutError", "EndpointConnectionError", "NoCredentialsError")  # fmt: skip


def transient(error: str | None) -> bool:
    """True when a listing error says the storage failed (access, network), not the file."""
    return error is not None and error.split(":", 1)[0].strip() in TRANSIENT
