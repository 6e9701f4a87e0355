"""The pickle VM of the restricted unpickler (see :mod:`ckptview.unpickle`): its byte source,
opcode handlers and the loop running them.
"""

from __future__ import annotations

import codecs as _codecs
import struct
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ._pickle_globals import (
    ALLOWED,
    ArrayRef,
    DtypeRef,
    LazyBytes,
    Record,
    RestrictedUnpicklingError,
    TensorRef,
    _as_np_dtype,
    _ints,
    _ordered_dict,
    _RecordClass,
    resolve_global,
)
from .io import HEAD_BLOCK, Blob, TruncatedError

LAZY_MIN = 4096  # payloads at least this long stay on disk as LazyBytes (Blob sources)
CHUNK = 1 << 16
MAX_LINE = 1 << 26  # protocol-0 text lines (a py2 STRING may hold an array)
#: objects the VM may hold at once (stack + memo entries): a pickle of millions of DUP/PUT
#: opcodes must not build an enormous memo
MAX_OBJECTS = 10_000_000


# -- the VM ------------------------------------------------------------------------------------
class _Source:
    """A bounded, buffered reader over bytes or a Blob; ``pos`` is an absolute file offset."""

    def __init__(self, source: bytes | Blob, offset: int = 0, end: int | None = None):
        if isinstance(source, (bytes, bytearray, memoryview)):
            self.data: bytes | None = bytes(source)
            self.blob: Blob | None = None
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

    def _fill(self, n: int) -> None:
        if self.pos + n > self.end:
            raise TruncatedError(
                f"pickle needs {n} bytes at {self.pos} but only {self.left} are left"
            )

    def read(self, n: int) -> bytes:
        self._fill(n)
        if self.data is not None:
            out = self.data[self.pos : self.pos + n]
        else:
            rel = self.pos - self._buf_at
            if rel < 0 or rel + n > len(self._buf):
                self._load(n)
                rel = self.pos - self._buf_at
            out = self._buf[rel : rel + n]
        self.pos += n
        return out

    def _load(self, n: int) -> None:
        """Make the buffer hold ``[pos, pos + n)``, reading only bytes not held already.

        The Blob's cached first block serves what lies in it; bytes past it are read ahead
        (``CHUNK``, within ``end``), keeping the held bytes the new window overlaps."""
        pos, first = self.pos, min(HEAD_BLOCK, self.blob.size)
        if pos + n <= first:
            self._buf, self._buf_at = self.blob.head(), 0
            return
        held = b""
        for buf, at in ((self.blob.head() if pos < first else b"", 0), (self._buf, self._buf_at)):
            if at <= pos < at + len(buf):
                held = buf[pos - at :]
                break
        start = pos + len(held)
        stop = min(self.end, max(pos + n, start + CHUNK))
        self._buf = held + self.blob.read(start, stop - start) if stop > start else held
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
        if offset >= 0 and offset + n <= min(HEAD_BLOCK, self.blob.size):
            return self.blob.head()[offset : offset + n]  # the Blob's cached first block
        return None

    def skip(self, n: int) -> int:
        """Advance over ``n`` bytes without reading them; returns their offset."""
        self._fill(n)
        at = self.pos
        self.pos += n
        return at

    def readline(self) -> bytes:
        out = bytearray()
        while True:
            if self.left <= 0:
                raise TruncatedError("pickle ends inside a text line")
            n = min(self.left, 256)
            chunk = self.read(n)
            i = chunk.find(b"\n")
            if i >= 0:
                out += chunk[: i + 1]
                self.pos -= n - i - 1
                return bytes(out)
            out += chunk
            if len(out) > MAX_LINE:
                raise RestrictedUnpicklingError("protocol-0 text line too long")


class _Mark:
    pass


_MARK = _Mark()
_PyUnpicklingError = __import__("pickle").UnpicklingError


