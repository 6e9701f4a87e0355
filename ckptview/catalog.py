"""Catalog: a checkpoint tree as pandas tables, built from headers only."""

from __future__ import annotations

import posixpath
import threading
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import registry
from .codecs.base import Codec, PartialRead
from .io import Storage
from .kinds import guess_kind
from .model import FileRef, SerialInfo, TreeScan, VarInfo
from .tree import Tree

SERIAL_COLUMNS = [
    "path", "complete", "latest", "timestamp", "nbytes", "n_files", "n_variables",
    "epoch", "step", "nodes", "error",
]  # fmt: skip
VARIABLE_COLUMNS = [
    "serial", "node", "name", "kind", "dtype", "shape", "numel", "nbytes", "file", "error",
    "alias",
]  # fmt: skip
#: VarInfo.attrs keys that give a variable's other name (TF object-graph path, Paddle param)
ALIAS_ATTRS = ("full_name", "param_name")

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


def list_file(storage: Storage, serial: int, ref: FileRef) -> FileResult:
    """Detect the codec of one file and list its variables; never raises."""
    blob = storage.blob(ref.path, ref.size)
    codec: Codec | None = None
    try:
        if ref.codec:
            codec = registry.get_codec(ref.codec)
        else:
            head = blob.head() if blob.size else b""
            codec = registry.detect_codec(posixpath.basename(ref.path), head, blob)
        if codec is None:
            if ref.optional:
                return FileResult(serial, ref, None, [])
            return FileResult(serial, ref, None, [], "no codec recognizes this file")
        variables = codec.list_variables(blob, ref.hints)
        return FileResult(serial, ref, codec.name, variables)
    except PartialRead as e:
        return FileResult(serial, ref, codec.name if codec else None, e.variables, str(e))
    except Exception as e:  # noqa: BLE001 - a bad file becomes an error row, never a crash
        return FileResult(serial, ref, codec.name if codec else None, [], _message(e))


def _none_or_str(col: pd.Series) -> pd.Series:
    """An ``error`` column as object dtype holding str or None (pandas 3 would infer a str
    dtype whose missing value is NaN; DESIGN.md §3 promises None)."""
    return pd.Series([v if isinstance(v, str) else None for v in col], index=col.index,
                     dtype=object)  # fmt: skip


