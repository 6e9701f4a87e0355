"""Numeric diff of two serials (of one tree, or of two trees in any formats), streamed.

Both sides are read as flat chunks (each codec picks its own boundaries) and re-chunked into
aligned pairs, so peak memory is a few chunks per variable in flight, whatever the size: per
pair, two chunks per side (the one compared, the next read ahead on a reader thread of the
stream's own) and the float64 scratch of :mod:`.sums`.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..dtypes import is_numeric
from ..scan.core import Scan
from .reads import run_jobs
from .stats import CHUNK_BYTES, bounded_map, resolve_serial
from .sums import PIECE, ROW, row_dots, scratch

DIFF_COLUMNS = [
    "node", "name", "status", "dtype_a", "dtype_b", "shape_a", "shape_b", "numel",
    "max_abs", "l2", "rel_l2", "cosine", "norm_a", "norm_b", "n_changed", "error",
]  # fmt: skip
STATUSES = ("identical", "changed", "added", "removed", "shape_changed", "dtype_changed", "error")


def aligned(chunks_a: Iterable[np.ndarray],
            chunks_b: Iterable[np.ndarray]) -> Iterator[tuple[np.ndarray, np.ndarray]]:  # fmt: skip
    """Pairs of equally long flat pieces from two streams cut at different boundaries.

    A chunk is let go before the stream is asked for its next one (with a read-ahead
    stream, that next one's successor is then read while it is used: two chunks per side,
    not three); a caller that drops each pair before asking for the next keeps it so."""
    it_a, it_b = iter(chunks_a), iter(chunks_b)
    a: np.ndarray | None = _NONE
    b: np.ndarray | None = _NONE
    ia = ib = 0
    while True:
        if a is not None and ia >= len(a):
            a = None
            a, ia = _piece(it_a), 0
        if b is not None and ib >= len(b):
            b = None
            b, ib = _piece(it_b), 0
        if a is None or b is None:
            if a is not None or b is not None:
                raise ValueError("the two sides hold different numbers of values")
            return
        n = min(len(a) - ia, len(b) - ib)
        yield a[ia : ia + n], b[ib : ib + n]
        ia += n
        ib += n


_NONE = np.empty(0)


def _piece(it: Iterator[np.ndarray]) -> np.ndarray | None:
    """The stream's next non-empty chunk, flat; None at its end."""
    while True:
        nxt = next(it, None)
        if nxt is None:
            return None
        nxt = np.asarray(nxt).reshape(-1)
        if nxt.size:
            return nxt


def _wide(x: np.ndarray, complex_: bool) -> np.ndarray:
    if complex_:
        return x.astype(np.complex128)
    return x.astype(np.float64)


#: values per dot product, and per row compared alone when a piece's difference holds NaN
#: (values are widened in pieces of :data:`~.sums.PIECE`; see :mod:`.sums`)
BLOCK = ROW


