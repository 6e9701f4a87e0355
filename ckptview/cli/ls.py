"""``ckptview ls URL``: the serials table; on stderr, what the verdicts found at tree level
(the framework's own resume pointer when it names another serial, files outside every
serial). ``--json`` adds a ``framework_latest`` column."""

from __future__ import annotations

import sys

from ._common import add_open_args, open_tree, print_table


def register(sub) -> None:
    p = sub.add_parser("ls", help="list the serials of a checkpoint tree")
    add_open_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    cat = open_tree(args)
    serials, attrs = cat.serials, cat.attrs
    pointer = attrs.get("framework_latest", "absent")
    if args.json:
        print_table(serials.assign(framework_latest=serials.index == pointer), True)
    else:
        print_table(serials, False)
    if "framework_latest" in attrs:
        named = f"serial {pointer}" if pointer is not None else "no loadable serial"
        print(f"warning: the framework's own pointer names {named}; ckptview's latest "
              f"(the newest serial that loads) is {cat.latest}", file=sys.stderr)  # fmt: skip
    for w in attrs.get("warnings", []):
        print(f"warning: {w}", file=sys.stderr)
    return 0
