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


@dataclass
class Accumulator:
    """Streaming statistics (Chan et al. merge of count/mean/M2 per chunk)."""

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
        x = as_float64(np.asarray(chunk).reshape(-1))
        self.n += x.size
        self.n_zero += int(np.count_nonzero(x == 0))
        finite_mask = np.isfinite(x)
        k = int(np.count_nonzero(finite_mask))
        if k < x.size:
            nan = int(np.count_nonzero(np.isnan(x)))
            self.n_nan += nan
            self.n_inf += x.size - k - nan
            x = x[finite_mask]
        del finite_mask
        if k == 0:
            return
        cmean = float(x.mean())
        self.sumsq += float(np.dot(x, x))
        self.lo = min(self.lo, float(x.min()))
        self.hi = max(self.hi, float(x.max()))
        x -= cmean
        cm2 = float(np.dot(x, x))
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
