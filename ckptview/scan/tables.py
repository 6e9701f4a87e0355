"""The catalog's tables (variables, serials, metrics, files) built from a scan's file results."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from itertools import repeat
from typing import Any

import numpy as np
import pandas as pd

from .. import registry
from ..dtypes import itemsize
from ..io import utc_time
from ..kinds import guess_kind
from ..model import META_DIR, FileRef, SerialInfo, TreeScan, VarInfo, as_columns, with_errors
from ..tree import Tree
from .listing import NO_CODEC, FileResult

SERIAL_COLUMNS = [
    "path", "complete", "latest", "timestamp", "nbytes", "n_files", "n_variables",
    "epoch", "step", "nodes", "error", "loadable", "warning",
]  # fmt: skip
VARIABLE_COLUMNS = [
    "serial", "node", "name", "kind", "dtype", "shape", "numel", "nbytes", "file", "error",
    "alias", "n_shards", "quant",
]  # fmt: skip
SHARD_COLUMNS = [
    "serial", "name", "node", "file", "stored_name", "offsets", "shape", "dtype", "nbytes",
    "role", "placement",
]  # fmt: skip
FILE_COLUMNS = ["path", "size", "serial", "node", "role", "codec", "n_variables", "error"]
ROLES = ("data", "index", "marker", "state", "metadata", "unclaimed")
#: pointer and state files frameworks keep beside their serials
STATE_NAMES = frozenset({
    "latest", "checkpoint", "latest_checkpointed_iteration.txt", "trainer_state.json",
    "checkpoint_state", "_CHECKPOINT_METADATA", "__paddle_checkpoint__", "last.ckpt",
})  # fmt: skip
DATA_NAME = re.compile(r"\.data-\d+-of-\d+$|\.distcp$", re.I)  # TF bundle shards, DCP payloads
INDEX_NAME = re.compile(r"(^|\.)index(\.json)?$|(^|\.)metadata$|\.index$", re.I)
#: VarInfo.attrs keys that give a variable's other name (TF object-graph path, Paddle param)
ALIAS_ATTRS = ("full_name", "param_name")


def var_name(ref: FileRef, var: VarInfo) -> str:
    """A variable's catalog name: the file's prefix joined with the codec's name for it.

    An unnamed variable (a file holding one tensor) takes the prefix, else the file's name.
    """
    if not var.name:
        return ref.prefix or posixpath.basename(ref.path)
    return _join(ref.prefix, var.name)


def catalog_names(ref: FileRef, variables: Sequence[VarInfo]) -> list[str]:
    """The catalog names of a file's variables (from the names alone for columns)."""
    if as_columns(variables) is not None:
        prefix = ref.prefix
        return [f"{prefix}/{n}" for n in variables.names] if prefix else variables.names
    return [var_name(ref, v) for v in variables]


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


def file_mtime(tree: Tree, path: str) -> float | None:
    """A file's mtime from the listing (POSIX seconds), None when unknown."""
    rel = tree.rel(path)
    entry = tree.entries.get(rel)
    return entry.get("mtime") if entry else None


class _Ints:
    """An int64 column gathered from whole arrays (columns) and single values (records)."""

    def __init__(self) -> None:
        self.chunks: list[np.ndarray] = []
        self.values: list[int] = []

    def add(self, chunk: np.ndarray) -> None:
        if self.values:
            self.chunks.append(np.array(self.values, dtype=np.int64))
            self.values.clear()  # the same list: callers hold its bound append
        self.chunks.append(chunk)

    def array(self) -> np.ndarray:
        self.add(np.empty(0, dtype=np.int64))
        return np.concatenate(self.chunks)


