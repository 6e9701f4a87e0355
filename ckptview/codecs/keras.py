"""Keras weight files: ``.weights.h5`` / ``.h5`` (HDF5) and ``.keras`` (a zip holding them).

Every HDF5 dataset is one variable named by its path (Keras 3: ``layers/<layer>/vars/<i>``,
optimizer ``optimizer/vars/<i>``; Keras 2: ``model_weights/<layer>/<layer>/kernel:0``).
Listing goes through h5py (the ``keras`` extra) on a ranged file object; a contiguous,
unfiltered dataset gets a Span so its values are read without h5py, straight from the file
(also inside a ``.keras`` zip whose member is stored uncompressed).
"""

from __future__ import annotations

import io
import struct
import zipfile
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ..dtypes import dtype_name, np_dtype
from ..io import HEAD_BLOCK, Blob
from ..kinds import guess_kind
from ..model import Span, VarInfo
from .base import Codec

HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
ZIP_MAGIC = b"PK\x03\x04"
#: a filtered dataset may not claim more than deflate's best ratio over its stored bytes
MAX_RATIO = 1032
BLOCK = 1 << 16  # read-ahead of remote file objects: HDF5 metadata reads are small
_ML_NAMES = ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")


def _h5py():
    try:
        import h5py
    except ImportError:  # pragma: no cover - h5py is in the test environment
        raise ImportError(
            "reading Keras/HDF5 files needs h5py: pip install 'ckptview[keras]'"
        ) from None
    return h5py


@dataclass
class _Dataset:
    """Where a dataset lives: the zip member holding the HDF5 file (or None) and its path."""

    member: str | None
    path: str


class _Window(io.RawIOBase):
    """A read-only, seekable view of ``length`` bytes at ``start`` of a file object."""

    def __init__(self, f, start: int, length: int):
        self._f, self._start, self._length, self._pos = f, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._length}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, b) -> int:
        n = max(0, min(len(b), self._length - self._pos))
        if n == 0:
            return 0
        self._f.seek(self._start + self._pos)
        data = self._f.read(n)
        b[: len(data)] = data
        self._pos += len(data)
        return len(data)


class _BlockFile(io.RawIOBase):
    """A read-only, seekable file over a Blob that fetches each aligned block once (a bounded
    LRU): h5py and zipfile re-read the same small metadata ranges many times, and a scan must
    not read a file more than once over. Block 0 is the Blob's cached head."""

    def __init__(self, blob: Blob, block: int = BLOCK, max_blocks: int = 128):
        self._blob, self._size, self._pos = blob, blob.size, 0
        self._block, self._max = block, max_blocks
        self._first = min(HEAD_BLOCK, self._size)
        self._blocks: OrderedDict[int, bytes] = OrderedDict()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def _start(self, i: int) -> int:
        return 0 if i == 0 else self._first + (i - 1) * self._block

    def _get(self, i: int) -> bytes:
        data = self._blocks.get(i)
        if data is None:
            if i == 0:
                data = self._blob.head()[: self._first]
            else:
                start = self._start(i)
                data = self._blob.read(start, min(self._block, self._size - start))
            self._blocks[i] = data
            if len(self._blocks) > self._max:
                self._blocks.popitem(last=False)
        else:
            self._blocks.move_to_end(i)
        return data

    def readinto(self, b) -> int:
        want = max(0, min(len(b), self._size - self._pos))
        done = 0
        while done < want:
            pos = self._pos + done
            i = 0 if pos < self._first else 1 + (pos - self._first) // self._block
            data = self._get(i)
            at = pos - self._start(i)
            piece = data[at : at + want - done]
            if not piece:
                break
            b[done : done + len(piece)] = piece
            done += len(piece)
        self._pos += done
        return done


def _member_data_offset(raw, blob: Blob, info: zipfile.ZipInfo) -> int:
    """Where a stored member's bytes start: after its local header (30 bytes + name + extra)."""
    raw.seek(info.header_offset)
    local = raw.read(30)
    if len(local) < 30 or local[:4] != ZIP_MAGIC:
        raise ValueError(f"{blob.name}: bad local header for {info.filename}")
    name_len, extra_len = struct.unpack_from("<HH", local, 26)
    start = info.header_offset + 30 + name_len + extra_len
    if start + info.compress_size > blob.size:
        raise ValueError(f"{blob.name}: member {info.filename} runs past the end of the file")
    return start


