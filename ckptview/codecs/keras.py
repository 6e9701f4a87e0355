"""Keras weight files: ``.weights.h5`` / ``.h5`` (HDF5) and ``.keras`` (a zip holding them).

Every HDF5 dataset is one variable named by its path (Keras 3: ``layers/<layer>/vars/<i>``,
optimizer ``optimizer/vars/<i>``; Keras 2: ``model_weights/<layer>/<layer>/kernel:0``).
Listing goes through h5py (the ``keras`` extra); a contiguous, unfiltered dataset gets a Span
so its values are read without h5py, straight from the file (also inside a ``.keras`` zip
whose member is stored uncompressed).

libhdf5 can crash the whole process on a corrupt file, so every h5py call runs in one reused
child process (:mod:`ckptview.formats.hdf5`) that asks this process for the file's bytes: the reads are
counted and cached as usual. When the child dies, the file becomes an error row ("HDF5
library crashed reading this file") and the next file gets a fresh child.
"""

from __future__ import annotations

import atexit
import io
import os
import pickle
import select
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..dtypes import dtype_name, np_dtype
from ..formats import hdf5 as wire
from ..formats.zipdir import STORED, Seen, locate, read_directory
from ..io import HEAD_BLOCK, Blob
from ..kinds import guess_kind
from ..model import Span, VarInfo
from .base import Codec, CodecTier

HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
ZIP_MAGIC = b"PK\x03\x04"
MAX_RATIO = wire.MAX_RATIO
#: seconds the h5py child may stay silent (no result, no read request) before it is killed
CHILD_TIMEOUT = 60.0
_ML_NAMES = ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")


def _h5py():
    try:
        import h5py
    except ImportError:  # pragma: no cover - h5py is in the test environment
        raise ImportError(
            "reading Keras/HDF5 files needs h5py: pip install 'ckptview[keras]'"
        ) from None
    return h5py


class HDF5CrashError(OSError):
    """The h5py child process died (or hung) on a file."""


@dataclass
class _Dataset:
    """Where a dataset lives: the HDF5 file's member tuple ``(zip member or None, data start,
    compressed size, size, method)`` and the dataset's path in it."""

    member: tuple
    path: str


# -- the h5py child ---------------------------------------------------------------------------
_LAUNCH = (
    "import sys, importlib.util as u\n"
    "sys.path[:] = [p for p in sys.path if p not in ('', '.')]\n"
    "s = u.spec_from_file_location('_ckptview_h5worker', sys.argv[1])\n"
    "m = u.module_from_spec(s); s.loader.exec_module(m); m.serve()\n"
)


