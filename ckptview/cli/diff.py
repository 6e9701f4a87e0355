"""``ckptview diff URL A B [--other URL]``: variable-by-variable numeric diff, biggest change
first (the order of ``cat.diff`` and of the dashboard)."""

from __future__ import annotations

import math
import sys

import pandas as pd

from ckptview.engine.diff import describe_pairing, rename_prefixes
from ckptview.fmt import fmt_shape

from . import _table as t
from ._common import add_open_args, emit_json, open_tree, progress


def register(sub) -> None:
    p = sub.add_parser("diff", help="compare two serials variable by variable")
    add_open_args(p)
    p.add_argument("a", type=int, metavar="SERIAL_A", help="serial A")
    p.add_argument("b", type=int, metavar="SERIAL_B",
                   help="serial B (of --other when given)")  # fmt: skip
    p.add_argument("--other", metavar="URL", help="a second tree (cross-run diff)")
    p.add_argument("--other-layout", help="force the second tree's layout")
    p.add_argument("--name", action="append", help="only this variable (repeatable)")
    p.add_argument("--exact", action="store_true", help="pair by (node, name) only")
    p.add_argument("--match", choices=("auto", "exact"), default=None,
                   help="how tensors pair (default auto: also across nodes, then by logical "
                   "name with container prefixes model/ module. _orig_mod. model. stripped)")
    p.add_argument("--rename", action="append", default=[], metavar="OLD=NEW",
                   help="B's names starting with OLD are paired as starting with NEW "
                   "(repeatable)")  # fmt: skip
    p.add_argument("--changed", action="store_true", help="hide identical variables")
    p.set_defaults(func=run)


COLUMNS = [
    t.Col("status"),
    t.Col("name", fit=t.FOLD),
    t.Col("node", fit=t.CUT, optional=True),
    t.Col("shape", drop=3),
    t.Col("rel_l2", fmt=t.number, right=True),
    t.Col("l2", fmt=t.number, right=True, drop=4),
    t.Col("max_abs", fmt=t.number, right=True),
    t.Col("cosine", fmt=t.number, right=True, drop=1),
    t.Col("error", fit=t.FOLD, optional=True),
]


def _shape(a, b) -> str:
    if a is None or b is None:
        return fmt_shape(a if b is None else b) if (a, b) != (None, None) else ""
    return fmt_shape(a) if tuple(a) == tuple(b) else f"{fmt_shape(a)} → {fmt_shape(b)}"


#: the numeric columns JSON cannot hold when infinite (they become null there)
FLOAT_COLUMNS = ("max_abs", "l2", "rel_l2", "cosine", "norm_a", "norm_b")


def json_notes(df: pd.DataFrame) -> list[str | None]:
    """Per row, why a number is null in JSON: an infinite value (JSON has no infinity; the
    table shows ``inf``) or a cosine that is undefined because one side is all zeros."""
    notes: list[str | None] = []
    for row in df.to_dict("records"):
        parts = []
        for col in FLOAT_COLUMNS:
            v = row.get(col)
            if isinstance(v, float) and math.isinf(v):
                why = ": serial A is all zeros and B is not" if col == "rel_l2" else ""
                parts.append(f"{col} is {'-' if v < 0 else ''}infinite (null in JSON){why}")
        zero = [s for s in ("a", "b") if row.get(f"norm_{s}") == 0]
        if zero and not row.get("error") and pd.isna(row.get("cosine")):
            parts.append(f"cosine is undefined: serial {zero[0].upper()} is all zeros")
        notes.append("; ".join(parts) or None)
    return notes


def run(args) -> int:
    cat = open_tree(args)
    other = open_tree(args, args.other, args.other_layout) if args.other else None
    vars_a = cat.variables
    total = int(vars_a.loc[vars_a["serial"] == args.a, "nbytes"].sum()) * 2
    with progress(total, "diff", args=args) as bar:
        match = "exact" if args.exact else args.match
        df = cat.diff(args.a, args.b, other, args.name, match=match,
                      rename=rename_prefixes(args.rename) if args.rename else None,
                      progress=bar.update)  # fmt: skip
    pairing = df.attrs.get("pairing")
    if pairing and (pairing.get("logical") or pairing.get("across_nodes")):
        print(describe_pairing(pairing), file=sys.stderr)
    if args.changed:
        df = df[df["status"] != "identical"]
    if args.json:
        emit_json(df.assign(note=json_notes(df)))
        return 0
    shown = df.assign(shape=[_shape(a, b) for a, b in zip(df["shape_a"], df["shape_b"])])
    b = f"{other.url} serial {args.b}" if other is not None else f"serial {args.b}"
    counts = shown["status"].value_counts()
    tally = ", ".join(f"{n} {s}" for s, n in counts.items())
    t.render(shown, COLUMNS, title=f"{cat.url} serial {args.a} -> {b}: {tally or 'nothing'}",
             empty="no differences" if args.changed else "no variables")  # fmt: skip
    return 0
