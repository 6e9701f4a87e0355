"""NumPy ``.npy`` (NEP 1, versions 1-3) and ``.npz`` (a zip of ``.npy`` members).

Headers are parsed with ``ast.literal_eval`` (never a pickle). Object arrays (``np.save`` of a
list of arrays) are read through the restricted pickle VM: the array and each numeric element
are listed (:mod:`ckptview.formats.npy_objects`, rows marked ``attrs["needs_pickle"]``), anything
else is an error row naming it.
Stored npz members are Spans at offsets computed from their local zip headers; deflated
members are inflated by streaming, and listing inflates only the first bytes of each.
"""

from __future__ import annotations

import ast
import re
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from ..dtypes import dtype_name
from ..formats.inflate import inflate
from ..formats.zipdir import DEFLATED, STORED, ZipEntry, locate, read_directory
from ..formats.zipdir import read as zip_read
from ..io import Blob, TruncatedError
from ..model import Span, VarInfo
from .base import Codec, CodecTier

MAGIC = b"\x93NUMPY"
PY2_LONG = re.compile(r"(\d)L\b")
NEEDS_PICKLE = "object array: its values are a pickle, which ckptview never runs"
MAX_HEADER = 1 << 20  # numpy itself refuses headers over 10 000 bytes unless told otherwise
_LOCAL = struct.Struct("<4s5H3L2H")  # zip local file header (30 bytes)
_PEEK = 256  # first bytes of each member read with its local header: the .npy header


@dataclass
class NpyHeader:
    """A parsed ``.npy`` header: on-disk dtype, shape, order and where the values start."""

    dtype: np.dtype
    shape: tuple[int, ...]
    fortran: bool
    data_offset: int  # relative to the start of the .npy stream

    @property
    def nbytes(self) -> int:
        n = self.dtype.itemsize
        for d in self.shape:
            n *= d
        return n


def parse_npy_header(prefix: bytes, read_more=None) -> NpyHeader:
    """Parse a header from the first bytes of a ``.npy`` stream.

    ``read_more(n)`` returns the first ``n`` bytes when ``prefix`` is too short.
    """
    if len(prefix) == 0:
        raise ValueError("empty file: no .npy header")
    if len(prefix) < 10 or not prefix.startswith(MAGIC):
        raise ValueError("not a .npy stream (bad magic)")
    major = prefix[6]
    if major == 1:
        fixed = 10
    elif major in (2, 3):
        fixed = 12
    else:
        raise ValueError(f".npy format version {major}.{prefix[7]} is not supported")
    if len(prefix) < fixed:
        raise ValueError("truncated .npy header")
    hlen = struct.unpack("<H" if major == 1 else "<I", prefix[8:fixed])[0]
    if hlen > MAX_HEADER:
        raise ValueError(f".npy header length {hlen} exceeds {MAX_HEADER}")
    if len(prefix) < fixed + hlen:
        if read_more is None:
            raise ValueError("truncated .npy header")
        prefix = read_more(fixed + hlen)
        if len(prefix) < fixed + hlen:
            raise ValueError("truncated .npy header")
    text = prefix[fixed : fixed + hlen].decode("utf-8" if major == 3 else "latin1")
    text = PY2_LONG.sub(r"\1", text)  # Python 2 wrote shapes as (2L,)
    try:
        meta = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError) as e:
        raise ValueError(f"unreadable .npy header: {e}") from None
    if not isinstance(meta, dict) or set(meta) != {"descr", "fortran_order", "shape"}:
        raise ValueError(f".npy header has unexpected keys: {text[:80]!r}")
    shape = meta["shape"]
    if not isinstance(shape, tuple) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ValueError(f"bad .npy shape {shape!r}")
    if not isinstance(meta["fortran_order"], bool):
        raise ValueError("bad .npy fortran_order")
    return NpyHeader(_descr_dtype(meta["descr"]), shape, meta["fortran_order"], fixed + hlen)


def _descr_dtype(descr: object) -> np.dtype:
    if not isinstance(descr, str):
        raise ValueError("structured .npy dtypes are not supported")
    try:
        dt = np.dtype(descr)
    except TypeError as e:
        raise ValueError(f"bad .npy descr {descr!r}: {e}") from None
    return dt