class Unpickler:
    """The restricted pickle VM. ``load()`` returns one object; ``pos`` is then after STOP."""

    def __init__(
        self,
        source: bytes | Blob,
        *,
        offset: int = 0,
        end: int | None = None,
        persistent_load: Callable[[Any], Any] | None = None,
        allow: Mapping[str, Any] | Iterable[str] | None = None,
        encoding: str = "ASCII",
        lazy_min: int | None = LAZY_MIN,
        max_objects: int | None = None,
    ):
        self.src = _Source(source, offset, end)
        self.max_objects = MAX_OBJECTS if max_objects is None else max_objects
        self.persistent_load = persistent_load
        self.allow = allow
        self.encoding = encoding
        self.lazy_min = lazy_min if isinstance(source, Blob) else None
        self.refused: list[str] = []
        self._globals: dict[tuple[str, str], Any] = {}  # resolved GLOBALs, by name

    @property
    def pos(self) -> int:
        return self.src.pos

    def _find_class(self, module: str, name: str) -> Any:
        key = (module, name)
        found = self._globals.get(key)
        if found is None:
            found = self._globals[key] = resolve_global(module, name, self.allow)
        return found

    def _persistent(self, pid: Any) -> Any:
        if self.persistent_load is None:
            raise RestrictedUnpicklingError("persistent id in a pickle without persistent_load")
        return self.persistent_load(pid)

    def _payload(self, n: int, text: bool = False) -> Any:
        if n < 0:
            raise _PyUnpicklingError("negative length")
        if self.lazy_min is not None and n >= self.lazy_min:
            at = self.src.skip(n)
            return LazyBytes(at, n, self.src.blob, text=text)
        data = self.src.read(n)
        return data.decode("utf-8", "surrogatepass") if text else data

    def _pop_mark(self) -> list:
        stack = self.stack
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] is _MARK:
                items = stack[i + 1 :]
                del stack[i:]
                return items
        raise _PyUnpicklingError("MARK not found")

    def _pop(self) -> Any:
        if not self.stack:
            raise _PyUnpicklingError("unpickling stack underflow")
        v = self.stack.pop()
        if v is _MARK:
            raise _PyUnpicklingError("unexpected MARK")
        return v

    def _top(self) -> Any:
        if not self.stack or self.stack[-1] is _MARK:
            raise _PyUnpicklingError("unpickling stack underflow")
        return self.stack[-1]

    def _decode_string(self, data: Any) -> Any:
        if isinstance(data, LazyBytes) or self.encoding == "bytes":
            return data
        return data.decode(self.encoding, "strict")

    def load(self) -> Any:
        self.stack: list = []
        self.memo: dict[int, Any] = {}
        src = self.src
        u = struct.unpack
        stack, memo, cap = self.stack, self.memo, self.max_objects
        while True:
            buf, base, limit = src.window()
            pos = src.pos - base
            if 0 <= pos < limit:  # the fast loop over the bytes held
                try:
                    pos, outcome, value = _run(self, buf, pos, limit)
                except IndexError:
                    raise _PyUnpicklingError("unpickling stack underflow") from None
                except KeyError as e:
                    raise _PyUnpicklingError(f"memo key {e.args[0]!r} missing") from None
                src.pos = base + pos
                if outcome == _STOPPED:
                    return value
                if len(stack) + len(memo) > cap:  # at most _BUDGET objects past the cap
                    raise _PyUnpicklingError(
                        f"pickle builds more than {cap} objects (stack + memo) at {src.pos}"
                    )
                if outcome == _SPENT:
                    continue
            # one opcode through the handler table: it reads (and refills the buffer) as it
            # needs, keeps large payloads lazy, and does the rare and text opcodes
            op = src.read(1)
            handler = _DISPATCH.get(op)
            if handler is None:
                raise _PyUnpicklingError(f"unsupported pickle opcode {op!r} at {src.pos - 1}")
            if handler is _stop:
                return self._pop()
            handler(self, src, u)
            if len(stack) + len(memo) > cap:
                raise _PyUnpicklingError(
                    f"pickle builds more than {cap} objects (stack + memo) at {src.pos}"
                )


def _stop(self, src, u):  # pragma: no cover - handled in load
    pass


def _apply(self, func: Any, args: Any, kwargs: dict | None = None) -> Any:
    if not callable(func):
        raise RestrictedUnpicklingError(f"REDUCE of a non-callable {type(func).__name__}")
    if not isinstance(args, tuple):
        raise _PyUnpicklingError("REDUCE arguments are not a tuple")
    try:
        return func(*args, **kwargs) if kwargs else func(*args)
    except RestrictedUnpicklingError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
        raise _PyUnpicklingError(f"bad arguments for {getattr(func, '__name__', func)}: {e}") from e


