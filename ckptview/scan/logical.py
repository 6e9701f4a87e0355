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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ..dtypes import np_dtype
from ..model import FileRef, Piece, VarInfo
from .listing import FileResult
from .tables import catalog_names, stored_nbytes, var_name

#: the codec name of the synthetic results holding assembled variables
ASSEMBLED = "(assembled)"

PiecesOf = Callable[[FileRef, Sequence[VarInfo]], "list[Piece | None] | None"]
ReadPiece = Callable[[FileResult, VarInfo], np.ndarray]
ChunkPiece = Callable[[FileResult, VarInfo, int], Iterator[np.ndarray]]


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
        return Logical(results)
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
    """Problems with how the pieces tile the tensor: out of bounds or not covering it."""
    errors = []
    covered = 0
    for p in placed:
        if p.copy:
            continue
        if (
            len(p.offsets) != len(shape)
            or len(p.shape) != len(shape)
            or any(o < 0 or o + s > d for o, s, d in zip(p.offsets, p.shape, shape, strict=True))
        ):
            errors.append(f"{_where(p.res)}: piece {p.shape} at {p.offsets} outside {shape}")
            continue
        covered += math.prod(p.shape)
    total = math.prod(shape)
    if not errors and covered < total:
        have = sorted({p.res.ref.node or _where(p.res) for p in placed})
        errors.append(
            f"pieces cover {covered} of {total} elements: a piece is missing "
            f"(pieces from {', '.join(have)})"
        )
    elif not errors and covered > total:
        errors.append(f"pieces overlap: {covered} elements for a tensor of {total}")
    return errors


def _where(res: FileResult) -> str:
    return res.ref.path.rsplit("/", 1)[-1]


# -- reading ----------------------------------------------------------------------------------
def read_assembled(var: VarInfo, read_piece: ReadPiece, chunk_piece: ChunkPiece,
                   max_bytes: int = 64 << 20) -> np.ndarray:  # fmt: skip
    """The full tensor, filled piece by piece into one preallocated array: a piece that is
    contiguous in the result (split on the first axis) streams in chunks, others are read
    whole (peak: the result plus one piece)."""
    if var.error:
        raise ValueError(f"{var.name}: {var.error}")
    out = np.empty(var.shape, dtype=np_dtype(var.dtype))
    flat = out.reshape(-1)
    for p in var.locator:
        if p.copy:
            continue
        if p.rows is None and _rows(p, var.shape):
            at = _flat_start(p.offsets, var.shape)
            for chunk in chunk_piece(p.res, p.var, max_bytes):
                flat[at : at + chunk.size] = chunk.reshape(-1)
                at += chunk.size
            continue
        if p.rows is None and p.var.shape:
            _fill_rows(out, p, chunk_piece(p.res, p.var, max_bytes))
            continue
        index = tuple(slice(o, o + s) for o, s in zip(p.offsets, p.shape, strict=True))
        values = read_piece(p.res, p.var)
        out[index] = values if p.rows is None else values[p.rows[0] : p.rows[1]]
    return out


def iter_assembled(var: VarInfo, read_piece: ReadPiece, chunk_piece: ChunkPiece,
                   max_bytes: int) -> Iterator[np.ndarray]:  # fmt: skip
    """The tensor's values in C order as flat chunks: piece by piece when the pieces split it
    on the first axis (memory: one chunk), else assembled first."""
    if var.error:
        raise ValueError(f"{var.name}: {var.error}")
    pieces = sorted((p for p in var.locator if not p.copy), key=lambda p: p.offsets)
    if all(p.rows is None and _rows(p, var.shape) for p in pieces):
        for p in pieces:
            for chunk in chunk_piece(p.res, p.var, max_bytes):
                yield chunk.reshape(-1)
        return
    flat = read_assembled(var, read_piece, chunk_piece, max_bytes).reshape(-1)
    step = max(1, max_bytes // max(1, flat.itemsize))
    for at in range(0, flat.size, step):
        yield flat[at : at + step]


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
