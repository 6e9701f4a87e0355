"""Sums of products in float64 over long arrays, at few numpy calls per value.

Values are widened to float64 in pieces of :data:`PIECE` values (one ``copyto`` per piece, a
2 MiB buffer); each piece's dot products are formed by rows of :data:`ROW` values in one
``vecdot`` call. Rows keep OpenBLAS on the calling thread (it computes a dot of at most
10,000 values there; larger ones wake its pool, which costs more than it saves while reads
and other variables' jobs share the cores), and one call per piece instead of one per row
keeps numpy's per-call overhead (~1-2 µs, a third of the time with 8 Ki-value pieces) off the
values. Rows also bound the general path: a row whose difference holds a NaN is compared
alone, as before.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

#: values widened to float64 at once
PIECE = 1 << 18
#: values per dot product (under OpenBLAS's 10,000-value threshold for its threads)
ROW = 8 << 10
#: scratch buffers kept between uses (at most 6 MiB each)
KEEP_SCRATCH = 4
_vecdot = getattr(np, "vecdot", None)  # numpy >= 2; einsum before
_FREE: list[np.ndarray] = []
_LOCK = threading.Lock()


def row_dots(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Σ u·v of each run of :data:`ROW` values of two flat float64 arrays of one length (the
    last run may be shorter), every row's dot in one call."""
    full = u.size - u.size % ROW
    nrows = full // ROW
    out = np.empty(nrows + (full < u.size))
    if nrows:
        ru, rv = u[:full].reshape(nrows, ROW), v[:full].reshape(nrows, ROW)
        out[:nrows] = _vecdot(ru, rv) if _vecdot is not None else np.einsum("ij,ij->i", ru, rv)
    if full < u.size:
        out[-1] = u[full:].dot(v[full:])
    return out


def row_squares(v: np.ndarray) -> np.ndarray:
    """Σx² of each run of :data:`ROW` values of a flat float64 array."""
    return row_dots(v, v)


def sum_squares(v: np.ndarray) -> float:
    """Σx² of a flat float64 array, by rows."""
    if v.size <= ROW:
        return float(v.dot(v))
    return float(row_dots(v, v).sum())


@contextmanager
def scratch(n: int, rows: int = 3) -> Iterator[np.ndarray]:
    """``rows`` float64 rows of ``n`` values to work in, given back after use: up to
    :data:`KEEP_SCRATCH` of them are kept for the next caller (fresh pages would be faulted in
    and zeroed for each variable), whatever thread it runs on."""
    with _LOCK:
        for i, buf in enumerate(_FREE):
            if buf.shape[0] == rows and buf.shape[1] >= n:
                del _FREE[i]
                break
        else:
            buf = None
    if buf is None:
        buf = np.empty((rows, max(n, ROW)))
    try:
        yield buf[:, :n]
    finally:
        with _LOCK:
            if len(_FREE) < KEEP_SCRATCH:
                _FREE.append(buf)
