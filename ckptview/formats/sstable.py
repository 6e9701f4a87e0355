"""LevelDB tables ("SSTables") read by ranges: the ``.index`` file of TF tensor bundles.

A table is data blocks of prefix-compressed ``(key, value)`` entries, an index block naming
each data block's handle, and a 48-byte footer (the index block's handle and a magic number).
Every block ends with a 5-byte trailer: its compression (none or snappy) and a masked crc32c,
verified for tables up to ``CRC_VERIFY_LIMIT`` (as TF's ``ReadBlock`` does for every block;
crc32c in numpy, :mod:`.crc32c`). A table up to
``WHOLE_FILE_LIMIT`` is read in one request; a larger one block by block. No offset or length
is trusted: each is checked against the file's size (or its block) before anything is read.

Budgets, so that no index makes the walk outlast or outgrow its file: each data block is
visited once (an index naming one block twice is refused), a key may not outgrow
``MAX_KEY`` nor its block, and the keys walked may total at most ``KEY_BYTES_PER_BYTE`` times
the file's size (prefix compression lets an entry of a few bytes name a long key).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from ..io import Blob
from . import protobuf as pb
from .crc32c import crc32c

TABLE_MAGIC = 0xDB4775248B80FB57
FOOTER_SIZE = 48
BLOCK_TRAILER = 5
WHOLE_FILE_LIMIT = 16 << 20  # smaller indexes are read in one request
CRC_VERIFY_LIMIT = 4 << 20  # verify the blocks of indexes up to this size
MAX_KEY = 1 << 16  # TF bundle keys are tensor names
KEY_BYTES_PER_BYTE = 64  # the key bytes a table may spell per byte of file (plus 1 MiB)


class FormatError(ValueError):
    """The bytes are not a valid tensor bundle."""


# -- crc32c (Castagnoli), masked as LevelDB/TF store it ------------------------------------
def unmask_crc(masked: int) -> int:
    rot = (masked - 0xA282EAD8) & 0xFFFFFFFF
    return ((rot >> 17) | (rot << 15)) & 0xFFFFFFFF


# -- LevelDB table ---------------------------------------------------------------------------
def handle(buf: bytes | memoryview, pos: int) -> tuple[int, int, int]:
    offset, pos = pb.read_varint(buf, pos)
    size, pos = pb.read_varint(buf, pos)
    return offset, size, pos


def _entries_end(block: bytes) -> int:
    """Where a block's entries end (its restart array begins), checked against its size."""
    n = len(block)
    if n < 4:
        raise FormatError("block shorter than its restart count")
    (num_restarts,) = struct.unpack_from("<I", block, n - 4)
    limit = n - 4 - 4 * num_restarts
    if num_restarts == 0 or limit < 0:
        raise FormatError(f"block claims {num_restarts} restart points in {n} bytes")
    return limit


def block_spans(block: bytes, budget: list[int] | None = None) -> list[tuple[bytes, int, int]]:
    """(key, value start, value end) of each entry of one table block: prefix-compressed keys,
    the restart array at the end; the values are ``block[start:end]`` (not copied).

    ``budget`` (a one-item list) counts down the key bytes this walk may still spell."""
    if type(block) is not bytes:
        block = bytes(block)
    n = len(block)
    limit = _entries_end(block)
    max_key = min(MAX_KEY, n)
    left = budget[0] if budget is not None else -1
    read_varint = pb.read_varint
    out = []
    pos, key = 0, b""
    try:
        while pos < limit:
            shared = block[pos]  # three varints, nearly always one byte each
            if shared < 0x80:
                pos += 1
            else:
                shared, pos = read_varint(block, pos)
            non_shared = block[pos]
            if non_shared < 0x80:
                pos += 1
            else:
                non_shared, pos = read_varint(block, pos)
            value_len = block[pos]
            if value_len < 0x80:
                pos += 1
            else:
                value_len, pos = read_varint(block, pos)
            if shared > len(key) or non_shared + value_len > limit - pos:
                raise FormatError("block entry runs past its block")
            if shared + non_shared > max_key:
                raise FormatError(f"block key of {shared + non_shared} bytes outgrows its block")
            if budget is not None:
                left -= shared + non_shared
                if left < 0:
                    raise FormatError("table keys total more than the file could name")
            end = pos + non_shared
            key = key[:shared] + block[pos:end] if shared else block[pos:end]
            pos = end + value_len
            out.append((key, end, pos))
    except IndexError:  # a varint's first byte past the block
        raise pb.DecodeError("truncated varint") from None
    finally:
        if budget is not None:
            budget[0] = left
    return out


