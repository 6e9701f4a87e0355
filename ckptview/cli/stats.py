"""``ckptview stats URL [--serial N] [--name NAME]... [--follow NAME --stat l2]``."""

from __future__ import annotations

from ._common import add_open_args, open_tree, print_table


def register(sub) -> None:
    p = sub.add_parser("stats", help="per-variable statistics of a serial, or one over serials")
    add_open_args(p)
    p.add_argument("--serial", type=int, help="serial (default: the latest)")
    p.add_argument("--name", action="append", help="only this variable (repeatable)")
    p.add_argument("--follow", metavar="NAME", help="one variable across every serial")
    p.add_argument("--stat", default="l2", help="statistic for --follow (default l2)")
    p.add_argument("--node", default="", help="node of the --follow variable")
    p.set_defaults(func=run)


def run(args) -> int:
    cat = open_tree(args)
    if args.follow:
        series = cat.trajectory(args.follow, args.stat, args.node)
        print_table(series.to_frame(), args.json)
        return 0
    print_table(cat.stats(args.serial, args.name), args.json, index=False)
    return 0