def variables_table(tree: Tree, results: list[FileResult]) -> pd.DataFrame:
    """One row per variable (and one per unreadable file), built column by column: a file
    listed as columns (:class:`~ckptview.model.VarColumns`) extends them whole, other files
    add their variables one by one; one DataFrame at the end (a million rows on big trees,
    tests/test_scale.py)."""
    url_of = tree.storage.url
    serials, numels, nbytes_col, n_shards = _Ints(), _Ints(), _Ints(), _Ints()
    nodes: list[str] = []
    names: list[str] = []
    kinds: list[str] = []
    dtypes: list[str] = []
    shapes: list[tuple] = []
    files: list[str] = []
    errors: list[str | None] = []
    aliases: list[str | None] = []
    quants: list[str | None] = []
    guessed: dict[str, str] = {}  # name -> kind (names repeat across serials)

    def kind_of(name: str) -> str:
        kind = guessed.get(name)
        if kind is None:
            kind = guessed[name] = guess_kind(name)
        return kind

    serial_values_append, numel_values_append = serials.values.append, numels.values.append
    nbytes_values_append, shards_values_append = nbytes_col.values.append, n_shards.values.append
    nodes_append, names_append, kinds_append = nodes.append, names.append, kinds.append
    dtypes_append, shapes_append, files_append = dtypes.append, shapes.append, files.append
    errors_append, aliases_append, quants_append = errors.append, aliases.append, quants.append
    for res in results:
        url = url_of(res.ref.path)
        ref, serial, node, ref_kind = res.ref, res.serial, res.ref.node, res.ref.kind
        variables = res.variables
        if as_columns(variables) is not None:
            n = len(variables)
            row_names = catalog_names(ref, variables)
            serials.add(np.full(n, serial, dtype=np.int64))
            nodes += [node] * n
            names += row_names
            col_kinds = variables.kinds
            if col_kinds is not None:  # each row's own kind first, as a record's
                kinds += [k or ref_kind or guessed.get(name) or kind_of(name)
                          for k, name in zip(col_kinds, row_names)]  # fmt: skip
            elif ref_kind:
                kinds += [ref_kind] * n
            else:
                known = list(map(guessed.get, row_names))
                if None in known:
                    known = [k or kind_of(name) for k, name in zip(known, row_names)]
                kinds += known
            dtypes += variables.dtypes
            shapes += variables.shapes
            numels.add(variables.numels)
            nbytes_col.add(variables.nbytes)
            files += [url] * n
            errors += [None] * n
            aliases += [None] * n if variables.aliases is None else variables.aliases
            n_shards.add(np.ones(n, dtype=np.int64))
            quants += [None] * n
        else:
            prefix = ref.prefix
            for var in variables:
                name = var.name
                if name:
                    name = f"{prefix}/{name}" if prefix else name
                else:  # one unnamed tensor: the prefix names it, else the file
                    name = prefix or posixpath.basename(ref.path)
                shape = var.shape
                if type(shape) is not tuple or not all(type(d) is int for d in shape):
                    shape = tuple(map(int, shape))
                numel = 1
                for d in shape:
                    numel *= d
                nbytes = var.nbytes
                dtype = var.dtype
                if nbytes is None:
                    nbytes = numel * itemsize(dtype) if dtype != "object" else 0
                attrs = var.attrs
                alias = shards_n = quant = None
                if attrs:
                    alias = next((attrs[k] for k in ALIAS_ATTRS if attrs.get(k)), None)
                    shards_n, quant = attrs.get("n_shards"), attrs.get("quant")
                serial_values_append(serial)
                nodes_append(node)
                names_append(name)
                kinds_append(var.kind or ref_kind or guessed.get(name) or kind_of(name))
                dtypes_append(dtype)
                shapes_append(shape)
                numel_values_append(numel)
                nbytes_values_append(int(nbytes))
                files_append(url)
                error = var.error
                errors_append(error if type(error) is str else _str_or_none(error))
                aliases_append(alias if alias is None else _str_or_none(alias))
                shards_values_append(1 if shards_n is None else shards_n)
                quants_append(quant if quant is None else _str_or_none(quant))
        if res.error and not foreign(res):
            serials.values.append(res.serial)
            nodes.append(res.ref.node)
            names.append(_file_row_name(res.ref))
            kinds.append("other")
            dtypes.append("object")
            shapes.append(())
            numels.values.append(0)
            nbytes_col.values.append(0)
            files.append(url)
            errors.append(_str_or_none(res.error))
            aliases.append(None)
            n_shards.values.append(0)
            quants.append(None)
    shape_col = np.empty(len(shapes), dtype=object)  # tuples kept whole (not a 2-d array)
    shape_col[:] = shapes
    columns = {
        "serial": serials.array(),
        "node": _strings(nodes),
        "name": _strings(names),
        "kind": _strings(kinds),
        "dtype": _strings(dtypes),
        "shape": shape_col,
        "numel": numels.array(),
        "nbytes": nbytes_col.array(),
        "file": _strings(files),
        "error": _objects(errors),
        "alias": _objects(aliases),
        "n_shards": n_shards.array(),
        "quant": _objects(quants),
    }
    return pd.DataFrame(columns, columns=VARIABLE_COLUMNS, copy=False)


