"""``ckptview journal URL [--recover [--yes]] [--break-lock]``: the tree's change journal;
roll back or finish an interrupted restore or retention."""

from __future__ import annotations

import sys

from ckptview.changes.journal import open_root
from ckptview.changes.lock import break_lock
from ckptview.changes.recover import recover
from ckptview.changes.status import status

from . import _table as t
from ._common import add_progress_args, emit_json, guarded, show_change


def register(sub) -> None:
    p = sub.add_parser("journal", help="show the change journal; recover from a crash")
    p.add_argument("url", metavar="URL", help="checkpoint tree (the root the change was made in)")
    p.add_argument("--last", type=int, default=20, metavar="N", help="operations shown (20)")
    p.add_argument("--recover", action="store_true",
                   help="roll back / finish interrupted changes and remove leftovers")  # fmt: skip
    p.add_argument("--yes", action="store_true", help="with --recover: do it (default: plan)")
    p.add_argument("--break-lock", action="store_true",
                   help="remove the tree's lock first, whoever holds it")  # fmt: skip
    p.add_argument("--json", action="store_true",
                   help="print one JSON document (the full data) instead of a table")  # fmt: skip
    add_progress_args(p)
    p.set_defaults(func=guarded(run))


COLUMNS = [
    t.Col("started", fmt=t.when),
    t.Col("action"),
    t.Col("serials", fmt=t.listed, fit=t.CUT),
    t.Col("status"),
    t.Col("steps", right=True),
    t.Col("op_id", "id", drop=1),
    t.Col("detail", fit=t.FOLD, optional=True),
]


def run(args) -> int:
    if args.last < 1:
        raise ValueError("--last must be at least 1")
    if args.break_lock:
        fs, root = open_root(args.url, None)
        held = break_lock(fs, root)
        print(f"lock removed: {held}" if held else "no lock", file=sys.stderr)
    if args.recover:
        result = recover(args.url, dry_run=not args.yes)
        show_change(result, args.json)
        if result.dry_run and (len(result.ops) or result.outcomes):
            print("(plan only: re-run with --recover --yes to recover)", file=sys.stderr)
        return 0
    df = status(args.url, last=args.last)
    if args.json:
        emit_json(df)
        return 0
    t.render(df, COLUMNS, empty=f"no changes journaled in {args.url}")
    pending = df.attrs.get("pending") or []
    if pending:
        print(f"{len(pending)} interrupted operation(s): ckptview journal {args.url} "
              "--recover --yes", file=sys.stderr)  # fmt: skip
    return 0