@dataclass
class DiffAccumulator:
    """Streaming max|b-a|, ‖b-a‖², ‖a‖², ‖b‖², <a,b> and the count of differing values.

    Real values are widened to float64 block by block into reused, cache-sized buffers:
    d = b - a once, four ``np.dot`` reductions, ``max``/``min`` of d, and the changed count
    on the raw values (or ``d != 0``: for finite values ``b - a == 0`` exactly when
    ``a == b``). A block where d holds a NaN (a NaN, or the same infinity on both sides)
    takes the general path, as do complex values.
    """

    max_abs: float = 0.0
    d2: float = 0.0
    a2: float = 0.0
    b2: float = 0.0
    ab: float = 0.0
    n: int = 0
    n_changed: int = 0

    def add(self, xa: np.ndarray, xb: np.ndarray) -> None:
        self.n += xa.size
        if xa.size == 0:
            return
        with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: handled, not news
            self._add(xa, xb)

    def _add(self, xa: np.ndarray, xb: np.ndarray) -> None:
        if "c" in (xa.dtype.kind, xb.dtype.kind) or "O" in (xa.dtype.kind, xb.dtype.kind):
            self._add_general(xa, xb)
            return
        # same dtype: count differences on the raw values (cheaper than on float64)
        raw = xa.dtype == xb.dtype and xa.dtype.kind in "fiub"
        with scratch(min(PIECE, xa.size)) as bufs:
            self._add_pieces(xa, xb, raw, bufs)

    def _add_pieces(self, xa: np.ndarray, xb: np.ndarray, raw: bool, bufs: np.ndarray) -> None:
        full = bufs.shape[1]
        copy, sub, count = np.copyto, np.subtract, np.count_nonzero
        top, bottom = np.maximum.reduce, np.minimum.reduce
        d2 = a2 = b2 = ab = hi = 0.0
        changed = 0
        for start in range(0, xa.size, full):
            pa, pb = xa[start : start + full], xb[start : start + full]
            a, b, d = bufs if pa.size == full else bufs[:, : pa.size]
            copy(a, pa, casting="unsafe")
            copy(b, pb, casting="unsafe")
            sub(b, a, out=d)
            rows = row_dots(d, d)
            dd = float(rows.sum())
            if dd != dd:  # NaN in d: its rows alone take the general path
                self._add_rows(pa, pb, a, b, d, rows, raw)
                continue
            d2 += dd
            a2 += float(row_dots(a, a).sum())
            b2 += float(row_dots(b, b).sum())
            ab += float(row_dots(a, b).sum())
            changed += int(count(pa != pb) if raw else count(d != 0))
            m = max(float(top(d)), -float(bottom(d)))
            if m > hi:
                hi = m
        self.d2 += d2
        self.a2 += a2
        self.b2 += b2
        self.ab += ab
        self.n_changed += changed
        # a NaN max stays NaN: max() keeps its first argument when the other is not larger
        self.max_abs = max(self.max_abs, hi)

    def _add_rows(self, pa: np.ndarray, pb: np.ndarray, a: np.ndarray, b: np.ndarray,
                  d: np.ndarray, rows: np.ndarray, raw: bool) -> None:  # fmt: skip
        """A piece holding NaN in its difference, row by row (``a``, ``b``, ``d``: its values
        widened, and b - a; ``rows``: each row's Σd²): a row whose difference is NaN (a NaN,
        or the same infinity on both sides) takes the general path."""
        count = np.count_nonzero
        for r, dd in enumerate(rows.tolist()):
            start, end = r * BLOCK, (r + 1) * BLOCK
            if dd != dd:
                self._add_general(pa[start:end], pb[start:end])
                continue
            ra, rb, rd = a[start:end], b[start:end], d[start:end]
            self.d2 += dd
            self.a2 += float(ra.dot(ra))
            self.b2 += float(rb.dot(rb))
            self.ab += float(ra.dot(rb))
            self.n_changed += int(count(pa[start:end] != pb[start:end]) if raw else count(rd != 0))
            self.max_abs = max(self.max_abs, float(rd.max()), -float(rd.min()))

    def _add_general(self, xa: np.ndarray, xb: np.ndarray) -> None:
        """Any dtypes (complex, NaN, infinities): widened whole, equal NaNs masked out."""
        exact = xa.dtype == xb.dtype and xa.dtype.kind in "iub"
        complex_ = xa.dtype.kind == "c" or xb.dtype.kind == "c"
        a, b = _wide(xa, complex_), _wide(xb, complex_)
        same = (xa == xb) if exact else (a == b) | (np.isnan(a) & np.isnan(b))
        self.n_changed += int(same.size - np.count_nonzero(same))
        d = b - a
        d[same] = 0  # equal NaNs / infs are no difference
        del same
        self.a2 += float(np.vdot(a, a).real)
        self.b2 += float(np.vdot(b, b).real)
        self.ab += float(np.vdot(a, b).real)
        del a, b
        self.d2 += float(np.vdot(d, d).real)
        if d.dtype.kind == "c":
            d = np.abs(d)
        else:
            np.abs(d, out=d)
        self.max_abs = max(self.max_abs, float(d.max())) if not np.isnan(d).any() else math.nan

    def result(self) -> dict:
        norm_a, norm_b, l2 = math.sqrt(self.a2), math.sqrt(self.b2), math.sqrt(self.d2)
        rel = l2 / norm_a if norm_a else 0.0 if l2 == 0 else math.inf
        denom = norm_a * norm_b
        return {"max_abs": self.max_abs if self.n else math.nan, "l2": l2, "rel_l2": rel,
                "cosine": self.ab / denom if denom else math.nan, "norm_a": norm_a,
                "norm_b": norm_b, "n_changed": self.n_changed}  # fmt: skip


