"""The state of the pickle VM and what its opcode handlers share.

An opcode handler is ``handler(vm, buf, pos, limit) -> pos``: ``buf[pos]`` is its opcode,
``buf[:limit]`` the bytes held (file offset ``vm.base`` onwards). It returns the position after
its arguments, or raises :class:`Short` when they run past ``limit`` (the loop then holds more
bytes and runs it again), or :class:`Stopped` at STOP. The handlers live in :mod:`.ops_data`
and :mod:`.ops_objects`; :mod:`.vm` gathers them into the one dispatch table and runs it.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ...io import TruncatedError
from .allowlist import resolve_global
from .source import Reader
from .standins import LazyBytes, RestrictedUnpicklingError

MAX_LINE = 1 << 26  # protocol-0 text lines (a py2 STRING may hold an array)
NO_LAZY = 1 << 62  # lazy_min of a VM keeping every payload in memory
UnpicklingError = pickle.UnpicklingError

#: containers nested deeper than this are refused as they are built: hashing a tuple nested
#: 200,000 deep (a dict key, a frozenset member) recurses in C past the thread's stack
MAX_DEPTH = 1000
#: bytes the objects a pickle builds may take: ``BUDGET_BASE + BUDGET_PER_BYTE`` per byte of
#: pickle, at most ``BUDGET_MAX`` (containers, strings and byte strings charged by their size,
#: memo and stack entries by theirs)
BUDGET_BASE = 64 << 20
BUDGET_PER_BYTE = 8
BUDGET_MAX = 1 << 30
MEMO_COST = 48  # bytes per memo entry (a dict slot and its int key)
_CONTAINERS = frozenset({tuple, list, dict, set, frozenset})
_SCALARS = frozenset({str, int, float, bytes, bool, type(None)})


class BudgetError(UnpicklingError):
    """A pickle that builds more (or deeper) than its budget allows."""


def budget_for(nbytes: int) -> int:
    """The byte budget of a pickle ``nbytes`` long."""
    return min(BUDGET_MAX, BUDGET_BASE + BUDGET_PER_BYTE * max(nbytes, 0))


class Mark:
    """The MARK opcode's stack entry."""


MARK = Mark()


class Short(Exception):  # noqa: N818 - a signal, not an error
    """An opcode's arguments run past the bytes held: ``need`` bytes from its opcode on."""

    def __init__(self, need: int):
        super().__init__(need)
        self.need = need


class Stopped(Exception):  # noqa: N818 - a signal, not an error
    """The STOP opcode: the VM's ``result`` is set."""


STOPPED = Stopped()


