"""Per-variable statistics, streamed in chunks with float64 accumulators.

min, max, mean, std and l2 are over the *finite* values (NaN and ±inf are counted in
``n_nan`` / ``n_inf`` instead of poisoning every statistic); ``frac_zero`` is over all values.
Complex values are taken by magnitude, bools as 0/1; object (non-tensor) variables get NaN.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..dtypes import is_numeric
from ..scan.core import Scan
from .sums import PIECE, scratch, sum_squares

STAT_COLUMNS = ["min", "max", "mean", "std", "l2", "n_nan", "n_inf", "frac_zero"]
STATS_TABLE = ["serial", "node", "name", "dtype", "shape", "numel", *STAT_COLUMNS, "error"]
CHUNK_BYTES = 4 << 20  # raw bytes per chunk: float64 temporaries stay a few times this
WINDOW = 4  # variables in flight at once: peak memory ~ WINDOW x a few chunks


def as_float64(chunk: np.ndarray) -> np.ndarray:
    """A chunk as float64 (complex by magnitude, bool as 0/1)."""
    if chunk.dtype.kind == "c":
        return np.abs(chunk.astype(np.complex128))
    if chunk.dtype.kind in "OSU":
        raise TypeError(f"{chunk.dtype.name} values have no numeric statistics")
    return chunk.astype(np.float64)


#: a piece's Σ(x - mean)² is taken as Σx² - (Σx)²/k when that keeps at least this share of
#: Σx² (|mean| up to ~8 standard deviations: under 2 of float64's ~16 digits cancel, ~1e-12
#: relative); else from the values centred, as numpy's two passes do (constant tensors,
#: offsets like 1e4 ± 1e-3)
CANCEL = 1 / 64
_F64 = np.dtype(np.float64)


@dataclass
class Accumulator:
    """Streaming statistics over float64 pieces (Chan et al. merge of count/mean/M2 per piece).

    Each chunk is widened to float64 in pieces of :data:`~.sums.PIECE` values into a shared
    scratch row (:func:`~.sums.scratch`; float64 chunks are used as they are): Σx² by rows
    (:func:`~.sums.sum_squares`, which is also the finiteness test: a piece holding NaN/inf
    takes the masked path), Σx, and min/max and the zero count on the values at their own
    width. A piece's M2 comes from Σx² and Σx unless that would cancel (see :data:`CANCEL`):
    six passes over a cache-sized piece (2 MiB of float64, no fresh memory) instead of nine
    over a fresh float64 copy of the chunk, and no BLAS dot long enough to wake OpenBLAS's
    threads (16 M float32 values in 4 MiB chunks: 20-22 -> 12.8-13.3 ms in-process; 160-260
    ms before on two busy cores, where each chunk's dots woke OpenBLAS's pool).
    """

    n: int = 0
    n_finite: int = 0
    mean: float = 0.0
    m2: float = 0.0
    sumsq: float = 0.0
    lo: float = math.inf
    hi: float = -math.inf
    n_nan: int = 0
    n_inf: int = 0
    n_zero: int = 0

    def add(self, chunk: np.ndarray) -> None:
        x = np.asarray(chunk).reshape(-1)
        if x.dtype.kind in "cOSU":
            x = as_float64(x)  # complex by magnitude; strings raise
        if x.size == 0:
            return
        self.n += x.size
        quiet = np.errstate(over="ignore", invalid="ignore")  # Σx² of huge values: inf
        with quiet, scratch(min(PIECE, x.size), rows=1) as bufs:
            for start in range(0, x.size, PIECE):
                self._add_piece(x[start : start + PIECE], bufs[0])

    def _add_piece(self, part: np.ndarray, buf: np.ndarray) -> None:
        k = part.size
        if part.dtype == _F64:
            a = part
        else:
            a = buf[:k]
            np.copyto(a, part, casting="unsafe")
        raw = part if part.dtype.kind in "fiub" else a  # its own width: cheaper to scan
        self.n_zero += int(np.count_nonzero(raw == 0))
        ss = sum_squares(a)
        if ss - ss == 0:  # every value finite (a NaN or ±inf makes Σx² NaN or inf)
            lo, hi = float(np.minimum.reduce(raw)), float(np.maximum.reduce(raw))
            self._merge(a, ss, lo, hi, buf[:k])
            return
        finite = np.isfinite(a)
        n_finite = int(np.count_nonzero(finite))
        nan = int(np.count_nonzero(np.isnan(a)))
        self.n_nan += nan
        self.n_inf += k - n_finite - nan
        if n_finite:
            f = a[finite]  # a copy: centred in place if need be
            self._merge(f, sum_squares(f), float(f.min()), float(f.max()), f)

    def _merge(self, a: np.ndarray, ss: float, lo: float, hi: float, work: np.ndarray) -> None:
        """One piece of finite values ``a`` (its Σx² ``ss``) into the totals; ``work``: room
        for ``a`` centred (``a`` itself, or a scratch row)."""
        k = a.size
        s = float(np.add.reduce(a))
        cmean = s / k
        cm2 = ss - s * cmean
        if not (cm2 >= CANCEL * ss and ss < math.inf):  # cancels (or overflowed): centre
            np.subtract(a, cmean, out=work)
            cm2 = sum_squares(work)
        self.sumsq += ss
        self.lo = min(self.lo, lo)
        self.hi = max(self.hi, hi)
        total = self.n_finite + k
        delta = cmean - self.mean
        self.mean += delta * k / total
        self.m2 += cm2 + delta * delta * self.n_finite * k / total
        self.n_finite = total

    def result(self) -> dict:
        empty = self.n_finite == 0
        return {
            "min": math.nan if empty else self.lo,
            "max": math.nan if empty else self.hi,
            "mean": math.nan if empty else self.mean,
            "std": math.nan if empty else math.sqrt(max(self.m2, 0.0) / self.n_finite),
            "l2": math.nan if empty else math.sqrt(self.sumsq),
            "n_nan": self.n_nan,
            "n_inf": self.n_inf,
            "frac_zero": self.n_zero / self.n if self.n else math.nan,
        }


def nan_stats(error: str | None = None) -> dict:
    out: dict[str, Any] = dict.fromkeys(STAT_COLUMNS, math.nan)
    out.update(n_nan=0, n_inf=0, error=error)
    return out


def chunk_stats(chunks: Iterable[np.ndarray]) -> dict:
    acc = Accumulator()
    for chunk in chunks:
        acc.add(chunk)
    return acc.result()


def variable_stats(scan: Scan, name: str, serial: int, node: str, dtype: str,
                   chunk_bytes: int = CHUNK_BYTES) -> dict:  # fmt: skip
    """Statistics of one variable; a read error becomes the ``error`` field."""
    if not is_numeric(dtype):
        return nan_stats()
    try:
        out = chunk_stats(scan.iter_chunks(name, serial, node, chunk_bytes))
        out["error"] = None
        return out
    except Exception as e:  # noqa: BLE001 - one bad variable must not sink the table
        return nan_stats(f"{type(e).__name__}: {e}"[:300])


def bounded_map(fn: Callable, items: list, executor: Executor | None,
                window: int = WINDOW) -> Iterator:  # fmt: skip
    """``fn(*item)`` for each item, in order, at most ``window`` running at once."""
    if executor is None or len(items) <= 1:
        for item in items:
            yield fn(*item)
        return
    pending = []
    for item in items:
        pending.append(executor.submit(fn, *item))
        if len(pending) >= window:
            yield pending.pop(0).result()
    for fut in pending:
        yield fut.result()


def _map_stats(scan: Scan, jobs: list[tuple], chunk_bytes: int) -> Iterator[dict]:
    """:func:`variable_stats` of each job, in order: on remote storage ``ckptview_max_
    concurrency`` at once with small files fetched whole (:func:`.reads.run_jobs`), else
    ``WINDOW`` at once on the executor."""
    from .reads import run_jobs  # imported when values are read (not by opening a tree)

    def memory(n: int | None) -> int:  # a chunk read, and its float64 copy
        return 3 * (chunk_bytes if n is None else min(n, chunk_bytes))

    def reads(job: tuple) -> list:  # what variable_stats reads: numeric values
        return [job[:4]] if is_numeric(job[4]) else []

    return run_jobs(scan, variable_stats, jobs, reads, memory,
                    lambda: bounded_map(variable_stats, jobs, scan.pool()))  # fmt: skip


def resolve_serial(scan: Scan, serial: int | None) -> int:
    """``serial`` checked to exist; None: the latest (else the highest) serial."""
    if serial is None:
        serial = scan.latest
        if serial is None:
            if not len(scan.serials):
                raise KeyError("the tree has no serials")
            serial = int(scan.serials.index.max())
    serial = int(serial)
    if serial not in set(scan.serials.index):
        raise KeyError(f"no serial {serial}; serials: {list(scan.serials.index)}")
    return serial


def stats(scan: Scan, serial: int | None = None, names: Iterable[str] | None = None,
          chunk_bytes: int = CHUNK_BYTES) -> pd.DataFrame:  # fmt: skip
    """One row per variable of a serial: its header fields and statistics."""
    serial = resolve_serial(scan, serial)
    df = scan.variables
    df = df[df["serial"] == serial]
    if names is not None:
        names = [names] if isinstance(names, str) else list(names)
        missing = sorted(set(names) - set(df["name"]))
        if missing:
            raise KeyError(f"no variable {missing[0]!r} in serial {serial}")
        df = df[df["name"].isin(names)]
    rows = list(df.itertuples(index=False))
    jobs = [(scan, r.name, serial, r.node, r.dtype, chunk_bytes) for r in rows if r.error is None]
    results = iter(_map_stats(scan, jobs, chunk_bytes))
    out = []
    for r in rows:
        st = next(results) if r.error is None else nan_stats(r.error)
        out.append({"serial": serial, "node": r.node, "name": r.name, "dtype": r.dtype,
                    "shape": r.shape, "numel": r.numel, **st})  # fmt: skip
    table = pd.DataFrame(out, columns=STATS_TABLE)
    return table.astype({"serial": "int64", "numel": "int64", "n_nan": "int64",
                         "n_inf": "int64"})  # fmt: skip


def trajectory(scan: Scan, name: str, stat: str = "l2", node: str = "",
               chunk_bytes: int = CHUNK_BYTES) -> pd.Series:  # fmt: skip
    """One statistic of one variable across every serial holding it (index: serial)."""
    if stat not in STAT_COLUMNS:
        raise ValueError(f"unknown stat {stat!r}; one of {', '.join(STAT_COLUMNS)}")
    df = scan.variables
    df = df[df["name"] == name]
    if node:
        df = df[df["node"] == node]
    elif (df["node"] == "").any():
        df = df[df["node"] == ""]
    elif df.groupby("serial")["node"].nunique().max() > 1:
        raise KeyError(f"{name!r} is on several nodes ({', '.join(sorted(set(df['node'])))}): "
                       "pass node=")  # fmt: skip
    if df.empty:
        raise KeyError(f"no variable {name!r} in any serial")
    rows = list(df.sort_values("serial").itertuples(index=False))
    jobs = [(scan, r.name, r.serial, r.node, r.dtype, chunk_bytes) for r in rows]
    values = [
        st[stat] if r.error is None else math.nan
        for r, st in zip(rows, _map_stats(scan, jobs, chunk_bytes))
    ]
    index = pd.Index([int(r.serial) for r in rows], name="serial", dtype="int64")
    return pd.Series(values, index=index, name=f"{name}:{stat}", dtype="float64")
