"""``ckptview retain URL [policy flags] [--save] [--apply --yes]``: plan or apply retention.

On an experiment directory (DESIGN.md §3d) one plan covers every run: ``--budget 2TB``
deletes oldest first across runs (never a run's newest loadable serial, its best or its
pins) until the experiment fits."""

from __future__ import annotations

import sys

from ckptview.changes.lock import break_lock
from ckptview.engine.policies import describe_policy, make_policy
from ckptview.fmt import human_bytes

from . import CLIError
from . import _table as t
from ._common import add_open_args, emit_json, guarded, open_tree, progress


def register(sub) -> None:
    p = sub.add_parser("retain", help="plan retention (and with both --apply and --yes, apply "
                       "it)")  # fmt: skip
    add_open_args(p)
    p.add_argument("--keep-last", type=int, metavar="N", help="keep the N newest complete")
    p.add_argument("--keep-every", type=int, metavar="K", help="keep serials divisible by K")
    p.add_argument("--every-by", choices=("serial", "step"), default="serial",
                   help="what --keep-every divides: the serial number (default) or the "
                   "training step")  # fmt: skip
    p.add_argument("--keep-best", metavar="METRIC:N[:min|max]", help="keep the N best")
    p.add_argument("--pin", type=int, action="append", default=[], metavar="SERIAL",
                   help="always keep this serial (repeatable)")  # fmt: skip
    p.add_argument("--older-than", metavar="DURATION",
                   help="keep every serial written within DURATION (7d, 12h); older ones may "
                   "be deleted unless another flag keeps them")  # fmt: skip
    p.add_argument("--slim-older-than", metavar="DURATION",
                   help="delete the optimizer state of kept serials older than this (7d), "
                   "keeping their weights; never the newest loadable serial")  # fmt: skip
    p.add_argument("--budget", metavar="SIZE",
                   help="an experiment directory: delete oldest first across runs until the "
                   "runs fit SIZE (2TB, 500GB)")  # fmt: skip
    p.add_argument("--save", action="store_true", help="store these flags as the tree's policy")
    p.add_argument("--apply", action="store_true",
                   help="delete (and slim) what the plan says; needs --yes too")  # fmt: skip
    p.add_argument("--yes", action="store_true",
                   help="confirm --apply (either flag alone only prints the plan)")  # fmt: skip
    p.add_argument("--break-lock", action="store_true", help="remove a lock left by a crash")
    p.set_defaults(func=guarded(run))


PLAN_COLUMNS = [
    t.Col("serial", right=True),
    t.Col("action"),
    t.Col("nbytes", "size", t.size, right=True),
    t.Col("frees", fmt=t.size, right=True, drop=2),
    t.Col("timestamp", "written (UTC)", t.when, drop=1),
    t.Col("step", fmt=t.integer, right=True, optional=True, drop=3),
    t.Col("reason", fit=t.FOLD),
]
DONE_COLUMNS = [
    t.Col("serial", right=True),
    t.Col("action"),
    t.Col("nbytes", "freed", t.size, right=True),
    t.Col("steps", right=True),
]


EXP_COLUMNS = [
    t.Col("run", fit=t.FOLD),
    t.Col("serial", right=True),
    t.Col("action"),
    t.Col("nbytes", "size", t.size, right=True),
    t.Col("timestamp", "written (UTC)", t.when, drop=1),
    t.Col("reason", fit=t.FOLD),
]


def confirmed(args) -> bool:
    """Deletion needs both ``--apply`` and ``--yes``; either alone prints the plan."""
    return bool(args.apply and args.yes)


def plan_only_hint(args) -> str:
    """What to add to the command line to apply the plan."""
    missing = [f for f, given in (("--apply", args.apply), ("--yes", args.yes)) if not given]
    return f" (plan only: add {' '.join(missing)} to do it)"


def run_experiment(args, exp) -> int:
    """One plan for every run of an experiment; applied run by run with ``--apply --yes``."""
    policy = make_policy(args.keep_last, args.keep_every, args.keep_best, (), args.older_than,
                         args.every_by)  # fmt: skip
    pins: list[int] = list(args.pin)
    plan = exp.plan_retention(args.budget, policy=policy if policy else None, pinned=pins,
                              slim_older_than=args.slim_older_than)  # fmt: skip
    n_del = int(plan["action"].isin(["delete", "slim"]).sum()) if len(plan) else 0
    freed = int(plan["frees"].sum()) if len(plan) else 0
    a = plan.attrs
    fits = "" if a["budget"] is None else (
        f"; {human_bytes(a['after'])} after, budget {human_bytes(a['budget'])}"
        + ("" if a["fits"] else " (NOT met: the rest is protected)"))  # fmt: skip
    if not confirmed(args) or n_del == 0:
        if args.json:
            emit_json(plan)
        else:
            t.render(plan.reset_index(), EXP_COLUMNS,
                     title=f"retention plan for experiment {exp.root}", empty="no serials")  # fmt: skip
        print(f"{len(exp)} runs, {human_bytes(a['total'])}: would delete {n_del} serial(s), "
              f"freeing {human_bytes(freed)}{fits}"
              + ("" if n_del == 0 else plan_only_hint(args)), file=sys.stderr)  # fmt: skip
        return 0
    with progress(n_del, "retain", unit="serial", args=args) as bar:
        result = exp.apply_retention(plan, progress=bar.update)
    if args.json:
        emit_json(result)
    else:
        done = result.deleted.reset_index()
        t.render(done, [t.Col("run", fit=t.FOLD), *DONE_COLUMNS], title=result.headline())
    if result.errors:
        raise CLIError("; ".join(f"{run}: {why}" for run, why in result.errors.items()))
    return 0


def run(args) -> int:
    from .ls import experiment

    exp = None if args.save or args.break_lock else experiment(args)
    if exp is not None:
        return run_experiment(args, exp)
    if args.budget is not None:
        raise CLIError("--budget needs an experiment: a directory of several runs")
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
    if not confirmed(args) or n_del + n_slim == 0:
        if args.json:
            emit_json(plan)
        else:
            t.render(plan.reset_index(), PLAN_COLUMNS, title=f"retention plan for {cat.url}",
                     empty="no serials")  # fmt: skip
        what = f"would delete {n_del} serial(s)" + (f", slim {n_slim}" if n_slim else "")
        print(f"policy: {describe_policy(policy)}; {what}, freeing {human_bytes(freed)}"
              + ("" if n_del + n_slim == 0 else plan_only_hint(args)),
              file=sys.stderr)  # fmt: skip
        return 0
    with progress(n_del + n_slim, "retain", unit="serial", args=args) as bar:
        result = cat.apply_retention(plan, progress=bar.update)
    if args.json:
        emit_json(result)
    else:
        done = result.deleted.reset_index()
        done["path"] = [t.relative_to(cat.url)(p) for p in done["path"]]
        t.render(done, [*DONE_COLUMNS[:2], t.Col("path", fit=t.CUT), *DONE_COLUMNS[2:]],
                 title=result.headline())  # fmt: skip
    return 0