def _build(self, obj: Any, state: Any) -> None:
    if isinstance(obj, ArrayRef):
        _build_array(obj, state)
    elif isinstance(obj, DtypeRef):
        if isinstance(state, tuple) and len(state) >= 8:
            obj.byteorder = state[1] if isinstance(state[1], str) else "="
            obj.names, obj.fields = state[3], state[4]
    elif isinstance(obj, Record):
        obj.state = state
    elif isinstance(obj, TensorRef):
        obj.metadata = state
    elif isinstance(obj, (dict, list, set)):
        pass  # e.g. an OrderedDict's _metadata attribute: not data
    else:
        raise RestrictedUnpicklingError(f"BUILD on a {type(obj).__name__} refused")


def _build_array(arr: ArrayRef, state: Any) -> None:
    if not isinstance(state, tuple) or len(state) not in (4, 5):
        raise _PyUnpicklingError("numpy array state is not a tuple of 4 or 5")
    if len(state) == 5:
        state = state[1:]
    shape, dtype, fortran, data = state
    arr.shape = _ints(shape, "shape")
    arr.dtype = _as_np_dtype(dtype)
    arr.fortran_order = bool(fortran)
    if isinstance(data, bytearray):
        data = bytes(data)
    if arr.dtype.hasobject:
        if not isinstance(data, list):
            raise _PyUnpicklingError("object array without a list of items")
    elif not isinstance(data, (bytes, str, LazyBytes)):
        raise _PyUnpicklingError(f"numpy array data is a {type(data).__name__}")
    arr.data = data


def _op(code: bytes):
    def deco(fn):
        _DISPATCH[code] = fn
        return fn

    return deco


_DISPATCH: dict[bytes, Callable] = {b".": _stop}


@_op(b"\x80")
def _proto(self, src, u):
    v = src.read(1)[0]
    if v > 5:
        raise _PyUnpicklingError(f"unsupported pickle protocol {v}")


@_op(b"\x95")
def _frame(self, src, u):
    (n,) = u("<Q", src.read(8))
    if n > src.left:
        raise TruncatedError(f"pickle frame of {n} bytes but {src.left} left")


_DISPATCH[b"\x98"] = lambda self, src, u: None  # READONLY_BUFFER


@_op(b"\x97")
def _next_buffer(self, src, u):
    raise RestrictedUnpicklingError("out-of-band pickle buffers are not supported")


for _code in (b"\x82", b"\x83", b"\x84"):
    _DISPATCH[_code] = lambda self, src, u: (_ for _ in ()).throw(
        RestrictedUnpicklingError("pickle extension registry (EXT*) refused")
    )


@_op(b"(")
def _mark(self, src, u):
    self.stack.append(_MARK)


@_op(b"0")
def _popop(self, src, u):
    if self.stack:
        self.stack.pop()
    else:
        raise _PyUnpicklingError("POP on an empty stack")


@_op(b"1")
def _pop_mark(self, src, u):
    self._pop_mark()


@_op(b"2")
def _dup(self, src, u):
    self.stack.append(self._top())


@_op(b"N")
def _none(self, src, u):
    self.stack.append(None)


_DISPATCH[b"\x88"] = lambda self, src, u: self.stack.append(True)
_DISPATCH[b"\x89"] = lambda self, src, u: self.stack.append(False)


@_op(b"I")
def _int(self, src, u):
    line = src.readline()[:-1]
    if line == b"00":
        v: Any = False
    elif line == b"01":
        v = True
    else:
        v = int(line)
    self.stack.append(v)


_DISPATCH[b"J"] = lambda self, src, u: self.stack.append(u("<i", src.read(4))[0])
_DISPATCH[b"K"] = lambda self, src, u: self.stack.append(src.read(1)[0])
_DISPATCH[b"M"] = lambda self, src, u: self.stack.append(u("<H", src.read(2))[0])


@_op(b"L")
def _long(self, src, u):
    line = src.readline()[:-1]
    if line.endswith(b"L"):
        line = line[:-1]
    self.stack.append(int(line))


@_op(b"\x8a")
def _long1(self, src, u):
    n = src.read(1)[0]
    self.stack.append(int.from_bytes(src.read(n), "little", signed=True))


@_op(b"\x8b")
def _long4(self, src, u):
    (n,) = u("<i", src.read(4))
    if n < 0 or n > min(src.left, 1 << 16):
        raise _PyUnpicklingError(f"LONG4 of {n} bytes refused")
    self.stack.append(int.from_bytes(src.read(n), "little", signed=True))