_IO_LOCK = threading.Lock()
_END = object()
#: idle one-thread readers kept for the next streams (one per stream while it is read)
KEEP_READERS = 16
_READERS: list[ThreadPoolExecutor] = []


def _lease_reader() -> ThreadPoolExecutor:
    """A thread of its own for one stream's reads: the one used last, else a new one.

    Private (not the catalog's executor): ``compare`` itself runs on that executor, and
    waiting there on tasks queued behind it could deadlock a small pool. One thread per
    stream, not a shared pool: a local read allocates its chunk on the reading thread, so in
    that thread's malloc arena (glibc keeps one per thread, up to 8 per core, and each keeps
    up to 2 chunks' worth of freed memory once the first chunk-sized ``free`` has raised its
    mmap threshold). A stream read on one thread reuses the chunk it freed; a stream whose
    reads hopped over 16 pool threads left freed chunks in every arena it touched (a diff of
    4 x 128 MiB variables held ~2x its live chunks in resident memory).
    """
    with _IO_LOCK:
        if _READERS:
            return _READERS.pop()  # the last given back: its arena holds free chunks
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckptview-read")


def _give_back(reader: ThreadPoolExecutor) -> None:
    with _IO_LOCK:
        if len(_READERS) < KEEP_READERS:
            _READERS.append(reader)
            return
    reader.shutdown(wait=False)


class ReadAhead:
    """An iterator that fetches its next item on a reader thread of its own while the caller
    works on the current one: one item in flight, so memory stays one chunk more per side
    (a caller that lets each item go before asking for the next; see :func:`aligned`)."""

    def __init__(self, iterable: Iterable):
        self._it = iter(iterable)
        self._reader: ThreadPoolExecutor | None = _lease_reader()
        self._next: Future | None = self._reader.submit(next, self._it, _END)

    def __iter__(self):
        return self

    def __next__(self):
        if self._next is None or self._reader is None:
            raise StopIteration
        item = self._next.result()
        if item is _END:
            self._next = None
            raise StopIteration
        self._next = self._reader.submit(next, self._it, _END)
        return item

    def close(self) -> None:
        """Wait for the read in flight (its generator is busy until then), then close, and
        give the reader thread back."""
        fut, self._next = self._next, None
        if fut is not None:
            try:
                fut.result()
            except Exception:  # noqa: BLE001 - the caller is already failing or done
                pass
        reader, self._reader = self._reader, None
        try:
            close = getattr(self._it, "close", None)
            if close is not None:
                close()
        finally:
            if reader is not None:
                _give_back(reader)


@dataclass
class Side:
    """One variable on one side of a diff."""

    scan: Scan
    serial: int
    node: str
    name: str
    dtype: str
    shape: tuple
    numel: int
    error: str | None


def _empty_metrics() -> dict:
    return {"max_abs": math.nan, "l2": math.nan, "rel_l2": math.nan, "cosine": math.nan,
            "norm_a": math.nan, "norm_b": math.nan, "n_changed": pd.NA}  # fmt: skip


