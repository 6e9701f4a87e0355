"""Opcode handlers that build containers and objects: tuples, lists, dicts, sets, GLOBAL and
the calls (REDUCE, NEWOBJ, INST, OBJ, BUILD) -- only ever of allowlisted stand-ins -- and the
persistent ids. See :mod:`.machine` for the handler convention.
"""

from __future__ import annotations

from typing import Any

from .allowlist import ALLOWED
from .machine import MARK, STOPPED, Handler, Machine, UnpicklingError, registrar
from .standins import (
    ArrayRef,
    DtypeRef,
    LazyBytes,
    Record,
    RecordClass,
    RestrictedUnpicklingError,
    as_np_dtype,
    ints,
)
from .torch_globals import TensorRef

OBJECT_OPS: dict[int, Handler] = {}
op = registrar(OBJECT_OPS)


@op(b".")
def _stop(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    vm.result = vm.pop()
    raise STOPPED


# -- tuples --------------------------------------------------------------------------------
@op(b")")
def _empty_tuple(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    vm.stack.append(())
    return pos + 1


@op(b"t")
def _tuple(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    stack = vm.stack
    k = vm.mark()
    items = tuple(stack[k + 1 :])
    del stack[k:]
    stack.append(vm.nested(items, items, 56 + 8 * len(items)))
    return pos + 1


@op(b"\x85")
def _tuple1(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    stack = vm.stack
    a = stack[-1]  # IndexError on an empty stack: the loop words it
    if a is MARK:
        raise UnpicklingError("unpickling stack underflow")
    t = (a,)
    stack[-1] = vm.nested(t, t, 64)
    return pos + 1


@op(b"\x86")
def _tuple2(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    stack = vm.stack
    a, b = stack[-2:] if len(stack) >= 2 else (MARK, MARK)
    if a is MARK or b is MARK:
        raise UnpicklingError("unpickling stack underflow")
    del stack[-1]
    t = (a, b)
    stack[-1] = vm.nested(t, t, 72)
    return pos + 1


@op(b"\x87")
def _tuple3(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    stack = vm.stack
    a, b, c = stack[-3:] if len(stack) >= 3 else (MARK, MARK, MARK)
    if a is MARK or b is MARK or c is MARK:
        raise UnpicklingError("unpickling stack underflow")
    del stack[-2:]
    t = (a, b, c)
    stack[-1] = vm.nested(t, t, 80)
    return pos + 1


# -- lists, dicts, sets --------------------------------------------------------------------
@op(b"]")
def _empty_list(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    vm.charge(56)
    vm.stack.append([])
    return pos + 1


@op(b"}")
def _empty_dict(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    vm.charge(64)
    vm.stack.append({})
    return pos + 1


@op(b"\x8f")
def _empty_set(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    vm.charge(216)
    vm.stack.append(set())
    return pos + 1


@op(b"l")
def _list(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    items = vm.pop_mark()
    vm.stack.append(vm.nested(items, items, 56 + 8 * len(items)))
    return pos + 1


@op(b"\x91")
def _frozenset(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    items = vm.pop_mark()
    depth = vm.over(items)  # before the members hash
    vm.charge(216 + 40 * len(items))
    vm.stack.append(vm.register(frozenset(items), depth))
    return pos + 1


@op(b"d")
def _dict(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    items = vm.pop_mark()
    if len(items) % 2:
        raise UnpicklingError("odd number of items for DICT")
    depth = vm.over(items)  # before the keys hash
    vm.charge(64 + 20 * len(items))
    vm.stack.append(vm.register({items[i]: items[i + 1] for i in range(0, len(items), 2)}, depth))
    return pos + 1


@op(b"a")
def _append(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    value = vm.stack.pop()  # IndexError on an empty stack: the loop words it
    if value is MARK:
        raise UnpicklingError("unexpected MARK")
    lst = vm.container(list)
    vm.nested(lst, (value,), 8, vm.depth(lst))
    lst.append(value)
    return pos + 1


@op(b"e")
def _appends(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    items = vm.pop_mark()
    lst = vm.container(list)
    vm.nested(lst, items, 8 * len(items), vm.depth(lst))
    lst.extend(items)
    return pos + 1


@op(b"s")
def _setitem(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    stack = vm.stack
    value = stack.pop()
    key = stack.pop()
    if key is MARK or value is MARK:
        raise UnpicklingError("unexpected MARK")
    d = vm.container(dict)
    vm.nested(d, (key, value), 40, vm.depth(d))
    d[key] = value
    return pos + 1


@op(b"u")
def _setitems(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    items = vm.pop_mark()
    if len(items) % 2:
        raise UnpicklingError("odd number of items for SETITEMS")
    d = vm.container(dict)
    vm.nested(d, items, 20 * len(items), vm.depth(d))
    for i in range(0, len(items), 2):
        d[items[i]] = items[i + 1]
    return pos + 1


@op(b"\x90")
def _additems(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    items = vm.pop_mark()
    s = vm.container(set)
    vm.nested(s, items, 40 * len(items), vm.depth(s))
    s.update(items)
    return pos + 1


# -- globals and calls ---------------------------------------------------------------------
@op(b"c")
def _global(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    a = vm.line(buf, pos, pos + 1, limit)
    b = vm.line(buf, pos, a + 1, limit)
    module = buf[pos + 1 : a].decode("utf-8")
    vm.stack.append(vm.find_class(module, buf[a + 1 : b].decode("utf-8")))
    return b + 1


@op(b"\x93")
def _stack_global(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    name = vm.pop()
    module = vm.pop()
    if not isinstance(name, str) or not isinstance(module, str):
        raise UnpicklingError("STACK_GLOBAL requires str")
    vm.stack.append(vm.find_class(module, name))
    return pos + 1


def _apply(func: Any, args: Any, kwargs: dict | None = None) -> Any:
    if not callable(func):
        raise RestrictedUnpicklingError(f"REDUCE of a non-callable {type(func).__name__}")
    if not isinstance(args, tuple):
        raise UnpicklingError("REDUCE arguments are not a tuple")
    try:
        return func(*args, **kwargs) if kwargs else func(*args)
    except RestrictedUnpicklingError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
        raise UnpicklingError(f"bad arguments for {getattr(func, '__name__', func)}: {e}") from e


def _new(cls: Any, args: Any, kwargs: Any) -> Any:
    if isinstance(cls, RecordClass):
        return Record(cls.qualname, tuple(args), dict(kwargs or {}))
    if cls is ALLOWED["collections.OrderedDict"] or cls is ALLOWED["collections.defaultdict"]:
        return {}
    empty: dict[str, Any] = {
        "tuple": (),
        "list": [],
        "dict": {},
        "set": set(),
        "frozenset": frozenset(),
    }
    for builtin, value in empty.items():
        if cls is ALLOWED[f"builtins.{builtin}"]:
            return cls(*args) if args else value
    raise RestrictedUnpicklingError(f"NEWOBJ of {getattr(cls, 'qualname', cls)!r} refused")


def _instance(cls: Any, args: tuple) -> Any:
    return Record(cls.qualname, args) if isinstance(cls, RecordClass) else _apply(cls, args)


def _size(obj: Any) -> int:
    """Roughly the bytes ``obj`` takes (a constructor's result, charged to the budget)."""
    t = type(obj)
    if t is list or t is tuple:
        return 56 + 8 * len(obj)
    if t is dict or t is set or t is frozenset:
        return 64 + 40 * len(obj)
    if t is str or t is bytes or t is bytearray:
        return 49 + len(obj)
    return 64


def _made(vm: Machine, obj: Any, *parts: Any) -> Any:
    """A constructor's result: charged by its size, its depth recorded over its inputs."""
    vm.charge(_size(obj))
    return vm.register(obj, vm.over(parts))


@op(b"R")
def _reduce(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    stack = vm.stack
    args = stack.pop()
    func = stack.pop()
    if args is MARK or func is MARK:
        raise UnpicklingError("unexpected MARK")
    stack.append(_made(vm, _apply(func, args), args))
    return pos + 1


@op(b"\x81")
def _newobj(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    args = vm.pop()
    cls = vm.pop()
    vm.stack.append(_made(vm, _new(cls, args, {}), args))
    return pos + 1


@op(b"\x92")
def _newobj_ex(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    kwargs = vm.pop()
    args = vm.pop()
    cls = vm.pop()
    vm.stack.append(_made(vm, _new(cls, args, kwargs), args, kwargs))
    return pos + 1


@op(b"i")
def _inst(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    a = vm.line(buf, pos, pos + 1, limit)
    b = vm.line(buf, pos, a + 1, limit)
    module, name = buf[pos + 1 : a].decode("utf-8"), buf[a + 1 : b].decode("utf-8")
    args = tuple(vm.pop_mark())
    vm.stack.append(_made(vm, _instance(vm.find_class(module, name), args), args))
    return b + 1


@op(b"o")
def _obj(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    items = vm.pop_mark()
    if not items:
        raise UnpicklingError("OBJ without a class")
    args = tuple(items[1:])
    vm.stack.append(_made(vm, _instance(items[0], args), args))
    return pos + 1


@op(b"b")
def _build(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    state = vm.stack.pop()
    if state is MARK:
        raise UnpicklingError("unexpected MARK")
    obj = vm.top()
    vm.nested(obj, (state,), 0, vm.depth(obj))
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
    elif not isinstance(obj, (dict, list, set)):  # dicts: an OrderedDict's _metadata, say
        raise RestrictedUnpicklingError(f"BUILD on a {type(obj).__name__} refused")
    return pos + 1


def _build_array(arr: ArrayRef, state: Any) -> None:
    if not isinstance(state, tuple) or len(state) not in (4, 5):
        raise UnpicklingError("numpy array state is not a tuple of 4 or 5")
    if len(state) == 5:
        state = state[1:]
    shape, dtype, fortran, data = state
    arr.shape = ints(shape, "shape")
    arr.dtype = as_np_dtype(dtype)
    arr.fortran_order = bool(fortran)
    if isinstance(data, bytearray):
        data = bytes(data)
    if arr.dtype.hasobject:
        if not isinstance(data, list):
            raise UnpicklingError("object array without a list of items")
    elif not isinstance(data, (bytes, str, LazyBytes)):
        raise UnpicklingError(f"numpy array data is a {type(data).__name__}")
    arr.data = data


# -- persistent ids ------------------------------------------------------------------------
@op(b"P")
def _persid(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    i = vm.line(buf, pos, pos + 1, limit)
    vm.stack.append(vm.persistent(buf[pos + 1 : i].decode("ascii")))
    return i + 1


@op(b"Q")
def _binpersid(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    stack = vm.stack
    pid = stack.pop()
    if pid is MARK:
        raise UnpicklingError("unexpected MARK")
    stack.append(vm.persistent(pid))
    return pos + 1
