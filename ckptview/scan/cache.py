"""Header cache: what a file's header said, keyed by the file's identity on storage.

A catalog lists each data file once (codec, ``VarInfo`` list, error) and each small layout file
(markers, state JSON) once. Both are remembered under ``(url, size, mtime, etag, …)``, so a
rescan of an unchanged tree — a second ``ckptview.open`` or ``Catalog.refresh`` — redoes the
listing only and reads no header again; a file whose size, mtime or ETag changed is re-read.

Entries live in a process-wide, bounded LRU in memory (weighted by variables and bytes) and,
optionally, in a directory on disk (``ckptview.open(url, cache="~/.cache/ckptview")``, or
``configure(directory=...)`` / ``$CKPTVIEW_CACHE_DIR`` for every open). Disk entries are
pickles written by this module into a directory created private (0700); point the cache at a
directory only you can write.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..model import FileRef, VarColumns
from ..tree import Tree

#: a cache key: the identity of a file on storage (see HeaderCache.key)
CacheKey = tuple

#: a cached file listing: (codec name, variables, error)
Listing = tuple[str | None, list, str | None]

#: files modified less than this many seconds ago (without an ETag) are not cached: file
#: systems stamp mtimes coarsely (a kernel tick, or 1-2 s), as git's "racily clean" entries
RACY = 2.0
DEFAULT_MAX_WEIGHT = 2_000_000  # ~ variable rows + small-file KiB held in memory
FORMAT = 4  # bump when VarInfo/Span change shape: old disk entries are then ignored


class HeaderCache:
    """A bounded LRU of listings and small-file bytes, optionally backed by a directory."""

    def __init__(self, directory: str | os.PathLike | None = None,
                 max_weight: int = DEFAULT_MAX_WEIGHT, private: bool = False):  # fmt: skip
        self.directory = Path(directory).expanduser() if directory else None
        #: one catalog's own cache (``open(cache=False)``), kept for its ``refresh``: nothing
        #: can be in it before its first listing, so that listing keys its files later, on
        #: the cache's next use (:meth:`defer`), and not at all when none comes
        self.private = private
        #: True once a listing was stored (or deferred) here
        self.listed = False
        self._pending: list[Callable[[], None]] = []
        self.max_weight = int(max_weight)
        self._items: OrderedDict[CacheKey, tuple[Any, int]] = OrderedDict()
        self._weight = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)

    def __reduce__(self):  # a catalog shipped to a worker gets a fresh, empty cache
        return (HeaderCache, (self.directory, self.max_weight, self.private))

    def __len__(self) -> int:
        self._flush()
        return len(self._items)

    def __bool__(self) -> bool:  # an empty cache is still a cache
        return True

    # -- keys ------------------------------------------------------------------------
    @staticmethod
    def key(kind: str, url: str, info: dict | None, *extra: Any) -> CacheKey | None:
        """A key for a file, or None when its identity is unknown (no size, or no mtime/ETag)."""
        if not info or info.get("type") == "directory":
            return None
        return HeaderCache.key_at(time.time(), kind, url, info, *extra)

    @staticmethod
    def key_at(now: float, kind: str, url: str, info: dict | None, *extra: Any) -> CacheKey | None:
        """:meth:`key` as it was at time ``now`` (a key computed after the listing)."""
        if not info or info.get("type") == "directory":
            return None
        mtime, etag = info.get("mtime"), info.get("etag")
        if mtime is None and not etag:
            return None
        if hasattr(mtime, "timestamp"):  # a datetime (listings hold POSIX seconds)
            mtime = mtime.timestamp()
        if not etag and mtime is not None and mtime > now - RACY:
            return None  # written just now: a same-size rewrite could keep this mtime
        # the parts themselves, the mtime as a number (hashing them is for file names on
        # disk only: see _file)
        return (FORMAT, kind, url, int(info.get("size") or 0), mtime, etag or "", *extra)

    # -- get / put --------------------------------------------------------------------
    def defer(self, store: Callable[[], None]) -> None:
        """Run ``store`` (which puts entries) before the next lookup or count, not now."""
        with self._lock:
            self._pending.append(store)

    @property
    def pending(self) -> bool:
        """True while stores put off by :meth:`defer` have not run."""
        return bool(self._pending)

    def _flush(self) -> None:
        if self._pending:
            with self._lock:
                pending, self._pending = self._pending, []
            for store in pending:
                store()

    def get(self, key: CacheKey | None) -> Any | None:
        self._flush()
        if key is None:
            return None
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                self.hits += 1
                return hit[0]
        value = self._load(key)
        with self._lock:
            if value is None:
                self.misses += 1
            else:
                self.hits += 1
        if value is not None:
            self._remember(key, value)
        return value

    def put(self, key: CacheKey | None, value: Any, later: bool = False) -> None:
        """Remember ``value``; on disk too (``later``: written by a background thread, so a
        caller done computing need not wait for the file system; a lookup on disk in this
        process waits for the writes still pending, and they finish before the interpreter
        exits)."""
        self._flush()
        if key is None or value is None:
            return
        self._remember(key, value)
        if later and self.directory is not None:
            _write_later(self.directory, self._store, key, value)
        else:
            self._store(key, value)

    def clear(self) -> None:
        """Forget the memory entries (disk entries stay)."""
        with self._lock:
            self._items.clear()
            self._pending.clear()
            self._weight = 0

    def _remember(self, key: CacheKey, value: Any) -> None:
        weight = _weight(value)
        if weight > self.max_weight:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._weight -= old[1]
            self._items[key] = (value, weight)
            self._weight += weight
            while self._weight > self.max_weight and self._items:
                _, (_, w) = self._items.popitem(last=False)
                self._weight -= w

    # -- disk -------------------------------------------------------------------------
    def _file(self, key: CacheKey) -> Path | None:
        if not self.directory:
            return None
        digest = hashlib.sha256(repr(key).encode("utf-8", "surrogatepass")).hexdigest()
        return self.directory / digest[:2] / f"{digest}.pkl"

    def _load(self, key: CacheKey) -> Any | None:
        path = self._file(key)
        if path is not None:
            _settle(self.directory)
        if path is None or not path.exists():
            return None
        try:
            return pickle.loads(path.read_bytes())
        except Exception:  # noqa: BLE001 - a stale or broken entry is a miss
            return None

    def _store(self, key: CacheKey, value: Any) -> None:
        path = self._file(key)
        if path is None:
            return
        try:
            data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # noqa: BLE001 - a listing holding live objects stays in memory only
            return
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _weight(value: Any) -> int:
    if isinstance(value, (bytes, bytearray)):
        return 1 + len(value) // 1024
    if isinstance(value, tuple) and len(value) == 3 and isinstance(value[1], (list, VarColumns)):
        return 1 + len(value[1])
    return 1


# -- writes in the background ---------------------------------------------------------------
_WRITER: ThreadPoolExecutor | None = None
_PENDING: dict[Path | None, list[Future]] = {}
_WRITER_LOCK = threading.Lock()


def _write_later(directory: Path | None, store: Callable[..., None], *args: Any) -> None:
    """``store(*args)`` on the cache's writer thread (one: files written in order; its
    queue is drained before the interpreter exits)."""
    global _WRITER
    with _WRITER_LOCK:
        if _WRITER is None:
            _WRITER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckptview-cache")
        pending = [f for f in _PENDING.get(directory, []) if not f.done()]
        pending.append(_WRITER.submit(store, *args))
        _PENDING[directory] = pending


def _settle(directory: Path | None) -> None:
    """Wait for the writes to ``directory`` still pending."""
    if not _PENDING:
        return
    with _WRITER_LOCK:
        pending = _PENDING.pop(directory, [])
    for fut in pending:
        if fut.exception() is not None:  # a file not written is a later miss, not an error
            continue


# -- the process-wide default ----------------------------------------------------------------
_DEFAULT: HeaderCache | None = None
_DIRS: dict[Path, HeaderCache] = {}
_GLOBAL_LOCK = threading.Lock()


def configure(directory: str | os.PathLike | None = None,
              max_weight: int = DEFAULT_MAX_WEIGHT) -> HeaderCache:  # fmt: skip
    """Replace the process-wide cache (used by every ``ckptview.open`` without ``cache=``)."""
    global _DEFAULT
    with _GLOBAL_LOCK:
        _DEFAULT = HeaderCache(directory, max_weight)
        return _DEFAULT


def default_cache() -> HeaderCache:
    """The process-wide cache (memory; on disk too when ``$CKPTVIEW_CACHE_DIR`` is set)."""
    global _DEFAULT
    with _GLOBAL_LOCK:
        if _DEFAULT is None:
            _DEFAULT = HeaderCache(os.environ.get("CKPTVIEW_CACHE_DIR") or None)
        return _DEFAULT


def resolve(cache: Any) -> HeaderCache:
    """``ckptview.open``'s ``cache=``: None → the process-wide cache; False → a private one
    (so the catalog's own ``refresh`` still rereads only what changed); a path → memory plus
    that directory (one cache per directory per process); a HeaderCache → itself."""
    if cache is None or cache is True:
        return default_cache()
    if cache is False:
        return HeaderCache(private=True)
    if isinstance(cache, HeaderCache):
        return cache
    path = Path(os.fspath(cache)).expanduser().resolve()
    with _GLOBAL_LOCK:
        if path not in _DIRS:
            _DIRS[path] = HeaderCache(path)
        return _DIRS[path]


# -- the key of a data file's listing ----------------------------------------------------------
def listing_key(cache: HeaderCache, tree: Tree, ref: FileRef, entries: dict | None = None,
                now: float | None = None) -> CacheKey | None:  # fmt: skip
    """The cache key of one data file as a layout hands it over (forced codec and hints
    count); ``entries``/``now``: the tree's listing and the time it was made (a key made
    later, :meth:`HeaderCache.defer`)."""
    info = (tree.entries if entries is None else entries).get(tree.rel(ref.path))
    if info is not None and ref.size is not None and info.get("size") != ref.size:
        return None
    hints = repr(sorted((str(k), repr(v)) for k, v in ref.hints.items())) if ref.hints else "[]"
    return cache.key_at(time.time() if now is None else now, "listing",
                        tree.storage.url(ref.path), info, ref.codec or "", hints,
                        ref.optional)  # fmt: skip


def deep_key(cache: HeaderCache, tree: Tree, path: str, serial_files: list[str],
             kind: str = "deep") -> CacheKey | None:  # fmt: skip
    """The cache key of what a deep verify (``kind``: or the checks of small files) found in
    one file: the file's identity and those of every file of its serial (a data file a
    metadata file names may change alone)."""
    entries = tree.entries
    info = entries.get(tree.rel(path))
    peers = []
    for p in sorted(serial_files):
        e = entries.get(tree.rel(p)) or {}
        peers.append((tree.rel(p), int(e.get("size") or 0), e.get("mtime"), e.get("etag") or ""))
    return cache.key(kind, tree.storage.url(path), info, repr(peers))
