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
    p.add_argument("--slim-older-than", metavar="DURATION",
                   help="delete the optimizer state of kept serials older than this (7d), "
                   "keeping their weights; never the newest loadable serial")  # fmt: skip
    p.add_argument("--save", action="store_true", help="store these flags as the tree's policy")
    p.add_argument("--apply", action="store_true", help="delete (and slim) what the plan says")
    p.add_argument("--yes", action="store_true", help="confirm: delete and slim")
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
    plan = cat.plan_retention(policy=policy, slim_older_than=args.slim_older_than)
    n_del = int((plan["action"] == "delete").sum())
    n_slim = int((plan["action"] == "slim").sum())
    freed = int(plan["frees"].sum())
    if not args.yes or n_del + n_slim == 0:
        print_table(plan, args.json)
        what = f"would delete {n_del} serial(s)" + (f", slim {n_slim}" if n_slim else "")
        print(f"policy: {describe_policy(policy)}; {what}, freeing {freed} bytes"
              + ("" if n_del + n_slim == 0 else " (plan only: add --yes to do it)"),
              file=sys.stderr)  # fmt: skip
        return 0
    with progress(n_del + n_slim, "retain", unit="serial", args=args) as bar:
        done = cat.apply_retention(plan, progress=bar.update)
    print_table(done, args.json)
    n_done = int((done["action"] == "delete").sum()) if len(done) else 0
    print(f"deleted {n_done} serial(s), slimmed {len(done) - n_done}, "
          f"freed {int(done['nbytes'].sum())} bytes", file=sys.stderr)  # fmt: skip
    return 0
