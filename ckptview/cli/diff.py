"""``ckptview diff URL A B [--other URL]``: variable-by-variable numeric diff."""

from __future__ import annotations

from ._common import add_open_args, open_tree, print_table, progress


def register(sub) -> None:
    p = sub.add_parser("diff", help="compare two serials variable by variable")
    add_open_args(p)
    p.add_argument("a", type=int, help="serial A")
    p.add_argument("b", type=int, help="serial B (of --other when given)")
    p.add_argument("--other", metavar="URL", help="a second tree (cross-run diff)")
    p.add_argument("--other-layout", help="force the second tree's layout")
    p.add_argument("--name", action="append", help="only this variable (repeatable)")
    p.add_argument("--exact", action="store_true", help="pair by (node, name) only")
    p.add_argument("--changed", action="store_true", help="hide identical variables")
    p.set_defaults(func=run)


def run(args) -> int:
    cat = open_tree(args)
    other = open_tree(args, args.other, args.other_layout) if args.other else None
    vars_a = cat.variables
    total = int(vars_a.loc[vars_a["serial"] == args.a, "nbytes"].sum()) * 2
    with progress(total, "diff", args=args) as bar:
        df = cat.diff(args.a, args.b, other, args.name, match="exact" if args.exact else "auto",
                      progress=bar.update)  # fmt: skip
    if args.changed:
        df = df[df["status"] != "identical"]
    print_table(df, args.json, index=False)
    return 0
