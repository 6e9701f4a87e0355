"""Health over serials (DESIGN.md §3e): per-variable statistics across a run, the rules that
find where it went wrong, and the serial to roll back to.

:func:`health` reads each serial's values once: one job per variable (several at once on the
scan's executor) streams the serials that need work side by side, chunk by chunk (logical
tensors of any layout, through :meth:`Scan.iter_chunks`), re-cut into blocks of one size so
they line up; per block each serial's float64 copy serves both its own statistics and
``update_rel`` against the serial before (:func:`measure_variable`). Memory: about two chunks
per serial streamed, at most :data:`MEMORY_BYTES` per variable. Spectral statistics need the
whole 2-D matrix in memory (as float64); matrices above ``spectral_max_numel`` values are
skipped (NaN and a ``note``).

Results are kept in the scan's header cache, keyed by the identities (URL, size, mtime,
ETag) of the files holding the variable in that serial, and of both serials' files for
``update_rel``: reopening a tree, or one that gained a serial, reads only the new files.

The power-law exponent ``alpha`` is fitted as WeightWatcher does (its own ``WW_powerlaw``
fit): the eigenvalues of WᵀW (λ = σ² of W, ``min(rows, cols)`` of them), without numerical
zeros (λ ≤ 1e-10·λ_max), sorted; for every candidate ``xmin`` (each eigenvalue but the
largest) the continuous power-law MLE over the tail λ ≥ xmin, α = 1 + n / Σ ln(λ/xmin)
(Clauset, Shalizi & Newman 2009), and the Kolmogorov–Smirnov distance between the tail's
empirical CDF (i/n, i = 0…n−1) and the fitted 1 − (λ/xmin)^(1−α); the fit with the smallest
distance wins. No ``xmax``; fewer than :data:`MIN_EVALS` eigenvalues give NaN.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..dtypes import itemsize
from ..scan.cache import FORMAT, CacheKey, HeaderCache
from ..scan.core import Scan
from .diff import DiffAccumulator, _ReadAhead
from .kept import KEPT
from .stats import CHUNK_BYTES, bounded_map
from .sums import PIECE, ROW, row_squares, scratch, sum_squares

HEALTH_STATS = ["l2", "rms", "max_abs", "n_nan", "n_inf"]
SPECTRAL = ["sigma_max", "alpha"]
HEALTH_COLUMNS = ["serial", "node", "name", "kind", "dtype", "shape", *HEALTH_STATS,
                  "update_rel", "prev_serial", "note", "error"]  # fmt: skip
STATUSES = ("ok", "nonfinite", "spike", "frozen", "not_loadable")
SUMMARY_COLUMNS = ["status", "findings", "onset", "n_nonfinite", "n_spike", "n_frozen",
                   "loss_spike", "max_update_ratio", "loadable"]  # fmt: skip
#: the largest matrix (values) whose spectrum is computed: 2**24 = 4096 x 4096 (128 MiB f64)
SPECTRAL_MAX_NUMEL = 1 << 24
MIN_EVALS = 10  # fewer eigenvalues: no alpha (WeightWatcher skips small layers too)
MIN_UPDATES = 3  # a variable's update median needs this many finite update_rel values
#: values a variable's job holds at once (its serials streamed side by side, about two chunks
#: each); up to :data:`~ckptview.engine.stats.WINDOW` variables are measured at once
MEMORY_BYTES = 32 << 20
MIN_CHUNK = 1 << 20  # chunks shrink to this before a run's serials are split into groups
VERSION = 1  # bump when a cached health value changes meaning
LOSS_NAME = re.compile(r"loss", re.I)


def is_float(dtype: str) -> bool:
    """Whether a ckptview dtype name is floating point (float16…64, bfloat16, float8…)."""
    return dtype.startswith(("float", "bfloat"))


# -- the power-law fit ------------------------------------------------------------------------
def fit_alpha(evals: np.ndarray) -> tuple[float, float, float]:
    """(alpha, xmin, KS distance) of the eigenvalues' tail, as WeightWatcher fits it (see the
    module docstring); NaNs when there are too few eigenvalues."""
    x = np.asarray(evals, dtype=np.float64).reshape(-1)
    x = x[np.isfinite(x)]
    if x.size:
        x = np.sort(x[x > 1e-10 * x.max()])
    n = x.size
    if n < MIN_EVALS:
        return math.nan, math.nan, math.nan
    logs = np.log(x)
    tail_logs = np.cumsum(logs[::-1])[::-1]  # sum of logs[i:]
    best = (math.inf, math.nan, math.nan)
    for i in range(n - 1):
        m = n - i
        s = tail_logs[i] - m * logs[i]
        if s <= 0:
            continue
        alpha = 1.0 + m / s
        fitted = 1.0 - np.exp((1.0 - alpha) * (logs[i:] - logs[i]))
        d = float(np.max(np.abs(fitted - np.arange(m) / m)))
        if d < best[0]:
            best = (d, alpha, float(x[i]))
    return best[1], best[2], best[0]


def spectral_stats(w: np.ndarray) -> dict:
    """``sigma_max`` and ``alpha`` of a 2-D matrix (NaN for non-finite values)."""
    w = np.asarray(w, dtype=np.float64)
    if not np.isfinite(w).all():
        return {"sigma_max": math.nan, "alpha": math.nan, "note": "spectral: non-finite values"}
    sv = np.linalg.svd(w, compute_uv=False)
    alpha = fit_alpha(sv * sv)[0] if sv.size else math.nan
    return {"sigma_max": float(sv[0]) if sv.size else math.nan, "alpha": alpha}


# -- one variable in one serial ---------------------------------------------------------------
class NormAccumulator:
    """Streaming Σx², max|x| and counts over finite values, widened to float64 in pieces of
    :data:`PIECE` values; a piece holding NaN/inf (its Σx² is not finite) takes the masked
    path."""

    def __init__(self) -> None:
        self.n_finite = self.n_nan = self.n_inf = 0
        self.sumsq = 0.0
        self.max_abs = 0.0

    def add(self, chunk: np.ndarray) -> None:
        x = np.asarray(chunk).reshape(-1)
        with scratch(min(PIECE, max(x.size, 1)), rows=1) as bufs:
            self._add(x, bufs[0])

    def _add(self, x: np.ndarray, buf: np.ndarray) -> None:
        full = buf.size
        for start in range(0, x.size, full):
            part = x[start : start + full]
            b = buf if part.size == full else buf[: part.size]
            np.copyto(b, part, casting="unsafe")
            ss = sum_squares(b)
            if math.isfinite(ss):
                self.sumsq += ss
                self.n_finite += b.size
                self.max_abs = max(self.max_abs, float(b.max()), -float(b.min()))
                continue
            finite = np.isfinite(b)
            nan = int(np.count_nonzero(np.isnan(b)))
            self.n_nan += nan
            self.n_inf += b.size - int(np.count_nonzero(finite)) - nan
            f = b[finite]
            if f.size:
                self.sumsq += sum_squares(f)
                self.n_finite += f.size
                self.max_abs = max(self.max_abs, float(np.abs(f).max()))

    def result(self) -> dict:
        empty = self.n_finite == 0
        return {"l2": math.nan if empty else math.sqrt(self.sumsq),
                "rms": math.nan if empty else math.sqrt(self.sumsq / self.n_finite),
                "max_abs": math.nan if empty else self.max_abs,
                "n_nan": self.n_nan, "n_inf": self.n_inf}  # fmt: skip


def _flat_chunks(w: np.ndarray, chunk_bytes: int) -> Iterator[np.ndarray]:
    flat = w.reshape(-1)
    step = max(1, chunk_bytes // max(1, flat.itemsize))
    for start in range(0, flat.size, step):
        yield flat[start : start + step]


def _blocks(chunks: Iterable[np.ndarray], n: int) -> Iterator[np.ndarray]:
    """A stream cut anywhere, re-cut into flat blocks of exactly ``n`` values (the last may be
    shorter): views of the stream's chunks when their edges fall on block edges (a stream
    read with the same chunk size), one copy across them otherwise."""
    buf: np.ndarray | None = None
    fill = 0
    for chunk in chunks:
        c = np.asarray(chunk).reshape(-1)
        i = 0
        if buf is not None:
            if c.dtype != buf.dtype:
                buf = buf.astype(np.result_type(buf.dtype, c.dtype))
            take = min(n - fill, c.size)
            buf[fill : fill + take] = c[:take]
            fill, i = fill + take, take
            if fill < n:
                continue
            yield buf
            buf, fill = None, 0
        while c.size - i >= n:
            yield c[i : i + n]
            i += n
        if i < c.size:
            buf = np.empty(n, c.dtype)
            fill = c.size - i
            buf[:fill] = c[i:]
        c = chunk = None  # type: ignore[assignment]  # not held while the next is read
    if buf is not None:
        yield buf[:fill]


@dataclass
class Want:
    """One serial of a variable in a :func:`measure_variable` job: what is asked of it.
    ``update``: ``update_rel`` against the previous entry of the job (same shape); an entry
    asking nothing is read as the next one's predecessor (its statistics come along)."""

    serial: int
    shape: tuple
    dtype: str
    stats: bool = False
    update: bool = False
    spectral: bool = False


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:300]


