"""``ckptview vars URL [--serial N]``: the variables table."""

from __future__ import annotations

import sys

from ckptview.scan.access import denied_message, touches, unreadable_dirs

from . import _table as t
from ._common import add_open_args, emit_json, open_tree


def register(sub) -> None:
    p = sub.add_parser("vars", help="list the variables of a serial")
    add_open_args(p)
    p.add_argument("--serial", type=int, help="serial (default: the latest)")
    p.add_argument("--all", action="store_true", help="every serial")
    p.set_defaults(func=run)


def columns(root: str, every_serial: bool) -> list[t.Col]:
    cols = [t.Col("serial", right=True)] if every_serial else []
    return cols + [
        t.Col("name", fit=t.FOLD),
        t.Col("node", fit=t.CUT, optional=True),
        t.Col("kind", drop=4),
        t.Col("dtype"),
        t.Col("shape", fmt=t.shape),
        t.Col("nbytes", "size", t.size, right=True),
        t.Col("n_shards", "shards", t.integer, right=True, optional=True, drop=3),
        t.Col("quant", optional=True, drop=3),
        t.Col("file", fmt=t.relative_to(root), fit=t.CUT, drop=1),
        t.Col("error", fit=t.FOLD, optional=True),
    ]


def run(args) -> int:
    cat = open_tree(args)
    df = cat.variables
    title = f"{cat.layout}: {cat.url}, every serial"
    if not args.all:
        serial = args.serial if args.serial is not None else cat.latest
        if serial is None and len(cat.serials):
            serial = int(cat.serials.index.max())
        if serial is not None and serial not in set(cat.serials.index):
            raise ValueError(f"no serial {serial}; serials: {list(cat.serials.index)}")
        df = df[df["serial"] == serial]
        title = f"{cat.layout}: {cat.url}, serial {serial}"
    if args.json:
        emit_json(df.reset_index(drop=True))
        return report_denied(cat, None if args.all else serial)
    shown = df.assign(n_shards=df["n_shards"].where(df["n_shards"] > 1))
    t.render(shown, columns(cat.url, args.all), title=title, empty="no variables")
    return report_denied(cat, None if args.all else serial)


def report_denied(cat, serial: int | None) -> int:
    """Name on stderr each directory of the shown serial(s) this process may not read (its
    variables are missing above); 1 when there is one, else 0."""
    paths = cat.serials["path"] if serial is None else cat.serials.loc[[serial], "path"]
    denied = [d for d in unreadable_dirs(cat.tree) if any(touches(d, p) for p in paths)]
    for d in denied:
        print(f"error: {denied_message(d)}", file=sys.stderr)
    return 1 if denied else 0
