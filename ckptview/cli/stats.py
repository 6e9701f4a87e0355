"""``ckptview stats URL [--serial N] [--name NAME]... [--follow NAME --stat l2]``."""

from __future__ import annotations

from ckptview.fmt import missing

from . import _table as t
from ._common import add_open_args, emit_json, open_tree


def register(sub) -> None:
    p = sub.add_parser("stats", help="per-variable statistics of a serial, or one over serials")
    add_open_args(p)
    p.add_argument("--serial", type=int, help="serial (default: the latest)")
    p.add_argument("--name", action="append", help="only this variable (repeatable)")
    p.add_argument("--follow", metavar="NAME", help="one variable across every serial")
    p.add_argument("--stat", default="l2", help="statistic for --follow (default l2)")
    p.add_argument("--node", default="", help="node of the --follow variable")
    p.set_defaults(func=run)


def _count(n) -> str:
    """A count of NaN/inf values; blank when there are none."""
    return "" if missing(n) or int(n) == 0 else f"{int(n):,}"


def _percent(x) -> str:
    return "" if missing(x) else f"{100 * float(x):.3g}%"


COLUMNS = [
    t.Col("name", fit=t.FOLD),
    t.Col("node", fit=t.CUT, optional=True),
    t.Col("dtype", drop=4),
    t.Col("shape", fmt=t.shape, drop=3),
    *(t.Col(c, fmt=t.number, right=True, drop=d)
      for c, d in (("min", 0), ("max", 0), ("mean", 2), ("std", 5), ("l2", 0))),
    t.Col("n_nan", "nan", _count, right=True, optional=True),
    t.Col("n_inf", "inf", _count, right=True, optional=True),
    t.Col("frac_zero", "zeros", _percent, right=True, drop=6),
    t.Col("error", fit=t.FOLD, optional=True),
]  # fmt: skip


def run(args) -> int:
    cat = open_tree(args)
    if args.follow:
        series = cat.trajectory(args.follow, args.stat, args.node)
        if args.json:
            emit_json(series.rename("value").to_frame())
            return 0
        shown = series.rename("value").reset_index()
        t.render(shown, [t.Col("serial", right=True), t.Col("value", args.stat, t.number, right=True)],
                 title=f"{args.follow}: {args.stat} by serial", empty="no serials")  # fmt: skip
        return 0
    table = cat.stats(args.serial, args.name)
    if args.json:
        emit_json(table)
        return 0
    serial = int(table["serial"].iloc[0]) if len(table) else args.serial
    t.render(table, COLUMNS, title=f"{cat.layout}: {cat.url}, serial {serial}",
             empty="no variables")  # fmt: skip
    return 0
