"""``ckptview restore URL SERIAL [--to URL] [--yes]``: copy out, or promote in place."""

from __future__ import annotations

import sys

from ._common import add_open_args, guarded, open_tree, progress, show_change


def register(sub) -> None:
    p = sub.add_parser("restore", help="copy a serial elsewhere or make the framework resume it")
    add_open_args(p)
    p.add_argument("serial", type=int, metavar="SERIAL",
                   help="the serial to restore (ckptview ls lists them)")  # fmt: skip
    p.add_argument("--to", metavar="URL", help="copy into this tree (default: promote in place)")
    p.add_argument("--force", action="store_true",
                   help="allow restoring a serial that is incomplete or does not load")  # fmt: skip
    p.add_argument("--yes", action="store_true", help="do it (default: print the plan only)")
    p.set_defaults(func=guarded(run))


def run(args) -> int:
    cat = open_tree(args)
    plan = cat.restore(args.serial, to=args.to, dry_run=True, force=args.force)
    if not args.yes or not len(plan.ops):
        show_change(plan, args.json)
        if len(plan.ops):
            print("(plan only: re-run with --yes to restore)", file=sys.stderr)
        return 0
    with progress(int(plan.ops["nbytes"].sum()), "restore", args=args) as bar:
        result = cat.restore(args.serial, to=args.to, force=args.force, progress=bar.update)
    show_change(result, args.json)
    return 0
