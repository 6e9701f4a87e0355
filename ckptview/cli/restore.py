"""``ckptview restore URL SERIAL [--to URL] [--yes]``: copy out, or promote in place."""

from __future__ import annotations

import json
import sys

from ._common import add_open_args, guarded, open_tree, print_table, progress


def register(sub) -> None:
    p = sub.add_parser("restore", help="copy a serial elsewhere or make the framework resume it")
    add_open_args(p)
    p.add_argument("serial", type=int)
    p.add_argument("--to", metavar="URL", help="copy into this tree (default: promote in place)")
    p.add_argument("--force", action="store_true", help="allow restoring an incomplete serial")
    p.add_argument("--yes", action="store_true", help="do it (default: print the plan only)")
    p.set_defaults(func=guarded(run))


def run(args) -> int:
    cat = open_tree(args)
    plan = cat.restore(args.serial, to=args.to, dry_run=True, force=args.force)
    if not args.yes or not len(plan.ops):
        _show(plan, args.json)
        if len(plan.ops):
            print("(plan only: re-run with --yes to restore)", file=sys.stderr)
        return 0
    with progress(int(plan.ops["nbytes"].sum()), "restore", args=args) as bar:
        result = cat.restore(args.serial, to=args.to, force=args.force, progress=bar.update)
    _show(result, args.json)
    return 0


def _show(result, as_json: bool) -> None:
    if as_json:
        head = {"serial": result.serial, "target": result.target,
                "new_serial": result.new_serial, "dry_run": result.dry_run,
                "done": result.done, "message": result.message}  # fmt: skip
        print(json.dumps(head))
        print_table(result.ops, True)
        return
    print(str(result).splitlines()[0])
    if len(result.ops):
        print_table(result.ops[["kind", "path", "nbytes", "note"]], False)