def compare(a: Side | None, b: Side | None, chunk_bytes: int = CHUNK_BYTES,
            progress: Callable[[int], None] | None = None) -> dict:  # fmt: skip
    """One diff row."""
    ref = a if a is not None else b
    if ref is None:
        raise TypeError("compare needs at least one side")
    row = {"node": ref.node, "name": ref.name, "dtype_a": a.dtype if a else None,
           "dtype_b": b.dtype if b else None, "shape_a": a.shape if a else None,
           "shape_b": b.shape if b else None, "numel": ref.numel, "error": None,
           **_empty_metrics()}  # fmt: skip
    if a is None or b is None:
        row["status"] = "added" if a is None else "removed"
        return row
    errors = [f"{s}: {x.error}" for s, x in (("a", a), ("b", b)) if x.error]
    if errors:
        return {**row, "status": "error", "error": "; ".join(errors)}
    if tuple(a.shape) != tuple(b.shape):
        return {**row, "status": "shape_changed"}
    status = "dtype_changed" if a.dtype != b.dtype else None
    try:
        if not (is_numeric(a.dtype) and is_numeric(b.dtype)):
            same = _objects_equal(a, b)
            return {**row, "status": status or ("identical" if same else "changed")}
        acc = DiffAccumulator()
        # both sides' next chunks are read concurrently, while the current pair is compared
        stream_a = ReadAhead(a.scan.iter_chunks(a.name, a.serial, a.node, chunk_bytes))
        try:
            stream_b = ReadAhead(b.scan.iter_chunks(b.name, b.serial, b.node, chunk_bytes))
            try:
                for xa, xb in aligned(stream_a, stream_b):
                    acc.add(xa, xb)
                    nbytes = xa.nbytes + xb.nbytes
                    del xa, xb  # let the chunks go before the next ones are asked for
                    if progress:
                        progress(nbytes)
            finally:
                stream_b.close()
        finally:
            stream_a.close()
        row.update(acc.result())
        row["status"] = status or ("identical" if acc.n_changed == 0 else "changed")
        return row
    except Exception as e:  # noqa: BLE001 - a bad variable is an error row
        return {**row, "status": "error", "error": f"{type(e).__name__}: {e}"[:300]}


def _objects_equal(a: Side, b: Side) -> bool:
    va = a.scan.read(a.name, a.serial, a.node)
    vb = b.scan.read(b.name, b.serial, b.node)
    try:
        return bool(np.array_equal(np.asarray(va), np.asarray(vb)))
    except Exception:  # noqa: BLE001 - incomparable objects differ
        return repr(va) == repr(vb)


def _sides(scan: Scan, serial: int, names: set[str] | None) -> dict[tuple[str, str], Side]:
    df = scan.variables
    df = df[df["serial"] == serial]
    if names is not None:
        df = df[df["name"].isin(names)]
    return {
        (r.node, r.name): Side(
            scan, serial, r.node, r.name, r.dtype, tuple(r.shape), r.numel, r.error
        )  # fmt: skip
        for r in df.itertuples(index=False)
    }


#: what ``match`` may be: pairing by (node, name) only, or also across nodes and by
#: logical name (container prefixes stripped)
MATCHES = ("exact", "auto")
#: containers a framework or wrapper puts before a model's own tensor names (a Lightning or
#: Megatron ``model/`` dict, DDP's ``module.``, ``torch.compile``'s ``_orig_mod.``, an HF
#: base model's ``model.``); stripped, repeatedly, to pair tensors across layouts
CONTAINER_PREFIXES = ("model/", "module.", "_orig_mod.", "model.", "state_dict/", "module/")
#: optimizer state named ``optimizer.state.<key>.<param>`` (Megatron dist) or
#: ``optimizer/<param>/<key>`` (named torch state): one logical name for both
_OPT_DOTTED = re.compile(r"^optimizer\.state\.([^./]+)\.(.+)$")
_OPT_SLASHED = re.compile(r"^optimizer/(.+\.[^/]+)/([^/.]+)$")


def logical_name(name: str) -> tuple[str, str]:
    """``name`` with its container prefixes stripped (optimizer state as
    ``optimizer:<key>:<param>``), and the prefixes stripped."""
    m = _OPT_DOTTED.match(name) or _OPT_SLASHED.match(name)
    if m is not None:
        dotted = name.startswith("optimizer.state.")
        key, param = (m[1], m[2]) if dotted else (m[2], m[1])
        core, stripped = logical_name(param)
        scheme = "optimizer.state.<key>." if dotted else "optimizer/…/<key>"
        return f"optimizer:{key}:{core}", scheme + (f" {stripped}" if stripped else "")
    stripped = ""
    changed = True
    while changed:
        changed = False
        for prefix in CONTAINER_PREFIXES:
            if name.startswith(prefix) and len(name) > len(prefix):
                name, stripped, changed = name[len(prefix) :], stripped + prefix, True
    return name, stripped


