"""Raw-deflate zip members read by streaming: :func:`inflate` yields a range of a member's
inflated bytes, :class:`InflatingBlob` reads a member as a file (front to back)."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Any

from ..io import HEAD_BLOCK, Blob, TruncatedError

INFLATE_OUT = 8 << 20  # inflated bytes per decompress call
INFLATE_STEP = 64 << 10  # compressed bytes per read


def inflate(
    blob: Blob, offset: int, size: int, skip: int, want: int, step: int = INFLATE_STEP,
    first: bytes = b"",
) -> Iterator[bytes]:  # fmt: skip
    """Inflate raw-deflate bytes at ``offset``; yield output ``[skip, skip + want)`` in pieces.

    Reads ``step`` compressed bytes at a time and never produces more than asked for;
    ``first``: compressed bytes at ``offset`` in hand already (not read again).
    """
    d = zlib.decompressobj(-zlib.MAX_WBITS)
    first = first[:size]
    pos, end = offset + len(first), offset + size
    to_skip, left, drained = skip, want, False
    while left > 0:
        if d.unconsumed_tail:
            chunk = d.unconsumed_tail
        elif first:
            chunk, first = first, b""
        elif pos < end:
            n = min(step, end - pos)
            chunk = blob.read(pos, n)
            pos += n
        elif not drained:  # input used up: what zlib still holds (a match cut at max_length)
            chunk, drained = b"", True
        else:
            break
        try:  # at most INFLATE_OUT per call: one compressed step may inflate 1000-fold
            out = d.decompress(chunk, min(to_skip + left, INFLATE_OUT))
        except zlib.error as e:
            raise ValueError(f"corrupt deflate stream: {e}") from None
        if to_skip:
            cut = min(to_skip, len(out))
            out, to_skip = out[cut:], to_skip - cut
        if out:
            out = out[:left]
            left -= len(out)
            yield out
        if d.eof:
            break


class InflatingBlob(Blob):
    """A deflated zip member read as a file of ``size`` inflated bytes, front to back (the
    pickle VM's growing window): skipped bytes are inflated and dropped, a read behind the
    last one starts over. Used while listing only; ``path`` stays the archive's."""

    def __init__(self, parent: Blob, offset: int, compressed: int, size: int):
        super().__init__(parent.storage, parent.path, size)
        self.parent, self.base, self.compressed = parent, offset, compressed
        self._restart()

    def _restart(self) -> None:
        self._d = zlib.decompressobj(-zlib.MAX_WBITS)
        self._in = self.base  # next compressed byte to read
        self._out = 0  # inflated offset of the next byte produced
        self._drained = False

    def _pull(self, limit: int) -> bytes:
        """Up to ``limit`` more inflated bytes; b"" at the end of the stream."""
        d, end = self._d, self.base + self.compressed
        while not d.eof:
            if d.unconsumed_tail:
                chunk = d.unconsumed_tail
            elif self._in < end:
                n = min(INFLATE_STEP, end - self._in)
                chunk = self.parent.read(self._in, n)
                self._in += n
            elif not self._drained:
                chunk, self._drained = b"", True
            else:
                return b""
            try:
                out = d.decompress(chunk, min(limit, INFLATE_OUT))
            except zlib.error as e:
                raise ValueError(f"corrupt deflate stream: {e}") from None
            if out:
                self._drained = False
                self._out += len(out)
                return out
        return b""

    def read(self, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise TruncatedError(f"{self.name}: needs inflated bytes {offset}..{offset + length} "
                                 f"of a {self.size}-byte member")  # fmt: skip
        if offset < self._out:
            self._restart()
        while self._out < offset:
            if not self._pull(offset - self._out):
                raise TruncatedError(f"{self.name}: compressed member ends early")
        pieces, need = [], length
        while need:
            out = self._pull(need)
            if not out:
                raise TruncatedError(f"{self.name}: compressed member ends early")
            pieces.append(out)
            need -= len(out)
        return b"".join(pieces)

    def head(self, n: int = HEAD_BLOCK) -> bytes:
        if self._head is None:
            self._head = self.read(0, min(HEAD_BLOCK, self.size))
        return self._head[:n] if n <= HEAD_BLOCK else self.read(0, min(n, self.size))

    def read_ranges(self, ranges: list[tuple[int, int]]) -> list[bytes]:
        return [self.read(a, b - a) for a, b in ranges]

    def open(self, **kwargs: Any):
        raise NotImplementedError("an inflating member has no file object")