_DISPATCH[b"F"] = lambda self, src, u: self.stack.append(float(src.readline()[:-1]))
_DISPATCH[b"G"] = lambda self, src, u: self.stack.append(u(">d", src.read(8))[0])


@_op(b"S")
def _string(self, src, u):
    data = src.readline()[:-1]
    if len(data) >= 2 and data[0] == data[-1] and data[:1] in (b'"', b"'"):
        data = data[1:-1]
    else:
        raise _PyUnpicklingError("the STRING opcode argument must be quoted")
    self.stack.append(self._decode_string(_codecs.escape_decode(data)[0]))


@_op(b"T")
def _binstring(self, src, u):
    (n,) = u("<i", src.read(4))
    self.stack.append(self._decode_string(self._payload(n)))


_DISPATCH[b"U"] = lambda self, src, u: self.stack.append(
    self._decode_string(src.read(src.read(1)[0]))
)
_DISPATCH[b"B"] = lambda self, src, u: self.stack.append(self._payload(u("<I", src.read(4))[0]))
_DISPATCH[b"C"] = lambda self, src, u: self.stack.append(src.read(src.read(1)[0]))
_DISPATCH[b"\x8e"] = lambda self, src, u: self.stack.append(self._payload(u("<Q", src.read(8))[0]))


@_op(b"\x96")
def _bytearray8(self, src, u):
    (n,) = u("<Q", src.read(8))
    data = self._payload(n)
    self.stack.append(data if isinstance(data, LazyBytes) else bytearray(data))


@_op(b"V")
def _unicode(self, src, u):
    self.stack.append(src.readline()[:-1].decode("raw-unicode-escape"))


_DISPATCH[b"X"] = lambda self, src, u: self.stack.append(
    self._payload(u("<I", src.read(4))[0], text=True)
)
_DISPATCH[b"\x8d"] = lambda self, src, u: self.stack.append(
    self._payload(u("<Q", src.read(8))[0], text=True)
)
_DISPATCH[b"\x8c"] = lambda self, src, u: self.stack.append(
    src.read(src.read(1)[0]).decode("utf-8", "surrogatepass")
)


@_op(b")")
def _empty_tuple(self, src, u):
    self.stack.append(())


@_op(b"t")
def _tuple(self, src, u):
    self.stack.append(tuple(self._pop_mark()))


def _tuple_n(n: int):
    def handler(self, src, u):
        if len(self.stack) < n or any(x is _MARK for x in self.stack[-n:]):
            raise _PyUnpicklingError("unpickling stack underflow")
        items = tuple(self.stack[-n:])
        del self.stack[-n:]
        self.stack.append(items)

    return handler


_DISPATCH[b"\x85"] = _tuple_n(1)
_DISPATCH[b"\x86"] = _tuple_n(2)
_DISPATCH[b"\x87"] = _tuple_n(3)
_DISPATCH[b"]"] = lambda self, src, u: self.stack.append([])
_DISPATCH[b"}"] = lambda self, src, u: self.stack.append({})
_DISPATCH[b"\x8f"] = lambda self, src, u: self.stack.append(set())
_DISPATCH[b"l"] = lambda self, src, u: self.stack.append(self._pop_mark())


@_op(b"\x91")
def _frozenset(self, src, u):
    self.stack.append(frozenset(self._pop_mark()))


@_op(b"d")
def _dict(self, src, u):
    items = self._pop_mark()
    if len(items) % 2:
        raise _PyUnpicklingError("odd number of items for DICT")
    self.stack.append({items[i]: items[i + 1] for i in range(0, len(items), 2)})


def _container(self, kind: type) -> Any:
    obj = self._top()
    if not isinstance(obj, kind):
        raise _PyUnpicklingError(f"expected a {kind.__name__}, got {type(obj).__name__}")
    return obj


@_op(b"a")
def _append(self, src, u):
    value = self._pop()
    _container(self, list).append(value)


@_op(b"e")
def _appends(self, src, u):
    items = self._pop_mark()
    _container(self, list).extend(items)


@_op(b"s")
def _setitem(self, src, u):
    value = self._pop()
    key = self._pop()
    _container(self, dict)[key] = value


@_op(b"u")
def _setitems(self, src, u):
    items = self._pop_mark()
    if len(items) % 2:
        raise _PyUnpicklingError("odd number of items for SETITEMS")
    d = _container(self, dict)
    for i in range(0, len(items), 2):
        d[items[i]] = items[i + 1]