def pair(left: dict, right: dict, match: str = "auto") -> list[tuple[Side | None, Side | None]]:
    """Exact (node, name) pairs; with ``match="auto"`` leftovers whose name is unique on
    both sides pair across nodes (a per-node tree against a flat export), then leftovers
    whose logical name (:func:`logical_name`) is unique on both sides."""
    return pair_with_info(left, right, match)[0]


def pair_with_info(left: dict, right: dict, match: str = "auto"
                   ) -> tuple[list[tuple[Side | None, Side | None]], dict]:  # fmt: skip
    """:func:`pair`, and how it paired them: ``{"match", "exact", "across_nodes",
    "logical", "stripped_a", "stripped_b", "renamed"}`` (counts of pairs made each way, the
    prefixes stripped on each side, and ``{a name: b name}`` of pairs by logical name)."""
    if match not in MATCHES:
        raise ValueError(f"match must be one of {', '.join(map(repr, MATCHES))}, not {match!r}")
    pairs = [(left[k], right.get(k)) for k in left]
    info: dict = {"match": match, "exact": sum(b is not None for _, b in pairs),
                  "across_nodes": 0, "logical": 0, "stripped_a": [], "stripped_b": [],
                  "renamed": {}}  # fmt: skip
    rest = [k for k in right if k not in left]
    if match == "exact":
        return pairs + [(None, right[k]) for k in rest], info
    index = {k: i for i, k in enumerate(left)}
    for step in ("across_nodes", "logical"):
        lone_a = [k for k, (_, b) in zip(left, pairs) if b is None]
        if not lone_a or not rest:
            break
        key = (lambda k: k[1]) if step == "across_nodes" else (lambda k: logical_name(k[1])[0])
        by_a, by_b = _unique_by(lone_a, key), _unique_by(rest, key)
        taken = set()
        for name, ka in by_a.items():
            kb = by_b.get(name)
            if kb is None:
                continue
            pairs[index[ka]] = (left[ka], right[kb])
            taken.add(kb)
            info[step] += 1
            if step == "logical":
                info["renamed"][ka[1]] = kb[1]
                for side, k in (("stripped_a", ka), ("stripped_b", kb)):
                    cut = logical_name(k[1])[1]
                    if cut and cut not in info[side]:
                        info[side].append(cut)
        rest = [k for k in rest if k not in taken]
    return pairs + [(None, right[k]) for k in rest], info


def _unique_by(keys: list[tuple[str, str]], key: Callable) -> dict[str, tuple[str, str]]:
    seen: dict[str, list] = {}
    for k in keys:
        seen.setdefault(key(k), []).append(k)
    return {name: ks[0] for name, ks in seen.items() if len(ks) == 1}


def describe_pairing(info: dict) -> str:
    """One line: how a diff paired the two sides' tensors."""
    parts = [f"{info.get('exact', 0)} by name"]
    if info.get("across_nodes"):
        parts.append(f"{info['across_nodes']} across nodes")
    if info.get("logical"):
        cut = [f"{', '.join(info[s])} on {s[-1]}" for s in ("stripped_a", "stripped_b") if info[s]]
        parts.append(f"{info['logical']} by logical name" + (f" (stripped {'; '.join(cut)})" if cut else ""))
    return f"paired {', '.join(parts)} (match={info.get('match')})"


def rename_prefixes(pairs: Iterable[str]) -> Callable[[str], str]:
    """A ``rename`` from ``OLD=NEW`` strings: a name starting with OLD starts with NEW instead
    (the first OLD that fits, in order; ``=model/`` puts ``model/`` before every name)."""
    rules = []
    for text in pairs:
        old, sep, new = text.partition("=")
        if not sep:
            raise ValueError(f"rename must be OLD=NEW, not {text!r}")
        rules.append((old, new))

    def renamed(name: str) -> str:
        for old, new in rules:
            if name.startswith(old):
                return new + name[len(old) :]
        return name

    return renamed


