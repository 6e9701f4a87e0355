"""A bounded MessagePack decoder (the msgpack spec; no library needed for t5x's small
``checkpoint`` files). Every length is checked against the bytes, nesting is capped, and
extension values come back as :class:`Ext` for the caller to interpret."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

MAX_DEPTH = 256
MAX_ITEMS = 1_000_000


class DecodeError(ValueError):
    """The bytes are not well-formed MessagePack."""


@dataclass
class Ext:
    """An extension value: its type code and raw bytes."""

    code: int
    data: bytes


def unpackb(data: bytes) -> Any:
    """The one object ``data`` holds (trailing bytes are an error)."""
    r = _Reader(data)
    obj = r.value(0)
    if r.pos != len(data):
        raise DecodeError(f"{len(data) - r.pos} bytes after the object")
    return obj


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.pos, self.items = data, 0, 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise DecodeError(f"needs {n} bytes at {self.pos}, {len(self.data) - self.pos} left")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def count(self, n: int) -> int:
        self.items += n
        if self.items > MAX_ITEMS or n > len(self.data) - self.pos:
            raise DecodeError(f"a container of {n} items cannot fit in the bytes left")
        return n

    def value(self, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise DecodeError("nested too deep")
        b = self.take(1)[0]
        if b <= 0x7F:
            return b
        if b >= 0xE0:
            return b - 0x100
        if 0x80 <= b <= 0x8F:
            return self.map(b & 0x0F, depth)
        if 0x90 <= b <= 0x9F:
            return self.array(b & 0x0F, depth)
        if 0xA0 <= b <= 0xBF:
            return self.take(b & 0x1F).decode("utf-8", "replace")
        simple = {0xC0: None, 0xC2: False, 0xC3: True}
        if b in simple:
            return simple[b]
        sized = {0xC4: ">B", 0xC5: ">H", 0xC6: ">I"}  # bin
        if b in sized:
            return self.take(self.unpack(sized[b]))
        strs = {0xD9: ">B", 0xDA: ">H", 0xDB: ">I"}
        if b in strs:
            return self.take(self.unpack(strs[b])).decode("utf-8", "replace")
        nums = {0xCA: ">f", 0xCB: ">d", 0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q",
                0xD0: ">b", 0xD1: ">h", 0xD2: ">i", 0xD3: ">q"}  # fmt: skip
        if b in nums:
            return self.unpack(nums[b])
        if b in (0xDC, 0xDD):
            return self.array(self.unpack(">H" if b == 0xDC else ">I"), depth)
        if b in (0xDE, 0xDF):
            return self.map(self.unpack(">H" if b == 0xDE else ">I"), depth)
        fixext = {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}
        if b in fixext:
            code = self.unpack(">b")
            return Ext(code, self.take(fixext[b]))
        exts = {0xC7: ">B", 0xC8: ">H", 0xC9: ">I"}
        if b in exts:
            n = self.unpack(exts[b])
            code = self.unpack(">b")
            return Ext(code, self.take(n))
        raise DecodeError(f"byte {b:#x} at {self.pos - 1} starts no MessagePack value")

    def array(self, n: int, depth: int) -> list:
        return [self.value(depth + 1) for _ in range(self.count(n))]

    def map(self, n: int, depth: int) -> dict:
        out = {}
        for _ in range(self.count(n)):
            key = self.value(depth + 1)
            out[key if isinstance(key, (str, int, bytes)) else repr(key)] = self.value(depth + 1)
        return out
