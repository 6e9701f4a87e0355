"""``ckptview ls URL``: the serials table; on stderr, what the verdicts found at tree level
(the framework's own resume pointer when it names another serial, files outside every
serial). ``--json`` adds a ``framework_latest`` column."""

from __future__ import annotations

import sys

from ckptview.fmt import serial_status

from . import _table as t
from ._common import add_open_args, emit_json, open_tree


def register(sub) -> None:
    p = sub.add_parser("ls", help="list the serials of a checkpoint tree")
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


def run(args) -> int:
    cat = open_tree(args)
    serials, attrs = cat.serials, cat.attrs
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
    return 0