def diff(scan: Scan, a: int | None, b: int | None, other: Scan | None = None,
         names: Iterable[str] | None = None, match: str | None = "auto",
         rename: Callable[[str], str] | dict | None = None, chunk_bytes: int = CHUNK_BYTES,
         progress: Callable[[int], None] | None = None) -> pd.DataFrame:  # fmt: skip
    """One row per (node, name) in either serial; see DESIGN.md §3 for the columns.

    ``other`` is a second tree's Scan (``b`` is then its serial); ``rename`` maps the b side's
    names onto a's (a dict or a function) before pairing. ``match`` (None: ``"auto"``): see
    :func:`pair`; ``df.attrs["pairing"]`` says how the sides were paired
    (:func:`pair_with_info`), and rows paired under another name keep a's name.
    """
    match = match or "auto"
    other = scan if other is None else other
    a = resolve_serial(scan, a)
    b = resolve_serial(other, b)
    wanted = None if names is None else ({names} if isinstance(names, str) else set(names))
    left = _sides(scan, a, wanted)
    right = _sides(other, b, None)
    if rename is not None:
        mapping = rename

        def renamed(name: str) -> str:
            return mapping.get(name, name) if isinstance(mapping, dict) else mapping(name)

        right = {(k[0], renamed(k[1])): v for k, v in right.items()}
    if wanted is not None:
        right = {k: v for k, v in right.items() if k[1] in wanted}
    pairs, info = pair_with_info(left, right, match)
    jobs = [(x, y, chunk_bytes, progress) for x, y in pairs]
    rows = list(_map_pairs(scan, other, jobs, chunk_bytes))
    for (x, y), row in zip(pairs, rows):
        if y is not None and x is not None and y.name != x.name:
            row["name"] = x.name
    df = pd.DataFrame(rows, columns=DIFF_COLUMNS)
    df["n_changed"] = df["n_changed"].astype("Int64")
    df["numel"] = df["numel"].astype("int64")
    df.attrs.update({"a": a, "b": b, "pairing": info})
    return by_change(df)


def _map_pairs(scan: Scan, other: Scan, jobs: list[tuple], chunk_bytes: int) -> Iterator[dict]:
    """:func:`compare` of each pair, in order: on remote storage (either side's)
    ``ckptview_max_concurrency`` pairs at once, small files fetched whole
    (:func:`.reads.run_jobs`); else ``WINDOW`` at once on the executor."""

    def reads(job: tuple) -> list:  # a pair whose values are compared (see compare)
        a, b = job[:2]
        if a is None or b is None or a.error or b.error or tuple(a.shape) != tuple(b.shape):
            return []
        return [(s.scan, s.name, s.serial, s.node) for s in (a, b)]

    def memory(n: int | None) -> int:  # both sides' chunks and their read-ahead
        return 2 * (2 * chunk_bytes if n is None else min(n, 2 * chunk_bytes))

    remote = other if other.storage.remote and not scan.storage.remote else scan
    return run_jobs(remote, compare, jobs, reads, memory,
                    lambda: bounded_map(compare, jobs, scan.pool()))  # fmt: skip


def by_change(df: pd.DataFrame) -> pd.DataFrame:
    """Diff rows biggest change first, the order every face shows: rows that differ by
    ``rel_l2`` descending, then those without one (added, removed, shape/dtype changed,
    errors), identical rows last; ties by name and node."""
    order = df["rel_l2"].astype("float64").fillna(-1.0)
    identical = (df["status"] == "identical").astype(int)
    keyed = df.assign(_same=identical, _rel=order)
    keyed = keyed.sort_values(["_same", "_rel", "name", "node"], ascending=[True, False, True, True],
                              kind="stable")  # fmt: skip
    return keyed.drop(columns=["_same", "_rel"]).reset_index(drop=True)
