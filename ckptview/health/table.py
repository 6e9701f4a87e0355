"""The health table: one row per (serial, node, name), measured or taken from the cache.

Results are kept in the scan's header cache, keyed by the identities (URL, size, mtime,
ETag) of the files holding the variable in that serial, and of both serials' files for
``update_rel``: reopening a tree, or one that gained a serial, reads only the new files. The
newest serial's values stay in memory (:mod:`.kept`) for the next call on a live run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable
from typing import Any

import numpy as np
import pandas as pd

from ..engine.stats import CHUNK_BYTES, bounded_map
from ..scan.cache import FORMAT, CacheKey, HeaderCache
from ..scan.core import Scan
from .kept import KEPT
from .measure import HEALTH_STATS, MEMORY_BYTES, Want, known_sumsq, measure_variable
from .spectral import SPECTRAL_MAX_NUMEL

SPECTRAL = ["sigma_max", "alpha"]
HEALTH_COLUMNS = ["serial", "node", "name", "kind", "dtype", "shape", *HEALTH_STATS,
                  "update_rel", "prev_serial", "note", "error"]  # fmt: skip
VERSION = 1  # bump when a cached health value changes meaning


def is_float(dtype: str) -> bool:
    """Whether a ckptview dtype name is floating point (float16…64, bfloat16, float8…)."""
    return dtype.startswith(("float", "bfloat"))


# -- cache keys -------------------------------------------------------------------------------
class _Files:
    """The identities of the files holding each variable of each serial."""

    def __init__(self, scan: Scan):
        tree = scan.tree
        entries, url = tree.entries, tree.storage.url
        self.ident: dict[str, CacheKey | None] = {}
        for res in scan.file_results():
            u = url(res.ref.path)
            self.ident[u] = HeaderCache.key("file", u, entries.get(tree.rel(res.ref.path)))
        self._pieces: dict[tuple[int, str], list[tuple[str, str]]] | None = None
        self.scan = scan

    def pieces(self) -> dict[tuple[int, str], list[tuple[str, str]]]:
        if self._pieces is None:
            sh = self.scan.shards
            self._pieces = {}
            for s, name, node, f in zip(sh["serial"], sh["name"], sh["node"], sh["file"]):
                self._pieces.setdefault((int(s), name), []).append((node, f))
        return self._pieces

    def key(self, serial: int, node: str, name: str, file: str, whole: bool) -> tuple | None:
        """The identities of the files of one variable (None when one is unknown)."""
        if whole:
            files = [file]
        else:
            got = self.pieces().get((serial, name), [])
            files = sorted({f for n, f in got if not node or n == node} | {file})
        idents = [self.ident.get(f) for f in files]
        if any(i is None for i in idents):
            return None
        return tuple(idents)


def _key(kind: str, node: str, name: str, *parts: Any) -> CacheKey | None:
    if any(p is None for p in parts):
        return None
    return (FORMAT, f"health-{kind}", VERSION, node, name, *parts)


# -- the table --------------------------------------------------------------------------------
def _entries(scan: Scan, serials: Iterable[int] | int | None, names: Iterable[str] | str | None,
             kinds: Iterable[str] | str | None) -> tuple[list[tuple], dict[tuple[str, str], int]]:  # fmt: skip
    """The floating-point variables asked for, ordered by (node, name, serial), each with its
    predecessor's ``serial, shape, dtype, file, n_shards, quant`` (Nones for the first; the
    predecessor may be outside ``serials``); and each variable's newest serial."""
    v = scan.variables
    cols = [v[c].tolist() for c in ("serial", "node", "name", "kind", "dtype", "shape", "file",
                                    "n_shards", "quant", "error")]  # fmt: skip
    serial_, node_, name_, kind_, dtype_ = cols[:5]
    keep = [i for i, d in enumerate(dtype_) if is_float(d)]
    if kinds is not None:
        wanted_kinds = {kinds} if isinstance(kinds, str) else set(kinds)
        keep = [i for i in keep if kind_[i] in wanted_kinds]
    if names is not None:
        wanted_names = {names} if isinstance(names, str) else set(names)
        missing = sorted(wanted_names - {name_[i] for i in keep})
        if missing:
            raise KeyError(f"no floating-point variable {missing[0]!r}")
        keep = [i for i in keep if name_[i] in wanted_names]
    keep.sort(key=lambda i: (node_[i], name_[i], serial_[i]))  # stable, as the table's order
    wanted: set[int] | None = None
    if serials is not None:
        wanted = {int(s) for s in ([serials] if isinstance(serials, int) else serials)}
        unknown = sorted(wanted - set(scan.serials.index))
        if unknown:
            raise KeyError(f"no serial {unknown[0]}; serials: {list(scan.serials.index)}")
    none: tuple = (None,) * 6
    entries: list[tuple] = []
    newest: dict[tuple[str, str], int] = {}
    last: tuple[str, str] | None = None
    before: tuple = none
    for i in keep:
        here = (node_[i], name_[i])
        if here != last:
            last, before = here, none
        row = tuple(c[i] for c in cols)
        serial = int(row[0])
        newest[here] = serial
        if wanted is None or serial in wanted:
            entries.append((serial, *row[1:], *before))
        before = (serial, row[5], row[4], row[6], row[7], row[8])
    return entries, newest


