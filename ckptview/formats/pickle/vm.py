"""The restricted pickle VM: the one dispatch table (opcode -> handler, from :mod:`.ops_data`
and :mod:`.ops_objects`) and the loop running it over the bytes held.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ...io import Blob
from .machine import MEMO_COST, Handler, Machine, Short, Stopped, UnpicklingError
from .ops_data import DATA_OPS
from .ops_objects import OBJECT_OPS
from .source import Reader

LAZY_MIN = 4096  # payloads at least this long stay on disk as LazyBytes (Blob sources)
#: objects the VM may hold at once (stack + memo entries): a pickle of millions of DUP/PUT
#: opcodes must not build an enormous memo
MAX_OBJECTS = 10_000_000
_BUDGET = range(1024)  # opcodes per run: the object cap is checked between runs


def _unsupported(vm: Machine, buf: bytes, pos: int, limit: int) -> int:
    raise UnpicklingError(f"unsupported pickle opcode {buf[pos : pos + 1]!r} at {vm.base + pos}")


def _table() -> list[Handler]:
    if DATA_OPS.keys() & OBJECT_OPS.keys():
        raise RuntimeError("an opcode with two handlers")
    table: list[Handler] = [_unsupported] * 256
    for code, handler in (DATA_OPS | OBJECT_OPS).items():
        table[code] = handler
    return table


#: THE dispatch table: the handler of each opcode byte
DISPATCH: list[Handler] = _table()


def _run(vm: Machine, buf: bytes, pos: int, limit: int) -> tuple[int, int]:
    """Opcodes of ``buf[pos:limit]`` until STOP, ``_BUDGET`` opcodes, the end of the bytes held
    or an opcode whose arguments are not all held. Returns the position reached and how many
    bytes from it to hold before the next run (0: stopped)."""
    table = DISPATCH
    try:
        for _ in _BUDGET:
            pos = table[buf[pos]](vm, buf, pos, limit)
    except IndexError:
        if pos < limit:  # a stack underflow (buf[pos] past the bytes held is not one)
            raise
    except Short as short:
        return pos, short.need
    except Stopped:
        return pos + 1, 0
    return pos, 1


class Unpickler(Machine):
    """The restricted pickle VM. ``load()`` returns one object; ``pos`` is then after STOP."""

    __slots__ = ()

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
        super().__init__(
            Reader(source, offset, end), persistent_load, allow, encoding,
            lazy_min if isinstance(source, Blob) else None,
            MAX_OBJECTS if max_objects is None else max_objects,
        )  # fmt: skip

    @property
    def pos(self) -> int:
        return self.src.pos

    def load(self) -> Any:
        """The next object of the pickle (its STOP opcode read)."""
        stack: list = []
        memo: dict[int, Any] = {}
        self.stack, self.memo = stack, memo
        src, cap, need = self.src, self.max_objects, 1
        while True:
            src.ensure(need)  # TruncatedError past the end
            buf, base, limit = src.window()
            self.base = base
            try:
                pos, need = _run(self, buf, src.pos - base, limit)
            except IndexError:
                raise UnpicklingError("unpickling stack underflow") from None
            except KeyError as e:
                raise UnpicklingError(f"memo key {e.args[0]!r} missing") from None
            except TypeError as e:  # an unhashable dict key or set member, as pickle says
                raise UnpicklingError(f"bad pickle: {e}") from None
            src.pos = base + pos
            if not need:
                result, self.result = self.result, None
                return result
            if len(stack) + len(memo) > cap:  # at most _BUDGET objects past the cap
                raise UnpicklingError(
                    f"pickle builds more than {cap} objects (stack + memo) at {src.pos}"
                )
            if self.spent + MEMO_COST * len(memo) + 8 * len(stack) > self.budget:
                self.charge(MEMO_COST * len(memo) + 8 * len(stack))  # raises BudgetError
