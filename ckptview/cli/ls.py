"""``ckptview ls URL``: the serials table; on stderr, what the verdicts found at tree level
(the framework's own resume pointer when it names another serial, files outside every
serial, install hints whole, directories it may not read: then exit 1). ``--json`` adds a
``framework_latest`` column.

A directory whose runs are below it (an experiment) prints the runs table
instead: one row per run, never one merged run."""

from __future__ import annotations

import sys

import pandas as pd

from ckptview.fmt import serial_status
from ckptview.scan.access import denied_message, touches, unreadable_dirs

from . import _table as t
from ._common import add_open_args, emit_json, missing_extras, open_tree, progress


def register(sub) -> None:
    p = sub.add_parser("ls", help="list the serials of a checkpoint tree (the runs of an "
                       "experiment directory)")  # fmt: skip
    add_open_args(p)
    p.set_defaults(func=run)


def columns(root: str) -> list[t.Col]:
    """The serials table as the terminal shows it (``cat.serials`` plus a ``status``)."""
    return [
        t.Col("serial", right=True),
        t.Col("status"),
        t.Col("timestamp", "written (UTC)", t.when, drop=2),
        t.Col("nbytes", "size", t.size, right=True),
        t.Col("n_files", "files", t.integer, right=True, drop=4),
        t.Col("n_variables", "vars", t.integer, right=True, drop=5),
        t.Col("epoch", fmt=t.integer, right=True, optional=True, drop=3),
        t.Col("step", fmt=t.integer, right=True, optional=True),
        t.Col("nodes", fmt=t.listed, fit=t.CUT, optional=True, drop=6),
        t.Col("path", fmt=t.relative_to(root), fit=t.CUT, drop=1),
        t.Col("error", fit=t.CUT, optional=True),
        t.Col("warning", fit=t.CUT, optional=True),
    ]


RUN_COLUMNS = [
    t.Col("run", fit=t.FOLD),
    t.Col("layout", fit=t.CUT, drop=3),
    t.Col("n_serials", "serials", t.integer, right=True, drop=4),
    t.Col("latest", fmt=t.integer, right=True),
    t.Col("latest_step", "step", t.integer, right=True, drop=2),
    t.Col("best", fmt=t.integer, right=True, optional=True),
    t.Col("best_metric", "metric", t.number, right=True, optional=True, drop=5),
    t.Col("nbytes", "size", t.size, right=True),
    t.Col("last_write", "last write (UTC)", t.when, drop=1),
    t.Col("error", fit=t.CUT, optional=True),
]


def experiment(args):
    """The experiment at ``args.url`` (None for one tree, or with ``--layout``)."""
    if getattr(args, "layout", None):
        return None
    from ckptview.experiment import experiment_at

    bar = None

    def tick(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = progress(total, "runs", unit="run", args=args)
        bar.update(done - bar.n)
        if done >= total:
            bar.close()

    return experiment_at(args.url, progress=tick)


def show_runs(args, exp) -> int:
    """The runs table (``--json``: every column), stray files on stderr."""
    table = exp.runs
    if args.json:
        emit_json(table)
    else:
        shown = table.reset_index()
        shown["nbytes"] = shown["nbytes"].astype("float64")
        errors = int(table["error"].notna().sum())
        title = (f"{len(table)} runs" + (f" ({errors} with errors)" if errors else "")
                 + f" in experiment {exp.root}")  # fmt: skip
        t.render(shown, RUN_COLUMNS, title=title, empty="no runs")
    for f in exp.attrs.get("stray", []):
        print(f"warning: {f} is in no run", file=sys.stderr)
    return 0


def with_denied(serials: pd.DataFrame, denied: list[str], root: str) -> pd.DataFrame:
    """The serials table with the error of each serial inside (or holding) a directory this
    process may not read saying so, instead of what the missing files imply."""
    if not denied:
        return serials
    out = serials.copy()
    for serial, path in out["path"].items():
        hit = [d for d in denied if touches(d, path)]
        if hit:
            out.loc[serial, "error"] = f"permission denied: {t.relative_to(root)(hit[0])}"
            out.loc[serial, ["complete", "loadable"]] = False
    return out


def run(args) -> int:
    exp = experiment(args)
    if exp is not None:
        return show_runs(args, exp)
    cat = open_tree(args)
    denied = unreadable_dirs(cat.tree)
    serials, attrs = with_denied(cat.serials, denied, cat.url), cat.attrs
    pointer = attrs.get("framework_latest", "absent")
    if args.json:
        emit_json(serials.assign(framework_latest=serials.index == pointer))
    else:
        shown = serials.reset_index()
        shown.insert(1, "status", [serial_status(r) for _, r in shown.iterrows()])
        hidden = t.render(shown, columns(cat.url), title=f"{cat.layout}: {cat.url}",
                          empty="no serials")  # fmt: skip
        if {"error", "warning"} & set(hidden):
            print("(messages cut to fit: ckptview verify, or ls --json, shows them whole)",
                  file=sys.stderr)  # fmt: skip
    if "framework_latest" in attrs:
        named = f"serial {pointer}" if pointer is not None else "no loadable serial"
        print(f"warning: the framework's own pointer names {named}; ckptview's latest "
              f"(the newest serial that loads) is {cat.latest}", file=sys.stderr)  # fmt: skip
    for w in attrs.get("warnings", []):
        print(f"warning: {w}", file=sys.stderr)
    for hint in missing_extras(serials["error"]):
        print(f"error: {hint}", file=sys.stderr)
    for d in denied:
        print(f"error: {denied_message(d)}", file=sys.stderr)
    return 1 if denied else 0
