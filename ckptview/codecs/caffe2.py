"""Caffe2 minidb files: length-prefixed records of BlobProto values (specs/caffe2.md §2-§6).

Listing walks record and protobuf *headers* with buffered ranged reads and skips every
data field by its length, so tensor payloads are never read. A tensor split into chunks
(keys ``name#%k``, records in any order) is one variable, reassembled by ``segment`` on read.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from ..formats.cursor import Window
from ..formats.minidb import (
    DTYPE_NAMES,
    DTYPES,
    WINDOW,
    BlobRecord,
    Chunk,
    ints,
    read_records,
    sniff,
    tensor_values,
)
from ..formats.protobuf import DecodeError, decode, signed
from ..io import Blob
from ..model import VarInfo
from .base import Codec, CodecTier, PartialRead

MAX_BLOB_NAMES = 4 << 20  # the blob_names cross-check reads at most this much

TRAINER_TYPES = ("Counter", "TreeCursor", "DBReader")


@dataclass
class Locator:
    """How to read a blob: its records' TensorProto ranges, sorted by segment."""

    kind: str  # "tensor" | "blob" | "opaque"
    data_type: int | None
    dims: tuple[int, ...]
    chunks: list[tuple[int, int, tuple[int, int] | None, int]]  # offset, length, segment, fmt
    contents: list[tuple[int, int]]  # BlobProto.content ranges, in chunk-id order
    blob_type: str = ""


