"""The catalog's tables (variables, serials, metrics, files) built from a scan's file results."""

from __future__ import annotations

import posixpath
from datetime import datetime

import pandas as pd

from ..dtypes import itemsize
from ..kinds import guess_kind
from ..model import FileRef, TreeScan, VarInfo
from ..tree import Tree
from .listing import FileResult

SERIAL_COLUMNS = [
    "path", "complete", "latest", "timestamp", "nbytes", "n_files", "n_variables",
    "epoch", "step", "nodes", "error",
]  # fmt: skip
VARIABLE_COLUMNS = [
    "serial", "node", "name", "kind", "dtype", "shape", "numel", "nbytes", "file", "error",
    "alias",
]  # fmt: skip
FILE_COLUMNS = ["serial", "node", "path", "size", "codec", "n_variables", "error"]
#: VarInfo.attrs keys that give a variable's other name (TF object-graph path, Paddle param)
ALIAS_ATTRS = ("full_name", "param_name")


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


def _none_or_str(col: pd.Series) -> pd.Series:
    """An ``error`` column as object dtype holding str or None (pandas 3 would infer a str
    dtype whose missing value is NaN; DESIGN.md §3 promises None)."""
    return pd.Series([v if isinstance(v, str) else None for v in col], index=col.index,
                     dtype=object)  # fmt: skip


def file_size(tree: Tree, path: str) -> int:
    """A file's size from the listing, else from storage (0 when it is gone)."""
    rel = tree.rel(path)
    if rel in tree.entries:
        return tree.entries[rel]["size"]
    try:
        return tree.storage.info(path)["size"]
    except (FileNotFoundError, OSError):
        return 0


def file_mtime(tree: Tree, path: str) -> datetime | None:
    rel = tree.rel(path)
    entry = tree.entries.get(rel)
    return entry.get("mtime") if entry else None


def variables_table(tree: Tree, results: list[FileResult]) -> pd.DataFrame:
    """One row per variable (and one per unreadable file)."""
    storage = tree.storage
    rows: list[tuple] = []
    append = rows.append  # hot loop: a million rows on big trees (tests/test_scale.py)
    for res in results:
        url = storage.url(res.ref.path)
        ref, serial, node, ref_kind = res.ref, res.serial, res.ref.node, res.ref.kind
        for var in res.variables:
            name = var_name(ref, var)
            numel = var.numel
            nbytes = var.nbytes
            if nbytes is None:
                nbytes = numel * itemsize(var.dtype) if var.dtype != "object" else 0
            attrs = var.attrs
            alias = next((attrs[k] for k in ALIAS_ATTRS if attrs.get(k)), None) if attrs else None
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


def serials_table(tree: Tree, found: TreeScan, results: list[FileResult]) -> pd.DataFrame:
    """One row per serial (index: serial); ``latest`` marks :func:`latest_from`'s pick."""
    by_serial: dict[int, list[FileResult]] = {}
    for res in results:
        by_serial.setdefault(res.serial, []).append(res)
    rows = []
    for s in sorted(found.serials, key=lambda s: s.serial):
        files = by_serial.get(s.serial, [])
        errors = [f"{posixpath.basename(r.ref.path)}: {r.error}" for r in files if r.error]
        complete = s.complete if s.complete is not None else not errors
        paths = [r.ref.path for r in files]
        sizes = [
            r.ref.size if r.ref.size is not None else file_size(tree, r.ref.path) for r in files
        ]
        others = [p for p in s.other_files if p not in paths]
        sizes += [file_size(tree, p) for p in others]
        stamps = [file_mtime(tree, p) for p in paths + others]
        mtimes = [m for m in stamps if m is not None]
        timestamp = s.timestamp or (max(mtimes) if mtimes else None)
        nodes = (
            s.nodes if s.nodes is not None else tuple(sorted({r.ref.node for r in files} - {""}))
        )
        n_vars = sum(len(r.variables) + (1 if r.error else 0) for r in files)
        error = "; ".join(([s.error] if s.error else []) + errors) or None
        rows.append(
            (s.serial, tree.storage.url(s.path), bool(complete), False, timestamp, int(sum(sizes)),
             len(paths) + len(others), n_vars, s.epoch, s.step, tuple(nodes), error)
        )  # fmt: skip
    df = pd.DataFrame(rows, columns=["serial", *SERIAL_COLUMNS])
    df["error"] = _none_or_str(df["error"])
    df["timestamp"] = pd.to_datetime(df["timestamp"], utc=True).astype("datetime64[ns, UTC]")
    df = df.astype({"serial": "int64", "nbytes": "int64", "n_files": "int64",
                    "n_variables": "int64", "epoch": "Int64", "step": "Int64"})  # fmt: skip
    df = df.set_index("serial").sort_index()
    latest = latest_from(df, found)
    if latest is not None:
        df.loc[latest, "latest"] = True
    return df


def latest_from(df: pd.DataFrame, found: TreeScan) -> int | None:
    """The framework's resume pick when it is loadable, else the newest loadable serial.

    Loadable: complete and read without error. When the framework's own pointer names a
    serial that is not loadable (corrupt, hostile, half-written), the catalog falls back to
    the newest loadable one and keeps the pointer in ``attrs["framework_latest"]``.
    """
    loadable = df.index[df["complete"].astype(bool) & df["error"].isna()]
    if found.latest_rule:
        if found.latest is None or found.latest in loadable:
            return found.latest
        found.attrs["framework_latest"] = found.latest
        older = [s for s in loadable if s < found.latest]
        return int(max(older)) if older else (int(loadable.max()) if len(loadable) else None)
    return int(loadable.max()) if len(loadable) else None


def metrics_table(found: TreeScan) -> pd.DataFrame:
    """One row per (serial, metric name): the tree-level metrics, then each serial's."""
    rows = list(found.metrics)
    for s in found.serials:
        rows += [(s.serial, k, v) for k, v in s.metrics.items()]
    df = pd.DataFrame(rows, columns=["serial", "name", "value"])
    return df.astype({"serial": "int64", "value": "float64"})


def files_table(tree: Tree, results: list[FileResult]) -> pd.DataFrame:
    """One row per data file: serial, node, path, size, codec, n_variables, error."""
    rows = [
        (r.serial, r.ref.node, tree.storage.url(r.ref.path),
         r.ref.size if r.ref.size is not None else file_size(tree, r.ref.path), r.codec,
         len(r.variables), r.error)
        for r in results
    ]  # fmt: skip
    return pd.DataFrame(rows, columns=FILE_COLUMNS)
