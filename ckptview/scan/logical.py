"""Logical tensors (DESIGN.md §3b): the pieces a serial's files hold, grouped by the tensor
they belong to, placed, and read back as one array.

A listed variable is a piece when its codec marked it (``VarInfo.attrs["piece"]``: a DTensor
shard, a DCP-written safetensors slice) or its layout says so (:meth:`Layout.piece`: Megatron
tensor-parallel shards). Pieces of one serial with the same catalog name become one
assembled variable: node ``""``, the full shape, ``n_shards``, and a locator listing each
piece with its offsets. A tensor also stored whole in the serial (a consolidated copy beside
the shards) stays that one row; its pieces are still listed in the shards table.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np

from ..dtypes import np_dtype
from ..model import FileRef, Piece, VarInfo
from .listing import FileResult
from .tables import catalog_names, stored_nbytes, var_name

#: the codec name of the synthetic results holding assembled variables
ASSEMBLED = "(assembled)"
#: up to this many pieces, overlaps are looked for in plain Python (else with numpy)
SMALL = 32

PiecesOf = Callable[[FileRef, Sequence[VarInfo]], "list[Piece | None] | None"]
ReadPiece = Callable[[FileResult, VarInfo], np.ndarray]
ChunkPiece = Callable[[FileResult, VarInfo, int], Iterator[np.ndarray]]
#: ``run(fn, items, cost)``: ``fn(item)`` for each item, results in order (``Storage.map_window``:
#: several at once on remote storage, within a budget of ``cost(item)`` bytes)
Run = Callable[..., Iterator]


def in_turn(fn: Callable, items: Iterable, cost: Callable | None = None) -> Iterator:
    """The plain :data:`Run`: one item after another."""
    for item in items:
        yield fn(item)


@dataclass
class Placed:
    """One stored piece of a logical tensor: its listing, its file's result and where it sits
    (``offsets``); ``rows``: the part of the stored tensor it is (a range on the first axis),
    None for all of it; ``copy``: a replica of another piece (listed, not read)."""

    var: VarInfo
    res: FileResult
    offsets: tuple[int, ...]
    piece: Piece
    copy: bool = False
    rows: tuple[int, int] | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        if self.rows is None:
            return tuple(self.var.shape)
        return (self.rows[1] - self.rows[0], *self.var.shape[1:])

    @property
    def nbytes(self) -> int:
        whole = stored_nbytes(self.var)
        if self.rows is None or not self.var.shape or not self.var.shape[0]:
            return whole
        return whole * (self.rows[1] - self.rows[0]) // int(self.var.shape[0])


@dataclass
class Logical:
    """The logical view of a scan: results with assembled variables, and every piece."""

    results: list[FileResult]
    #: (serial, catalog name) -> its pieces (assembled tensors and shadowed pieces alike)
    pieces: dict[tuple[int, str], list[Placed]] = field(default_factory=dict)


def assemble(results: list[FileResult], pieces_of: PiecesOf) -> Logical:
    """Group the pieces of each serial into logical variables (the rest pass unchanged)."""
    groups: dict[tuple[int, str], list[tuple[VarInfo, FileResult, Piece]]] = {}
    kept: list[FileResult] = []
    for res in results:
        if res.codec and res.codec.startswith("("):  # synthetic (quantized groups)
            kept.append(res)
            continue
        if type(res.variables) is list:  # records (columns list no chunks)
            res = _chunks_checked(res)
        marks = pieces_of(res.ref, res.variables)
        if marks is None:  # no piece in this file (columns stay columns)
            kept.append(res)
            continue
        plain = []
        for var, piece in zip(res.variables, marks, strict=True):
            if piece is None:
                plain.append(var)
                continue
            name = piece.name or var_name(res.ref, var)
            groups.setdefault((res.serial, name), []).append((var, res, piece))
        kept.append(res if len(plain) == len(res.variables) else replace(res, variables=plain))
    if not groups:
        return Logical(kept)
    # the variables stored whole (outside nodes), by name: a group of pieces named the same
    # keeps its row reading the whole one
    whole = {(res.serial, name) for res in kept
             if not res.ref.node and not (res.codec and res.codec.startswith("("))
             for name in catalog_names(res.ref, res.variables)}  # fmt: skip
    out = Logical(kept)
    synthetic: dict[tuple[int, str], FileResult] = {}
    for (serial, name), members in groups.items():
        var, placed = _assembled(name, members)
        out.pieces[(serial, name)] = placed
        if (serial, name) in whole:
            continue  # stored whole too: that row reads it; the pieces stay in the shards
        first = members[0][1].ref
        key = (serial, first.path)
        if key not in synthetic:
            ref = FileRef(first.path, node="", size=first.size, required=first.required)
            synthetic[key] = FileResult(serial, ref, ASSEMBLED, [])
            out.results.append(synthetic[key])
        synthetic[key].variables.append(var)
    return out


def _chunks_checked(res: FileResult) -> FileResult:
    """``res`` with each variable that lists its stored chunks (a locator of objects with
    ``offsets`` and ``sizes``: DCP's ``.metadata``) given an error unless they cover it
    exactly once (from the header: no values read)."""
    variables = None
    for i, var in enumerate(res.variables):
        chunks = var.locator
        if type(chunks) is not list or not chunks or not hasattr(chunks[0], "sizes"):
            continue
        if var.dtype == "object":
            continue
        try:
            boxes = [(tuple(c.offsets), tuple(c.sizes)) for c in chunks]
        except (AttributeError, TypeError):
            continue
        errors = cover_errors(tuple(var.shape), boxes, partial(_chunk_label, chunks), "chunks")
        if not errors:
            continue
        if variables is None:
            variables = list(res.variables)
        error = "; ".join(filter(None, [var.error, *errors]))[:500]
        variables[i] = replace(var, error=error)
    return res if variables is None else replace(res, variables=variables)


def _chunk_label(chunks: list, i: int) -> str:
    chunk = chunks[i]
    at, size = tuple(getattr(chunk, "offsets", ())), tuple(getattr(chunk, "sizes", ()))
    return f"chunk {size} at {at} in {getattr(chunk, 'file', '?')}"


def _assembled(name: str, members: list[tuple[VarInfo, FileResult, Piece]]
               ) -> tuple[VarInfo, list[Placed]]:  # fmt: skip
    """The logical variable of one group of pieces, and the pieces placed."""
    first_var, first_res, first_piece = members[0]
    shape = first_piece.shape
    errors = [f"{_where(r)}: {v.error}" for v, r, _ in members if v.error]
    placed = _place(members)
    if shape is None:  # only the pieces tell: the union of their extents
        shape = tuple(max(p.offsets[d] + p.shape[d] for p in placed)
                      for d in range(len(first_var.shape)))  # fmt: skip
    dtype = first_var.dtype
    var = VarInfo("", dtype, tuple(shape), kind=first_var.kind or first_res.ref.kind)
    var.name = name
    var.nbytes = sum(p.nbytes for p in placed if not p.copy)
    var.locator = placed
    n_stored = len({(id(p.res), id(p.var)) for p in placed})
    var.attrs = {"n_shards": n_stored, "placement": first_piece.placement}
    if any(p.var.dtype != dtype for p in placed):
        errors.append(f"pieces of different dtypes ({sorted({p.var.dtype for p in placed})})")
    errors += _coverage(tuple(shape), placed)
    if errors:
        var.error = "; ".join(dict.fromkeys(errors))[:500]
    return var, placed


def _place(members: list[tuple[VarInfo, FileResult, Piece]]) -> list[Placed]:
    """Each piece with its offsets: given, or from its shard coordinates (torch's chunking:
    coordinate ``c`` of ``n`` starts at ``c * ceil(size / n)``; with no full shape, at ``c``
    times the piece's extent); a piece of ``blocks`` parts placed part by part; replicas
    marked as copies."""
    seen: set = set()
    out = []
    ndim = len(members[0][0].shape)
    counts: dict[int, int] = {}
    for _v, _r, piece in members:
        for dim, coord, n in piece.shard:
            counts[dim] = max(counts.get(dim, 0), n or 0, coord + 1)
    for var, res, piece in members:
        if piece.offsets is not None:
            parts = [(tuple(piece.offsets), None)]
        else:
            parts = _parts(var, piece, ndim, counts)
        for offsets, rows in parts:
            key = (offsets, rows and rows[1] - rows[0], tuple(var.shape))
            out.append(Placed(var, res, offsets, piece, copy=key in seen, rows=rows))
            seen.add(key)
    return out


def _parts(var: VarInfo, piece: Piece, ndim: int, counts: dict[int, int]
           ) -> list[tuple[tuple[int, ...], tuple[int, int] | None]]:  # fmt: skip
    """Where a piece given by shard coordinates sits: ``(offsets, rows)`` per part."""
    at = [0] * ndim
    for dim, coord, n in piece.shard:
        if dim >= ndim:
            continue
        n = n or counts[dim]
        if piece.shape is None:
            at[dim] = coord * int(var.shape[dim])
        else:
            at[dim] = coord * math.ceil(piece.shape[dim] / n)
    if piece.blocks <= 1 or not piece.shard or piece.shard[0][0] != 0 or not ndim:
        return [(tuple(at), None)]
    _dim, coord, n = piece.shard[0]
    n = n or counts[0]
    k = piece.blocks
    size = int(var.shape[0]) // k  # rows of one part
    out = []
    for j in range(k):
        offsets = (j * n * size + coord * size, *at[1:])
        out.append((offsets, (j * size, (j + 1) * size)))
    return out


def _coverage(shape: tuple[int, ...], placed: list[Placed]) -> list[str]:
    """Problems with how the pieces tile the tensor (replicas aside): see :func:`cover_errors`."""
    live = [p for p in placed if not p.copy]
    boxes = [(tuple(p.offsets), tuple(p.shape)) for p in live]
    errors = cover_errors(shape, boxes, lambda i: _label(live[i]), "pieces")
    if errors and errors[-1].startswith("pieces cover"):
        have = sorted({p.res.ref.node or _where(p.res) for p in placed})
        errors[-1] += f" (pieces from {', '.join(have)})"
    return errors


def cover_errors(shape: tuple[int, ...], boxes: Sequence[tuple[tuple[int, ...], tuple[int, ...]]],
                 label: Callable[[int], str], noun: str = "pieces") -> list[str]:  # fmt: skip
    """Why ``boxes`` (``(offsets, sizes)``) do not cover a tensor of ``shape`` exactly once:
    a box out of bounds, two that overlap (named by ``label(i)``, with where), or a hole
    (where); empty when they do. No overlap, every box inside and the volumes adding up to
    the element count make an exact cover; the overlap test sorts the boxes along one dim
    and compares only those sharing a range of it (no per-element marking)."""
    ndim = len(shape)
    errors = []
    for i, (at, size) in enumerate(boxes):
        if (len(at) != ndim or len(size) != ndim
                or any(o < 0 or s < 0 or o + s > d
                       for o, s, d in zip(at, size, shape, strict=True))):  # fmt: skip
            errors.append(f"{label(i)}: outside {shape}")
    if errors:
        more = f" (+{len(errors) - 3} more)" if len(errors) > 3 else ""
        return ["; ".join(errors[:3]) + more]
    live = [i for i, (_at, size) in enumerate(boxes) if math.prod(size)]
    covered = sum(math.prod(boxes[i][1]) for i in live)
    total = math.prod(shape)
    if len(live) == 1 and covered == total:  # one box inside, as large as the tensor
        return []
    small = len(live) <= SMALL
    pair = _first_overlap_small([boxes[i] for i in live]) if small else None
    if small and pair is None and covered == total:
        return []
    lo = np.array([boxes[i][0] for i in live], dtype=np.int64).reshape(len(live), ndim)
    hi = lo + np.array([boxes[i][1] for i in live], dtype=np.int64).reshape(len(live), ndim)
    if not small:
        pair = _first_overlap(lo, hi)
    if pair is not None:
        a, b = pair
        where = _box(np.maximum(lo[a], lo[b]), np.minimum(hi[a], hi[b]))
        return [f"{noun} overlap: {label(live[a])} and {label(live[b])} both hold {where}"]
    if covered != total:  # no overlap, all inside: fewer
        hole = _box(*_hole(shape, lo, hi))
        return [f"{noun} cover {covered} of {total} elements: a piece is missing "
                f"(hole at {hole})"]  # fmt: skip
    return []


def _first_overlap_small(boxes: list[tuple[tuple[int, ...], tuple[int, ...]]]
                         ) -> tuple[int, int] | None:  # fmt: skip
    """:func:`_first_overlap` for a few boxes, in Python (no array overhead): sorted on the
    first dim, each box against those starting before it ends there."""
    if len(boxes) < 2:
        return None
    order = sorted(range(len(boxes)), key=lambda i: boxes[i][0])
    for n, a in enumerate(order):
        lo_a, size_a = boxes[a]
        for b in order[n + 1 :]:
            lo_b, size_b = boxes[b]
            if lo_a and lo_b[0] >= lo_a[0] + size_a[0]:
                break
            if all(p < q + t and q < p + s for p, s, q, t in zip(lo_a, size_a, lo_b, size_b)):
                return (min(a, b), max(a, b))
    return None


def _first_overlap(lo: np.ndarray, hi: np.ndarray, batch: int = 1 << 20
                   ) -> tuple[int, int] | None:  # fmt: skip
    """Two non-empty boxes (rows of ``lo``/``hi``, ends exclusive) that share an element:
    sorted on the dim with the most distinct starts, each box is compared with the boxes
    starting before it ends on that dim (all pairs for 0-d boxes), ``batch`` pairs at a time."""
    k, ndim = lo.shape
    if k < 2:
        return None
    if not ndim:
        return (0, 1)
    dim = max(range(ndim), key=lambda d: len(np.unique(lo[:, d])))
    order = np.argsort(lo[:, dim], kind="stable")
    slo, shi = lo[order], hi[order]
    stop = np.searchsorted(slo[:, dim], shi[:, dim], side="left")
    count = np.maximum(stop - np.arange(k) - 1, 0)
    i = 0
    while i < k:
        ends = np.cumsum(count[i:])
        j = i + max(1, int(np.searchsorted(ends, batch, side="right")))
        n = count[i:j]
        first = np.repeat(np.arange(i, j), n)
        if first.size:
            # second: first + 1 + rank within the first's run
            runs = np.cumsum(n) - n
            second = first + 1 + np.arange(first.size) - np.repeat(runs, n)
            hit = np.all((slo[first] < shi[second]) & (slo[second] < shi[first]), axis=1)
            if hit.any():
                at = int(np.argmax(hit))
                a, b = int(order[first[at]]), int(order[second[at]])
                return (min(a, b), max(a, b))
        i = j
    return None


def _hole(shape: tuple[int, ...], lo: np.ndarray, hi: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """A box no box covers, for disjoint boxes inside ``shape`` that do not fill it: dim by
    dim, the first slab (between box edges) whose boxes cover less than its cross-section,
    then the same among the boxes spanning that slab."""
    ndim = len(shape)
    start, end = np.zeros(ndim, np.int64), np.zeros(ndim, np.int64)
    for d in range(ndim):
        edges = np.unique(np.concatenate([[0, shape[d]], lo[:, d], hi[:, d]]))
        cross = np.prod(hi[:, d + 1 :] - lo[:, d + 1 :], axis=1, dtype=np.int64)
        diff = np.zeros(len(edges), np.int64)
        np.add.at(diff, np.searchsorted(edges, lo[:, d]), cross)
        np.subtract.at(diff, np.searchsorted(edges, hi[:, d]), cross)
        area = np.cumsum(diff)[:-1]
        short = np.flatnonzero(area < math.prod(shape[d + 1 :]))
        t = int(short[0]) if short.size else 0
        start[d], end[d] = edges[t], edges[t + 1]
        keep = (lo[:, d] <= start[d]) & (hi[:, d] >= end[d])
        lo, hi = lo[keep], hi[keep]
    return start, end


def _box(start: Sequence[int] | np.ndarray, end: Sequence[int] | np.ndarray) -> str:
    return "[" + ", ".join(f"{int(a)}:{int(b)}" for a, b in zip(start, end, strict=True)) + "]"


def _label(p: Placed) -> str:
    node = f" ({p.res.ref.node})" if p.res.ref.node else ""
    return f"{_where(p.res)}{node} piece {tuple(p.shape)} at {tuple(p.offsets)}"


def _where(res: FileResult) -> str:
    return res.ref.path.rsplit("/", 1)[-1]


# -- reading ----------------------------------------------------------------------------------
def read_assembled(var: VarInfo, read_piece: ReadPiece, chunk_piece: ChunkPiece,
                   max_bytes: int = 64 << 20, run: Run = in_turn) -> np.ndarray:  # fmt: skip
    """The full tensor, filled piece by piece into one preallocated array: a piece that is
    contiguous in the result (split on the first axis) streams in chunks, others are read
    whole (peak: the result plus one piece per piece in flight). The pieces go through
    ``run`` (several at once on remote storage: each fills its own box). The result is
    allocated uninitialised only once the pieces are proven to cover it exactly, and each
    piece must fill its whole box."""
    _check_cover(var)
    out = np.empty(var.shape, dtype=np_dtype(var.dtype))
    flat = out.reshape(-1)

    def fill(p: Placed) -> None:
        if p.rows is None and _rows(p, var.shape):
            at = _flat_start(p.offsets, var.shape)
            _stream(flat, at, p, chunk_piece(p.res, p.var, max_bytes))
            return
        if p.rows is None and p.var.shape:
            _fill_rows(out, p, chunk_piece(p.res, p.var, max_bytes))
            return
        index = tuple(slice(o, o + s) for o, s in zip(p.offsets, p.shape, strict=True))
        values = read_piece(p.res, p.var)
        out[index] = values if p.rows is None else values[p.rows[0] : p.rows[1]]

    def cost(p: Placed) -> int:  # a streamed piece holds a chunk, others all their bytes
        streams = p.rows is None and bool(p.var.shape)
        return min(p.nbytes, max_bytes) if streams else stored_nbytes(p.var)

    for _ in run(fill, [p for p in var.locator if not p.copy], cost):
        pass
    return out


def iter_assembled(var: VarInfo, read_piece: ReadPiece, chunk_piece: ChunkPiece,
                   max_bytes: int, run: Run = in_turn) -> Iterator[np.ndarray]:  # fmt: skip
    """The tensor's values in C order as flat chunks: piece by piece when the pieces split it
    on the first axis (memory: one chunk; pieces of at most a chunk go through ``run``, so
    on remote storage the next ones are read while one is used), else assembled first."""
    _check_cover(var)
    pieces = sorted((p for p in var.locator if not p.copy), key=lambda p: p.offsets)
    if all(p.rows is None and _rows(p, var.shape) for p in pieces):

        def small(p: Placed) -> bool:
            return p.nbytes <= max_bytes

        def fetch(p: Placed) -> list[np.ndarray] | None:  # a large piece streams in turn
            return list(chunk_piece(p.res, p.var, max_bytes)) if small(p) else None

        fetched = run(fetch, pieces, lambda p: p.nbytes if small(p) else 0)
        for p, held in zip(pieces, fetched):
            got, want = 0, math.prod(p.shape)
            for chunk in held if held is not None else chunk_piece(p.res, p.var, max_bytes):
                got += chunk.size
                if got > want:
                    break
                yield chunk.reshape(-1)
            if got != want:
                raise ValueError(f"{var.name}: {_label(p)} gave {got} of {want} values")
        return
    flat = read_assembled(var, read_piece, chunk_piece, max_bytes, run).reshape(-1)
    step = max(1, max_bytes // max(1, flat.itemsize))
    for at in range(0, flat.size, step):
        yield flat[at : at + step]


def _check_cover(var: VarInfo) -> None:
    """Raise unless ``var`` (an assembled variable) reads: no error, its pieces (checked
    again here: the values must never show uninitialised memory) covering it exactly."""
    if var.error:
        raise ValueError(f"{var.name}: {var.error}")
    errors = _coverage(tuple(var.shape), var.locator)
    if errors:
        raise ValueError(f"{var.name}: {'; '.join(errors)}")


def _stream(flat: np.ndarray, at: int, p: Placed, chunks: Iterator[np.ndarray]) -> None:
    """Copy a piece of whole rows into ``flat`` from ``at``, chunk by chunk; it must give
    exactly its element count."""
    want, got = math.prod(p.shape), 0
    for chunk in chunks:
        if got + chunk.size > want:
            got += chunk.size
            break
        flat[at + got : at + got + chunk.size] = chunk.reshape(-1)
        got += chunk.size
    if got != want:
        raise ValueError(f"{p.var.name}: {_label(p)} gave {got} of {want} values")


def _fill_rows(out: np.ndarray, p: Placed, chunks: Iterator[np.ndarray]) -> None:
    """Copy a piece into its place in ``out`` chunk by chunk, a block of the piece's rows at a
    time (memory: one chunk, whatever the piece's size)."""
    shape = tuple(int(d) for d in p.var.shape)
    row = math.prod(shape[1:])
    rest = tuple(slice(o, o + s) for o, s in zip(p.offsets[1:], shape[1:], strict=True))
    at, carry = 0, None
    for chunk in chunks:
        flat = chunk.reshape(-1)
        if carry is not None and carry.size:
            flat = np.concatenate([carry, flat])
        n = flat.size // row if row else 0
        if n:
            block = flat[: n * row].reshape(n, *shape[1:])
            out[(slice(p.offsets[0] + at, p.offsets[0] + at + n), *rest)] = block
            at += n
        carry = flat[n * row :]
    if at != shape[0]:
        raise ValueError(f"{p.var.name}: piece gave {at} of {shape[0]} rows")


def _rows(p: Placed, shape: tuple[int, ...]) -> bool:
    """Whether a piece is a block of whole rows (contiguous in the C-ordered result)."""
    return tuple(p.shape[1:]) == tuple(shape[1:]) and all(o == 0 for o in p.offsets[1:])


def _flat_start(offsets: tuple[int, ...], shape: tuple[int, ...]) -> int:
    return offsets[0] * math.prod(shape[1:]) if shape else 0