#: pandas' string dtype, as inference gives; its arrays are made directly (a Series per
#: column made the DataFrame align their indexes: 40 % of a small table's build)
_STR = pd.api.types.pandas_dtype("str")
_STR_ARRAY = _STR.construct_array_type()


def _strings(values: list[str]) -> pd.api.extensions.ExtensionArray:
    """A str column (an extension array of :data:`_STR`)."""
    return _STR_ARRAY._from_sequence(np.array(values, dtype=object), dtype=_STR)


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _objects(values: list) -> pd.Series:
    """An object column (str or None: pandas 3 would infer a str dtype whose missing value
    is NaN, from an array too; DESIGN.md §3 promises None)."""
    if values.count(None) == len(values):
        out = np.full(len(values), None, dtype=object)
    else:
        out = np.empty(len(values), dtype=object)
        out[:] = values
    return pd.Series(out, dtype=object, copy=False)


def foreign(res: FileResult) -> bool:
    """A file the layout offered in case a codec knows it (``FileRef.optional``) and none
    does: listed in ``files`` and as a warning, not as a variable row."""
    if not (res.ref.optional and res.codec is None and res.error == NO_CODEC):
        return False
    return not res.ref.path.lower().endswith(registry.known_suffixes())


def blocking(res: FileResult) -> bool:
    """Whether a problem of this file keeps its serial from loading."""
    return res.ref.required and not foreign(res)


def _name(res: FileResult) -> str:
    return posixpath.basename(res.ref.path)


def index_mismatch(res: FileResult) -> str | None:
    """How a file's listing disagrees with the names its index puts there (None: agrees)."""
    if res.codec is None or res.error:
        return None
    cols = as_columns(res.variables)
    names = set(cols.names) if cols is not None else {v.name for v in res.variables}
    want = set(res.ref.expects or ())
    missing, extra = sorted(want - names), sorted(names - want)
    if not (missing or extra):
        return None
    parts = []
    if missing:
        parts.append(f"lacks {_some(missing)}, which the index puts there")
    if extra:
        parts.append(f"holds {_some(extra)}, which the index does not name")
    return f"{_name(res)}: " + "; ".join(parts)


def _some(names: list[str]) -> str:
    return ", ".join(repr(n) for n in names[:3]) + (f" (+{len(names) - 3} more)" if len(names) > 3 else "")


def pickled(variables: Sequence[VarInfo]) -> list[VarInfo]:
    """The variables stored as a pickle that a safe loader refuses (``attrs["needs_pickle"]``:
    an object ``.npy`` / ``.npz`` member), none in columns not yet made into records."""
    if as_columns(variables) is not None:
        return []
    return [v for v in variables if v.attrs and v.attrs.get("needs_pickle")]


def verdicts(s: SerialInfo, files: list[FileResult], deep: Sequence[str] = (),
             misfit: Sequence[str] = (),
             checked: Sequence[str] = ()) -> tuple[bool, str | None, bool, str | None]:  # fmt: skip
    """``(complete, error, loadable, warning)`` of one serial (DESIGN.md §3c).

    ``error``: the serial's own problem and those of the files its resume reads; ``warning``:
    problems of files it does not need. Loadable: complete, no such error, no unreadable
    variable in a required file, and at least one variable."""
    errors = [f"{_name(r)}: {r.error}" for r in files if r.error and blocking(r)]
    errors += [m for r in files if r.ref.expects is not None and (m := index_mismatch(r))]
    warnings = [f"{_name(r)}: {r.error}" for r in files if r.error and not blocking(r)]
    complete = s.complete if s.complete is not None else not errors
    errors += list(misfit)  # shapes the run's model refuses: complete, but it does not load
    for label, found in (("checksums", checked), ("deep verify", deep)):
        if found:  # what only the bytes tell: the serial does not load, its files are all there
            more = f" (+{len(found) - 3} more)" if len(found) > 3 else ""
            errors.append(f"{label}: {'; '.join(found[:3])}{more}")
    bad_vars = [(r, v) for r in files if r.ref.required for v in with_errors(r.variables)]
    errors += [f"{_name(r)}: {v.name or '(array)'}: an object array (a pickle): "
               "np.load(allow_pickle=False) refuses it"
               for r in files if r.ref.required for v in pickled(r.variables)]  # fmt: skip
    warnings += [f"{_name(r)}: {v.name or '(tensor)'}: {v.error}"
                 for r in files if not r.ref.required for v in with_errors(r.variables)]  # fmt: skip
    error = "; ".join(([s.error] if s.error else []) + errors) or None
    if bad_vars:
        shown = "; ".join(f"{v.name or _name(r)}: {v.error}" for r, v in bad_vars[:3])
        more = f" (+{len(bad_vars) - 3} more)" if len(bad_vars) > 3 else ""
        error = "; ".join(
            filter(None, [error, f"{len(bad_vars)} unreadable variable(s): {shown}{more}"])
        )
    if error is None and not any(r.variables for r in files):
        error = "no variables: no file of this serial holds any that ckptview can list"
    loadable = bool(complete) and error is None
    return bool(complete), error, loadable, "; ".join(warnings) or None


