"""The two readers every header parser shares: a sliding window of ranged reads over a Blob,
and a bounds-checked cursor over bytes already read. Neither reads or allocates past the
bytes that exist: a header that claims more raises (TruncatedError or ValueError).
"""

from __future__ import annotations

import struct

from ..io import Blob, TruncatedError

WINDOW = 4096  # bytes fetched per header read past the cached first block


class Window:
    """Ranged reads of a Blob through one sliding buffer, starting from its cached first block:
    small header fields next to each other share one request, payloads in between are never
    read. ``window`` is how far a miss reads ahead (a parser that knows its records are big
    passes a larger one)."""

    def __init__(self, blob: Blob, window: int = WINDOW):
        self.blob = blob
        self.size = blob.size
        self.window = window
        self._start = 0
        self._buf = blob.head() if self.size else b""

    def get(self, offset: int, length: int, window: int | None = None) -> bytes:
        """Exactly ``length`` bytes at ``offset``; TruncatedError past the end of the file."""
        end = offset + length
        if offset < 0 or length < 0 or end > self.size:
            raise TruncatedError(
                f"{self.blob.name}: header needs bytes {offset}..{end} but the file has {self.size}"
            )
        if self._start <= offset and end <= self._start + len(self._buf):
            return self._buf[offset - self._start : end - self._start]
        ahead = self.window if window is None else window
        want = max(length, min(ahead, self.size - offset))
        self._buf, self._start = self.blob.read(offset, want), offset
        return self._buf[:length]

    def cached(self, offset: int, length: int) -> bytes | None:
        """Bytes already at hand (no read), or None."""
        if self._start <= offset and offset + length <= self._start + len(self._buf):
            return self._buf[offset - self._start : offset + length - self._start]
        return None

    def u32(self, offset: int) -> int:
        return struct.unpack("<I", self.get(offset, 4))[0]

    def u64(self, offset: int) -> int:
        return struct.unpack("<Q", self.get(offset, 8))[0]

    def i32(self, offset: int) -> int:
        return struct.unpack("<i", self.get(offset, 4))[0]

    def i64(self, offset: int) -> int:
        return struct.unpack("<q", self.get(offset, 8))[0]


class Cursor:
    """A cursor over bytes with little-endian varints; every read is bounds-checked and
    ``count`` refuses a count the remaining bytes cannot hold (no allocation on a claim)."""

    def __init__(self, data: bytes, what: str = "bytes"):
        self.data, self.pos, self.what = data, 0, what

    @property
    def left(self) -> int:
        return len(self.data) - self.pos

    def take(self, n: int) -> bytes:
        if n < 0 or n > self.left:
            raise ValueError(f"{self.what}: record ends early (need {n} bytes at {self.pos})")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def u8(self) -> int:
        return self.take(1)[0]

    def varint(self) -> int:
        value = shift = 0
        while True:
            byte = self.u8()
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
            shift += 7
            if shift > 63:
                raise ValueError(f"{self.what}: varint too long")

    def count(self, per_item: int = 1) -> int:
        """A varint count of items of at least ``per_item`` bytes each."""
        n = self.varint()
        if n * per_item > self.left:
            raise ValueError(f"{self.what}: count {n} exceeds the record")
        return n

    def varints(self, n: int) -> list[int]:
        return [self.varint() for _ in range(n)]
