"""The bytes the pickle VM runs over: all of them (a bytes source) or a window onto a Blob that
grows as the VM asks, reading no byte twice (the Blob's cached head and the bytes held already
serve what they cover).
"""

from __future__ import annotations

from ...io import HEAD_BLOCK, Blob, TruncatedError

CHUNK = 1 << 16  # Blob bytes read ahead past what an opcode needs


class Reader:
    """A bounded window over bytes or a Blob; ``pos`` is an absolute file offset, ``end`` the
    offset no read may pass (the file's size or the caller's bound)."""

    def __init__(self, source: bytes | bytearray | memoryview | Blob, offset: int = 0,
                 end: int | None = None):  # fmt: skip
        self.data: bytes | None
        self.blob: Blob | None
        if isinstance(source, (bytes, bytearray, memoryview)):
            self.data, self.blob = bytes(source), None
            size = len(self.data)
        else:
            self.data, self.blob = None, source
            size = source.size
        self.end = size if end is None else min(int(end), size)
        if offset < 0 or offset > self.end:
            raise TruncatedError(f"pickle offset {offset} outside the file ({size} bytes)")
        if self.data is not None and self.end < size:
            self.data = self.data[: self.end]  # the bytes held end where the pickle must
        self.pos = offset
        self._buf = b""
        self._buf_at = 0

    @property
    def left(self) -> int:
        return self.end - self.pos

    def ensure(self, n: int) -> None:
        """Make the window hold ``[pos, pos + n)``; TruncatedError if that passes ``end``."""
        if self.pos + n > self.end:
            raise TruncatedError(
                f"pickle needs {n} bytes at {self.pos} but only {self.left} are left"
            )
        if self.blob is not None:
            rel = self.pos - self._buf_at
            if rel < 0 or rel + n > len(self._buf):
                self._load(self.blob, n)

    def _load(self, blob: Blob, n: int) -> None:
        """Make the buffer hold ``[pos, pos + n)``, reading only bytes not held already.

        The Blob's cached first block serves what lies in it; bytes past it are read ahead
        (``CHUNK``, within ``end``), keeping the held bytes the new window overlaps."""
        pos, first = self.pos, min(HEAD_BLOCK, blob.size)
        if pos + n <= first:
            self._buf, self._buf_at = blob.head(), 0
            return
        held = b""
        for buf, at in ((blob.head() if pos < first else b"", 0), (self._buf, self._buf_at)):
            if at <= pos < at + len(buf):
                held = buf[pos - at :]
                break
        start = pos + len(held)
        stop = min(self.end, max(pos + n, start + CHUNK))
        self._buf = held + blob.read(start, stop - start) if stop > start else held
        self._buf_at = pos

    def window(self) -> tuple[bytes, int, int]:
        """The bytes held: ``(buf, base, limit)``, ``buf`` being the file's bytes
        ``[base, base + limit)`` within the pickle's bounds (``len(buf) == limit``)."""
        if self.data is not None:
            return self.data, 0, self.end
        buf, limit = self._buf, min(len(self._buf), self.end - self._buf_at)
        return (buf if len(buf) <= limit else buf[:limit]), self._buf_at, limit

    def hold(self, offset: int, data: bytes) -> None:
        """Bytes of the file at ``offset`` the caller read already (with a zip local header,
        say): reads they cover cost no request."""
        if self.blob is not None and data:
            self._buf, self._buf_at = bytes(data), offset

    def cached(self, offset: int, n: int) -> bytes | None:
        """``n`` bytes at ``offset`` if the reader holds them already (buffer or head)."""
        if self.data is not None:
            return self.data[offset : offset + n] if offset + n <= len(self.data) else None
        rel = offset - self._buf_at
        if rel >= 0 and rel + n <= len(self._buf):
            return self._buf[rel : rel + n]
        if self.blob is not None and offset >= 0 and offset + n <= min(HEAD_BLOCK, self.blob.size):
            return self.blob.head()[offset : offset + n]  # the Blob's cached first block
        return None
