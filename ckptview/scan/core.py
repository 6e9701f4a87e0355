"""Scan: one checkpoint tree read through its layout: serials, listed files, tables, values."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from typing import Any

import numpy as np
import pandas as pd

from .. import registry
from ..codecs.base import Codec
from ..io import Blob, Storage
from ..layouts.base import Layout
from ..model import META_DIR, FileRef, SerialInfo, TreeScan, VarInfo, as_columns
from ..tree import Tree
from .cache import HeaderCache, deep_key, resolve
from .checks import small_checks
from .listing import NO_CODEC, FileResult, default_executor, paused_gc, run_listings
from .logical import ASSEMBLED, Logical, Placed, assemble, iter_assembled, read_assembled
from .peers import drift
from .quant import QUANTIZED, iter_quantized, read_quantized
from .quant import group as group_quantized
from .slimmed import read_slimmed
from .tables import (
    catalog_names,
    files_table,
    metrics_table,
    serials_table,
    shards_table,
    tree_warnings,
    var_name,
    variables_table,
)


def bare_pickle_problem(blob: Blob) -> str | None:
    """What a plain pickle (no torch or numpy wrapper) would do if loaded: the global it
    names that the restricted VM refuses, else None (it is inert data)."""
    if blob.size < 2 or blob.head(1) != b"\x80":
        return None
    from ..formats.pickle import InertClasses, RestrictedUnpicklingError, load_pickle

    try:
        load_pickle(blob, allow=InertClasses())
    except RestrictedUnpicklingError as e:
        return f"a pickle the framework would load unsafely: {e}"
    except Exception:  # noqa: BLE001 - not a pickle after all: no codec says more
        return None
    return None


#: unclaimed checkpoint-like files listed per tree at most (the rest stay unread warnings)
MAX_LOOSE = 256


class Scan:
    """A tree, its layout and what they found: the layout's ``TreeScan``, every data file's
    listing (through the header cache) and the tables built from them, all computed on
    first use and forgotten by :meth:`refresh`. Picklable (for process executors)."""

    def __init__(self, tree: Tree, layout: Layout, executor: Executor | None = None,
                 cache: Any = None, progress: Callable[[int, int], None] | None = None):  # fmt: skip
        self.tree = tree
        #: ``progress(done, total)``: called per file as a scan lists headers (a UI hook)
        self.progress = progress
        self.storage: Storage = tree.storage
        self.layout = layout
        self.executor = executor
        self.cache: HeaderCache = resolve(cache)  # header cache: see ckptview.scan.cache
        if getattr(tree, "cache", None) is None:
            tree.cache = self.cache
        self._lock = threading.RLock()
        self._found: TreeScan | None = None
        self._results: list[FileResult] | None = None
        self._logical: Logical | None = None
        self._tables: dict[str, Any] = {}  # name -> a table (or the warnings), till a refresh
        #: (serial, node, name) -> (position in its file's variables, the file's listing)
        self._index: dict[tuple[int, str, str], tuple[int, FileResult]] = {}
        #: file URL -> the error findings of a deep verify ([] when clean): folded into the
        #: serials' verdicts, and kept in the header cache for unchanged files
        self._deep: dict[str, list[str]] = {}
        self._checked: dict[int, list[str]] | None = None

    @property
    def url(self) -> str:
        return self.tree.url(self.tree.single or "")

    @property
    def tree_scan(self) -> TreeScan:
        """What the layout found (serials, their files, the latest, metrics, attrs)."""
        with self._lock:
            if self._found is None:
                early = self.tree.scans.pop(self.layout.name, None)  # made by detection
                self._found = early if early is not None else self.layout.scan(self.tree)
            return self._found

    def serial_info(self, serial: int) -> SerialInfo:
        """The layout's record of one serial (KeyError when there is none)."""
        found = self.tree_scan.serials
        for s in found:
            if s.serial == serial:
                return s
        raise KeyError(f"no serial {serial}; serials: {sorted(s.serial for s in found)}")

    def pool(self) -> Executor:
        """The executor for concurrent reads (stats, diff): the one given, else a shared
        thread pool (also when the one given isolates listings only: ``lists_only``)."""
        if self.executor is None or getattr(self.executor, "lists_only", False):
            return default_executor()
        return self.executor

    def file_results(self) -> list[FileResult]:
        """Every data file listed (codec, variables, error), in the layout's order."""
        with self._lock, paused_gc:
            if self._results is None:
                jobs = [(s.serial, ref) for s in self.tree_scan.serials for ref in s.files]
                self._results = self._run(jobs)
                self._index = {}  # built on the first read (resolve): costly at 1e6 rows
            return self._results

    def logical(self) -> Logical:
        """The file results with each logical tensor's pieces assembled (DESIGN.md §3b)."""
        results = self.file_results()
        with self._lock, paused_gc:
            if self._logical is None:
                grouped, quantized = group_quantized(results)
                logical = assemble(grouped, self._pieces_of)
                for key, members in quantized.items():
                    logical.pieces[key] = [Placed(v, r, (0,) * len(v.shape), p)
                                           for v, r, p in members]  # fmt: skip
                self._logical = logical
            return self._logical

    def _pieces_of(self, ref: FileRef, variables: Sequence[VarInfo]) -> list | None:
        """Each variable's piece: marked by its codec, else as its layout says; None when
        no variable of the file is a piece."""
        layout_says = type(self.layout).pieces is not Layout.pieces  # else always None
        if as_columns(variables) is not None:
            if not layout_says:
                return None
            told = self.layout.pieces(ref, variables)  # columns carry no piece marks
            return told if told is not None and any(p is not None for p in told) else None
        else:
            marked = [var.attrs.get("piece") if var.attrs else None for var in variables]
        if layout_says and any(p is None for p in marked):
            told = self.layout.pieces(ref, variables)
            if told is not None:
                marked = [m if m is not None else t for m, t in zip(marked, told, strict=True)]
        return marked if any(p is not None for p in marked) else None

    def _run(self, jobs: list[tuple[int, FileRef]]) -> list[FileResult]:
        """List files through the header cache; misses run concurrently on the executor given,
        else on the shared thread pool for remote storage (I/O waits overlap) and in this
        thread for local files (parsing is CPU work: threads would only contend for the GIL)."""
        executor = self.executor
        if executor is None and not self.storage.local:
            executor = default_executor()
        return run_listings(self.storage, self.tree, jobs, executor, self.cache, self.progress)

    def __getstate__(self) -> dict:  # picklable for process executors (Dask diff/stats jobs)
        state = self.__dict__.copy()
        state.update(_lock=None, executor=None, _tables={}, progress=None, _logical=None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.RLock())

    def _build_index(self) -> None:
        """Every variable by (serial, node, name), from the names alone: a file's records
        are made when one of its variables is asked for."""
        index: dict[tuple[int, str, str], tuple[int, FileResult]] = {}
        for res in self.logical().results:
            serial, node = res.serial, res.ref.node
            for i, name in enumerate(catalog_names(res.ref, res.variables)):
                index.setdefault((serial, node, name), (i, res))
        self._index = index

    # -- tables ---------------------------------------------------------------------
    def _table(self, name: str, build: Callable[[], pd.DataFrame]) -> pd.DataFrame:
        with self._lock:
            if name not in self._tables:
                with paused_gc:  # a table of a million rows: no collection walks it midway
                    self._tables[name] = build()
            return self._tables[name]

    @property
    def variables(self) -> pd.DataFrame:
        return self._table("variables", lambda: variables_table(self.tree, self.logical().results))

    @property
    def shards(self) -> pd.DataFrame:
        """One row per stored piece of every variable (DESIGN.md §3b)."""
        return self._table("shards", lambda: shards_table(self.tree, self.logical()))

    @property
    def serials(self) -> pd.DataFrame:
        def build() -> pd.DataFrame:
            results = self.logical().results
            return serials_table(self.tree, self.tree_scan, results, read_slimmed(self.tree),
                                 self._deep_findings(), drift(self.tree, results),
                                 self._small_checks())  # fmt: skip

        return self._table("serials", build)

    def _small_checks(self) -> dict[int, list[str]]:
        """Per serial: the checksums its small files fail where the framework checks them on
        load (:mod:`.checks`); checked once, then kept in the header cache."""
        with self._lock:
            if self._checked is None:
                self._checked = small_checks(self.tree, self.storage, self.cache,
                                             self.file_results(), self._serial_paths)  # fmt: skip
            return self._checked

    def _serial_paths(self) -> dict[int, list[str]]:
        """Every file path of each serial (its listed files and the others)."""
        out: dict[int, list[str]] = {}
        for s in self.tree_scan.serials:
            out[s.serial] = [r.path for r in s.files] + list(s.other_files)
        return out

    def _deep_findings(self) -> dict[int, list[str]]:
        """Per serial: the error findings deep verifies made of its files, this catalog's
        and the header cache's (for files unchanged since)."""
        out: dict[int, list[str]] = {}
        shared = not self.cache.private  # a catalog's own cache holds only what it folded
        for serial, paths in self._serial_paths().items():
            for path in paths:
                url = self.storage.url(path)
                found = self._deep.get(url)
                if found is None and shared:
                    found = self.cache.get(deep_key(self.cache, self.tree, path, paths))
                    if found is not None:
                        self._deep[url] = found
                if found:
                    out.setdefault(serial, []).extend(found)
        return out

    def fold_deep(self, serial_findings: dict[int, dict[str, list[str]]]) -> None:
        """Record a deep verify's error findings (serial -> file URL -> messages, [] when
        clean) here and in the header cache, and rebuild the serials table from them."""
        paths = self._serial_paths()
        with self._lock:
            for serial, by_url in serial_findings.items():
                mine = paths.get(serial, [])
                for path in mine:
                    url = self.storage.url(path)
                    if url in by_url:
                        self._deep[url] = list(by_url[url])
                        self.cache.put(deep_key(self.cache, self.tree, path, mine), list(by_url[url]))
            self._tables.pop("serials", None)

    @property
    def metrics(self) -> pd.DataFrame:
        return self._table("metrics", lambda: metrics_table(self.tree_scan))

    @property
    def files(self) -> pd.DataFrame:
        def build() -> pd.DataFrame:
            found, results = self.tree_scan, self.file_results()
            markers = {s.serial: self._ask(self.layout.commit_markers, s) for s in found.serials}
            owned = {s.serial: self._ask(self.layout.serial_files, s) for s in found.serials}
            return files_table(self.tree, found, results, markers, owned,
                               self._loose(results, owned))  # fmt: skip

        return self._table("files", build)

    def _loose(self, results: list[FileResult], owned: dict[int, set[str]]) -> dict[str, FileResult]:
        """Unclaimed files with a checkpoint suffix, listed (a pickle beside the run that
        would run code when loaded is named, never left unread)."""
        if self.tree.single:
            return {}
        taken = {self.tree.rel(r.ref.path) for r in results}.union(*owned.values())
        for s in self.tree_scan.serials:
            taken |= {self.tree.rel(p) for p in s.other_files}
        suffixes = registry.known_suffixes()
        rels = [rel for rel in self.tree.files() if rel not in taken and
                rel.split("/", 1)[0] != META_DIR and rel.lower().endswith(suffixes)]  # fmt: skip
        if not rels:
            return {}
        jobs = [(-1, FileRef(self.tree.abs(rel), size=self.tree.size(rel), optional=True))
                for rel in rels[:MAX_LOOSE]]  # fmt: skip
        out = {}
        for res in self._run(jobs):
            if res.codec is None and res.error == NO_CODEC:
                res = FileResult(res.serial, res.ref, None, [], bare_pickle_problem(
                    self.storage.blob(res.ref.path, res.ref.size)) or res.error)
            out[self.tree.rel(res.ref.path)] = res
        return out

    def _ask(self, hook: Callable[[Tree, SerialInfo], list[str]], info: SerialInfo) -> set[str]:
        """A layout hook's files of one serial (relative paths); none if it fails."""
        try:
            return set(hook(self.tree, info))
        except Exception:  # noqa: BLE001 - a label or an owner never fails the files table
            return set()

    @property
    def warnings(self) -> list[str]:
        """Tree-level problems no serial's verdict covers (DESIGN.md §3c); formed once per
        listing (every served page's summary names them)."""
        return list(self._table("warnings", lambda: tree_warnings(self.files)))

    @property
    def latest(self) -> int | None:
        df = self.serials
        hit = df.index[df["latest"]]
        return int(hit[0]) if len(hit) else None

    # -- values ---------------------------------------------------------------------
    def resolve(
        self, name: str, serial: int | None, node: str | None
    ) -> tuple[VarInfo, FileResult]:
        """The header record of a variable and the listing of its file."""
        self.file_results()
        with self._lock:
            if not self._index and self._results:
                self._build_index()
        if serial is None:
            serial = self.latest
            if serial is None:
                serials = self.serials.index
                if len(serials) == 0:
                    raise KeyError("the tree has no serials")
                serial = int(serials.max())
        serial = int(serial)
        hit = self._index.get((serial, node or "", name))
        if hit is None:
            same = [k for k in self._index if k[0] == serial and k[2] == name]
            if not node and len(same) == 1:
                hit = self._index[same[0]]
        if hit is not None:
            i, res = hit
            return res.variables[i], res
        if not same:
            listed = self._listed_error(serial, node, name)
            if listed is not None:  # a row the catalog lists with its error: say that
                raise ValueError(f"{name}: {listed}")
            raise KeyError(f"no variable {name!r} in serial {serial}")
        nodes = ", ".join(repr(k[1]) for k in same)
        raise KeyError(f"{name!r} in serial {serial} is on several nodes ({nodes}): pass node=")

    def _listed_error(self, serial: int, node: str | None, name: str) -> str | None:
        """The error of a ``variables`` row no file lists as a variable (a file that does
        not parse is a row named after it), else None."""
        v = self.variables
        hit = v[(v["serial"] == serial) & (v["name"] == name) & v["error"].notna()]
        if node:
            hit = hit[hit["node"] == node]
        return str(hit["error"].iloc[0]) if len(hit) else None

    def _codec_blob(self, res: FileResult) -> tuple[Codec, Blob]:
        codec = registry.get_codec(res.codec)
        return codec, self.storage.blob(res.ref.path, res.ref.size)

    def read(self, name: str, serial: int | None = None, node: str = "",
             dequantize: bool = True) -> np.ndarray:  # fmt: skip
        """One variable's values (default serial: the latest); a logical tensor assembled
        from its pieces; a quantized group dequantized, or its stored weight."""
        var, res = self.resolve(name, serial, node)
        if var.error:
            raise ValueError(f"{name}: {var.error}")
        if res.codec == ASSEMBLED:
            return read_assembled(var, self._read_piece, self._chunk_piece, run=self._concurrently)
        if res.codec == QUANTIZED:
            return read_quantized(var, self._read_piece, dequantize)
        if not dequantize and var.attrs.get("quant"):
            codec, blob = self._codec_blob(res)
            return codec.read_stored(blob, var)
        return self._read_piece(res, var)

    def _concurrently(self, fn: Callable, items: list, cost: Callable | None = None) -> Iterator:
        """``fn(item)`` per item in order; the pieces of a tensor read concurrently on remote
        storage (``Storage.map_window``), one after another on local disk."""
        return self.storage.map_window(fn, items, cost)

    def _read_piece(self, res: FileResult, var: VarInfo) -> np.ndarray:
        if var.error:
            raise ValueError(f"{var.name}: {var.error}")
        codec, blob = self._codec_blob(res)
        return codec.read(blob, var)

    def piece_name(self, res: FileResult, var: VarInfo) -> str:
        """The catalog name of a stored variable (prefix included)."""
        return var_name(res.ref, var)

    def iter_piece(self, res: FileResult, var: VarInfo, max_bytes: int) -> Iterator[np.ndarray]:
        """One stored variable's values as flat chunks (a piece of a logical tensor)."""
        return self._chunk_piece(res, var, max_bytes)

    def _chunk_piece(self, res: FileResult, var: VarInfo, max_bytes: int) -> Iterator[np.ndarray]:
        if var.error:
            raise ValueError(f"{var.name}: {var.error}")
        codec, blob = self._codec_blob(res)
        return codec.iter_chunks(blob, var, max_bytes)

    def iter_chunks(self, name: str, serial: int | None = None, node: str = "",
                    max_bytes: int = 64 << 20) -> Iterator[np.ndarray]:  # fmt: skip
        """A variable's values as flat pieces of about ``max_bytes`` (bounded memory)."""
        var, res = self.resolve(name, serial, node)
        if var.error:
            raise ValueError(f"{name}: {var.error}")
        if res.codec == ASSEMBLED:
            return iter_assembled(var, self._read_piece, self._chunk_piece, max_bytes, self._concurrently)
        if res.codec == QUANTIZED:
            return iter_quantized(var, self._read_piece, max_bytes)
        return self._chunk_piece(res, var, max_bytes)

    def load(self, serial: int | None = None) -> dict[str, np.ndarray]:
        """Every variable of a serial keyed by name (``node/name`` where a name repeats)."""
        if serial is None:
            serial = self.latest
        df = self.variables
        df = df[(df["serial"] == serial) & df["error"].isna()]
        counts = df["name"].value_counts()
        out = {}
        for row in df.itertuples():
            key = row.name if counts[row.name] == 1 else f"{row.node}/{row.name}"
            out[key] = self.read(row.name, serial=serial, node=row.node)
        return out

    def refresh(self) -> None:
        """Forget the listing and every table: the next access rescans the tree."""
        with self._lock:
            self.tree.forget()
            self._found = self._results = self._logical = None
            self._tables = {}
            self._index = {}
            self._deep = {}
            self._checked = None
