"""OCDBT, tensorstore's key-value database as Orbax writes it (metadata only, pure Python):
the manifest and B+tree nodes (``kvstore/ocdbt/index.rst``), decompressed with zstandard,
give every key and its small inline value or where an out-of-line value lies. No tensor
chunk is read.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass

from ..io import Blob, Storage
from .cursor import Cursor
from .small import read_small

MAX_NODE_BYTES = 64 << 20
MAX_NODES = 100_000
MANIFEST_MAGIC, BTREE_MAGIC = 0x0CDB3A2A, 0x0CDB20DE


def _decode_envelope(data: bytes, magic: int) -> Cursor:
    """Check magic/length, strip the crc footer, decompress the body."""
    if len(data) < 17 or struct.unpack(">I", data[:4])[0] != magic:
        raise ValueError(f"OCDBT: bad magic (want {magic:#x})")
    length = struct.unpack("<Q", data[4:12])[0]
    if length != len(data):
        raise ValueError(f"OCDBT: length field {length} != {len(data)} bytes")
    head = Cursor(data[:-4], "OCDBT")
    head.pos = 12
    version, compression = head.varint(), head.varint()
    if version != 0:
        raise ValueError(f"OCDBT: unsupported version {version}")
    body = data[head.pos : -4]
    if compression == 1:
        import zstandard

        reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(body))
        body = reader.read(MAX_NODE_BYTES + 1)
        if len(body) > MAX_NODE_BYTES:
            raise ValueError("OCDBT: node decompresses beyond the size limit")
    elif compression != 0:
        raise ValueError(f"OCDBT: unknown compression {compression}")
    return Cursor(body, "OCDBT")


def _file_table(r: Cursor, transitive: str) -> list[tuple[str, str]]:
    """(full path, base path for children) per data file, relative to the database root."""
    n = r.count()
    prefix_len = r.varints(max(0, n - 1))
    suffix_len = r.varints(n)
    base_len = r.varints(n)
    out, prev = [], b""
    for i in range(n):
        keep = prefix_len[i - 1] if i else 0
        path = prev[:keep] + r.take(suffix_len[i])
        prev = path
        full = transitive + path.decode("utf-8")
        out.append((full, transitive + path[: base_len[i]].decode("utf-8")))
    return out


@dataclass
class _Ref:
    file: str  # relative to the database root
    base: str  # transitive path for nodes reached through it
    offset: int
    length: int


class OcdbtIndex:
    """Keys of an OCDBT database (one directory) and their small values, from its B+tree."""

    def __init__(self, storage: Storage, root: str, sizes: dict[str, int] | None = None):
        self.storage, self.root, self.sizes = storage, root.rstrip("/"), sizes or {}
        self._nodes = 0

    def _read(self, rel: str, offset: int, length: int) -> bytes:
        blob = Blob(self.storage, f"{self.root}/{rel}", self.sizes.get(rel))
        return blob.read(offset, length)

    def root_ref(self) -> tuple[_Ref | None, int]:
        """The latest version's root node (None for an empty tree) and its height."""
        size = self.sizes.get("manifest.ocdbt")
        r = _decode_envelope(
            read_small(self.storage, f"{self.root}/manifest.ocdbt", size), MANIFEST_MAGIC
        )
        r.take(16)  # uuid
        if r.varint() != 0:
            raise ValueError("OCDBT: numbered manifests are not supported; use tensorstore")
        r.varint(), r.varint()  # max inline value bytes, max decoded node bytes
        r.u8()  # version tree arity log2
        if r.varint() == 1:
            r.take(4)  # zstd level
        files = _file_table(r, "")
        n = r.count(4)
        gens = r.varints(n)
        heights = [r.u8() for _ in range(n)]
        ids, offsets, lengths = r.varints(n), r.varints(n), r.varints(n)
        if not n or not gens:
            return None, 0
        fid = ids[-1]
        if fid >= len(files):
            raise ValueError("OCDBT: root refers to a missing data file")
        if lengths[-1] == 0:
            return None, 0
        return _Ref(files[fid][0], files[fid][1], offsets[-1], lengths[-1]), heights[-1]

    def items(self) -> dict[str, bytes | _Ref]:
        """key -> inline value bytes, or a _Ref for an out-of-line value."""
        ref, height = self.root_ref()
        out: dict[str, bytes | _Ref] = {}
        if ref is not None:
            self._walk(ref, height, b"", out)
        return out

    def _walk(self, ref: _Ref, height: int, prefix: bytes, out: dict) -> None:
        self._nodes += 1
        if self._nodes > MAX_NODES:
            raise ValueError("OCDBT: too many B+tree nodes")
        r = _decode_envelope(self._read(ref.file, ref.offset, ref.length), BTREE_MAGIC)
        if r.u8() != height:
            raise ValueError("OCDBT: B+tree node height mismatch")
        files = _file_table(r, ref.base)
        n = r.count()
        keys = _keys(r, n, with_subtree=height > 0)
        if height > 0:
            ids, offsets, lengths = r.varints(n), r.varints(n), r.varints(n)
            r.varints(3 * n)  # statistics
            for (key, common), fid, off, ln in zip(keys, ids, offsets, lengths):
                full, base = files[fid]
                self._walk(_Ref(full, base, off, ln), height - 1, prefix + key[:common], out)
            return
        lengths = r.varints(n)
        kinds = r.varints(n)
        indirect = [i for i in range(n) if kinds[i] == 1]
        ids, offsets = r.varints(len(indirect)), r.varints(len(indirect))
        for j, i in enumerate(indirect):
            full, base = files[ids[j]]
            out[(prefix + keys[i][0]).decode("utf-8", "replace")] = _Ref(
                full, base, offsets[j], lengths[i]
            )
        for i in range(n):
            if kinds[i] == 0:
                out[(prefix + keys[i][0]).decode("utf-8", "replace")] = r.take(lengths[i])

    def value(self, entry: bytes | _Ref) -> bytes:
        return (
            entry
            if isinstance(entry, bytes)
            else self._read(entry.file, entry.offset, entry.length)
        )


def _keys(r: Cursor, n: int, with_subtree: bool) -> list[tuple[bytes, int]]:
    prefix_len = r.varints(max(0, n - 1))
    suffix_len = r.varints(n)
    common = r.varints(n) if with_subtree else [0] * n
    out, prev = [], b""
    for i in range(n):
        keep = prefix_len[i - 1] if i else 0
        key = prev[:keep] + r.take(suffix_len[i])
        prev = key
        out.append((key, common[i]))
    return out