def serials_table(tree: Tree, found: TreeScan, results: list[FileResult],
                  slimmed: dict[int, dict] | None = None,
                  deep: dict[int, list[str]] | None = None,
                  misfit: dict[int, list[str]] | None = None,
                  checked: dict[int, list[str]] | None = None) -> pd.DataFrame:  # fmt: skip
    """One row per serial (index: serial); ``latest`` marks :func:`latest_from`'s pick;
    ``slimmed`` serials (optimizer state deleted by retention) are never loadable."""
    by_serial: dict[int, list[FileResult]] = {}
    for res in results:
        by_serial.setdefault(res.serial, []).append(res)
    rows = []
    for s in sorted(found.serials, key=lambda s: s.serial):
        files = by_serial.get(s.serial, [])
        complete, error, loadable, warning = verdicts(
            s, files, (deep or {}).get(s.serial, ()), (misfit or {}).get(s.serial, ()),
            (checked or {}).get(s.serial, ()))
        if slimmed and s.serial in slimmed:
            freed = int(slimmed[s.serial].get("nbytes", 0))
            note = f"slimmed: optimizer state deleted ({freed} bytes), not a resume point"
            loadable, warning = False, "; ".join(filter(None, [note, warning]))
        paths = [r.ref.path for r in files]
        sizes = [
            r.ref.size if r.ref.size is not None else file_size(tree, r.ref.path) for r in files
        ]
        others = [p for p in s.other_files if p not in paths]
        other_sizes = [file_size(tree, p) for p in others]
        sizes += other_sizes
        empty = [posixpath.basename(p) for p, n in zip(others, other_sizes, strict=True)
                 if empty_problem(p, n)]  # fmt: skip
        if empty:
            warning = "; ".join(filter(None, [warning, f"empty file(s): {', '.join(empty)}"]))
        stamps = [file_mtime(tree, p) for p in paths + others]
        mtimes = [m for m in stamps if m is not None]
        timestamp = s.timestamp or (utc_time(max(mtimes)) if mtimes else None)
        nodes = (
            s.nodes if s.nodes is not None else tuple(sorted({r.ref.node for r in files} - {""}))
        )
        n_vars = sum(len(r.variables) + (1 if r.error and not foreign(r) else 0) for r in files)
        rows.append(
            (s.serial, tree.storage.url(s.path), complete, False, timestamp, int(sum(sizes)),
             len(paths) + len(others), n_vars, s.epoch, s.step, tuple(nodes), error, loadable,
             warning)
        )  # fmt: skip
    df = _serials_frame(rows)
    latest = latest_from(df, found)
    if latest is not None:
        df.loc[latest, "latest"] = True
    return df