def health(scan: Scan, serials: Iterable[int] | None = None, names: Iterable[str] | None = None,
           spectral: bool = False, kinds: Iterable[str] | None = None,
           chunk_bytes: int = CHUNK_BYTES, spectral_max_numel: int = SPECTRAL_MAX_NUMEL,
           progress: Callable[[int, int], None] | None = None) -> pd.DataFrame:  # fmt: skip
    """One row per (serial, node, name) of floating-point variables: ``l2``, ``rms``,
    ``max_abs`` (over finite values), ``n_nan``, ``n_inf``, ``update_rel`` (‖W_s − W_prev‖₂ /
    ‖W_prev‖₂ against ``prev_serial``, the previous serial holding the variable; NaN for the
    first or when the shape changed), with ``spectral`` also ``sigma_max`` and ``alpha`` of
    2-D weights; ``note`` and ``error`` say what was skipped or failed. ``kinds``: only
    variables of these kinds (``model``, ``optimizer``…). ``progress(done, total)``: rows
    measured, after each variable (its serials are measured together, each read once; see
    :func:`measure_variable`)."""
    entries, newest = _entries(scan, serials, names, kinds)
    cache = scan.cache
    files = _Files(scan)
    rows: list[dict] = []
    # per variable: serial -> what to measure, and (its row or None, the cache keys to fill)
    plans: dict[tuple[str, str], dict[int, tuple[Want, int | None, list]]] = {}
    held: dict[tuple[str, str], dict[int, list[np.ndarray]]] = {}  # predecessors' in memory
    keeps: dict[tuple[str, str], tuple[int, Hashable, Hashable]] = {}  # the newest, to keep
    tree_url = scan.tree.url()
    in_rows: set[tuple[str, str, int]] = set()
    for (serial, node, name, kind, dtype, shape, file, n_shards, quant, error, p, p_shape,
         p_dtype, p_file, p_whole, p_quant) in entries:  # fmt: skip
        serial = int(serial)
        shape = tuple(shape)
        row: dict[str, Any] = {"serial": serial, "node": node, "name": name, "kind": kind,
                               "dtype": dtype, "shape": shape, "note": None, "error": error}  # fmt: skip
        row.update(dict.fromkeys(HEALTH_STATS, math.nan), n_nan=0, n_inf=0, update_rel=math.nan)
        has_prev = p is not None
        row["prev_serial"] = p
        if spectral:
            row.update(sigma_max=math.nan, alpha=math.nan)
        rows.append(row)
        in_rows.add((node, name, serial))
        if error is not None:
            continue
        ident = files.key(serial, node, name, file, n_shards == 1 and quant is None)
        k_stats = _key("stats", node, name, serial, ident)
        same_shape = has_prev and tuple(p_shape) == shape
        k_update = None
        if same_shape:
            p_ident = files.key(int(p), node, name, p_file, p_whole == 1)
            k_update = _key("update", node, name, serial, int(p), p_ident, ident)
        elif has_prev:
            row["note"] = f"shape changed from {tuple(p_shape)}"
        k_spec = _key("spectral", node, name, serial, spectral_max_numel, ident)
        need_stats = need_update = need_spec = False
        got = cache.get(k_stats)
        if got is None:
            need_stats = True
        else:
            row.update(got)
        if same_shape:
            got = cache.get(k_update)
            if got is None:
                need_update = True
            else:
                row["update_rel"] = got
        if spectral and len(shape) == 2:
            got = cache.get(k_spec)
            if got is None:
                need_spec = True
            else:
                row.update(sigma_max=got["sigma_max"], alpha=got["alpha"])
                if got.get("note"):
                    row["note"] = "; ".join(n for n in (row["note"], got["note"]) if n)
        if not (need_stats or need_update or need_spec):
            continue
        plan = plans.setdefault((node, name), {})
        if serial == newest[(node, name)] and ident is not None:
            keeps[(node, name)] = (serial, (tree_url, node, name), ("values", node, name, ident))
        if need_update and int(p) not in plan:
            values = KEPT.get(("values", node, name, p_ident))
            if values is not None:
                held.setdefault((node, name), {})[int(p)] = values
        if need_update and int(p) not in plan:  # read as the predecessor only
            whole = p_whole == 1 and p_quant is None
            p_key = _key("stats", node, name, int(p), files.key(int(p), node, name, p_file, whole))
            p_stats = cache.get(p_key)
            if p_stats is not None or (node, name, int(p)) in in_rows:
                p_key = None  # cached, or measured as a row of its own: not kept again here
            want = Want(int(p), shape, str(p_dtype), sumsq=known_sumsq(p_stats))
            plan[int(p)] = (want, None, [p_key, None, None])
        want = Want(serial, shape, dtype, need_stats, need_update, need_spec)
        plan[serial] = (want, len(rows) - 1, [k_stats if need_stats else None,
                                              k_update if need_update else None,
                                              k_spec if need_spec else None])  # fmt: skip
    jobs, slots = [], []
    for (node, name), plan in plans.items():
        entries = [plan[s] for s in sorted(plan)]
        jobs.append((scan, node, name, [w for w, _, _ in entries], chunk_bytes,
                     spectral_max_numel, MEMORY_BYTES, held.get((node, name)),
                     keeps.get((node, name))))  # fmt: skip
        slots.append(entries)
    total = sum(i is not None for entries in slots for _, i, _ in entries)
    done = 0
    if progress:
        progress(0, total)
    for entries, results in zip(slots, bounded_map(measure_variable, jobs, scan.pool())):
        for (want, i, (k_stats, k_update, k_spec)), got in zip(entries, results):
            if i is None:  # a predecessor only: its statistics came along
                if k_stats is not None and got["error"] is None and "l2" in got:
                    cache.put(k_stats, {k: got[k] for k in HEALTH_STATS}, later=True)
                continue
            row = rows[i]
            done += 1
            notes = [n for n in (row["note"], got.get("note")) if n]
            asked = [*(HEALTH_STATS if want.stats else []), *(["update_rel"] if want.update else []),
                     *(SPECTRAL if want.spectral else [])]  # fmt: skip
            row.update({k: got[k] for k in asked if k in got})
            row["note"] = "; ".join(notes) or None
            if got["error"] is not None:
                row["error"] = got["error"]
            else:
                if k_stats is not None:
                    cache.put(k_stats, {k: got[k] for k in HEALTH_STATS}, later=True)
                if k_update is not None:
                    cache.put(k_update, got["update_rel"], later=True)
                if k_spec is not None and "sigma_max" in got:
                    cache.put(k_spec, {"sigma_max": got["sigma_max"], "alpha": got["alpha"],
                                       **({"note": got["note"]} if got.get("note") else {})},
                              later=True)  # fmt: skip
        if progress:
            progress(done, total)
    cols = HEALTH_COLUMNS[:-2] + (SPECTRAL if spectral else []) + ["note", "error"]
    rows.sort(key=lambda r: (r["serial"], r["node"], r["name"]))  # stable
    return _table(rows, cols)


def _table(rows: list[dict], cols: list[str]) -> pd.DataFrame:
    """The health frame, built column by column with its dtypes."""
    types = {"serial": "int64", "n_nan": "int64", "n_inf": "int64", "prev_serial": "Int64",
             **dict.fromkeys(["l2", "rms", "max_abs", "update_rel", *SPECTRAL], "float64")}  # fmt: skip
    data: dict[str, Any] = {}
    for c in cols:
        values = [r[c] for r in rows]
        kind = types.get(c)
        if kind == "Int64":
            data[c] = pd.array(values, dtype="Int64")
        elif kind is not None:
            data[c] = np.array(values, dtype=kind)
        else:
            data[c] = values
    return pd.DataFrame(data, columns=cols)
