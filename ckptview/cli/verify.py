"""``ckptview verify URL [SERIAL...] [--deep] [--json]``: what could keep a serial from loading.

Exit 0 when clean, 1 on findings (errors or warnings), 2 on a usage error."""

from __future__ import annotations

from . import CLIError
from . import _table as t
from ._common import add_open_args, emit_json, open_tree


def register(sub) -> None:
    p = sub.add_parser("verify", help="check serials: headers, byte ranges, indexes, checksums")
    add_open_args(p)
    p.add_argument("serials", nargs="*", type=int, metavar="SERIAL", help="default: every serial")
    p.add_argument("--deep", action="store_true",
                   help="also read every value (NaN/inf) and check the zip CRC-32s")  # fmt: skip
    p.set_defaults(func=run)


def run(args) -> int:
    cat = open_tree(args)
    try:
        findings = cat.verify(args.serials or None, deep=args.deep)
    except KeyError as e:
        raise CLIError(e.args[0]) from None
    if args.json:
        emit_json(findings)
    elif len(findings):
        cols = [t.Col("serial", fmt=t.integer, right=True), t.Col("severity"), t.Col("check"),
                t.Col("file", fmt=t.relative_to(cat.url), fit=t.CUT, drop=1),
                t.Col("message", fit=t.FOLD)]  # fmt: skip
        t.render(findings, cols, title=f"{cat.layout}: {cat.url}: {len(findings)} finding(s)")
    else:
        checked = args.serials or list(cat.serials.index)
        print(f"{len(checked)} serial(s) checked{' (deep)' if args.deep else ''}: no findings")
    return 1 if len(findings) else 0