class KerasCodec(Codec):
    """Keras 3 ``.weights.h5`` / ``.keras`` and any HDF5 weights file, via h5py."""

    name = "keras"
    suffixes = (".keras", ".weights.h5", ".h5", ".hdf5")
    priority = 60

    def guess_can_open(self, filename: str, head: bytes) -> bool:
        name = filename.lower()
        if name.endswith(".keras"):
            return head.startswith(ZIP_MAGIC)
        return head.startswith(HDF5_MAGIC) or name.endswith((".weights.h5", ".hdf5"))

    @contextmanager
    def _h5(self, blob: Blob, member: str | None, raw: _BlockFile | None = None):
        """An open h5py File for the blob (or its zip member) and the member's data offset."""
        h5py = _h5py()
        raw = raw or _BlockFile(blob)
        if member is None:
            with h5py.File(raw, "r") as f:
                yield f, 0
            return
        with zipfile.ZipFile(raw) as zf:
            info = zf.getinfo(member)
            if info.compress_type == zipfile.ZIP_STORED:
                start = _member_data_offset(raw, blob, info)
                with h5py.File(_Window(raw, start, info.file_size), "r") as f:
                    yield f, start
            else:  # deflated: zipfile's seekable member stream (seeks back re-inflate)
                with zf.open(info) as stream, h5py.File(stream, "r") as f:
                    yield f, None

    def _members(self, blob: Blob, raw: _BlockFile) -> list[str | None]:
        if not blob.name.lower().endswith(".keras") and blob.head(4) != ZIP_MAGIC:
            return [None]
        with zipfile.ZipFile(raw) as zf:
            names = [i.filename for i in zf.infolist() if i.filename.endswith((".h5", ".hdf5"))]
        if not names:
            raise ValueError(f"{blob.name}: a .keras archive without a weights .h5 member")
        return names

    def list_variables(self, blob: Blob, hints: dict) -> list[VarInfo]:
        raw = _BlockFile(blob)
        members = self._members(blob, raw)
        out: list[VarInfo] = []
        for member in members:
            prefix = f"{member}/" if member is not None and len(members) > 1 else ""
            with self._h5(blob, member, raw) as (f, base):
                out += _datasets(f, blob, member, base, prefix)
        return out

    def read(self, blob: Blob, var: VarInfo) -> np.ndarray:
        if var.span is not None:
            return super().read(blob, var)
        loc: _Dataset = var.locator
        with self._h5(blob, loc.member) as (f, _):
            ds = f[loc.path]
            _check_claim(ds, var)
            return _convert(np.asarray(ds[()]), var.dtype)


def _datasets(f, blob: Blob, member: str | None, base: int | None, prefix: str) -> list[VarInfo]:
    h5py = _h5py()
    found: list[VarInfo] = []

    def visit(path: str, obj) -> None:
        if not isinstance(obj, h5py.Dataset):
            return
        name = prefix + path
        try:
            found.append(_var(obj, name, blob, member, base, path))
        except Exception as e:  # noqa: BLE001 - one odd dataset becomes an error row
            found.append(VarInfo(name, "object", (), error=f"{type(e).__name__}: {e}"))

    f.visititems(visit)
    return found


def _var(ds, name: str, blob: Blob, member: str | None, base: int | None, path: str) -> VarInfo:
    stored = ds.attrs.get("dtype")
    stored = stored.decode() if isinstance(stored, bytes) else stored
    disk = ds.dtype
    if (
        isinstance(stored, str)
        and stored in _ML_NAMES
        and disk.itemsize == np_dtype(stored).itemsize
    ):
        dtype = stored  # Keras 3 writes bfloat16/float8 as raw bytes with a dtype attribute
    elif disk.kind in "OSUV" or disk.names is not None:
        dtype = "object"
    else:
        dtype = dtype_name(disk.newbyteorder("="))
    var = VarInfo(name, dtype, tuple(int(d) for d in ds.shape), kind=_kind(name))
    parent = ds.parent.attrs.get("name")
    if parent is not None:
        var.attrs["layer"] = parent.decode() if isinstance(parent, bytes) else str(parent)
    var.locator = _Dataset(member, path)
    offset = ds.id.get_offset()
    if dtype != "object" and base is not None and offset is not None and ds.chunks is None:
        length = ds.id.get_storage_size()
        if base + offset + length > blob.size:
            raise ValueError(f"dataset claims bytes past the end of {blob.name}")
        var.span = Span(blob.path, base + offset, length, disk_dtype=_disk(disk, dtype))
    return var


def _disk(disk: np.dtype, dtype: str) -> str | None:
    if dtype in _ML_NAMES or disk.byteorder in ("=", "|", "<"):
        return None
    return disk.str


def _kind(name: str) -> str:
    if name.startswith(("optimizer/", "optimizer_weights/")):
        return "optimizer"
    return guess_kind(name)


def _check_claim(ds, var: VarInfo) -> None:
    """Refuse a dataset whose shape claims far more than its stored bytes could hold."""
    want = var.numel * max(1, ds.dtype.itemsize)
    stored = ds.id.get_storage_size()
    if want > MAX_RATIO * stored + (1 << 20):
        raise ValueError(f"{var.name}: shape {var.shape} claims {want} bytes, {stored} stored")


def _convert(arr: np.ndarray, dtype: str) -> np.ndarray:
    if dtype in _ML_NAMES:
        return arr.view(np_dtype(dtype))
    if dtype == "object":
        return arr.astype(object)
    return arr.astype(np_dtype(dtype), copy=False)