def block_entries(
    block: bytes, budget: list[int] | None = None
) -> Iterator[tuple[bytes, memoryview]]:
    """(key, value) pairs of one table block, one at a time (the lazy form of
    :func:`block_spans`: the same checks, in the same order)."""
    n = len(block)
    limit = _entries_end(block)
    mv = memoryview(block)
    pos, key = 0, b""
    while pos < limit:
        shared, pos = pb.read_varint(mv, pos)
        non_shared, pos = pb.read_varint(mv, pos)
        value_len, pos = pb.read_varint(mv, pos)
        if shared > len(key) or non_shared + value_len > limit - pos:
            raise FormatError("block entry runs past its block")
        if shared + non_shared > min(MAX_KEY, n):
            raise FormatError(f"block key of {shared + non_shared} bytes outgrows its block")
        if budget is not None:
            budget[0] -= shared + non_shared
            if budget[0] < 0:
                raise FormatError("table keys total more than the file could name")
        key = key[:shared] + bytes(mv[pos : pos + non_shared])
        pos += non_shared
        yield key, mv[pos : pos + value_len]
        pos += value_len


class TableFile:
    """Ranged access to one table file: the whole file in one read when it is small."""

    def __init__(self, blob: Blob):
        self.blob = blob
        self.size = blob.size
        self.data = blob.read(0, self.size) if self.size <= WHOLE_FILE_LIMIT else None
        self.verify = self.size <= CRC_VERIFY_LIMIT

    def read(self, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise FormatError(
                f"{self.blob.name}: block at {offset}+{length} lies outside the file ({self.size})"
            )
        if self.data is not None:
            return self.data[offset : offset + length]
        return self.blob.read(offset, length)

    def block(self, offset: int, size: int) -> bytes:
        raw = self.read(offset, size + BLOCK_TRAILER)
        data, kind = raw[:size], raw[size]
        if self.verify:
            (masked,) = struct.unpack_from("<I", raw, size + 1)
            if crc32c(raw[: size + 1]) != unmask_crc(masked):
                raise FormatError(f"{self.blob.name}: block at {offset} fails its crc32c")
        if kind == 0:
            return data
        if kind == 1:
            return snappy(data)
        raise FormatError(f"{self.blob.name}: unknown block compression {kind}")

    def entries(self) -> Iterator[tuple[bytes, memoryview]]:
        """(key, value) of every entry, in order, one at a time."""
        budget = self._budget()
        for block in self._data_blocks(budget):
            yield from block_entries(block, budget)

    def blocks(self) -> Iterator[tuple[bytes, list[tuple[bytes, int, int]]]]:
        """Each data block (its bytes) with its entries as :func:`block_spans`, in order: the
        entries of :meth:`entries`, a block at a time (a bad entry fails its whole block)."""
        budget = self._budget()
        for block in self._data_blocks(budget):
            if type(block) is not bytes:
                block = bytes(block)
            yield block, block_spans(block, budget)

    def _budget(self) -> list[int]:
        return [KEY_BYTES_PER_BYTE * self.size + (1 << 20)]

    def _data_blocks(self, budget: list[int]) -> Iterator[bytes]:
        """The data blocks named by the index block, each once, in order."""
        if self.size < FOOTER_SIZE:
            raise FormatError(f"{self.blob.name}: {self.size} bytes, a table needs {FOOTER_SIZE}")
        footer = self.read(self.size - FOOTER_SIZE, FOOTER_SIZE)
        if struct.unpack_from("<Q", footer, 40)[0] != TABLE_MAGIC:
            raise FormatError(f"{self.blob.name}: not a LevelDB table (bad footer magic)")
        _, _, pos = handle(footer, 0)  # metaindex: empty in bundles
        index_offset, index_size, _ = handle(footer, pos)
        seen: set[int] = set()
        for _sep, value in block_entries(self.block(index_offset, index_size), budget):
            offset, size, _ = handle(value, 0)
            if offset in seen:
                raise FormatError(f"{self.blob.name}: the index names the block at {offset} twice")
            seen.add(offset)
            yield self.block(offset, size)


def snappy(data: bytes) -> bytes:
    claimed, _ = pb.read_varint(data, 0)
    if claimed > 64 * len(data) + 64:  # snappy cannot expand more than ~32x
        raise FormatError(f"snappy block claims {claimed} bytes from {len(data)}")
    import cramjam

    return bytes(cramjam.snappy.decompress_raw(data))
