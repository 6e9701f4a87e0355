"""``ckptview health URL [--spectral] [--json]``: where a run went wrong, and the serial to
roll back to (DESIGN.md §3e, docs/health.md).

Exit 0 when healthy, 1 with findings, 2 on a usage error."""

from __future__ import annotations

import math

import pandas as pd

from ckptview.changes.result import records
from ckptview.fmt import missing

from . import CLIError
from . import _table as t
from ._common import add_open_args, emit_json, open_tree, progress


def register(sub) -> None:
    p = sub.add_parser("health", help="health over serials: NaN/inf, spikes, the rollback point")
    add_open_args(p)
    p.add_argument("--spectral", action="store_true",
                   help="also the largest singular value and power-law alpha of 2-D weights")  # fmt: skip
    p.add_argument("--spike-factor", type=float, default=10.0,
                   help="an update this many times a variable's median is a spike (default 10)")  # fmt: skip
    p.add_argument("--kind", action="append",
                   help="variable kinds judged (repeatable; default: model)")  # fmt: skip
    p.set_defaults(func=run)


class _Bar:
    """``progress(done, total)`` as a tqdm bar of variables measured."""

    def __init__(self, args):
        self.args, self.bar = args, None

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            if not total:
                return
            self.bar = progress(total, "health", unit="var", args=self.args)
        self.bar.update(done - self.bar.n)
        if done >= total:
            self.bar.close()


def _ratio(x) -> str:
    return "" if missing(x) or not math.isfinite(float(x)) else f"{float(x):.3g}x"


SERIAL_COLUMNS = [
    t.Col("serial", fmt=t.integer, right=True),
    t.Col("status"),
    t.Col("max_update_ratio", "upd/med", _ratio, right=True, drop=2),
    t.Col("findings", fit=t.FOLD, optional=True),
]
TOP_COLUMNS = [
    t.Col("name", fit=t.FOLD),
    t.Col("node", fit=t.CUT, optional=True),
    t.Col("serial", fmt=t.integer, right=True),
    t.Col("update_rel", "update", t.number, right=True),
    t.Col("median", fmt=t.number, right=True, drop=1),
    t.Col("ratio", fmt=_ratio, right=True),
]


def run(args) -> int:
    if not args.spike_factor > 1:
        raise CLIError("--spike-factor must be greater than 1")
    cat = open_tree(args)
    kinds = tuple(args.kind) if args.kind else ("model",)
    bar = _Bar(args)
    summary = cat.health_summary(args.spike_factor, kinds, progress=bar)
    table = cat.health(spectral=True, kinds=kinds) if args.spectral else None
    a = summary.attrs
    findings = bool((summary["status"] != "ok").any())
    if args.json:
        doc = {"url": cat.url, "layout": cat.layout, "healthy": not findings,
               "rollback_point": a["rollback_point"], "latest": a["latest"],
               "divergence": a["divergence"], "first": a["first"],
               "spike_factor": a["spike_factor"], "top": a["top"],
               "serials": summary.reset_index()}  # fmt: skip
        if table is not None:
            doc["spectral"] = table[["serial", "node", "name", "sigma_max", "alpha"]].dropna(
                subset=["sigma_max"]
            )
        emit_json(_jsonable(doc))
        return 1 if findings else 0
    out = t.console()
    out.print(f"{cat.layout}: {cat.url}: {len(summary)} serial(s)", overflow="fold")
    first = {k: v for k, v in a["first"].items() if v is not None}
    if a["divergence"] is None:
        out.print("no divergence: healthy", overflow="fold")
    else:
        kinds_at = [k for k, v in first.items() if v == a["divergence"]]
        out.print(f"first divergence: serial {a['divergence']} ({', '.join(kinds_at)})",
                  overflow="fold")  # fmt: skip
    others = {k: v for k, v in first.items() if v != a["divergence"]}
    if others:
        out.print("first seen: " + ", ".join(f"{k} at {v}" for k, v in others.items()),
                  overflow="fold")  # fmt: skip
    rb = a["rollback_point"]
    out.print(f"rollback point: {rb if rb is not None else 'none (no loadable serial before)'}"
              + (" (latest)" if rb is not None and rb == a["latest"] else ""),
              overflow="fold")  # fmt: skip
    shown = summary.reset_index()
    if len(shown) > 40:  # the serials with findings, and the first and last few
        keep = (shown["status"] != "ok") | (shown.index < 3) | (shown.index >= len(shown) - 3)
        shown = shown[keep]
    t.render(shown, SERIAL_COLUMNS, title=None, empty="no serials")
    spikes = pd.DataFrame(a["top"])
    if len(spikes) and (spikes["ratio"] > 1).any():
        t.render(spikes.head(5), TOP_COLUMNS, title="top variables by update spike")
    if table is not None:
        spec = table.dropna(subset=["sigma_max"])
        if len(spec):
            last = spec[spec["serial"] == spec["serial"].max()]
            cols = [t.Col("name", fit=t.FOLD), t.Col("node", fit=t.CUT, optional=True),
                    t.Col("sigma_max", "sigma_max", t.number, right=True),
                    t.Col("alpha", fmt=t.number, right=True)]  # fmt: skip
            t.render(last, cols, title=f"spectra at serial {int(last['serial'].iloc[0])}")
    return 1 if findings else 0


def _jsonable(doc: dict) -> dict:
    return {k: records(v) if isinstance(v, pd.DataFrame) else v for k, v in doc.items()}
