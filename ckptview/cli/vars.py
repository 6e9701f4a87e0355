"""``ckptview vars URL [--serial N]``: the variables table."""

from __future__ import annotations

from ._common import add_open_args, open_tree, print_table


def register(sub) -> None:
    p = sub.add_parser("vars", help="list the variables of a serial")
    add_open_args(p)
    p.add_argument("--serial", type=int, help="serial (default: the latest)")
    p.add_argument("--all", action="store_true", help="every serial")
    p.set_defaults(func=run)


def run(args) -> int:
    cat = open_tree(args)
    df = cat.variables
    if not args.all:
        serial = args.serial if args.serial is not None else cat.latest
        if serial is None and len(cat.serials):
            serial = int(cat.serials.index.max())
        if serial is not None and serial not in set(cat.serials.index):
            raise ValueError(f"no serial {serial}; serials: {list(cat.serials.index)}")
        df = df[df["serial"] == serial]
    print_table(df, args.json, index=False)
    return 0
