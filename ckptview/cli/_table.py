"""Terminal tables that fit the terminal: rich tables with human sizes and times, paths
relative to the tree, and columns such as ``error`` shown only when some row has one.

The width is the terminal's (``$COLUMNS`` when set; 80 when stdout is not a terminal). No
line is longer: names fold onto a second line, paths and messages are cut with ``…``.
``--json`` never comes here (:func:`ckptview.cli._common.emit_json` keeps the full data).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table

from ..fmt import fmt_number, fmt_shape, fmt_time, human_bytes, missing, text

#: how a cell is laid out when the table is too wide: ``keep`` (never cut: numbers, sizes),
#: ``fold`` (wrapped onto more lines: names), ``cut`` (one line ending in …: paths, messages)
KEEP, FOLD, CUT = "keep", "fold", "cut"


GAP = 2  # columns are two spaces apart
MIN_SHRUNK = 10  # a name, path or message column is not cut narrower than this
#: the width a name (folded) or a path or message (cut) should get before numbers are dropped
COMFORT = {FOLD: 36, CUT: 24}


@dataclass
class Col:
    """One column: ``key`` in the frame, shown as ``header`` through ``fmt``.

    ``fit``: see :data:`KEEP`. ``optional``: left out when every cell is empty (``error``).
    ``drop``: when even the cut columns do not fit, columns are left out highest ``drop``
    first (0: never)."""

    key: str
    header: str | None = None
    fmt: Callable[[Any], str] = text
    fit: str = KEEP
    right: bool = False
    optional: bool = False
    drop: int = 0

    @property
    def title(self) -> str:
        return self.header or self.key


def width() -> int:
    """$COLUMNS when set, else the terminal's width (80 when stdout is no terminal)."""
    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    return shutil.get_terminal_size((80, 24)).columns


class _Console(Console):
    def on_broken_pipe(self) -> None:  # rich would exit(1) itself; main() exits quietly
        raise BrokenPipeError


def console(stream=None) -> Console:
    """A rich console writing plain text (no colour codes unless a terminal) at :func:`width`."""
    return _Console(file=stream, width=width(), highlight=False, soft_wrap=False,
                    emoji=False, markup=False)  # fmt: skip


def layout(cols: list[Col], natural: list[int], total: int) -> list[int | None]:
    """Column widths for a table at most ``total`` wide (None: the column is left out).

    Numbers keep their width. While names, paths and messages would get less than a
    comfortable width (:data:`COMFORT`), columns are dropped, highest :attr:`Col.drop`
    first. Then names, paths and messages share what is left, each its natural width when
    that fits its share (water-filling; names weigh twice what a cut column does), none under
    :data:`MIN_SHRUNK`; only a terminal too narrow even for that cuts every column."""
    widths: list[int | None] = list(natural)
    while True:
        shown = [i for i, w in enumerate(widths) if w is not None]
        budget = total - GAP * (len(shown) - 1)
        fixed = sum(natural[i] for i in shown if cols[i].fit == KEEP)
        flexible = [i for i in shown if cols[i].fit != KEEP]
        want = sum(min(natural[i], COMFORT[cols[i].fit]) for i in flexible)
        droppable = [i for i in shown if cols[i].drop]
        if fixed + want <= budget or not droppable:
            break
        widths[max(droppable, key=lambda i: (cols[i].drop, i))] = None
    for i in flexible:
        widths[i] = min(natural[i], MIN_SHRUNK)
    extra = budget - fixed - sum(widths[i] or 0 for i in flexible)
    if extra < 0:  # too narrow even for the floors: cut everything
        return _squeezed(natural, shown, budget)
    weight = {i: 2 if cols[i].fit == FOLD else 1 for i in flexible}
    for i in sorted(flexible, key=lambda i: (natural[i] - (widths[i] or 0)) / weight[i]):
        grow = min(natural[i] - (widths[i] or 0), extra * weight[i] // sum(weight.values()))
        widths[i] = (widths[i] or 0) + grow
        extra -= grow
        del weight[i]
    return widths


def _squeezed(natural: list[int], shown: list[int], budget: int) -> list[int | None]:
    out: list[int | None] = [None] * len(natural)
    left = budget
    for n, i in enumerate(sorted(shown, key=lambda i: natural[i])):
        out[i] = max(1, min(natural[i], left // (len(shown) - n)))
        left -= out[i]
    return out


def render(
    df: pd.DataFrame,
    cols: Sequence[Col],
    *,
    empty: str = "(none)",
    title: str | None = None,
    stream=None,
) -> list[str]:
    """Print ``df`` as a table of ``cols`` (columns absent from ``df`` are skipped).
    Returns the keys of the columns left out or cut short (the full data: ``--json``)."""
    out = console(stream)
    if title:
        out.print(title, overflow="fold")
    if not len(df):
        out.print(empty, overflow="fold")
        return []
    used: list[Col] = []
    cells: list[list[str]] = []
    for col in cols:
        if col.key not in df.columns:
            continue
        values = [col.fmt(v) for v in df[col.key]]
        if col.optional and not any(values):
            continue
        used.append(col)
        cells.append(values)
    natural = [max([cell_len(c.title), *map(cell_len, v)]) for c, v in zip(used, cells)]
    widths = layout(used, natural, out.width)
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True,
                  header_style="bold", expand=False)  # fmt: skip
    kept = [i for i, w in enumerate(widths) if w is not None]
    for i in kept:
        col = used[i]
        table.add_column(col.title, justify="right" if col.right else "left",
                         width=widths[i], no_wrap=col.fit != FOLD,
                         overflow="fold" if col.fit == FOLD else "ellipsis")  # fmt: skip
    for row in zip(*(cells[i] for i in kept)):
        table.add_row(*row)
    out.print(table)
    return [c.key for c, w, n in zip(used, widths, natural)
            if w is None or (w < n and c.fit == CUT)]  # fmt: skip


# -- cell formats ----------------------------------------------------------------------------
def size(n) -> str:
    return human_bytes(n)


def number(x) -> str:
    return fmt_number(x)


def integer(x) -> str:
    return "" if missing(x) else f"{int(x):,}"


def shape(s) -> str:
    return "" if s is None else fmt_shape(s)


def when(ts) -> str:
    return fmt_time(ts)


def yes(flag) -> str:
    return "yes" if bool(flag) and not missing(flag) else ""


def listed(items) -> str:
    if items is None or (not isinstance(items, (list, tuple)) and missing(items)):
        return ""
    return ", ".join(map(str, items))


def relative_to(root: str) -> Callable[[Any], str]:
    """Paths shown relative to ``root`` (the tree's URL), unchanged when outside it."""
    prefix = root.rstrip("/") + "/"

    def rel(path) -> str:
        p = text(path)
        if p.rstrip("/") == root.rstrip("/"):
            return "."
        return p[len(prefix) :] if p.startswith(prefix) else p

    return rel