def _serials_frame(rows: list[tuple]) -> pd.DataFrame:
    """The serials table from its rows (serial first, then :data:`SERIAL_COLUMNS`), each
    column built with its dtype at once (a run's table is built on every open: no
    ``astype`` pass over a generic frame)."""
    cols = list(zip(*rows)) if rows else [()] * (len(SERIAL_COLUMNS) + 1)
    (serial, path, complete, latest, stamp, nbytes, n_files, n_vars, epoch, step, nodes,
     error, loadable, warning) = cols  # fmt: skip

    def objects(values: tuple, strings: bool = False) -> np.ndarray:
        out = np.empty(len(values), dtype=object)
        for i, v in enumerate(values):  # one by one: a tuple (nodes) is one value
            out[i] = v if not strings or isinstance(v, str) else None
        return out

    index = pd.Index(np.array(serial, dtype=np.int64), name="serial")
    stamps = pd.to_datetime(pd.Series(stamp, dtype=object), utc=True)
    data = {
        "path": objects(path),
        "complete": np.array(complete, dtype=bool),
        "latest": np.array(latest, dtype=bool),
        "timestamp": stamps.astype("datetime64[ns, UTC]").array,
        "nbytes": np.array(nbytes, dtype=np.int64),
        "n_files": np.array(n_files, dtype=np.int64),
        "n_variables": np.array(n_vars, dtype=np.int64),
        "epoch": pd.array(list(epoch), dtype="Int64"),
        "step": pd.array(list(step), dtype="Int64"),
        "nodes": objects(nodes),
        "error": pd.Series(objects(error, strings=True), index=index, dtype=object),
        "loadable": np.array(loadable, dtype=bool),
        "warning": pd.Series(objects(warning, strings=True), index=index, dtype=object),
    }
    df = pd.DataFrame(data, index=index, columns=SERIAL_COLUMNS, copy=False)
    return df if index.is_monotonic_increasing else df.sort_index()


def latest_from(df: pd.DataFrame, found: TreeScan) -> int | None:
    """The serial to resume from: complete and loadable (DESIGN.md §3c).

    Where the framework keeps a pointer (DeepSpeed ``latest``, TF ``checkpoint``, …) and it
    names a loadable serial, that one: the framework resumes there (after a restore, an older
    one). When the pointer names a serial that does not load (corrupt, hostile, half-written)
    or none, the newest loadable serial, and ``attrs["framework_latest"]`` keeps the pointer
    so every face can say so. Without a pointer: the newest loadable serial."""
    loadable = df.index[df["loadable"]]
    newest = int(loadable.max()) if len(loadable) else None
    if not found.latest_rule:
        return newest
    if found.latest is not None and found.latest in loadable:
        return int(found.latest)
    found.attrs["framework_latest"] = found.latest
    older = [int(s) for s in loadable if found.latest is None or s < found.latest]
    return max(older) if older else newest


def metrics_table(found: TreeScan) -> pd.DataFrame:
    """One row per (serial, metric name): the tree-level metrics, then each serial's."""
    rows = list(found.metrics)
    for s in found.serials:
        rows += [(s.serial, k, v) for k, v in s.metrics.items()]
    df = pd.DataFrame(rows, columns=["serial", "name", "value"])
    return df.astype({"serial": "int64", "value": "float64"})


#: file endings whose empty file is a problem worth naming (a state file, a program)
EMPTY_NAMED = (".json", ".pdmodel", ".pdiparams", ".index", ".metadata", ".yaml", ".pbtxt")


def empty_problem(rel: str, size: int | None) -> str | None:
    """``empty file`` for a zero-byte file whose kind is never empty, else None."""
    if size == 0 and rel.lower().endswith(EMPTY_NAMED):
        return "empty file (0 bytes)"
    return None


def files_table(tree: Tree, found: TreeScan, results: list[FileResult],
                markers: dict[int, set[str]], owned: dict[int, set[str]],
                loose: dict[str, FileResult] | None = None) -> pd.DataFrame:  # fmt: skip
    """One row per file under the root (DESIGN.md §3c): what the layout and codecs made of it.

    Listed files are ``data``; the other files of a serial are ``index``, ``marker`` (its
    commit markers), ``state`` or ``metadata``; files outside every serial are ``state``
    (pointers such as DeepSpeed's ``latest``, ckptview's ``.ckptview/``) or ``unclaimed``.
    ``owned``: every file of each serial (the layout's ``serial_files``), ``markers`` its
    commit markers, both relative to the root; ``loose``: listings of unclaimed files with a
    checkpoint suffix (relative path -> result), read so that nothing hostile sits unread."""
    url, rows, seen = tree.storage.url, [], set()
    for r in results:
        size = r.ref.size if r.ref.size is not None else file_size(tree, r.ref.path)
        rows.append((url(r.ref.path), size, r.serial, r.ref.node, "data", r.codec,
                     len(r.variables), r.error))  # fmt: skip
        seen.add(tree.rel(r.ref.path))
    for s in found.serials:
        for path in [*s.other_files, *map(tree.abs, sorted(owned.get(s.serial, ())))]:
            rel = tree.rel(path)
            if rel in seen or not tree.exists(rel) or tree.is_dir(rel):
                continue
            seen.add(rel)
            role = "marker" if rel in markers.get(s.serial, ()) else _role(rel)
            size = file_size(tree, path)
            rows.append((url(path), size, s.serial, "", role, None, 0, empty_problem(rel, size)))
    if not tree.single:
        for rel in tree.files():
            if rel not in seen:
                role = "state" if _is_state(rel) else "unclaimed"
                got = (loose or {}).get(rel)
                error = found.file_errors.get(rel) or empty_problem(rel, tree.size(rel))
                if got is not None:
                    rows.append((tree.url(rel), tree.size(rel), None, "", role, got.codec,
                                 len(got.variables), error or got.error))  # fmt: skip
                else:
                    rows.append((tree.url(rel), tree.size(rel), None, "", role, None, 0, error))
    df = pd.DataFrame(rows, columns=FILE_COLUMNS)
    df["serial"] = df["serial"].astype("Int64")
    df["codec"] = _none_or_str(df["codec"])
    df["error"] = _none_or_str(df["error"])
    return df.astype({"size": "int64", "n_variables": "int64"})


