"""One variable over several serials, each read once: its statistics, ``update_rel``
against the serial before, and its spectrum (:func:`measure_variable`).

A variable's serials that need work are streamed side by side, chunk by chunk (logical
tensors of any layout, through :meth:`Scan.iter_chunks`), re-cut into blocks of one size so
they line up; per block each serial's float64 copy serves both its own statistics and
``update_rel`` against the serial before. Memory: about two chunks per serial streamed, at
most :data:`MEMORY_BYTES` per variable. Spectral statistics need the whole 2-D matrix in
memory (as float64); matrices above ``spectral_max_numel`` values are skipped (NaN and a
``note``).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import itemsize
from ..engine.diff import DiffAccumulator, ReadAhead
from ..engine.stats import CHUNK_BYTES
from ..engine.sums import PIECE, ROW, row_squares, scratch, sum_squares
from ..scan.core import Scan
from .kept import KEPT
from .spectral import SPECTRAL_MAX_NUMEL, spectral_stats

#: the statistics of one variable in one serial (over its finite values)
HEALTH_STATS = ["l2", "rms", "max_abs", "n_nan", "n_inf"]
#: values a variable's job holds at once (its serials streamed side by side, about two chunks
#: each); up to :data:`~ckptview.engine.stats.WINDOW` variables are measured at once
MEMORY_BYTES = 32 << 20
MIN_CHUNK = 1 << 20  # chunks shrink to this before a run's serials are split into groups


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
            self.add_widened(b, sum_squares(b), part)

    def add_widened(self, b: np.ndarray, ss: float, raw: np.ndarray | None = None) -> None:
        """One piece already widened to float64 (``b``) with its Σx² (``ss``); ``raw``, the
        values it was widened from, gives max|x| at their own width."""
        if math.isfinite(ss):
            self.sumsq += ss
            self.n_finite += b.size
            src = raw if raw is not None and raw.dtype.kind == "f" else b
            self.max_abs = max(self.max_abs, float(src.max()), -float(src.min()))
            return
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
    asking nothing is read as the next one's predecessor (its statistics come along, unless
    ``sumsq``, its Σx² from the cache when it holds no NaN/inf, says they are known)."""

    serial: int
    shape: tuple
    dtype: str
    stats: bool = False
    update: bool = False
    spectral: bool = False
    sumsq: float | None = None


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


def _reduce(xs: list[np.ndarray | None], lanes: list[_Lane], pairs: list[DiffAccumulator | None],
            bufs: np.ndarray, known: list[float | None], dropped: list[float]) -> None:  # fmt: skip
    """One block index of a group, in pieces of :data:`PIECE` values: each lane's piece is
    widened to float64 once and serves its Σx² (:func:`row_squares`, the piece's finiteness
    test too: a piece holding NaN/inf takes :class:`NormAccumulator`'s masked path) and the
    difference against the lane before (``pairs[j]``: lane j - 1 against lane j). ``known[j]``:
    Σx² of lane j - 1 when it is known already (its statistics are cached and it holds no
    NaN/inf): its rows are then summed only where a difference is NaN, into ``dropped[j]``
    (those rows take :class:`DiffAccumulator`'s general path)."""
    k = len(xs)
    need = [x is not None and x.size > 0
            and (lanes[j].norm is not None or pairs[j] is not None
                 or (j + 1 < k and pairs[j + 1] is not None))
            for j, x in enumerate(xs)]  # fmt: skip
    size = max((x.size for x in xs if x is not None), default=0)
    copy, sub, f64 = np.copyto, np.subtract, np.dtype(np.float64)
    step = bufs.shape[1]
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: the general path's case
        for start in range(0, size, step):
            prev: np.ndarray | None = None
            prev_rows: np.ndarray | None = None
            for j in range(k):
                x = xs[j]
                if x is None or not need[j]:
                    prev = prev_rows = None
                    continue
                part = x[start : start + step]
                if part.dtype == f64:
                    cur = part
                else:
                    cur = bufs[j & 1] if part.size == step else bufs[j & 1, : part.size]
                    copy(cur, part, casting="unsafe")
                norm = lanes[j].norm
                later = j + 1 < k and pairs[j + 1] is not None and known[j + 1] is None
                rows = row_squares(cur) if norm is not None or later else None
                if norm is not None:
                    assert rows is not None
                    norm.add_widened(cur, float(rows.sum()), part)
                acc = pairs[j]
                if acc is not None and prev is not None and prev.size == cur.size:
                    d = bufs[2] if cur.size == step else bufs[2, : cur.size]
                    sub(cur, prev, out=d)
                    dd = row_squares(d)
                    total = float(dd.sum())
                    if total == total:
                        acc.d2 += total
                        acc.n += cur.size
                        if known[j] is None:
                            assert prev_rows is not None
                            acc.a2 += float(prev_rows.sum())
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
                        acc.d2 += float(dd[good].sum())
                        acc.n += int(lengths[good].sum())
                        before = prev_rows if prev_rows is not None else row_squares(prev)
                        if known[j] is None:
                            acc.a2 += float(before[good].sum())
                        else:
                            dropped[j] += float(before[bad].sum())
                prev, prev_rows = cur, rows


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
    known: list[float | None] = []  # Σx² of the lane before, when known (see _reduce)
    dropped = [0.0] * len(streamed)
    before_sumsq: float | None = None
    heads: list[ReadAhead] = []
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
                        head = ReadAhead(scan.iter_chunks(name, w.serial, node, chunk))
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
            sumsq = _sumsq(w, outs[i], carried=not own)
            stats = own and error is None and (w.stats or w.update or w.spectral or sumsq is None)
            lanes.append(_Lane(blocks, stats=stats, error=error, collect=collect))
            pairs.append(DiffAccumulator() if pos > 0 and w.update else None)
            before = lanes[pos - 1] if pos else None
            known.append(before_sumsq if before is not None and before.norm is None else None)
            before_sumsq = sumsq
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
                _reduce(xs, lanes, pairs, bufs, known, dropped)
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
            if known[pos] is not None:
                acc.a2 += known[pos] - dropped[pos]
            out["update_rel"] = acc.result()["rel_l2"]
        elif pos > 0 and wants[i].update and "update_error" not in out:
            out["update_error"] = lanes[pos - 1].error or lane.error or "ValueError: unpaired"


def known_sumsq(stats: dict | None) -> float | None:
    """Σx² from an entry's statistics (``l2``, ``n_nan``, ``n_inf``) when they cover every
    value (no NaN/inf, l2 finite), else None."""
    if not stats or stats.get("n_nan", 1) or stats.get("n_inf", 1):
        return None
    l2 = float(stats.get("l2", math.nan))
    return l2 * l2 if math.isfinite(l2) else None


def _sumsq(want: Want, out: dict, carried: bool) -> float | None:
    """Σx² of an entry known before its values stream by: from the cache (``want.sumsq``)
    or, for a group's carried first entry, from the group before (:func:`known_sumsq`)."""
    if want.sumsq is not None:
        return want.sumsq
    return known_sumsq(out) if carried and out.get("error") is None else None


def _itemsize(dtype: str) -> int:
    try:
        return max(1, itemsize(dtype))
    except Exception:  # noqa: BLE001 - an unknown name: assume float32
        return 4