class Machine:
    """Stack, memo and the settings an opcode handler reads."""

    __slots__ = ("src", "persistent_load", "allow", "encoding", "lazy_min", "max_objects",
                 "stack", "memo", "base", "result", "_globals", "depths", "spent", "budget", "span")  # fmt: skip

    def __init__(
        self,
        src: Reader,
        persistent_load: Callable[[Any], Any] | None,
        allow: Mapping[str, Any] | Iterable[str] | None,
        encoding: str,
        lazy_min: int | None,
        max_objects: int,
    ):
        self.src = src
        self.persistent_load = persistent_load
        self.allow = allow
        self.encoding = encoding
        self.lazy_min = NO_LAZY if lazy_min is None else lazy_min
        self.max_objects = max_objects
        self.stack: list = []
        self.memo: dict[int, Any] = {}
        self.base = 0  # file offset of the held bytes' first byte
        self.result: Any = None
        self._globals: dict[tuple[str, str], Any] = {}  # resolved GLOBALs, by name
        self.depths: dict[int, tuple[Any, int]] = {}  # id -> (object, depth) from depth 2 on
        self.spent = 0
        self.span = src.end - src.pos
        self.budget = budget_for(self.span)

    # -- budgets
    def charge(self, nbytes: int) -> None:
        """Count ``nbytes`` built against the budget; :class:`BudgetError` past it."""
        self.spent += nbytes
        if self.spent > self.budget:
            raise BudgetError(
                f"pickle builds more than {self.budget >> 20} MiB of objects (the budget of "
                f"a {self.span}-byte pickle)"
            )

    def depth(self, obj: Any) -> int:
        """How deep ``obj`` nests (0: not a container, 1: a flat one)."""
        e = self.depths.get(id(obj))
        if e is not None and e[0] is obj:
            return e[1]
        return 1 if type(obj) in _CONTAINERS else 0

    def over(self, items: Iterable, at_least: int = 1) -> int:
        """The depth of a container over ``items`` (at least ``at_least``), checked against
        :data:`MAX_DEPTH` before anything hashes or compares it."""
        depths, best = self.depths, at_least - 1
        for x in items:
            t = type(x)
            if t in _SCALARS:
                continue
            e = depths.get(id(x))
            d = e[1] if e is not None and e[0] is x else (1 if t in _CONTAINERS else 0)
            if d > best:
                best = d
        if best >= MAX_DEPTH:
            raise BudgetError(f"pickle nests containers more than {MAX_DEPTH} deep")
        return best + 1

    def register(self, obj: Any, depth: int) -> Any:
        if depth >= 2:
            self.depths[id(obj)] = (obj, depth)
        return obj

    def nested(self, obj: Any, items: Iterable, nbytes: int, at_least: int = 1) -> Any:
        """Charge ``nbytes`` for ``obj`` built over (or grown by) ``items`` and record its
        depth."""
        self.charge(nbytes)
        return self.register(obj, self.over(items, at_least))

    # -- the stack
    def pop(self) -> Any:
        if not self.stack:
            raise UnpicklingError("unpickling stack underflow")
        v = self.stack.pop()
        if v is MARK:
            raise UnpicklingError("unexpected MARK")
        return v

    def top(self) -> Any:
        if not self.stack or self.stack[-1] is MARK:
            raise UnpicklingError("unpickling stack underflow")
        return self.stack[-1]

    def mark(self) -> int:
        """The stack index of the topmost MARK."""
        stack = self.stack
        k = len(stack) - 1
        while k >= 0 and stack[k] is not MARK:
            k -= 1
        if k < 0:
            raise UnpicklingError("MARK not found")
        return k

    def pop_mark(self) -> list:
        """The items above the topmost MARK, removed with it."""
        k = self.mark()
        items = self.stack[k + 1 :]
        del self.stack[k:]
        return items

    def container(self, kind: type) -> Any:
        obj = self.top()
        if not isinstance(obj, kind):
            raise UnpicklingError(f"expected a {kind.__name__}, got {type(obj).__name__}")
        return obj

    # -- names and references
    def find_class(self, module: str, name: str) -> Any:
        key = (module, name)
        found = self._globals.get(key)
        if found is None:
            found = self._globals[key] = resolve_global(module, name, self.allow)
        return found

    @property
    def globals_named(self) -> frozenset[str]:
        """Every global the pickle named so far (``module.name``), allowed ones included."""
        return frozenset(f"{m}.{n}" for m, n in self._globals)

    def persistent(self, pid: Any) -> Any:
        if self.persistent_load is None:
            raise RestrictedUnpicklingError("persistent id in a pickle without persistent_load")
        return self.persistent_load(pid)

    # -- arguments
    def decode_string(self, data: Any) -> Any:
        """A py2 ``str`` payload: bytes with ``encoding="bytes"``, else decoded."""
        if isinstance(data, LazyBytes) or self.encoding == "bytes":
            return data
        return data.decode(self.encoding, "strict")

    def line(self, buf: bytes, pos: int, start: int, limit: int) -> int:
        """The index of the newline ending the text line at ``start`` (opcode at ``pos``)."""
        i = buf.find(b"\n", start, limit)
        if i >= 0:
            return i
        if limit - start > MAX_LINE:
            raise RestrictedUnpicklingError("protocol-0 text line too long")
        left = self.src.end - self.base - pos
        if limit - pos >= left:
            raise TruncatedError("pickle ends inside a text line")
        raise Short(min(2 * (limit - pos) + 1, left))

    def payload(self, buf: bytes, pos: int, start: int, n: int, limit: int,
                text: bool = False) -> tuple[Any, int]:  # fmt: skip
        """``n`` bytes (``text``: UTF-8) at ``start`` and the position after them; from
        ``lazy_min`` bytes on a :class:`LazyBytes` file range, nothing read."""
        if n < 0:
            raise UnpicklingError("negative length")
        if n >= self.lazy_min:
            at = self.base + start
            if at + n > self.src.end:
                raise TruncatedError(
                    f"pickle needs {n} bytes at {at} but only {self.src.end - at} are left"
                )
            return LazyBytes(at, n, self.src.blob, text=text), start + n
        stop = start + n
        if stop > limit:
            raise Short(stop - pos)
        self.charge(n)
        data = buf[start:stop]
        return (data.decode("utf-8", "surrogatepass") if text else data), stop


Handler = Callable[[Machine, bytes, int, int], int]


def registrar(table: dict[int, Handler]) -> Callable[[bytes], Callable[[Handler], Handler]]:
    """A decorator ``@op(b"X")`` entering a handler in ``table`` under its opcode."""

    def op(code: bytes) -> Callable[[Handler], Handler]:
        def enter(fn: Handler) -> Handler:
            table[code[0]] = fn
            return fn

        return enter

    return op