def _is_state(rel: str) -> bool:
    return rel.split("/", 1)[0] == META_DIR or posixpath.basename(rel) in STATE_NAMES


def _role(rel: str) -> str:
    name = posixpath.basename(rel)
    if _is_state(rel):
        return "state"
    if INDEX_NAME.search(name):
        return "index"
    if DATA_NAME.search(name) or name.lower().endswith(registry.known_suffixes()):
        return "data"
    return "metadata"


def tree_warnings(files: pd.DataFrame) -> list[str]:
    """Files outside every serial, so that no serial's verdict covers them: those the layout
    could not place (with its reason) and unclaimed files with a checkpoint suffix."""
    outside = files[files["serial"].isna()]
    failed = outside[outside["error"].notna()]
    out = [f"{p}: {e}" for p, e in zip(failed["path"], failed["error"], strict=True)]
    suffixes = registry.known_suffixes()
    rest = outside[outside["error"].isna() & (outside["role"] == "unclaimed")]
    loose = rest["path"].str.lower().str.endswith(suffixes)
    return out + [f"{p}: a checkpoint-like file outside every serial" for p in rest["path"][loose]]


def shards_table(tree: Tree, logical: Any) -> pd.DataFrame:
    """One row per stored piece (DESIGN.md §3b): every piece of an assembled tensor with its
    offsets and placement, and one piece per variable stored whole."""
    url = tree.storage.url
    rows: list[tuple] = []
    for res in logical.results:
        if res.codec and res.codec.startswith("("):  # assembled, quantized: pieces below
            continue
        cols = res.variables
        if as_columns(cols) is not None:  # no records made
            origins: dict[int, tuple] = {}
            starts = [origins.setdefault(len(shape), (0,) * len(shape)) for shape in cols.shapes]
            rows.extend(zip(repeat(res.serial), catalog_names(res.ref, cols), repeat(res.ref.node),
                            repeat(url(res.ref.path)), cols.names, starts, cols.shapes,
                            cols.dtypes, cols.nbytes.tolist(), repeat("data"), repeat("")))  # fmt: skip
            continue
        for var in cols:
            rows.append((res.serial, var_name(res.ref, var), res.ref.node, url(res.ref.path),
                         var.name, (0,) * len(var.shape), tuple(map(int, var.shape)),
                         var.dtype, stored_nbytes(var), "data", ""))  # fmt: skip
    for (serial, name), placed in logical.pieces.items():
        for p in placed:
            placement = p.piece.placement + (" (replica)" if p.copy else "")
            rows.append((serial, name, p.res.ref.node, url(p.res.ref.path), p.var.name,
                         p.offsets, tuple(map(int, p.shape)), p.var.dtype,
                         p.nbytes, p.piece.role, placement))  # fmt: skip
    df = pd.DataFrame(rows, columns=SHARD_COLUMNS)
    return df.astype({"serial": "int64", "nbytes": "int64"})


def stored_nbytes(var: VarInfo) -> int:
    """Bytes a listed variable takes as stored (its own count, else numel x itemsize)."""
    if var.nbytes is not None:
        return int(var.nbytes)
    return var.numel * itemsize(var.dtype) if var.dtype != "object" else 0