@_op(b"\x90")
def _additems(self, src, u):
    items = self._pop_mark()
    _container(self, set).update(items)


@_op(b"c")
def _global(self, src, u):
    module = src.readline()[:-1].decode("utf-8")
    name = src.readline()[:-1].decode("utf-8")
    self.stack.append(self._find_class(module, name))


@_op(b"\x93")
def _stack_global(self, src, u):
    name = self._pop()
    module = self._pop()
    if not isinstance(name, str) or not isinstance(module, str):
        raise _PyUnpicklingError("STACK_GLOBAL requires str")
    self.stack.append(self._find_class(module, name))


@_op(b"R")
def _reduce(self, src, u):
    args = self._pop()
    func = self._pop()
    self.stack.append(_apply(self, func, args))


@_op(b"\x81")
def _newobj(self, src, u):
    args = self._pop()
    cls = self._pop()
    self.stack.append(_new(cls, args, {}))


@_op(b"\x92")
def _newobj_ex(self, src, u):
    kwargs = self._pop()
    args = self._pop()
    cls = self._pop()
    self.stack.append(_new(cls, args, kwargs))


def _new(cls: Any, args: Any, kwargs: Any) -> Any:
    if isinstance(cls, _RecordClass):
        return Record(cls.qualname, tuple(args), dict(kwargs or {}))
    if cls is _ordered_dict or cls is ALLOWED["collections.defaultdict"]:
        return {}
    empty = {"tuple": (), "list": [], "dict": {}, "set": set(), "frozenset": frozenset()}
    for builtin, value in empty.items():
        if cls is ALLOWED[f"builtins.{builtin}"]:
            return cls(*args) if args else value
    raise RestrictedUnpicklingError(f"NEWOBJ of {getattr(cls, 'qualname', cls)!r} refused")


@_op(b"i")
def _inst(self, src, u):
    module = src.readline()[:-1].decode("utf-8")
    name = src.readline()[:-1].decode("utf-8")
    args = tuple(self._pop_mark())
    cls = self._find_class(module, name)
    if isinstance(cls, _RecordClass):
        self.stack.append(Record(cls.qualname, args))
    else:
        self.stack.append(_apply(self, cls, args))


@_op(b"o")
def _obj(self, src, u):
    items = self._pop_mark()
    if not items:
        raise _PyUnpicklingError("OBJ without a class")
    cls, args = items[0], tuple(items[1:])
    if isinstance(cls, _RecordClass):
        self.stack.append(Record(cls.qualname, args))
    else:
        self.stack.append(_apply(self, cls, args))


@_op(b"b")
def _buildop(self, src, u):
    state = self._pop()
    _build(self, self._top(), state)


@_op(b"P")
def _persid(self, src, u):
    pid = src.readline()[:-1].decode("ascii")
    self.stack.append(self._persistent(pid))


@_op(b"Q")
def _binpersid(self, src, u):
    self.stack.append(self._persistent(self._pop()))


def _get(self, idx: int):
    if idx not in self.memo:
        raise _PyUnpicklingError(f"memo key {idx} missing")
    self.stack.append(self.memo[idx])


def _put(self, idx: int):
    if idx < 0:
        raise _PyUnpicklingError("negative memo key")
    self.memo[idx] = self._top()


_DISPATCH[b"g"] = lambda self, src, u: _get(self, int(src.readline()[:-1]))
_DISPATCH[b"h"] = lambda self, src, u: _get(self, src.read(1)[0])
_DISPATCH[b"j"] = lambda self, src, u: _get(self, u("<I", src.read(4))[0])
_DISPATCH[b"p"] = lambda self, src, u: _put(self, int(src.readline()[:-1]))
_DISPATCH[b"q"] = lambda self, src, u: _put(self, src.read(1)[0])
_DISPATCH[b"r"] = lambda self, src, u: _put(self, u("<I", src.read(4))[0])
_DISPATCH[b"\x94"] = lambda self, src, u: _put(self, len(self.memo))


# -- the fast loop -----------------------------------------------------------------------------
_STOPPED, _SPENT, _SLOW = 0, 1, 2  # how a run ends: STOP, its opcode budget, a slow opcode
_BUDGET = range(1024)  # opcodes per run: the object cap is checked between runs
_U4 = struct.Struct("<I").unpack_from
_I4 = struct.Struct("<i").unpack_from
_F8 = struct.Struct(">d").unpack_from
_NO_LAZY = 1 << 62