class _Worker:
    """One reused child process running h5py; requests are served one at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._w: io.BufferedWriter | None = None

    def _start(self) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-c", _LAUNCH, str(Path(wire.__file__))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            bufsize=0, close_fds=True,
        )  # fmt: skip
        self._proc, self._w = proc, io.BufferedWriter(proc.stdin)
        return proc

    def forget(self) -> None:
        """In a forked process: drop (close) the parent's pipes, never its child."""
        for f in (self._proc.stdin, self._proc.stdout) if self._proc is not None else ():
            try:
                f.close()
            except OSError:
                pass
        self.__init__()

    def stop(self) -> None:
        proc, self._proc, self._w = self._proc, None, None
        if proc is None:
            return
        for f in (proc.stdin, proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        if proc.poll() is None:
            proc.kill()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover
            pass

    def _recv(self, proc: subprocess.Popen):
        ready, _, _ = select.select([proc.stdout], [], [], CHILD_TIMEOUT)
        if not ready:
            raise TimeoutError(f"HDF5 library gave no answer in {CHILD_TIMEOUT:.0f} s")
        return wire.recv(proc.stdout)

    def call(self, blob: Blob, seen: Seen, *request):
        """Run ``request`` in the child; its reads of the file are served from ``blob``
        (bytes in ``seen`` or the cached head are not read again)."""
        with self._lock:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                self.stop()
                proc = self._start()
            try:
                wire.send(self._w, request)
                while True:
                    msg = self._recv(proc)
                    if msg[0] != "fetch":
                        break
                    try:
                        reply = ("data", _block(blob, seen, msg[1], msg[2]))
                    except Exception as e:  # noqa: BLE001 - the child raises it inside h5py
                        reply = ("fail", f"{type(e).__name__}: {e}")
                    wire.send(self._w, reply)
            except (EOFError, OSError, ValueError, pickle.UnpicklingError) as e:
                if isinstance(e, TimeoutError):
                    self.stop()
                    raise HDF5CrashError(f"HDF5 library hung reading this file ({e})") from None
                try:
                    code = proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    code = None
                self.stop()
                how = f"exit code {code}" if code is not None else type(e).__name__
                raise HDF5CrashError(f"HDF5 library crashed reading this file ({how})") from None
            except BaseException:  # a timeout, an interrupt: the child's state is unknown
                self.stop()
                raise
        if msg[0] == "ok":
            return msg[1]
        raise _rebuild(msg[1], msg[2])


def _block(blob: Blob, seen: Seen, start: int, length: int) -> bytes:
    if start == 0 and length <= HEAD_BLOCK:
        return blob.head()[:length]
    return seen.read(blob, start, length)


_KEEP = (ValueError, KeyError, IndexError, OSError, EOFError, NotImplementedError,
         OverflowError, ImportError)  # fmt: skip


def _rebuild(name: str, message: str) -> Exception:
    """The child's exception in this process: the same builtin type where it is an ordinary
    one, else an OSError naming it (h5py's own errors are OSError/KeyError subclasses; a
    MemoryError of the child is the file's fault, not this process's)."""
    cls = getattr(__import__("builtins"), name, None)
    if isinstance(cls, type) and issubclass(cls, _KEEP):
        return cls(message)
    return OSError(f"{name}: {message}")


_WORKER = _Worker()
atexit.register(_WORKER.stop)
if hasattr(os, "register_at_fork"):  # a forked child must not share our pipes
    os.register_at_fork(after_in_child=_WORKER.forget)


# -- the codec --------------------------------------------------------------------------------
class KerasCodec(Codec):
    """Keras 3 ``.weights.h5`` / ``.keras`` and any HDF5 weights file, via h5py."""

    name = "keras"
    suffixes = (".keras", ".weights.h5", ".h5", ".hdf5")
    save_suffixes = suffixes
    priority = CodecTier.LOOSE
    loads_into_model = True  # model.load_weights refuses a layer of another shape

    def guess_can_open(self, filename: str, head: bytes) -> bool:
        name = filename.lower()
        if name.endswith(".keras"):
            return head.startswith(ZIP_MAGIC)
        return head.startswith(HDF5_MAGIC) or name.endswith((".weights.h5", ".hdf5"))

    def _members(self, blob: Blob, seen: Seen) -> list[tuple]:
        """``(zip member or None, data start, compressed size, size, method)`` per HDF5 file."""
        if not blob.name.lower().endswith(".keras") and blob.head(4) != ZIP_MAGIC:
            return [(None, 0, blob.size, blob.size, STORED)]
        found = read_directory(blob, seen).values()
        entries = [e for e in found if e.filename.endswith((".h5", ".hdf5"))]
        if not entries:
            raise ValueError(f"{blob.name}: a .keras archive without a weights .h5 member")
        out = []
        for e, got in zip(entries, locate(blob, entries, seen=seen), strict=True):
            if isinstance(got, Exception):
                raise got
            if e.flag_bits & 1:
                raise ValueError(f"{blob.name}: member {e.filename} is encrypted")
            if e.compress_type not in (0, 8):
                raise ValueError(f"{e.filename}: zip compression method {e.compress_type}")
            out.append((e.filename, got[0], e.compress_size, e.file_size, e.compress_type))
        return out

    def list_variables(self, blob: Blob, hints: dict) -> list[VarInfo]:
        _h5py()  # the install hint, here rather than from the child
        seen = Seen()  # the zip directory's bytes: the child's reads reuse them
        members = self._members(blob, seen)
        rows = _WORKER.call(blob, seen, "list", blob.size, members)
        out = []
        for row in rows:
            try:
                if "error" in row:
                    raise ValueError(row["error"])
                out.append(_var(row, blob))
            except Exception as e:  # noqa: BLE001 - one odd dataset becomes an error row
                out.append(VarInfo(row["name"], "object", (), error=f"{type(e).__name__}: {e}"))
        return out

    def read(self, blob: Blob, var: VarInfo) -> np.ndarray:
        if var.span is not None:
            return super().read(blob, var)
        loc: _Dataset = var.locator
        _h5py()
        arr = _WORKER.call(blob, Seen(), "read", blob.size, loc.member, loc.path, var.numel)
        return _convert(np.asarray(arr), var.dtype)


def _var(row: dict, blob: Blob) -> VarInfo:
    """A VarInfo from the child's facts about one dataset."""
    stored, disk, name = row["stored"], row["disk"], row["name"]
    if stored in _ML_NAMES and disk.itemsize == np_dtype(stored).itemsize:
        dtype = stored  # Keras 3 writes bfloat16/float8 as raw bytes with a dtype attribute
    elif disk.kind in "OSUV" or disk.names is not None:
        dtype = "object"
    else:
        dtype = dtype_name(disk.newbyteorder("="))
    var = VarInfo(name, dtype, row["shape"], kind=_kind(name))
    if row["layer"] is not None:
        var.attrs["layer"] = row["layer"]
    member = row["member"]
    var.locator = _Dataset(member, row["path"])
    offset, length = row["offset"], row["storage"]
    base = member[1] if member[4] == STORED else None
    if dtype != "object" and base is not None and offset is not None and not row["chunked"]:
        if base + offset + length > min(blob.size, member[1] + member[3]):
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


def _convert(arr: np.ndarray, dtype: str) -> np.ndarray:
    if dtype in _ML_NAMES:
        return arr.view(np_dtype(dtype))
    if dtype == "object":
        return arr.astype(object)
    return arr.astype(np_dtype(dtype), copy=False)