def _message(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return f"{type(e).__name__}: {text}"[:500]


class Catalog:
    """A checkpoint tree's serials, variables and metrics (see DESIGN.md §3)."""

    def __init__(self, tree: Tree, layout, executor: Executor | None = None, cache=None,
                 progress=None):  # fmt: skip
        from .cache import resolve

        self.tree = tree
        #: ``progress(done, total)``: called per file as a scan lists headers (a UI hook)
        self.progress = progress
        self.storage = tree.storage
        self._layout = layout
        self.executor = executor
        self.cache = resolve(cache)  # header cache: see ckptview.cache
        if getattr(tree, "cache", None) is None:
            tree.cache = self.cache
        self._lock = threading.RLock()
        self._scan: TreeScan | None = None
        self._results: list[FileResult] | None = None
        self._tables: dict[str, pd.DataFrame] = {}
        self._index: dict[tuple[int, str, str], tuple[VarInfo, FileResult]] = {}

    # -- construction ---------------------------------------------------------------
    @property
    def layout(self) -> str:
        return self._layout.name

    @property
    def url(self) -> str:
        return self.tree.url(self.tree.single or "")

    def __repr__(self) -> str:
        return f"<ckptview.Catalog {self.layout} {self.url}>"

    @property
    def scan(self) -> TreeScan:
        with self._lock:
            if self._scan is None:
                self._scan = self._layout.scan(self.tree)
            return self._scan

    def _serial_infos(self) -> dict[int, SerialInfo]:
        return {s.serial: s for s in self.scan.serials}

    def _file_results(self) -> list[FileResult]:
        with self._lock:
            if self._results is None:
                jobs = [(s.serial, ref) for s in self.scan.serials for ref in s.files]
                self._results = self._run(jobs)
                self._index = {}  # built on the first read (_resolve): costly at 1e6 rows
            return self._results

    def _run(self, jobs: list[tuple[int, FileRef]]) -> list[FileResult]:
        """List files through the header cache; misses run concurrently on the executor."""
        from .cache import run_listings

        ex = self.executor or default_executor()
        return run_listings(self.storage, self.tree, jobs, ex, self.cache, self.progress)

    def __getstate__(self) -> dict:  # picklable for process executors (Dask diff/stats jobs)
        state = self.__dict__.copy()
        state.update(_lock=None, executor=None, _tables={}, progress=None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.RLock())

    def _build_index(self) -> None:
        self._index = {}
        for res in self._results or []:
            for var in res.variables:
                name = var_name(res.ref, var)
                self._index.setdefault((res.serial, res.ref.node, name), (var, res))

    # -- tables ---------------------------------------------------------------------
    @property
    def variables(self) -> pd.DataFrame:
        with self._lock:
            if "variables" not in self._tables:
                self._tables["variables"] = self._variables_table()
            return self._tables["variables"]

    def _variables_table(self) -> pd.DataFrame:
        from .dtypes import itemsize

        rows = []
        append = rows.append  # hot loop: a million rows on big trees (tests/test_scale.py)
        for res in self._file_results():
            url = self.storage.url(res.ref.path)
            ref, serial, node, ref_kind = res.ref, res.serial, res.ref.node, res.ref.kind
            for var in res.variables:
                name = var_name(ref, var)
                numel = var.numel
                nbytes = var.nbytes
                if nbytes is None:
                    nbytes = numel * itemsize(var.dtype) if var.dtype != "object" else 0
                attrs = var.attrs
                alias = (
                    next((attrs[k] for k in ALIAS_ATTRS if attrs.get(k)), None) if attrs else None
                )
                append(
                    (serial, node, name, var.kind or ref_kind or guess_kind(name),
                     var.dtype, tuple(map(int, var.shape)), numel, int(nbytes), url, var.error,
                     alias)
                )  # fmt: skip
            if res.error:
                rows.append(
                    (res.serial, res.ref.node, _file_row_name(res.ref), "other", "object", (),
                     0, 0, url, res.error, None)
                )  # fmt: skip
        df = pd.DataFrame(rows, columns=VARIABLE_COLUMNS)
        df["error"] = _none_or_str(df["error"])
        df["alias"] = _none_or_str(df["alias"])
        return df.astype({"serial": "int64", "numel": "int64", "nbytes": "int64"})

    @property
    def serials(self) -> pd.DataFrame:
        with self._lock:
            if "serials" not in self._tables:
                self._tables["serials"] = self._serials_table()
            return self._tables["serials"]

    def _serials_table(self) -> pd.DataFrame:
        results = self._file_results()
        by_serial: dict[int, list[FileResult]] = {}
        for res in results:
            by_serial.setdefault(res.serial, []).append(res)
        rows = []
        for s in sorted(self.scan.serials, key=lambda s: s.serial):
            files = by_serial.get(s.serial, [])
            errors = [f"{posixpath.basename(r.ref.path)}: {r.error}" for r in files if r.error]
            complete = s.complete if s.complete is not None else not errors
            paths = [r.ref.path for r in files]
            sizes = [
                r.ref.size if r.ref.size is not None else self._size(r.ref.path) for r in files
            ]
            others = [p for p in s.other_files if p not in paths]
            sizes += [self._size(p) for p in others]
            mtimes = [self._mtime(p) for p in paths + others]
            mtimes = [m for m in mtimes if m is not None]
            timestamp = s.timestamp or (max(mtimes) if mtimes else None)
            nodes = (
                s.nodes
                if s.nodes is not None
                else tuple(sorted({r.ref.node for r in files} - {""}))
            )
            n_vars = sum(len(r.variables) + (1 if r.error else 0) for r in files)
            error = "; ".join(([s.error] if s.error else []) + errors) or None
            rows.append(
                (s.serial, self.storage.url(s.path), bool(complete), False, timestamp, int(sum(sizes)),
                 len(paths) + len(others), n_vars, s.epoch, s.step, tuple(nodes), error)
            )  # fmt: skip
        df = pd.DataFrame(rows, columns=["serial", *SERIAL_COLUMNS])
        df["error"] = _none_or_str(df["error"])
        df["timestamp"] = pd.to_datetime(df["timestamp"], utc=True).astype("datetime64[ns, UTC]")
        df = df.astype({"serial": "int64", "nbytes": "int64", "n_files": "int64",
                        "n_variables": "int64", "epoch": "Int64", "step": "Int64"})  # fmt: skip
        df = df.set_index("serial").sort_index()
        latest = self._latest_from(df)
        if latest is not None:
            df.loc[latest, "latest"] = True
        return df

    def _latest_from(self, df: pd.DataFrame) -> int | None:
        """The framework's resume pick when it is loadable, else the newest loadable serial.

        Loadable: complete and read without error. When the framework's own pointer names a
        serial that is not loadable (corrupt, hostile, half-written), the catalog falls back to
        the newest loadable one and keeps the pointer in ``attrs["framework_latest"]``.
        """
        loadable = df.index[df["complete"].astype(bool) & df["error"].isna()]
        scan = self.scan
        if scan.latest_rule:
            if scan.latest is None or scan.latest in loadable:
                return scan.latest
            scan.attrs["framework_latest"] = scan.latest
            older = [s for s in loadable if s < scan.latest]
            return int(max(older)) if older else (int(loadable.max()) if len(loadable) else None)
        return int(loadable.max()) if len(loadable) else None

    def _size(self, path: str) -> int:
        rel = self.tree.rel(path)
        if rel in self.tree.entries:
            return self.tree.entries[rel]["size"]
        try:
            return self.storage.info(path)["size"]
        except (FileNotFoundError, OSError):
            return 0

    def _mtime(self, path: str):
        rel = self.tree.rel(path)
        entry = self.tree.entries.get(rel)
        return entry.get("mtime") if entry else None

    @property
    def latest(self) -> int | None:
        df = self.serials
        hit = df.index[df["latest"]]
        return int(hit[0]) if len(hit) else None

    @property
    def metrics(self) -> pd.DataFrame:
        with self._lock:
            if "metrics" not in self._tables:
                rows = list(self.scan.metrics)
                for s in self.scan.serials:
                    rows += [(s.serial, k, v) for k, v in s.metrics.items()]
                df = pd.DataFrame(rows, columns=["serial", "name", "value"])
                self._tables["metrics"] = df.astype({"serial": "int64", "value": "float64"})
            return self._tables["metrics"]

    @property
    def files(self) -> pd.DataFrame:
        """One row per data file: serial, node, path, size, codec, n_variables, error."""
        rows = [
            (r.serial, r.ref.node, self.storage.url(r.ref.path),
             r.ref.size if r.ref.size is not None else self._size(r.ref.path), r.codec,
             len(r.variables), r.error)
            for r in self._file_results()
        ]  # fmt: skip
        return pd.DataFrame(
            rows, columns=["serial", "node", "path", "size", "codec", "n_variables", "error"]
        )

    @property
    def attrs(self) -> dict:
        """Tree-level facts a layout found (e.g. ``best_model_checkpoint``)."""
        return dict(self.scan.attrs)

    # -- values ---------------------------------------------------------------------
    def _resolve(
        self, name: str, serial: int | None, node: str | None
    ) -> tuple[VarInfo, FileResult]:
        self._file_results()
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
        if hit is not None:
            return hit
        same = [k for k in self._index if k[0] == serial and k[2] == name]
        if not node and len(same) == 1:
            return self._index[same[0]]
        if not same:
            raise KeyError(f"no variable {name!r} in serial {serial}")
        nodes = ", ".join(repr(k[1]) for k in same)
        raise KeyError(f"{name!r} in serial {serial} is on several nodes ({nodes}): pass node=")

    def variable(self, name: str, serial: int | None = None, node: str = "") -> VarInfo:
        """The header record of one variable."""
        return self._resolve(name, serial, node)[0]

    def _codec_blob(self, res: FileResult):
        codec = registry.get_codec(res.codec)
        return codec, self.storage.blob(res.ref.path, res.ref.size)

    def read(self, name: str, serial: int | None = None, node: str = "") -> np.ndarray:
        """One variable's values (default serial: the latest)."""
        var, res = self._resolve(name, serial, node)
        if var.error:
            raise ValueError(f"{name}: {var.error}")
        codec, blob = self._codec_blob(res)
        return codec.read(blob, var)

    def iter_chunks(self, name: str, serial: int | None = None, node: str = "",
                    max_bytes: int = 64 << 20):  # fmt: skip
        """A variable's values as flat pieces of about ``max_bytes`` (bounded memory)."""
        var, res = self._resolve(name, serial, node)
        if var.error:
            raise ValueError(f"{name}: {var.error}")
        codec, blob = self._codec_blob(res)
        return codec.iter_chunks(blob, var, max_bytes)

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

    # -- compare, follow, restore, retain (thin delegations; see stats/diff/restore/retention)
    def refresh(self) -> Catalog:
        """Forget the listing and every table: the next access rescans the tree."""
        with self._lock:
            if self.tree._entries is None:
                self.tree.__dict__.pop("entries", None)
                self.storage.fs.invalidate_cache(self.tree.root)  # s3fs & co. cache listings
            self._scan = self._results = None
            self._tables = {}
            self._index = {}
        return self

    def stats(self, serial: int | None = None, names=None, **kwargs) -> pd.DataFrame:
        """Per-variable min, max, mean, std, l2, n_nan, n_inf, frac_zero (streamed)."""
        from .stats import stats

        return stats(self, serial, names, **kwargs)

    def diff(self, a: int | None, b: int | None, other: Catalog | None = None, names=None,
             **kwargs) -> pd.DataFrame:  # fmt: skip
        """Variable-by-variable numeric diff of serial ``a`` and ``b`` (of ``other``)."""
        from .diff import diff

        return diff(self, a, b, other, names, **kwargs)

    def trajectory(self, name: str, stat: str = "l2", node: str = "") -> pd.Series:
        """One statistic of one variable across serials."""
        from .stats import trajectory

        return trajectory(self, name, stat, node)

    def restore(self, serial: int, to=None, dry_run: bool = False, **kwargs):
        """Copy ``serial`` to ``to``, or promote it in place; never deletes."""
        from .restore import restore

        return restore(self, serial, to, dry_run, **kwargs)

    def plan_retention(self, keep_last=None, keep_every=None, keep_best=None, pinned=(),
                       older_than=None, **kwargs) -> pd.DataFrame:  # fmt: skip
        """Which serials a retention policy keeps and deletes (nothing is changed)."""
        from .retention import plan_retention

        return plan_retention(self, keep_last, keep_every, keep_best, pinned, older_than,
                              **kwargs)  # fmt: skip

    def apply_retention(self, plan: pd.DataFrame, **kwargs) -> pd.DataFrame:
        """Delete what ``plan`` says, after re-checking the tree; returns what was deleted."""
        from .retention import apply_retention

        return apply_retention(self, plan, **kwargs)

    def set_retention(self, policy=None, **kwargs):
        """Store a retention policy with the tree (``.ckptview/retention.json``)."""
        from .retention import set_retention

        return set_retention(self, policy, **kwargs)

    def retention_policy(self):
        """The policy stored with the tree, or None."""
        from .retention import retention_policy

        return retention_policy(self)


def var_name(ref: FileRef, var: VarInfo) -> str:
    """A variable's catalog name: the file's prefix joined with the codec's name for it.

    An unnamed variable (a file holding one tensor) takes the prefix, else the file's name.
    """
    if not var.name:
        return ref.prefix or posixpath.basename(ref.path)
    return _join(ref.prefix, var.name)


def _file_row_name(ref: FileRef) -> str:
    """The name of the row standing for a whole file that could not be read."""
    base = posixpath.basename(ref.path)
    return ref.prefix if ref.prefix.endswith(base) else _join(ref.prefix, base)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}/{name}" if prefix else name