def _run(self: Unpickler, buf: bytes, pos: int, limit: int) -> tuple[int, int, Any]:
    """Opcodes of ``buf[pos:limit]`` (bytes held in memory), dispatched inline, most frequent
    first. A run ends at STOP, after ``_BUDGET`` opcodes, or before an opcode it leaves to the
    handler table (``_SLOW``): one whose arguments are not all held, a payload to keep lazy, a
    rare or protocol-0 text opcode. Returns ``(pos, outcome, value)``; the checks and errors
    are the handlers' (an empty stack raises IndexError, a missing memo key KeyError: the
    caller words them)."""
    stack = self.stack
    memo = self.memo
    push = stack.append
    pop = stack.pop
    mark = _MARK
    lazy = _NO_LAZY if self.lazy_min is None else self.lazy_min
    try:
        for _ in _BUDGET:
            op = buf[pos]
            if op >= 0x60:  # two chains, each most frequent first: fewer compares
                if op == 0x68:  # BINGET
                    if pos + 2 > limit:
                        break
                    push(memo[buf[pos + 1]])
                    pos += 2
                elif op == 0x72:  # LONG_BINPUT
                    if pos + 5 > limit:
                        break
                    v = stack[-1]
                    if v is mark:
                        raise _PyUnpicklingError("unpickling stack underflow")
                    memo[_U4(buf, pos + 1)[0]] = v
                    pos += 5
                elif op == 0x71:  # BINPUT
                    if pos + 2 > limit:
                        break
                    v = stack[-1]
                    if v is mark:
                        raise _PyUnpicklingError("unpickling stack underflow")
                    memo[buf[pos + 1]] = v
                    pos += 2
                elif op == 0x74:  # TUPLE
                    k = len(stack) - 1
                    while k >= 0 and stack[k] is not mark:
                        k -= 1
                    if k < 0:
                        raise _PyUnpicklingError("MARK not found")
                    items = tuple(stack[k + 1 :])
                    del stack[k:]
                    push(items)
                    pos += 1
                elif op == 0x85:  # TUPLE1
                    v = stack[-1]
                    if v is mark:
                        raise _PyUnpicklingError("unpickling stack underflow")
                    stack[-1] = (v,)
                    pos += 1
                elif op == 0x89:  # NEWFALSE
                    push(False)
                    pos += 1
                elif op == 0x94:  # MEMOIZE
                    v = stack[-1]
                    if v is mark:
                        raise _PyUnpicklingError("unpickling stack underflow")
                    memo[len(memo)] = v
                    pos += 1
                elif op == 0x8C:  # SHORT_BINUNICODE
                    if pos + 2 > limit or pos + 2 + buf[pos + 1] > limit:
                        break
                    n = buf[pos + 1]
                    push(buf[pos + 2 : pos + 2 + n].decode("utf-8", "surrogatepass"))
                    pos += 2 + n
                elif op == 0x88:  # NEWTRUE
                    push(True)
                    pos += 1
                elif op == 0x86:  # TUPLE2
                    a, b = stack[-2], stack[-1]
                    if a is mark or b is mark:
                        raise _PyUnpicklingError("unpickling stack underflow")
                    del stack[-1]
                    stack[-1] = (a, b)
                    pos += 1
                elif op == 0x87:  # TUPLE3
                    a, b, c = stack[-3], stack[-2], stack[-1]
                    if a is mark or b is mark or c is mark:
                        raise _PyUnpicklingError("unpickling stack underflow")
                    del stack[-2:]
                    stack[-1] = (a, b, c)
                    pos += 1
                elif op == 0x7D:  # EMPTY_DICT
                    push({})
                    pos += 1
                elif op == 0x75:  # SETITEMS
                    items = self._pop_mark()
                    if len(items) % 2:
                        raise _PyUnpicklingError("odd number of items for SETITEMS")
                    d = _container(self, dict)
                    for i in range(0, len(items), 2):
                        d[items[i]] = items[i + 1]
                    pos += 1
                elif op == 0x65:  # APPENDS
                    items = self._pop_mark()
                    _container(self, list).extend(items)
                    pos += 1
                elif op == 0x73:  # SETITEM
                    value = self._pop()
                    key = self._pop()
                    _container(self, dict)[key] = value
                    pos += 1
                elif op == 0x61:  # APPEND
                    value = self._pop()
                    _container(self, list).append(value)
                    pos += 1
                elif op == 0x8A:  # LONG1
                    if pos + 2 > limit or pos + 2 + buf[pos + 1] > limit:
                        break
                    n = buf[pos + 1]
                    push(int.from_bytes(buf[pos + 2 : pos + 2 + n], "little", signed=True))
                    pos += 2 + n
                elif op == 0x6A:  # LONG_BINGET
                    if pos + 5 > limit:
                        break
                    push(memo[_U4(buf, pos + 1)[0]])
                    pos += 5
                elif op == 0x93:  # STACK_GLOBAL
                    _stack_global(self, None, None)
                    pos += 1
                elif op == 0x63:  # GLOBAL
                    a = buf.find(b"\n", pos + 1, limit)
                    b = buf.find(b"\n", a + 1, limit) if a >= 0 else -1
                    if b < 0:
                        break
                    module = buf[pos + 1 : a].decode("utf-8")
                    push(self._find_class(module, buf[a + 1 : b].decode("utf-8")))
                    pos = b + 1
                elif op == 0x81:  # NEWOBJ
                    _newobj(self, None, None)
                    pos += 1
                elif op == 0x62:  # BUILD
                    state = self._pop()
                    _build(self, self._top(), state)
                    pos += 1
                else:
                    break
            else:
                if op == 0x58:  # BINUNICODE
                    if pos + 5 > limit:
                        break
                    n = _U4(buf, pos + 1)[0]
                    if n >= lazy or pos + 5 + n > limit:
                        break
                    push(buf[pos + 5 : pos + 5 + n].decode("utf-8", "surrogatepass"))
                    pos += 5 + n
                elif op == 0x28:  # MARK
                    push(mark)
                    pos += 1
                elif op == 0x4D:  # BININT2
                    if pos + 3 > limit:
                        break
                    push(buf[pos + 1] | buf[pos + 2] << 8)
                    pos += 3
                elif op == 0x4B:  # BININT1
                    if pos + 2 > limit:
                        break
                    push(buf[pos + 1])
                    pos += 2
                elif op == 0x52:  # REDUCE
                    args = pop()
                    func = pop()
                    if args is mark or func is mark:
                        raise _PyUnpicklingError("unexpected MARK")
                    push(_apply(self, func, args))
                    pos += 1
                elif op == 0x51:  # BINPERSID
                    pid = pop()
                    if pid is mark:
                        raise _PyUnpicklingError("unexpected MARK")
                    push(self._persistent(pid))
                    pos += 1
                elif op == 0x29:  # EMPTY_TUPLE
                    push(())
                    pos += 1
                elif op == 0x4A:  # BININT
                    if pos + 5 > limit:
                        break
                    push(_I4(buf, pos + 1)[0])
                    pos += 5
                elif op == 0x4E:  # NONE
                    push(None)
                    pos += 1
                elif op == 0x5D:  # EMPTY_LIST
                    push([])
                    pos += 1
                elif op == 0x47:  # BINFLOAT
                    if pos + 9 > limit:
                        break
                    push(_F8(buf, pos + 1)[0])
                    pos += 9
                elif op == 0x32:  # DUP
                    push(self._top())
                    pos += 1
                elif op == 0x43:  # SHORT_BINBYTES
                    if pos + 2 > limit or pos + 2 + buf[pos + 1] > limit:
                        break
                    n = buf[pos + 1]
                    push(buf[pos + 2 : pos + 2 + n])
                    pos += 2 + n
                elif op == 0x42:  # BINBYTES
                    if pos + 5 > limit:
                        break
                    n = _U4(buf, pos + 1)[0]
                    if n >= lazy or pos + 5 + n > limit:
                        break
                    push(buf[pos + 5 : pos + 5 + n])
                    pos += 5 + n
                elif op == 0x55:  # SHORT_BINSTRING
                    if pos + 2 > limit or pos + 2 + buf[pos + 1] > limit:
                        break
                    n = buf[pos + 1]
                    push(self._decode_string(buf[pos + 2 : pos + 2 + n]))
                    pos += 2 + n
                elif op == 0x2E:  # STOP
                    return pos + 1, _STOPPED, self._pop()
                else:
                    break
        else:
            return pos, _SPENT, None
    except IndexError:
        if pos < limit:  # a stack underflow
            raise
    return pos, _SLOW, None