def _grouping(n: int, chunk_bytes: int, memory_bytes: int) -> tuple[int, int]:
    """(serials per group, chunk bytes) for a run of ``n`` serials streamed side by side:
    each holds about two chunks (the one reduced, the one read ahead), so
    group × 2 × chunk ≤ ``memory_bytes``; chunks shrink (down to :data:`MIN_CHUNK`) before a
    run is split into groups."""
    floor = max(1, min(chunk_bytes, MIN_CHUNK))
    group = max(2, min(n, memory_bytes // (2 * floor)))
    chunk = max(floor, min(chunk_bytes, memory_bytes // (2 * group)))
    return group, chunk


class _Lane:
    """One serial's stream in a group: its blocks, its statistics, and why it failed. With
    ``collect`` (the variable's number of values) its blocks are held as they pass (no copy:
    they are fresh arrays or views of the chunks read), to be kept for the next call
    (:mod:`.kept`); a stream larger than the store's budget is not collected."""

    def __init__(self, blocks: Iterator[np.ndarray] | None, stats: bool, error: str | None,
                 collect: int | None = None):  # fmt: skip
        self.blocks = blocks
        self.norm = NormAccumulator() if stats else None
        self.error = error
        self.done = blocks is None
        self.collect = collect
        self.held: list[np.ndarray] = []
        self.filled = 0
        self.held_bytes = 0

    def next(self) -> np.ndarray | None:
        if self.done or self.error is not None or self.blocks is None:
            return None
        try:
            x = next(self.blocks, None)
        except Exception as e:  # noqa: BLE001 - this serial's rows get the error
            self.error, x = _error(e), None
        if x is None:
            self.done = True
        elif self.collect is not None:
            self._collect(x)
        return x

    def _collect(self, x: np.ndarray) -> None:
        n = self.collect
        assert n is not None
        self.filled += x.size
        self.held_bytes += x.nbytes
        if self.filled > n or not KEPT.fits(self.held_bytes):
            self.collect, self.held = None, []
            return
        self.held.append(x)

    def collected(self) -> list[np.ndarray] | None:
        """The blocks held, when the stream ended whole and without error."""
        ok = self.done and self.error is None and self.collect is not None
        return self.held if ok and self.filled == self.collect else None


def _reduce(xs: list[np.ndarray | None], lanes: list[_Lane],
            pairs: list[DiffAccumulator | None], bufs: np.ndarray) -> None:  # fmt: skip
    """One block index of a group: each lane's block widened to float64 once, in pieces of
    :data:`PIECE` values, for both its Σx² and the diff against the lane before
    (``pairs[j]``: lane j - 1 against lane j), summed by rows (:func:`row_squares`). max|x|
    comes from the raw block; a block holding NaN/inf takes :class:`NormAccumulator`'s masked
    path, a row whose difference is NaN :class:`DiffAccumulator`'s general one."""
    k = len(xs)
    fast = [False] * k
    for j, (x, lane) in enumerate(zip(xs, lanes)):
        norm = lane.norm
        if x is None or norm is None or not x.size:
            continue
        if x.dtype.kind == "f" and x.dtype.isnative:
            hi, lo = float(x.max()), float(x.min())
            if math.isfinite(hi) and math.isfinite(lo):
                fast[j] = True
                norm.n_finite += x.size
                norm.max_abs = max(norm.max_abs, hi, -lo)
                continue
        norm.add(x)
    # widened: a lane whose Σx² is wanted (fast statistics; the old side of a diff), or the
    # new side of a diff
    wide = [x is not None and (fast[j] or pairs[j] is not None
                               or (j + 1 < k and pairs[j + 1] is not None))
            for j, x in enumerate(xs)]  # fmt: skip
    sums, d2, a2 = [0.0] * k, [0.0] * k, [0.0] * k
    counts = [0] * k
    size = max((x.size for x in xs if x is not None), default=0)
    copy, sub, f64 = np.copyto, np.subtract, np.dtype(np.float64)
    step = bufs.shape[1]
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: the general path's case
        for start in range(0, size, step):
            prev: np.ndarray | None = None
            prev_rows: np.ndarray | None = None
            for j in range(k):
                x = xs[j]
                if x is None or not wide[j]:
                    prev = None
                    continue
                part = x[start : start + step]
                if part.dtype == f64:
                    cur = part
                else:
                    cur = bufs[j & 1] if part.size == step else bufs[j & 1, : part.size]
                    copy(cur, part, casting="unsafe")
                rows = row_squares(cur)
                sums[j] += float(rows.sum())
                acc = pairs[j]
                if acc is not None and prev is not None and prev.size == cur.size:
                    d = bufs[2] if cur.size == step else bufs[2, : cur.size]
                    sub(cur, prev, out=d)
                    dd = row_squares(d)
                    total = float(dd.sum())
                    assert prev_rows is not None
                    if total == total:
                        d2[j] += total
                        a2[j] += float(prev_rows.sum())
                        counts[j] += cur.size
                    else:  # NaN in a row's difference: equal NaNs / infinities are no change
                        old = xs[j - 1]
                        assert old is not None
                        bad = np.isnan(dd)
                        for r in np.flatnonzero(bad).tolist():
                            lo = start + r * ROW
                            acc.add(old[lo : lo + ROW], x[lo : min(lo + ROW, start + step)])
                        good = ~bad
                        lengths = np.full(dd.size, ROW)
                        lengths[-1] = cur.size - ROW * (dd.size - 1)
                        d2[j] += float(dd[good].sum())
                        a2[j] += float(prev_rows[good].sum())
                        counts[j] += int(lengths[good].sum())
                prev, prev_rows = cur, rows
    for j in range(k):
        norm = lanes[j].norm
        if fast[j] and norm is not None:
            norm.sumsq += sums[j]
        acc = pairs[j]
        if acc is not None:
            acc.d2 += d2[j]
            acc.a2 += a2[j]
            acc.n += counts[j]


def measure_variable(scan: Scan, node: str, name: str, wants: list[Want],
                     chunk_bytes: int = CHUNK_BYTES,
                     spectral_max_numel: int = SPECTRAL_MAX_NUMEL,
                     memory_bytes: int = MEMORY_BYTES,
                     held: dict[int, list[np.ndarray]] | None = None,
                     keep: tuple[int, Hashable, Hashable] | None = None) -> list[dict]:  # fmt: skip
    """What is asked of one variable in several serials (``wants``, in serial order), each
    serial's values read once: runs of entries chained by ``update`` are streamed side by side
    in groups (see :func:`_grouping`), re-cut into blocks of one size so every stream lines up;
    consecutive groups share one serial (read again, as the next group's predecessor). One
    dict per entry: the statistics of every entry read, ``update_rel``, ``sigma_max`` and
    ``alpha``, ``note`` and ``error`` (a failed read: that entry's, or its predecessor's).
    ``held``: serial -> values already in memory (not read); ``keep``: ``(serial, owner,
    key)``, the serial whose values are kept in :data:`~.kept.KEPT` as they stream by."""
    outs: list[dict[str, Any]] = [{"notes": [], "error": None} for _ in wants]
    runs: list[list[int]] = []
    for i, w in enumerate(wants):
        if w.update and runs:
            runs[-1].append(i)
        else:
            runs.append([i])
    for run in runs:
        group, chunk = _grouping(len(run), chunk_bytes, memory_bytes)
        for start in range(0, max(1, len(run) - 1), group - 1):
            members = run[start : start + group]
            carried = start > 0  # the first member's statistics came with the group before
            _measure_group(scan, node, name, wants, members, carried, outs, chunk,
                           spectral_max_numel, memory_bytes, held or {}, keep)  # fmt: skip
    results = []
    for w, out in zip(wants, outs):
        got: dict[str, Any] = {"note": "; ".join(out.pop("notes")) or None}
        error = out.pop("error") or (out.pop("update_error", None) if w.update else None)
        if w.spectral and "sigma_max" in out:
            got.update(sigma_max=out["sigma_max"], alpha=out["alpha"])
        if error is None:
            got.update({k: v for k, v in out.items() if k in (*HEALTH_STATS, "update_rel")})
        got["error"] = error
        results.append(got)
    return results


def _measure_group(scan: Scan, node: str, name: str, wants: list[Want], members: list[int],
                   carried: bool, outs: list[dict], chunk: int, spectral_max_numel: int,
                   memory_bytes: int, held: dict[int, list[np.ndarray]],
                   keep: tuple[int, Hashable, Hashable] | None) -> None:  # fmt: skip
    """One group of :func:`measure_variable`: spectra first (whole matrices), then every
    member's values streamed in lockstep, block by block."""
    wholes: dict[int, np.ndarray] = {}
    kept: dict[int, list[np.ndarray]] = {}  # members whose values are held in memory
    share = memory_bytes // max(1, 2 * len(members))
    for pos, i in enumerate(members):
        w, out = wants[i], outs[i]
        if not w.spectral or (carried and pos == 0) or len(w.shape) != 2:
            continue
        numel = math.prod(w.shape)
        if numel > spectral_max_numel:
            out.update(sigma_max=math.nan, alpha=math.nan)
            out["notes"].append(f"spectral: skipped, {numel:,} values > {spectral_max_numel:,}")
            continue
        try:
            whole = np.asarray(scan.read(name, w.serial, node))
            if whole.ndim != 2:
                whole = whole.reshape(w.shape)
            got = spectral_stats(whole)
        except Exception as e:  # noqa: BLE001 - one bad serial must not sink the table
            out["error"] = _error(e)
            continue
        if "note" in got:
            out["notes"].append(got.pop("note"))
        out.update(got)
        if whole.nbytes <= share:  # small: its values are streamed from memory
            wholes[i] = whole
    for i in members:
        if i not in wholes and wants[i].serial in held:
            kept[i] = held[wants[i].serial]
        elif i in wholes and keep is not None and keep[0] == wants[i].serial:
            KEPT.put(keep[1], keep[2], [wholes[i].reshape(-1)])  # read whole for its spectrum
    streamed = [i for pos, i in enumerate(members)
                if wants[i].stats or wants[i].update or pos + 1 < len(members)]  # fmt: skip
    if not streamed:
        return
    width = max(_itemsize(wants[i].dtype) for i in streamed)
    n = max(1, chunk // width)
    lanes: list[_Lane] = []
    pairs: list[DiffAccumulator | None] = []
    heads: list[_ReadAhead] = []
    try:
        for pos, i in enumerate(streamed):
            w = wants[i]
            own = not (carried and pos == 0)
            error = outs[i]["error"] if own else None
            blocks = None
            if error is None:
                try:
                    if i in kept:
                        source: Iterable[np.ndarray] = iter(kept[i])
                    elif i in wholes:
                        source = _flat_chunks(wholes[i], chunk)
                    else:
                        head = _ReadAhead(scan.iter_chunks(name, w.serial, node, chunk))
                        heads.append(head)
                        source = head
                    blocks = _blocks(source, n)
                except Exception as e:  # noqa: BLE001 - its rows get the error
                    error = _error(e)
            collect = None
            numel = math.prod(w.shape)
            if (keep is not None and keep[0] == w.serial and i not in wholes and i not in kept
                    and KEPT.fits(numel * _itemsize(w.dtype))):  # fmt: skip
                collect = numel
                KEPT.release(keep[1])  # its older values are not held beside the new
            lanes.append(_Lane(blocks, stats=own and error is None, error=error, collect=collect))
            pairs.append(DiffAccumulator() if pos > 0 and w.update else None)
        with scratch(min(PIECE, n, max(1, math.prod(wants[streamed[0]].shape)))) as bufs:
            while True:
                xs = [lane.next() for lane in lanes]
                if all(x is None for x in xs):
                    break
                for j, acc in enumerate(pairs):
                    if acc is None:
                        continue
                    a, b = xs[j - 1], xs[j]
                    bad = lanes[j - 1].error or lanes[j].error
                    if bad is None and (a is None or b is None or a.size != b.size):
                        bad = "ValueError: the two sides hold different numbers of values"
                    if bad is not None:
                        outs[streamed[j]]["update_error"] = bad
                        pairs[j] = None
                _reduce(xs, lanes, pairs, bufs)
                del xs  # this block index is not held while the next one is read
    except Exception as e:  # noqa: BLE001 - an unexpected failure: every row of the group
        for pos, lane in enumerate(lanes):
            lane.error = lane.error or _error(e)
            if pairs[pos] is not None:
                outs[streamed[pos]]["update_error"] = lane.error
                pairs[pos] = None
    finally:
        for head in heads:
            head.close()
    for lane in lanes:
        values = lane.collected()
        if values is not None and keep is not None:
            KEPT.put(keep[1], keep[2], values)
    for pos, (i, lane, acc) in enumerate(zip(streamed, lanes, pairs)):
        out = outs[i]
        if lane.norm is not None:
            if lane.error is not None:
                out["error"] = out["error"] or lane.error
            else:
                out.update(lane.norm.result())
        if acc is not None:
            out["update_rel"] = acc.result()["rel_l2"]
        elif pos > 0 and wants[i].update and "update_error" not in out:
            out["update_error"] = lanes[pos - 1].error or lane.error or "ValueError: unpaired"


def _itemsize(dtype: str) -> int:
    try:
        return max(1, itemsize(dtype))
    except Exception:  # noqa: BLE001 - an unknown name: assume float32
        return 4


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
            p_key = None
            if (node, name, int(p)) not in in_rows:  # outside ``serials``: keep its stats too
                whole = p_whole == 1 and p_quant is None
                p_key = _key("stats", node, name, int(p),
                             files.key(int(p), node, name, p_file, whole))  # fmt: skip
                if cache.get(p_key) is not None:
                    p_key = None
            plan[int(p)] = (Want(int(p), shape, str(p_dtype)), None, [p_key, None, None])
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


# -- the rules --------------------------------------------------------------------------------
def _names(keys: Iterable[tuple[str, str]], limit: int = 3) -> str:
    shown = [f"{n}/{name}" if n else name for n, name in sorted(keys)]
    more = len(shown) - limit
    return ", ".join(shown[:limit]) + (f" (+{more} more)" if more > 0 else "")


def variable_rules(h: pd.DataFrame, spike_factor: float = 10.0) -> pd.DataFrame:
    """Per variable row of ``h`` (same index): ``update_ratio`` (update_rel over the
    variable's own median of positive update_rel values, NaN with fewer than
    :data:`MIN_UPDATES`; a spike is a ratio above ``spike_factor`` that also exceeds every
    earlier update of the variable), ``l2_ratio`` (l2 over its previous serial's), and the flags
    ``nonfinite``, ``update_spike``, ``l2_jump`` and ``frozen`` (zero update for two serials
    after it had moved, flagged on each serial of the streak)."""
    out = pd.DataFrame(index=h.index)
    out["nonfinite"] = (h["n_nan"] + h["n_inf"]) > 0
    h = h.sort_values(["node", "name", "serial"], kind="stable")
    groups = h.groupby(["node", "name"], sort=False)
    u = h["update_rel"]
    finite_u = u.where(np.isfinite(u))

    def median_positive(s: pd.Series) -> float:
        s = s[np.isfinite(s)]
        if len(s) < MIN_UPDATES:
            return math.nan
        pos = s[s > 0]
        return float(pos.median()) if len(pos) else math.nan

    med = groups["update_rel"].transform(median_positive)
    ratio = finite_u / med
    out["update_median"] = med
    out["update_ratio"] = ratio
    # a jump: above the factor over the run's median AND above every earlier update of the
    # variable (training's large first updates, decaying after, are never a spike)
    earlier = finite_u.groupby([h["node"], h["name"]], sort=False).transform(
        lambda s: s.shift(1).cummax())
    out["update_spike"] = ((ratio > spike_factor) & (finite_u > earlier)).fillna(False).astype(bool)
    prev_l2 = groups["l2"].shift(1)
    l2_ratio = (h["l2"] / prev_l2.where(prev_l2 > 0)).astype("float64")
    out["l2_ratio"] = l2_ratio
    out["l2_jump"] = (l2_ratio > spike_factor).fillna(False).astype(bool)
    moved = (u > 0).fillna(False)
    had_moved = moved.groupby([h["node"], h["name"]], sort=False).cummax()
    zero = (u == 0).fillna(False)
    frozen = pd.Series(False, index=h.index)
    for _, idx in zero.groupby([h["node"], h["name"]], sort=False).groups.items():
        z = zero.loc[idx].to_numpy()
        before = had_moved.loc[idx].shift(1, fill_value=False).to_numpy()
        # a streak of zeros starting after a move; flagged when at least two long
        run_start = -1
        flags = np.zeros(len(z), bool)
        for j in range(len(z)):
            if z[j]:
                if run_start < 0:
                    run_start = j
                if j - run_start >= 1 and bool(before[run_start]):
                    flags[run_start : j + 1] = True
            else:
                run_start = -1
        frozen.loc[idx] = flags
    out["frozen"] = frozen
    return out


def _loss_spikes(metrics: pd.DataFrame, serial_index: list[int],
                 loss_factor: float) -> dict[int, list[str]]:  # fmt: skip
    """Serial -> the losses that spiked at or before it (since the serial before): a value
    that is not finite, or above ``loss_factor`` times the median of that loss's earlier
    values (at least two of them, median > 0)."""
    out: dict[int, list[str]] = {}
    if metrics is None or not len(metrics) or not serial_index:
        return out
    losses = metrics[[bool(LOSS_NAME.search(str(n))) for n in metrics["name"]]]
    ordered = np.asarray(sorted(serial_index))
    for name, df in losses.groupby("name", sort=True):
        df = df.sort_values("serial", kind="stable")
        values = df["value"].to_numpy(dtype=np.float64)
        for j, (s, x) in enumerate(zip(df["serial"], values)):
            earlier = values[:j][np.isfinite(values[:j])]
            med = float(np.median(earlier)) if len(earlier) >= 2 else math.nan
            if np.isfinite(x) and not (med > 0 and x > loss_factor * med):
                continue
            at = int(np.searchsorted(ordered, int(s), side="left"))
            if at < len(ordered):  # the first serial saved at or after the spike
                what = f"{name} = {x:.4g}" + ("" if not med > 0 else f" (median {med:.4g})")
                out.setdefault(int(ordered[at]), []).append(what)
    return out


def summarize(h: pd.DataFrame, serials: pd.DataFrame, metrics: pd.DataFrame | None,
              latest: int | None, spike_factor: float = 10.0,
              loss_factor: float = 3.0) -> pd.DataFrame:  # fmt: skip
    """The per-serial verdicts of a health table (see :func:`health_summary`)."""
    if spike_factor <= 1 or loss_factor <= 1:
        raise ValueError("spike_factor and loss_factor must be greater than 1")
    index = [int(s) for s in serials.index]
    empty = ["nonfinite", "update_spike", "l2_jump", "frozen", "update_ratio"]
    rules = variable_rules(h, spike_factor) if len(h) else pd.DataFrame(columns=empty)
    keys = list(zip(h["node"], h["name"]))
    by: dict[str, dict[int, set]] = {k: {} for k in ("nonfinite", "update_spike", "l2_jump",
                                                      "frozen")}  # fmt: skip
    for flag, found in by.items():
        for i in np.flatnonzero(rules[flag].to_numpy(dtype=bool)) if len(h) else []:
            found.setdefault(int(h["serial"].iat[i]), set()).add(keys[i])
    # frozen counts only while most other variables move
    measured = h[np.isfinite(h["update_rel"])]
    moving = (measured["update_rel"] > 0).groupby(measured["serial"]).mean()
    by["frozen"] = {s: v for s, v in by["frozen"].items() if moving.get(s, 0) > 0.5}
    ratio = rules["update_ratio"].groupby(h["serial"]).max() if len(h) else pd.Series()
    loss = _loss_spikes(metrics, index, loss_factor)
    loadable = serials["loadable"] if "loadable" in serials else pd.Series(True, index=index)
    onsets: dict[str, set[int]] = {
        "nonfinite": set(by["nonfinite"]), "update_spike": set(by["update_spike"]),
        "l2_jump": set(by["l2_jump"]), "loss_spike": set(loss), "frozen": set(by["frozen"]),
        "not_loadable": {s for s in index if not loadable.get(s, True)},
    }  # fmt: skip
    first: dict[str, int | None] = {k: min(v) if v else None for k, v in onsets.items()}
    diverged = [f for k in ("nonfinite", "update_spike", "l2_jump", "loss_spike")
                if (f := first[k]) is not None]  # fmt: skip
    divergence = min(diverged) if diverged else None
    complete = serials["complete"] if "complete" in serials else pd.Series(True, index=index)
    if divergence is None:
        rollback = latest
    else:
        ok = [s for s in index if s < divergence and bool(loadable.get(s, True))
              and bool(complete.get(s, True))]  # fmt: skip
        rollback = max(ok) if ok else None
    rows = []
    for s in index:
        text = []
        nonfinite = by["nonfinite"].get(s, set())
        spikes = by["update_spike"].get(s, set()) | by["l2_jump"].get(s, set())
        frozen = by["frozen"].get(s, set())
        if not bool(loadable.get(s, True)):
            text.append("not loadable")
        if nonfinite:
            text.append(f"NaN/inf in {len(nonfinite)}: {_names(nonfinite)}")
        if by["update_spike"].get(s):
            text.append(f"update spike (> {spike_factor:g}x median) in "
                        f"{len(by['update_spike'][s])}: {_names(by['update_spike'][s])}")  # fmt: skip
        if by["l2_jump"].get(s):
            text.append(f"l2 jump (> {spike_factor:g}x) in {len(by['l2_jump'][s])}: "
                        f"{_names(by['l2_jump'][s])}")  # fmt: skip
        if loss.get(s):
            text.append("loss spike: " + ", ".join(loss[s]))
        if frozen:
            text.append(f"frozen (no change for 2+ serials) {len(frozen)}: {_names(frozen)}")
        if not bool(loadable.get(s, True)):
            status = "not_loadable"
        elif nonfinite:
            status = "nonfinite"
        elif spikes or loss.get(s):
            status = "spike"
        elif frozen:
            status = "frozen"
        else:
            status = "ok"
        onset = [k for k, f in first.items() if f == s]
        r = ratio.get(s, math.nan)
        rows.append({"serial": s, "status": status, "findings": "; ".join(text) or None,
                     "onset": ", ".join(onset) or None, "n_nonfinite": len(nonfinite),
                     "n_spike": len(spikes), "n_frozen": len(frozen),
                     "loss_spike": bool(loss.get(s)),
                     "max_update_ratio": float(r) if pd.notna(r) else math.nan,
                     "loadable": bool(loadable.get(s, True))})  # fmt: skip
    table = pd.DataFrame(rows, columns=["serial", *SUMMARY_COLUMNS]).set_index("serial")
    table = table.astype({"n_nonfinite": "int64", "n_spike": "int64", "n_frozen": "int64",
                          "loss_spike": bool, "loadable": bool,
                          "max_update_ratio": "float64"})  # fmt: skip
    table.index = table.index.astype("int64")
    for col in ("findings", "onset"):
        table[col] = table[col].astype(object).where(table[col].notna(), None)
    table.attrs.update(first=first, divergence=divergence, rollback_point=rollback,
                       latest=latest, spike_factor=spike_factor, loss_factor=loss_factor,
                       top=top_spikes(h, rules))  # fmt: skip
    return table


def top_spikes(h: pd.DataFrame, rules: pd.DataFrame, n: int = 10) -> list[dict]:
    """The variables whose update jumped most over their own median (largest first): one
    record each (node, name, serial, update_rel, median, ratio)."""
    if not len(h):
        return []
    df = pd.DataFrame({"node": h["node"], "name": h["name"], "serial": h["serial"],
                       "update_rel": h["update_rel"], "median": rules["update_median"],
                       "ratio": rules["update_ratio"]})  # fmt: skip
    df = df[np.isfinite(df["ratio"])]
    df = df.sort_values("ratio", ascending=False, kind="stable")
    df = df.drop_duplicates(["node", "name"]).head(n)
    return [{"node": r.node, "name": r.name, "serial": int(r.serial),
             "update_rel": float(r.update_rel), "median": float(r.median),
             "ratio": float(r.ratio)} for r in df.itertuples(index=False)]  # fmt: skip


def health_summary(scan: Scan, spike_factor: float = 10.0, kinds: Iterable[str] | None = ("model",),
                   loss_factor: float = 3.0,
                   progress: Callable[[int, int], None] | None = None) -> pd.DataFrame:  # fmt: skip
    """Per serial: ``status`` (ok | nonfinite | spike | frozen | not_loadable), ``findings``,
    ``onset`` (the anomalies first seen at this serial), counts and ``max_update_ratio``;
    ``.attrs``: ``first`` (anomaly -> first serial), ``divergence``, ``rollback_point``,
    ``top`` (the variables with the largest update spikes). See docs/health.md."""
    h = health(scan, kinds=kinds, progress=progress)
    return summarize(h, scan.serials, scan.metrics, scan.latest, spike_factor, loss_factor)
