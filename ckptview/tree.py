"""A listed checkpoint tree: one recursive listing shared by every layout's detection."""

from __future__ import annotations

import posixpath
import re
from bisect import bisect_left
from collections.abc import Callable
from functools import cached_property
from typing import Any

from .io import PREFETCH_BUDGET, Blob, Storage
from .model import META_DIR


class Tree:
    """The root of a checkpoint tree and its files, listed once.

    Paths in ``entries`` are relative to the root, '/'-separated. A root that is a single
    file lists as that file (relative name = its basename, ``root`` its parent).
    """

    def __init__(self, storage: Storage, root: str, entries: dict[str, dict] | None = None):
        self.storage = storage
        self.root = root.rstrip("/") or "/"
        self._entries = entries
        self.single: str | None = None  # set when the tree is one file
        #: a ckptview.scan.cache.HeaderCache for small-file reads, set by open() (typed Any:
        #: the tree sits below the scan layer)
        self.cache: Any = None
        #: layout name -> the TreeScan a layout made while detection weighed it (taken once
        #: by the scan, so a tree is not scanned twice; cleared by forget)
        self.scans: dict[str, Any] = {}
        #: ckptview's own state files under ``.ckptview/`` seen by the last listing
        self.meta_files: set[str] = set()
        #: (async filesystems) paths new or changed at the last listing, not fetched yet
        self._fresh: set[str] = set()
        #: a listing made by ``at`` (taken by the first ``entries``)
        self._prefound: dict[str, dict] | None = None
        #: the listing's paths sorted, and the entries they were sorted from
        self._sorted: list[str] = []
        self._sorted_of: dict | None = None
        #: (kind, depth) -> the whole tree's files or dirs, for the sorted listing above (and
        #: what ``per_listing`` keeps for it)
        self._selected: dict[tuple, Any] = {}

    @classmethod
    def at(cls, storage: Storage, path: str) -> Tree:
        """The tree rooted at ``path``; a file becomes a one-file tree in its directory."""
        if storage.async_fs:  # one listing tells a directory (an info would cost two)
            found = storage.find(path)
            if any(p.rstrip("/") != path.rstrip("/") for p in found):
                tree = cls(storage, path)
                tree._prefound = found
                return tree
        info = storage.info(path)
        if info["type"] == "file":
            tree = cls(
                storage, posixpath.dirname(path.rstrip("/")), {posixpath.basename(path): info}
            )
            tree.single = posixpath.basename(path)
            return tree
        return cls(storage, path)

    @cached_property
    def entries(self) -> dict[str, dict]:
        if self._entries is not None:
            return self._entries
        found, self._prefound = self._prefound or self.storage.find(self.root), None
        out = {}
        meta = set()
        for path, inf in found.items():
            rel = self.rel(path)
            if rel and not rel.startswith(META_DIR):
                out[rel] = inf
            elif rel.startswith(META_DIR + "/"):
                meta.add(rel)
        self.meta_files = meta
        if self.storage.async_fs:
            self._note(found)
        return out

    def _note(self, found: dict[str, dict]) -> None:
        """On an async filesystem: remember which files are new or changed since the last
        listing (the only ones a sibling prefetch may fetch: the rest are in the header cache)."""
        self._fresh = {path for path, _ in self.storage.note_listing(found, self.root)}

    def _prefetch_siblings(self, rel: str, limit: int) -> None:
        """A layout reads one small file whole (a marker, an index, a state file): every
        serial has its like. Fetch, concurrently in one batch, each fresh file of the same
        name pattern (digits aside) at the same depth (at most ``limit`` bytes each), so the
        layout's next reads cost no request of their own."""
        fresh = getattr(self, "_fresh", None)
        if not fresh or self.abs(rel) not in fresh:
            return
        pattern, depth, entries = _pattern(rel), rel.count("/"), self.entries
        todo, budget = [], PREFETCH_BUDGET
        for path in list(fresh):
            other = self.rel(path)
            inf = entries.get(other)
            if inf is None or other.count("/") != depth or _pattern(other) != pattern:
                continue
            n = min(inf["size"], limit)
            budget -= n
            if budget < 0:
                break
            todo.append((path, inf["size"]))
        fresh.difference_update(p for p, _ in todo)
        if len(todo) > 1:
            self.storage.prefetch(todo, limit)

    @property
    def listed(self) -> bool:
        """True once ``entries`` has been read (since construction or the last ``forget``)."""
        return "entries" in self.__dict__

    def forget(self) -> None:
        """Forget the listing: the next ``entries`` lists the storage again (and the
        filesystem's own listing cache is dropped). A tree built from given entries keeps them."""
        self.scans.clear()
        if self._entries is None:
            self.__dict__.pop("entries", None)
            self.storage.fs.invalidate_cache(self.root)  # s3fs & co. cache listings

    def rel(self, path: str) -> str:
        path = path.rstrip("/")
        root = self.root.rstrip("/")
        if path == root:
            return ""
        if root in ("", "/"):
            return path.lstrip("/")
        return path[len(root) + 1 :] if path.startswith(root + "/") else path

    def abs(self, rel: str) -> str:
        if not rel:
            return self.root
        return self.root.rstrip("/") + "/" + rel if self.root != "/" else "/" + rel

    def files(self, under: str = "", depth: int | None = None) -> list[str]:
        """Relative paths of files below ``under`` (all depths, or at most ``depth`` levels)."""
        return self._select("file", under, depth)

    def dirs(self, under: str = "", depth: int | None = 1) -> list[str]:
        """Relative paths of directories below ``under`` (direct children by default)."""
        return self._select("directory", under, depth)

    def _below(self, prefix: str) -> list[str]:
        """The listed paths starting with ``prefix``, sorted: one slice of the listing sorted
        once (layouts ask per serial; a scan of every entry each time grows with the tree)."""
        entries = self.entries
        if self._sorted_of is not entries or len(self._sorted) != len(entries):
            self._sorted, self._sorted_of = sorted(entries), entries  # (re)listed, or added to
            self._selected.clear()
        keys = self._sorted
        if not prefix:
            return keys
        lo = bisect_left(keys, prefix)
        # every string starting with prefix sorts before prefix + U+10FFFF
        hi = bisect_left(keys, prefix + "\U0010ffff", lo)
        return keys[lo:hi]

    def _select(self, kind: str, under: str, depth: int | None) -> list[str]:
        prefix = under.rstrip("/") + "/" if under else ""
        entries, start = self.entries, len(prefix)
        below = self._below(prefix)
        if not prefix:  # the whole tree: asked by every layout's detection, kept (a copy out)
            memo = self._selected.get((kind, depth))
            if memo is not None:
                return list(memo)
        if depth is None:
            out = [rel for rel in below if entries[rel]["type"] == kind]
        else:
            out = [rel for rel in below
                   if entries[rel]["type"] == kind and rel.count("/", start) < depth]  # fmt: skip
        if not prefix:
            self._selected[(kind, depth)] = out
            return list(out)
        return out

    def per_listing(self, key: tuple, make: Callable[[], Any]) -> Any:
        """``make()`` once per listing: a layout's parse of the whole tree, asked by
        detection and again by the scan; made again when the listing changes."""
        self._below("")  # re-sorts, and forgets what was kept, when the listing changed
        if key not in self._selected:
            self._selected[key] = make()
        return self._selected[key]

    def children(self, under: str = "") -> list[str]:
        """Names (not paths) directly below ``under``: files and directories."""
        prefix = under.rstrip("/") + "/" if under else ""
        names = set()
        for rel in self._below(prefix):
            if rel != under:
                names.add(rel[len(prefix) :].split("/", 1)[0])
        return sorted(names)

    def exists(self, rel: str) -> bool:
        return rel in self.entries

    def is_dir(self, rel: str) -> bool:
        return rel == "" or self.entries.get(rel, {}).get("type") == "directory"

    def info(self, rel: str) -> dict:
        return self.entries[rel]

    def size(self, rel: str) -> int:
        return self.entries.get(rel, {}).get("size", 0)

    def blob(self, rel: str) -> Blob:
        return self.storage.blob(self.abs(rel), self.entries.get(rel, {}).get("size"))

    def read_bytes(self, rel: str, limit: int = 1 << 20) -> bytes:
        """A small file's bytes (at most ``limit``: markers, state files, JSON)."""
        cache, key = self.cache, None
        if cache is not None:
            key = cache.key("bytes", self.url(rel), self.entries.get(rel), limit)
        data = cache.get(key) if key else None
        if data is None:
            if self.storage.async_fs:
                self._prefetch_siblings(rel, limit)
            data = self.blob(rel).read_upto(0, limit)
            if key:
                cache.put(key, data)
        return data

    def memo(self, rel: str, tag: str, compute: Callable[[], Any]) -> Any:
        """``compute()`` (a layout's parse of a small file), remembered in the header cache
        under the file's identity (url, size, mtime/ETag) so a rescan does not read it again."""
        cache, key = self.cache, None
        if cache is not None:
            key = cache.key(tag, self.url(rel), self.entries.get(rel))
        value = cache.get(key) if key else None
        if value is None:
            value = compute()
            if key:
                cache.put(key, value)
        return value

    def read_text(self, rel: str, limit: int = 1 << 20) -> str:
        return self.read_bytes(rel, limit).decode("utf-8", "replace")

    def url(self, rel: str = "") -> str:
        return self.storage.url(self.abs(rel))


_DIGITS = re.compile(r"\d+")


def _pattern(rel: str) -> str:
    """A file's name with its numbers blanked: ``checkpoint-100/trainer_state.json`` and
    ``checkpoint-200/trainer_state.json`` share one (as do ``trainer_0.3`` and ``trainer_1.4``)."""
    return _DIGITS.sub("#", rel)