def npy_var(name: str, path: str, header: NpyHeader, offset: int | None) -> VarInfo:
    """A VarInfo for a parsed header; ``offset`` is the absolute data offset for a Span."""
    if header.dtype.hasobject:  # the values are a pickle: listed with their shape, not read
        return VarInfo(name, "object", header.shape, nbytes=0, error=NEEDS_PICKLE)
    var = VarInfo(name, dtype_name(header.dtype), header.shape, nbytes=header.nbytes)
    var.attrs["descr"] = header.dtype.str
    if header.fortran:
        var.attrs["fortran_order"] = True
    if offset is not None:
        order = "F" if header.fortran else "C"
        var.span = Span(path, offset, header.nbytes, order=order, disk_dtype=header.dtype.str)
    return var


class NpyCodec(Codec):
    """A single ``.npy`` file: one unnamed tensor."""

    name = "npy"
    suffixes = (".npy",)
    magic = (MAGIC,)
    save_suffixes = suffixes
    priority = CodecTier.FORMAT

    def list_variables(self, blob: Blob, hints: dict) -> list[VarInfo]:
        if blob.size == 0:
            raise ValueError("empty file: no .npy header")
        header = parse_npy_header(blob.head(), lambda n: blob.read_upto(0, n))
        if header.dtype.hasobject:  # a pickle of the elements, run by the restricted VM
            from ..formats.npy_objects import object_array_vars

            return object_array_vars("", blob, header.data_offset, blob.size, header.shape)
        end = header.data_offset + header.nbytes
        if end > blob.size:
            raise TruncatedError(
                f"{blob.name}: values need bytes up to {end}, the file has {blob.size}"
            )
        return [npy_var("", blob.path, header, header.data_offset)]

    def read(self, blob: Blob, var: VarInfo) -> np.ndarray:
        if var.span is None:  # an object array or one of its elements
            return _read_object(blob, var)
        return super().read(blob, var)


@dataclass
class _Member:
    """Where a deflated npz member's compressed bytes lie."""

    offset: int  # first compressed byte
    compressed: int
    skip: int  # bytes of .npy header to drop from the inflated stream
    nbytes: int
    dtype: str  # on-disk dtype string
    order: str
    crc: int  # zip CRC-32 of the whole member (header included)


