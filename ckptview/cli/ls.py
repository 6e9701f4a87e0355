"""``ckptview ls URL``: the serials table."""

from __future__ import annotations

from ._common import add_open_args, open_tree, print_table


def register(sub) -> None:
    p = sub.add_parser("ls", help="list the serials of a checkpoint tree")
    add_open_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    cat = open_tree(args)
    print_table(cat.serials, args.json)
    return 0