# -- from records to variables ---------------------------------------------------------------
def _numel(dims: tuple[int, ...]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def _coverage(chunks: list[Chunk], numel: int) -> str | None:
    """Why the chunks do not cover [0, numel) exactly once (LoadOp's checks), or None."""
    if len(chunks) == 1 and chunks[0].segment is None:
        return None
    if any(c.segment is None for c in chunks):
        return "a chunk without a segment among several"
    at = 0
    for begin, stop in sorted(c.segment for c in chunks):
        if not 0 <= begin <= stop <= numel:
            return f"segment [{begin},{stop}) outside [0,{numel})"
        if begin != at:
            return f"chunks cover {at} then jump to {begin} of {numel} elements"
        at = stop
    return None if at == numel else f"chunks cover {at} of {numel} elements"


def _tensor_var(blob: BlobRecord) -> VarInfo:
    first = blob.chunks[0]
    dims, code = first.dims, first.data_type
    error = None
    if code is None:
        error = "TensorProto without data_type"
    elif any(c.dims != dims or c.data_type != code or c.tensor is None for c in blob.chunks):
        error = "chunks disagree on dims or data type"
    elif any(d < 0 for d in dims):
        error = f"negative dimension in {dims}"
    numel = _numel(dims) if error is None else 0
    dtype = DTYPES.get(code) if code is not None else None
    if code == 0 and numel == 0:
        dtype = "float32"  # UNDEFINED with no elements: an empty float tensor
    data_bytes = sum(c.data_bytes for c in blob.chunks)
    if error is None:
        error = _coverage(blob.chunks, numel)
    if error is None and data_bytes < numel:
        error = f"dims {list(dims)} claim {numel} elements, the records hold {data_bytes} bytes"
    kind = "tensor" if dtype is not None else "opaque"
    dtype = dtype or "object"
    chunks = sorted(blob.chunks, key=lambda c: c.segment or (0, 0))
    nbytes = data_bytes if dtype == "object" else numel * np.dtype(dtype).itemsize
    return VarInfo(
        name=blob.name,
        dtype=dtype,
        shape=tuple(dims) if error is None else (),
        nbytes=nbytes,
        kind="other" if blob.name == "blob_names" else None,
        error=error,
        locator=Locator(kind, code, tuple(dims), [_tensor_ref(c) for c in chunks if c.tensor], []),
        attrs={
            "caffe2_data_type": DTYPE_NAMES.get(code, str(code)),
            "n_records": len(blob.chunks),
            "storage_fields": sorted(
                {_FIELD_NAMES[f] for c in blob.chunks for f in c.fields}
                if len(blob.chunks) > 1
                else map(_FIELD_NAMES.__getitem__, first.fields)
            ),
        },
    )


_FIELD_NAMES = {3: "float_data", 4: "int32_data", 5: "byte_data", 6: "string_data",
                9: "double_data", 10: "int64_data", 13: "raw_data"}  # fmt: skip


def _other_var(blob: BlobRecord) -> VarInfo:
    """A non-tensor blob (std::string, Counter, TreeCursor, mutex, qtensor …): opaque; its
    value is the content (or the serialized QTensorProto) bytes."""
    chunks = blob.chunks
    error = None
    n = chunks[0].num_chunks
    ids = sorted(c.chunk_id if c.chunk_id is not None else -1 for c in chunks)
    if n is None and len(chunks) > 1:
        error = f"blob duplicated ({len(chunks)} records)"
    elif n is not None and ids != list(range(n)):
        error = f"content chunks {ids} do not cover 0..{n - 1}"
    ordered = sorted(chunks, key=lambda c: c.chunk_id or 0)
    contents = [c.content or c.qtensor for c in ordered if c.content or c.qtensor]
    tensors = [_tensor_ref(c) for c in ordered if c.tensor]
    nbytes = sum(r[1] for r in contents) + sum(t[1] for t in tensors)
    kind = "trainer" if any(t in blob.type for t in TRAINER_TYPES) else "other"
    first = chunks[0]
    return VarInfo(
        name=blob.name,
        dtype="object",
        shape=(),
        nbytes=nbytes,
        kind=kind,
        error=error,
        locator=Locator("blob", first.data_type, first.dims, tensors, contents, blob.type),
        attrs={"blob_type": blob.type, "n_records": len(chunks)},
    )


def _tensor_ref(chunk: Chunk) -> tuple:
    return (*chunk.tensor, chunk.segment, chunk.data_format)


def _variable(blob: BlobRecord) -> VarInfo:
    if blob.error:
        return VarInfo(blob.name, "object", (), nbytes=0, kind="other", error=blob.error)
    return _tensor_var(blob) if _is_tensor(blob) else _other_var(blob)


def _is_tensor(blob: BlobRecord) -> bool:
    if blob.type:
        return blob.type == "Tensor"
    return all(c.tensor is not None and c.content is None for c in blob.chunks)


# -- decoding values -------------------------------------------------------------------------


def _chunk_values(blob: Blob, loc: Locator, chunk: tuple, numel: int) -> np.ndarray:
    offset, length, segment, data_format = chunk
    msg = decode(blob.read(offset, length))
    values = tensor_values(msg, loc.data_type, data_format)
    want = numel if segment is None else segment[1] - segment[0]
    if values.size != want:
        raise ValueError(f"a chunk holds {values.size} values, its segment says {want}")
    return values


# -- the codec -------------------------------------------------------------------------------


class Caffe2Codec(Codec):
    """Caffe2 minidb: one file per node per epoch (or loose ``.minidb`` files)."""

    name = "caffe2"
    suffixes = (".minidb",)
    priority = CodecTier.LOOSE

    def guess_can_open(self, filename: str, head: bytes) -> bool:
        return filename.lower().endswith(self.suffixes) or sniff(head)

    def list_variables(self, blob: Blob, hints: dict) -> list[VarInfo]:
        win = Window(blob, WINDOW)
        blobs, problems = read_records(win, blob.size)
        variables = [_variable(b) for b in blobs.values()]
        for var in variables:
            if var.error:
                problems.append(f"{var.name}: {var.error}")
        missing = self._missing_from_blob_names(_Buffered(win), variables)  # type: ignore[arg-type]
        if missing:
            shown = ", ".join(missing[:5]) + (" …" if len(missing) > 5 else "")
            problems.append(f"blob_names lists {len(missing)} blob(s) absent here: {shown}")
        if problems:
            raise PartialRead(variables, "; ".join(problems))
        return variables

    def _missing_from_blob_names(self, blob: Blob, variables: list[VarInfo]) -> list[str]:
        """Blobs a checkpoint's own ``blob_names`` list (it names itself) that are absent."""
        var = next((v for v in variables if v.name == "blob_names"), None)
        if var is None or var.error or var.dtype != "object" or len(var.shape) != 1:
            return []
        if var.nbytes > MAX_BLOB_NAMES:
            return []
        try:
            names = {bytes(x).decode("utf-8", "replace") for x in self.read(blob, var)}
        except (DecodeError, ValueError):
            return []
        if "blob_names" not in names:
            return []  # not CheckpointManager's list
        return sorted(names - {v.name for v in variables})

    def read(self, blob: Blob, var: VarInfo) -> np.ndarray:
        loc: Locator = var.locator
        if loc.kind == "blob":
            return _blob_value(blob, loc)
        if loc.kind == "opaque":
            raw = [blob.read(off, n) for off, n, _s, _f in loc.chunks]
            out = np.empty((), dtype=object)
            out[()] = b"".join(raw)
            return out
        numel = _numel(loc.dims)
        dtype = np.dtype(var.dtype)
        if len(loc.chunks) == 1:
            flat = _chunk_values(blob, loc, loc.chunks[0], numel)
        else:
            flat = np.empty(numel, dtype=dtype)
            for chunk in loc.chunks:
                begin, stop = chunk[2]
                flat[begin:stop] = _chunk_values(blob, loc, chunk, numel)
        return flat.astype(dtype, copy=False).reshape(loc.dims)

    def iter_chunks(self, blob: Blob, var: VarInfo, max_bytes: int) -> Iterator[np.ndarray]:
        """Chunked tensors stream record by record, in segment order."""
        loc: Locator = var.locator
        if loc.kind != "tensor" or len(loc.chunks) < 2:
            yield np.asarray(self.read(blob, var)).reshape(-1)
            return
        numel = _numel(loc.dims)
        for chunk in loc.chunks:
            yield _chunk_values(blob, loc, chunk, numel).astype(var.dtype, copy=False)


def _blob_value(blob: Blob, loc: Locator) -> np.ndarray:
    """A non-tensor blob as a 0-d object array: its content bytes (std::string), or a dict
    ``{"type", "content", "tensor"}`` when it also carries a tensor (Counter, TreeCursor)."""
    content = b"".join(blob.read(off, n) for off, n in loc.contents)
    out = np.empty((), dtype=object)
    if not loc.chunks:
        out[()] = content
        return out
    offset, length, _segment, data_format = loc.chunks[0]
    msg = decode(blob.read(offset, length))
    code = signed(msg[2][-1]) if msg.get(2) else 1
    dims = tuple(ints(msg.get(1, [])).tolist())
    values = tensor_values(msg, code, data_format)
    if values.size == _numel(dims):
        values = values.reshape(dims)
    out[()] = {"type": loc.blob_type, "content": content, "tensor": values}
    return out


class _Buffered:
    """A Blob read through a listing's Window: a value inside the bytes the listing already
    fetched (``blob_names``, often last) costs no request of its own; another is read
    exactly (the window stays where the listing left it)."""

    def __init__(self, win: Window):
        self.win, self.blob = win, win.blob
        self.name, self.path, self.size = win.blob.name, win.blob.path, win.size

    def read(self, offset: int, length: int) -> bytes:
        win, end = self.win, offset + length
        if win._start <= offset and end <= win._start + len(win._buf):
            return win._buf[offset - win._start : end - win._start]
        return self.blob.read(offset, length)  # exactly the value, no window ahead
