"""The child process that runs h5py for the Keras codec (libhdf5 may crash on a corrupt file).

This module is loaded by path in a fresh interpreter and imports nothing from ckptview (the
child starts fast and needs only numpy and h5py). It reads requests from stdin and answers on
stdout, both as length-prefixed pickles; file bytes come from the parent, which serves them
through its Blob (``("fetch", start, length)``), so reads are counted, cached and work on every
filesystem. Results are plain data: dicts of numbers, strings and numpy dtypes, or an array.
"""

from __future__ import annotations

import io
import os
import pickle
import struct
import zlib
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

HEAD_BLOCK = 4096  # ckptview.io.HEAD_BLOCK: block 0 is the parent's cached head
BLOCK = 1 << 16  # HDF5 metadata reads are small: fetch aligned blocks, each once
STORED = 0
#: a filtered dataset may not claim more than deflate's best ratio over its stored bytes
MAX_RATIO = 1032
_LEN = struct.Struct("<Q")


# -- framing ----------------------------------------------------------------------------------
def send(f, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(_LEN.pack(len(data)))
    f.write(data)
    f.flush()


def read_exact(f, n: int) -> bytes:
    parts, got = [], 0
    while got < n:
        piece = f.read(n - got)
        if not piece:
            raise EOFError("the other side closed the pipe")
        parts.append(piece)
        got += len(piece)
    return b"".join(parts)


def recv(f):
    (n,) = _LEN.unpack(read_exact(f, _LEN.size))
    return pickle.loads(read_exact(f, n))  # noqa: S301 - our own process at the other end


# -- file objects -----------------------------------------------------------------------------
class _Raw(io.RawIOBase):
    """Read-only, seekable base: subclasses implement ``readinto`` at ``self._pos``."""

    _size = 0
    _pos = 0

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


class BlockFile(_Raw):
    """A file of ``size`` bytes whose aligned blocks come from ``fetch(start, length)``, each
    once (a bounded LRU): h5py re-reads the same small metadata ranges many times. Block 0 is
    the first ``HEAD_BLOCK`` bytes, the parent's cached head."""

    def __init__(self, size: int, fetch, block: int = BLOCK, max_blocks: int = 128):
        self._size, self._fetch, self._pos = size, fetch, 0
        self._block, self._max = block, max_blocks
        self._first = min(HEAD_BLOCK, size)
        self._blocks: OrderedDict[int, bytes] = OrderedDict()

    def _start(self, i: int) -> int:
        return 0 if i == 0 else self._first + (i - 1) * self._block

    def _get(self, i: int) -> bytes:
        data = self._blocks.get(i)
        if data is None:
            start = self._start(i)
            length = self._first if i == 0 else min(self._block, self._size - start)
            data = self._fetch(start, length)
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


class Window(_Raw):
    """``length`` bytes at ``start`` of a file object (a stored zip member)."""

    def __init__(self, f, start: int, length: int):
        self._f, self._start, self._size, self._pos = f, start, length, 0

    def readinto(self, b) -> int:
        n = max(0, min(len(b), self._size - self._pos))
        if n == 0:
            return 0
        self._f.seek(self._start + self._pos)
        data = self._f.read(n)
        b[: len(data)] = data
        self._pos += len(data)
        return len(data)


class Inflater(_Raw):
    """A deflated member's ``size`` inflated bytes; a backward seek inflates from the start."""

    def __init__(self, f, start: int, compress_size: int, size: int, step: int = 1 << 16):
        self._f, self._start, self._csize, self._size = f, start, compress_size, size
        self._step, self._pos = step, 0
        self._reset()

    def _reset(self) -> None:
        self._d = zlib.decompressobj(-zlib.MAX_WBITS)
        self._in = 0  # compressed bytes consumed
        self._buf, self._buf_at = b"", 0  # the latest inflated piece and where it starts

    def _more(self) -> bool:
        if self._d.eof:
            return False
        chunk = self._d.unconsumed_tail
        if not chunk:
            n = min(self._step, self._csize - self._in)
            if n <= 0:
                return False
            self._f.seek(self._start + self._in)
            chunk = self._f.read(n)
            if not chunk:
                return False
            self._in += len(chunk)
        try:
            piece = self._d.decompress(chunk, 1 << 20)
        except zlib.error as e:
            raise OSError(f"corrupt deflate stream: {e}") from None
        self._buf_at += len(self._buf)
        self._buf = piece
        return True

    def readinto(self, b) -> int:
        want = max(0, min(len(b), self._size - self._pos))
        if self._pos < self._buf_at:
            self._reset()
        done = 0
        while done < want:
            rel = self._pos + done - self._buf_at
            if rel >= len(self._buf):
                if not self._more():
                    break
                continue
            piece = self._buf[rel : rel + want - done]
            b[done : done + len(piece)] = piece
            done += len(piece)
        self._pos += done
        return done


# -- h5py work --------------------------------------------------------------------------------
def _open(raw, member: tuple):
    """An h5py File over a member ``(name, start, compress_size, size, method)``."""
    import h5py

    name, start, csize, size, method = member
    if method != STORED:
        return h5py.File(Inflater(raw, start, csize, size), "r")
    return h5py.File(raw if name is None else Window(raw, start, size), "r")


def _text(value):
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def list_datasets(size: int, members: list[tuple], fetch) -> list[dict]:
    """Every dataset of every member: plain facts, or an ``error`` for one odd dataset."""
    import h5py

    raw = BlockFile(size, fetch)
    found: list[dict] = []
    for member in members:
        prefix = f"{member[0]}/" if member[0] is not None and len(members) > 1 else ""

        def visit(path: str, obj, member=member, prefix=prefix) -> None:
            if not isinstance(obj, h5py.Dataset):
                return
            row = {"name": prefix + path, "member": member, "path": path}
            try:
                stored = _text(obj.attrs.get("dtype"))
                row.update(disk=obj.dtype, shape=tuple(int(d) for d in obj.shape))
                row["stored"] = stored if isinstance(stored, str) else None
                layer = obj.parent.attrs.get("name")
                row["layer"] = None if layer is None else str(_text(layer))
                row["offset"] = obj.id.get_offset()
                row["storage"] = obj.id.get_storage_size()
                row["chunked"] = obj.chunks is not None
            except Exception as e:  # noqa: BLE001 - one odd dataset becomes an error row
                row["error"] = f"{type(e).__name__}: {e}"
            found.append(row)

        with _open(raw, member) as f:
            f.visititems(visit)
    return found


def read_dataset(size: int, member: tuple, path: str, numel: int, fetch):
    """One dataset's values, after refusing a shape that claims far more than is stored."""
    with _open(BlockFile(size, fetch), member) as f:
        ds = f[path]
        want = numel * max(1, ds.dtype.itemsize)
        stored = ds.id.get_storage_size()
        if want > MAX_RATIO * stored + (1 << 20):
            raise ValueError(f"{path}: shape {ds.shape} claims {want} bytes, {stored} stored")
        import numpy as np

        return np.asarray(ds[()])


# -- the serving loop -------------------------------------------------------------------------
def serve() -> None:
    """Answer requests until stdin closes. stdout is kept for the protocol only."""
    rf = os.fdopen(os.dup(0), "rb", buffering=0)
    wf = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)  # a library printing to stdout must not corrupt the protocol

    def fetch(start: int, length: int) -> bytes:
        send(wf, ("fetch", start, length))
        reply = recv(rf)
        if reply[0] != "data":
            raise OSError(reply[1])
        return reply[1]

    handlers: dict[str, Callable[..., Any]] = {"list": list_datasets, "read": read_dataset}
    while True:
        try:
            request = recv(rf)
        except EOFError:
            return
        try:
            result: tuple = ("ok", handlers[request[0]](*request[1:], fetch=fetch))
        except Exception as e:  # noqa: BLE001 - sent to the parent, which raises it
            result = ("err", type(e).__name__, str(e)[:1000])
        send(wf, result)
