"""``ckptview export URL SERIAL --to DIR [--kinds model]``: a serial as consolidated
safetensors; by default its model weights only (``--kinds all``: every tensor)."""

from __future__ import annotations

import sys

from . import CLIError
from . import _table as t
from ._common import add_open_args, emit_json, guarded, open_tree, progress

SHOW_SKIPPED = 8


def register(sub) -> None:
    p = sub.add_parser("export", help="write a serial's tensors as consolidated safetensors")
    add_open_args(p)
    p.add_argument("serial", type=int, nargs="?", metavar="SERIAL",
                   help="the serial (default: the latest)")  # fmt: skip
    p.add_argument("--to", metavar="DIR", required=True, help="a new directory to write")
    p.add_argument("--max-shard-bytes", type=float, default=5 * 2**30, metavar="N",
                   help="shard above this many bytes per file (default 5 GiB)")  # fmt: skip
    p.add_argument("--name", action="append", dest="names", metavar="NAME",
                   help="export only this variable (repeatable)")  # fmt: skip
    p.add_argument("--kinds", default="model", metavar="KIND[,KIND]",
                   help="export variables of these kinds (the kind column of ckptview vars: "
                   "model, optimizer, trainer, scheduler, rng …) or 'all' (default: model, "
                   "the weights)")  # fmt: skip
    p.add_argument("--dequantize", action="store_true",
                   help="write quantized groups as float32 (default: as stored)")  # fmt: skip
    p.add_argument("--force", action="store_true",
                   help="export a serial that does not load, leaving out what cannot be read")  # fmt: skip
    p.add_argument("--dry-run", action="store_true", help="print the plan only")
    p.set_defaults(func=guarded(run))


def run(args) -> int:
    cat = open_tree(args)
    kinds = parse_kinds(args.kinds)
    kw = dict(to=args.to, names=args.names, max_shard_bytes=int(args.max_shard_bytes),
              dequantize=args.dequantize, force=args.force, kinds=kinds)  # fmt: skip
    plan = cat.export(args.serial, dry_run=True, **kw)
    left_out(cat, plan.serial, kinds)
    if args.dry_run:
        _show(plan, args.json)
        return 0
    with progress(plan.nbytes, "export", args=args) as bar:
        result = cat.export(args.serial, progress=bar.update, **kw)
    _show(result, args.json)
    return 0


def parse_kinds(text: str) -> list[str] | None:
    """``model,optimizer`` -> the kinds; ``all`` -> None (every kind)."""
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    if not kinds:
        raise CLIError("--kinds needs a kind (model, optimizer, …) or all")
    return None if "all" in kinds else kinds


def left_out(cat, serial: int, kinds: list[str] | None) -> None:
    """One stderr line: how many variables of which other kinds the export leaves out."""
    if kinds is None:
        return
    v = cat.variables
    rest = v[(v["serial"] == serial) & ~v["kind"].isin(kinds)]["kind"].value_counts()
    if len(rest):
        counts = ", ".join(f"{k} {n}" for k, n in rest.items())
        print(f"left out {int(rest.sum())} variable(s) of other kinds ({counts}): "
              "--kinds all (or a list) exports them", file=sys.stderr)  # fmt: skip


def _show(result, as_json: bool) -> None:
    if as_json:
        emit_json(result)
        return
    t.render(result.files, [t.Col("file", fit=t.CUT), t.Col("n_tensors", "tensors", t.integer, right=True),
                            t.Col("nbytes", "size", t.size, right=True)],
             title=result.headline(), empty="no files")  # fmt: skip
    if len(result.skipped):
        print(f"skipped {len(result.skipped)} (not numeric tensors, or unreadable):",
              file=sys.stderr)  # fmt: skip
        for row in result.skipped.head(SHOW_SKIPPED).itertuples():
            print(f"  {row.name}{' @' + row.node if row.node else ''}: {row.reason}",
                  file=sys.stderr)  # fmt: skip
