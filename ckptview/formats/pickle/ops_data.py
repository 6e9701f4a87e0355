"""Opcode handlers for plain data: framing, constants, numbers, strings, bytes and the memo.

See :mod:`.machine` for the handler convention. Every length is checked against the bytes left
before anything is allocated or read; payloads from ``lazy_min`` bytes stay on disk.
"""

from __future__ import annotations

import codecs
import struct

from ...io import TruncatedError
from .machine import MARK, Handler, Machine, Short, UnpicklingError, registrar
from .standins import LazyBytes, RestrictedUnpicklingError

DATA_OPS: dict[int, Handler] = {}
op = registrar(DATA_OPS)

_U4 = struct.Struct("<I").unpack_from
_I4 = struct.Struct("<i").unpack_from
_U8 = struct.Struct("<Q").unpack_from
_F8 = struct.Struct(">d").unpack_from


def _need(pos: int, n: int, limit: int) -> None:
    if pos + n > limit:
        raise Short(n)


# -- framing -------------------------------------------------------------------------------
@op(b"\x80")
def _proto(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    _need(pos, 2, limit)
    if buf[pos + 1] > 5:
        raise UnpicklingError(f"unsupported pickle protocol {buf[pos + 1]}")
    return pos + 2


@op(b"\x95")
def _frame(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    _need(pos, 9, limit)
    n = _U8(buf, pos + 1)[0]
    left = vm.src.end - vm.base - pos - 9
    if n > left:
        raise TruncatedError(f"pickle frame of {n} bytes but {left} left")
    return pos + 9


@op(b"\x98")
def _readonly_buffer(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    return pos + 1


@op(b"\x97")
def _next_buffer(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    raise RestrictedUnpicklingError("out-of-band pickle buffers are not supported")


@op(b"\x82")
@op(b"\x83")
@op(b"\x84")
def _ext(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    raise RestrictedUnpicklingError("pickle extension registry (EXT*) refused")


# -- the stack -----------------------------------------------------------------------------
@op(b"(")
def _mark(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    vm.stack.append(MARK)
    return pos + 1


@op(b"0")
def _pop(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    if not vm.stack:
        raise UnpicklingError("POP on an empty stack")
    vm.stack.pop()
    return pos + 1


@op(b"1")
def _pop_mark(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    vm.pop_mark()
    return pos + 1


@op(b"2")
def _dup(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    vm.stack.append(vm.top())
    return pos + 1


# -- constants and numbers -----------------------------------------------------------------
@op(b"N")
def _none(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    vm.stack.append(None)
    return pos + 1


@op(b"\x88")
def _newtrue(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    vm.stack.append(True)
    return pos + 1


@op(b"\x89")
def _newfalse(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    vm.stack.append(False)
    return pos + 1


@op(b"I")
def _int(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    i = vm.line(buf, pos, pos + 1, limit)
    text = buf[pos + 1 : i]
    vm.stack.append(False if text == b"00" else True if text == b"01" else int(text))
    return i + 1


@op(b"J")
def _binint(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    if pos + 5 > limit:
        raise Short(5)
    vm.stack.append(_I4(buf, pos + 1)[0])
    return pos + 5


@op(b"K")
def _binint1(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    if pos + 2 > limit:
        raise Short(2)
    vm.stack.append(buf[pos + 1])
    return pos + 2


@op(b"M")
def _binint2(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    if pos + 3 > limit:
        raise Short(3)
    vm.stack.append(buf[pos + 1] | buf[pos + 2] << 8)
    return pos + 3


@op(b"L")
def _long(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    i = vm.line(buf, pos, pos + 1, limit)
    text = buf[pos + 1 : i]
    vm.stack.append(int(text[:-1] if text.endswith(b"L") else text))
    return i + 1


@op(b"\x8a")
def _long1(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    if pos + 2 > limit:
        raise Short(2)
    end = pos + 2 + buf[pos + 1]
    if end > limit:
        raise Short(end - pos)
    vm.stack.append(int.from_bytes(buf[pos + 2 : end], "little", signed=True))
    return end


@op(b"\x8b")
def _long4(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    _need(pos, 5, limit)
    n = _I4(buf, pos + 1)[0]
    if n < 0 or n > min(vm.src.end - vm.base - pos - 5, 1 << 16):
        raise UnpicklingError(f"LONG4 of {n} bytes refused")
    _need(pos, 5 + n, limit)
    vm.stack.append(int.from_bytes(buf[pos + 5 : pos + 5 + n], "little", signed=True))
    return pos + 5 + n


@op(b"F")
def _float(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    i = vm.line(buf, pos, pos + 1, limit)
    vm.stack.append(float(buf[pos + 1 : i]))
    return i + 1


@op(b"G")
def _binfloat(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    if pos + 9 > limit:
        raise Short(9)
    vm.stack.append(_F8(buf, pos + 1)[0])
    return pos + 9


# -- strings and bytes ---------------------------------------------------------------------
@op(b"S")
def _string(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    i = vm.line(buf, pos, pos + 1, limit)
    data = buf[pos + 1 : i]
    if len(data) >= 2 and data[0] == data[-1] and data[:1] in (b'"', b"'"):
        data = data[1:-1]
    else:
        raise UnpicklingError("the STRING opcode argument must be quoted")
    vm.stack.append(vm.decode_string(codecs.escape_decode(data)[0]))
    return i + 1


@op(b"T")
def _binstring(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    _need(pos, 5, limit)
    data, end = vm.payload(buf, pos, pos + 5, _I4(buf, pos + 1)[0], limit)
    vm.stack.append(vm.decode_string(data))
    return end


@op(b"U")
def _short_binstring(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    if pos + 2 > limit:
        raise Short(2)
    end = pos + 2 + buf[pos + 1]
    if end > limit:
        raise Short(end - pos)
    vm.stack.append(vm.decode_string(buf[pos + 2 : end]))
    return end


@op(b"B")
def _binbytes(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    if pos + 5 > limit:
        raise Short(5)
    n = _U4(buf, pos + 1)[0]
    end = pos + 5 + n
    if n >= vm.lazy_min or end > limit:
        data, end = vm.payload(buf, pos, pos + 5, n, limit)
        vm.stack.append(data)
    else:
        vm.stack.append(buf[pos + 5 : end])
    return end


@op(b"C")
def _short_binbytes(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    if pos + 2 > limit:
        raise Short(2)
    end = pos + 2 + buf[pos + 1]
    if end > limit:
        raise Short(end - pos)
    vm.stack.append(buf[pos + 2 : end])
    return end


@op(b"\x8e")
def _binbytes8(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    _need(pos, 9, limit)
    data, end = vm.payload(buf, pos, pos + 9, _U8(buf, pos + 1)[0], limit)
    vm.stack.append(data)
    return end


@op(b"\x96")
def _bytearray8(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    _need(pos, 9, limit)
    data, end = vm.payload(buf, pos, pos + 9, _U8(buf, pos + 1)[0], limit)
    vm.stack.append(data if isinstance(data, LazyBytes) else bytearray(data))
    return end


@op(b"V")
def _unicode(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    i = vm.line(buf, pos, pos + 1, limit)
    vm.stack.append(buf[pos + 1 : i].decode("raw-unicode-escape"))
    return i + 1


@op(b"X")
def _binunicode(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    if pos + 5 > limit:
        raise Short(5)
    n = _U4(buf, pos + 1)[0]
    end = pos + 5 + n
    if n >= vm.lazy_min or end > limit:
        text, end = vm.payload(buf, pos, pos + 5, n, limit, text=True)
        vm.stack.append(text)
    else:
        vm.stack.append(buf[pos + 5 : end].decode("utf-8", "surrogatepass"))
    return end


@op(b"\x8d")
def _binunicode8(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    _need(pos, 9, limit)
    text, end = vm.payload(buf, pos, pos + 9, _U8(buf, pos + 1)[0], limit, text=True)
    vm.stack.append(text)
    return end


@op(b"\x8c")
def _short_binunicode(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    if pos + 2 > limit:
        raise Short(2)
    end = pos + 2 + buf[pos + 1]
    if end > limit:
        raise Short(end - pos)
    vm.stack.append(buf[pos + 2 : end].decode("utf-8", "surrogatepass"))
    return end


# -- the memo (a missing key raises KeyError: the loop words it) -------------------------------
def _put(vm: Machine, idx: int) -> None:
    v = vm.stack[-1]  # IndexError on an empty stack: the loop words it
    if v is MARK:
        raise UnpicklingError("unpickling stack underflow")
    vm.memo[idx] = v


@op(b"g")
def _get(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    i = vm.line(buf, pos, pos + 1, limit)
    vm.stack.append(vm.memo[int(buf[pos + 1 : i])])
    return i + 1


@op(b"h")
def _binget(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    if pos + 2 > limit:
        raise Short(2)
    vm.stack.append(vm.memo[buf[pos + 1]])
    return pos + 2


@op(b"j")
def _long_binget(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    if pos + 5 > limit:
        raise Short(5)
    vm.stack.append(vm.memo[_U4(buf, pos + 1)[0]])
    return pos + 5


@op(b"p")
def _put_text(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    i = vm.line(buf, pos, pos + 1, limit)
    idx = int(buf[pos + 1 : i])
    if idx < 0:
        raise UnpicklingError("negative memo key")
    _put(vm, idx)
    return i + 1


@op(b"q")
def _binput(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    if pos + 2 > limit:
        raise Short(2)
    v = vm.stack[-1]
    if v is MARK:
        raise UnpicklingError("unpickling stack underflow")
    vm.memo[buf[pos + 1]] = v
    return pos + 2


@op(b"r")
def _long_binput(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    if pos + 5 > limit:
        raise Short(5)
    v = vm.stack[-1]
    if v is MARK:
        raise UnpicklingError("unpickling stack underflow")
    vm.memo[_U4(buf, pos + 1)[0]] = v
    return pos + 5


@op(b"\x94")
def _memoize(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    v = vm.stack[-1]
    if v is MARK:
        raise UnpicklingError("unpickling stack underflow")
    memo = vm.memo
    memo[len(memo)] = v
    return pos + 1
