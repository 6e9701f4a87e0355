"""``ckptview retain URL [policy flags] [--save] [--apply --yes]``: plan or apply retention."""

from __future__ import annotations

import sys

from ckptview.changes.lock import break_lock
from ckptview.engine.policies import describe_policy, make_policy

from ._common import add_open_args, guarded, open_tree, print_table, progress


def register(sub) -> None:
    p = sub.add_parser("retain", help="plan (and with --apply --yes, apply) retention")
    add_open_args(p)
    p.add_argument("--keep-last", type=int, metavar="N", help="keep the N newest complete")
    p.add_argument("--keep-every", type=int, metavar="K", help="keep serials divisible by K")
    p.add_argument("--every-by", choices=("serial", "step"), default="serial")
    p.add_argument("--keep-best", metavar="METRIC:N[:min|max]", help="keep the N best")
    p.add_argument("--pin", type=int, action="append", default=[], metavar="SERIAL")
    p.add_argument("--older-than", metavar="DURATION", help="keep serials newer than (7d, 12h)")
    p.add_argument("--save", action="store_true", help="store these flags as the tree's policy")
    p.add_argument("--apply", action="store_true", help="delete what the plan says")
    p.add_argument("--yes", action="store_true", help="confirm deletion")
    p.add_argument("--break-lock", action="store_true", help="remove a lock left by a crash")
    p.set_defaults(func=guarded(run))


def run(args) -> int:
    cat = open_tree(args)
    if args.break_lock:
        held = break_lock(cat.storage.fs, cat.tree.root)
        print(f"lock removed: {held}" if held else "no lock", file=sys.stderr)
    policy = make_policy(args.keep_last, args.keep_every, args.keep_best, args.pin,
                         args.older_than, args.every_by)  # fmt: skip
    if args.save:
        cat.set_retention(policy if policy else None)
    if not policy:
        policy = cat.retention_policy() or policy
    plan = cat.plan_retention(policy=policy)
    n_del = int((plan["action"] == "delete").sum())
    freed = int(plan.loc[plan["action"] == "delete", "nbytes"].sum())
    if not (args.apply or args.yes) or not args.yes or n_del == 0:
        print_table(plan, args.json)
        print(f"policy: {describe_policy(policy)}; would delete {n_del} serial(s), {freed} bytes"
              + ("" if n_del == 0 else " (plan only: add --apply --yes to delete)"),
              file=sys.stderr)  # fmt: skip
        return 0
    with progress(n_del, "retain", unit="serial", args=args) as bar:
        deleted = cat.apply_retention(plan, progress=bar.update)
    print_table(deleted, args.json)
    print(
        f"deleted {len(deleted)} serial(s), {int(deleted['nbytes'].sum())} bytes", file=sys.stderr
    )
    return 0