class NpzCodec(Codec):
    """``.npz`` archives (``np.savez`` stored, ``np.savez_compressed`` deflated)."""

    name = "npz"
    checked_on_load = True  # zipfile checks each member's CRC-32 as np.load reads it
    zip_archive = True
    suffixes = (".npz",)
    save_suffixes = suffixes
    priority = CodecTier.FORMAT

    def guess_can_open(self, filename: str, head: bytes) -> bool:
        if filename.lower().endswith(self.suffixes):
            return True
        if not head.startswith(b"PK\x03\x04") or len(head) < 30:
            return False
        n = struct.unpack("<H", head[26:28])[0]
        return head[30 : 30 + n].endswith(b".npy")

    def list_variables(self, blob: Blob, hints: dict) -> list[VarInfo]:
        try:
            entries = [e for e in read_directory(blob).values() if not e.is_dir()]
        except TruncatedError:
            raise
        except (ValueError, struct.error) as e:
            raise ValueError(f"{blob.name}: not a readable zip ({e})") from None
        # every local header with the first bytes of its member (the .npy header), one batch
        found = locate(blob, entries, peek=_PEEK)
        return [
            v for e, got in zip(entries, found, strict=True) for v in self._member(blob, e, got)
        ]

    def _member(self, blob: Blob, info: ZipEntry,
                got: tuple[int, bytes] | Exception) -> list[VarInfo]:  # fmt: skip
        """A member's rows: one, or an object array's rows (itself and its elements)."""
        name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
        try:
            if isinstance(got, Exception):
                raise got
            start, peeked = got
            if info.flag_bits & 1:
                raise ValueError("encrypted member")
            if not info.filename.endswith(".npy"):
                var = VarInfo(name, "object", (), nbytes=info.file_size)
                var.locator = ("raw", start, info.compress_size, info.compress_type)
                return [var]
            if info.compress_type == STORED:
                header = parse_npy_header(peeked, lambda n: _more(blob, start, peeked, n))
                if header.dtype.hasobject:
                    from ..formats.npy_objects import object_array_vars

                    return object_array_vars(name, blob, start + header.data_offset,
                                             start + info.file_size, header.shape)  # fmt: skip
                if header.data_offset + header.nbytes > info.file_size:
                    raise TruncatedError(f"member {info.filename} is shorter than its header says")
                return [npy_var(name, blob.path, header, start + header.data_offset)]
            if info.compress_type != DEFLATED:
                raise ValueError(f"zip compression method {info.compress_type} is not supported")

            def inflated(n: int) -> bytes:
                pieces = inflate(blob, start, info.compress_size, 0, n, step=1024, first=peeked)
                return b"".join(pieces)

            header = parse_npy_header(inflated(256), inflated)
            if header.dtype.hasobject:
                from ..formats.npy_objects import Deflated, object_array_vars

                where = Deflated(start, info.compress_size, info.file_size)
                return object_array_vars(name, where.stream(blob), header.data_offset,
                                         info.file_size, header.shape, where)  # fmt: skip
            if header.data_offset + header.nbytes > info.file_size:
                raise TruncatedError(f"member {info.filename} is shorter than its header says")
            var = npy_var(name, blob.path, header, None)
            order = "F" if header.fortran else "C"
            var.locator = _Member(
                start,
                info.compress_size,
                header.data_offset,
                header.nbytes,
                header.dtype.str,
                order,
                info.CRC,
            )
            return [var]
        except Exception as e:  # noqa: BLE001 - one bad member is an error row, not a failed file
            return [VarInfo(name, "object", (), error=f"{type(e).__name__}: {e}"[:300])]

    def read(self, blob: Blob, var: VarInfo) -> np.ndarray:
        loc = var.locator
        if isinstance(loc, _Member):  # inflated into place: the array is the only copy
            dt = np.dtype(loc.dtype)
            flat = np.empty(var.numel, dtype=dt)
            out, at = memoryview(flat).cast("B"), 0
            for piece in _checked(blob, loc, var.name):
                if at + len(piece) > len(out):
                    raise ValueError(f"{var.name}: member inflates past its {len(out)} bytes")
                out[at : at + len(piece)] = piece
                at += len(piece)
            if not dt.isnative:
                flat = flat.byteswap(inplace=True).view(dt.newbyteorder("="))
            return flat.reshape(var.shape, order=loc.order)
        if isinstance(loc, tuple) and loc[0] == "raw":
            _, start, size, method = loc
            if method == STORED:
                return np.array(blob.read(start, size), dtype=object)
            return np.array(b"".join(inflate(blob, start, size, 0, var.nbytes)), dtype=object)
        if var.span is None:  # an object array or one of its elements
            return _read_object(blob, var)
        return super().read(blob, var)

    def iter_chunks(self, blob: Blob, var: VarInfo, max_bytes: int) -> Iterator[np.ndarray]:
        loc = var.locator
        if not (isinstance(loc, _Member) and loc.order == "C"):
            yield from super().iter_chunks(blob, var, max_bytes)
            return
        dt = np.dtype(loc.dtype)
        step = max(dt.itemsize, max_bytes - max_bytes % dt.itemsize)
        pending = b""
        for piece in _checked(blob, loc, var.name):
            pending += piece
            while len(pending) >= step:
                yield np.frombuffer(pending[:step], dtype=dt).astype(dt.newbyteorder("="))
                pending = pending[step:]
        if pending or var.numel == 0:
            yield np.frombuffer(pending, dtype=dt).astype(dt.newbyteorder("="))


def _read_object(blob: Blob, var: VarInfo) -> np.ndarray:
    """Values of an object array's row (imports the pickle VM on first use only)."""
    from ..formats.npy_objects import read_object

    return read_object(blob, var)


def _checked(blob: Blob, loc: _Member, name: str) -> Iterator[bytes]:
    """A deflated member's values in pieces; the CRC-32 is verified after the last one."""
    crc = 0
    got = 0
    for piece in inflate(blob, loc.offset, loc.compressed, 0, loc.skip + loc.nbytes):
        crc = zlib.crc32(piece, crc)
        head = max(0, loc.skip - got)
        got += len(piece)
        if head < len(piece):
            yield piece[head:]
    if got < loc.skip + loc.nbytes:
        raise ValueError(f"{name}: compressed member ends early")
    if crc != loc.crc:
        raise ValueError(f"{name}: CRC-32 mismatch (corrupt compressed member)")


def _more(blob: Blob, start: int, peeked: bytes, n: int) -> bytes:
    """The first ``n`` bytes of a stored member whose first bytes were peeked already."""
    return (
        peeked + blob.read_upto(start + len(peeked), n - len(peeked))
        if n > len(peeked)
        else peeked[:n]
    )


def _payload_offset(blob: Blob, info) -> int:
    """Absolute offset of a member's (compressed) data, from its local file header
    (``info``: a zipfile.ZipInfo or a ZipEntry)."""
    raw = zip_read(blob, info.header_offset, _LOCAL.size)
    fields = _LOCAL.unpack(raw)
    if fields[0] != b"PK\x03\x04":
        raise ValueError(f"member {info.filename}: bad local header signature")
    name_len, extra_len = fields[-2], fields[-1]
    return info.header_offset + _LOCAL.size + name_len + extra_len
