"""The rules that read a health table: per-variable flags, per-serial verdicts, the first
serial of each anomaly and the serial to roll back to (DESIGN.md §3e)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable

import numpy as np
import pandas as pd

from ..scan.core import Scan
from .table import health

STATUSES = ("ok", "nonfinite", "spike", "frozen", "not_loadable")
SUMMARY_COLUMNS = ["status", "findings", "onset", "n_nonfinite", "n_spike", "n_frozen",
                   "loss_spike", "max_update_ratio", "loadable"]  # fmt: skip
MIN_UPDATES = 3  # a variable's update median needs this many finite update_rel values
LOSS_NAME = re.compile(r"loss", re.I)


def _names(keys: Iterable[tuple[str, str]], limit: int = 3) -> str:
    shown = [f"{n}/{name}" if n else name for n, name in sorted(keys)]
    more = len(shown) - limit
    return ", ".join(shown[:limit]) + (f" (+{more} more)" if more > 0 else "")


def variable_rules(h: pd.DataFrame, spike_factor: float = 10.0) -> pd.DataFrame:
    """Per variable row of ``h`` (same index): ``update_ratio`` (update_rel over the
    variable's own median of positive update_rel values, NaN with fewer than
    :data:`MIN_UPDATES`; a spike is a ratio above ``spike_factor`` that also exceeds every
    earlier update of the variable), ``l2_ratio`` (l2 over its previous serial's), and the flags
    ``nonfinite``, ``update_spike``, ``l2_jump`` and ``frozen`` (zero update for two serials
    after it had moved, flagged on each serial of the streak)."""
    out = pd.DataFrame(index=h.index)
    out["nonfinite"] = (h["n_nan"] + h["n_inf"]) > 0
    h = h.sort_values(["node", "name", "serial"], kind="stable")
    groups = h.groupby(["node", "name"], sort=False)
    u = h["update_rel"]
    finite_u = u.where(np.isfinite(u))

    def median_positive(s: pd.Series) -> float:
        s = s[np.isfinite(s)]
        if len(s) < MIN_UPDATES:
            return math.nan
        pos = s[s > 0]
        return float(pos.median()) if len(pos) else math.nan

    med = groups["update_rel"].transform(median_positive)
    ratio = finite_u / med
    out["update_median"] = med
    out["update_ratio"] = ratio
    # a jump: above the factor over the run's median AND above every earlier update of the
    # variable (training's large first updates, decaying after, are never a spike)
    earlier = finite_u.groupby([h["node"], h["name"]], sort=False).transform(
        lambda s: s.shift(1).cummax())
    out["update_spike"] = ((ratio > spike_factor) & (finite_u > earlier)).fillna(False).astype(bool)
    prev_l2 = groups["l2"].shift(1)
    l2_ratio = (h["l2"] / prev_l2.where(prev_l2 > 0)).astype("float64")
    out["l2_ratio"] = l2_ratio
    out["l2_jump"] = (l2_ratio > spike_factor).fillna(False).astype(bool)
    moved = (u > 0).fillna(False)
    had_moved = moved.groupby([h["node"], h["name"]], sort=False).cummax()
    zero = (u == 0).fillna(False)
    frozen = pd.Series(False, index=h.index)
    for _, idx in zero.groupby([h["node"], h["name"]], sort=False).groups.items():
        z = zero.loc[idx].to_numpy()
        before = had_moved.loc[idx].shift(1, fill_value=False).to_numpy()
        # a streak of zeros starting after a move; flagged when at least two long
        run_start = -1
        flags = np.zeros(len(z), bool)
        for j in range(len(z)):
            if z[j]:
                if run_start < 0:
                    run_start = j
                if j - run_start >= 1 and bool(before[run_start]):
                    flags[run_start : j + 1] = True
            else:
                run_start = -1
        frozen.loc[idx] = flags
    out["frozen"] = frozen
    return out


def _loss_spikes(metrics: pd.DataFrame, serial_index: list[int],
                 loss_factor: float) -> dict[int, list[str]]:  # fmt: skip
    """Serial -> the losses that spiked at or before it (since the serial before): a value
    that is not finite, or above ``loss_factor`` times the median of that loss's earlier
    values (at least two of them, median > 0)."""
    out: dict[int, list[str]] = {}
    if metrics is None or not len(metrics) or not serial_index:
        return out
    losses = metrics[[bool(LOSS_NAME.search(str(n))) for n in metrics["name"]]]
    ordered = np.asarray(sorted(serial_index))
    for name, df in losses.groupby("name", sort=True):
        df = df.sort_values("serial", kind="stable")
        values = df["value"].to_numpy(dtype=np.float64)
        for j, (s, x) in enumerate(zip(df["serial"], values)):
            earlier = values[:j][np.isfinite(values[:j])]
            med = float(np.median(earlier)) if len(earlier) >= 2 else math.nan
            if np.isfinite(x) and not (med > 0 and x > loss_factor * med):
                continue
            at = int(np.searchsorted(ordered, int(s), side="left"))
            if at < len(ordered):  # the first serial saved at or after the spike
                what = f"{name} = {x:.4g}" + ("" if not med > 0 else f" (median {med:.4g})")
                out.setdefault(int(ordered[at]), []).append(what)
    return out


def summarize(h: pd.DataFrame, serials: pd.DataFrame, metrics: pd.DataFrame | None,
              latest: int | None, spike_factor: float = 10.0,
              loss_factor: float = 3.0) -> pd.DataFrame:  # fmt: skip
    """The per-serial verdicts of a health table (see :func:`health_summary`)."""
    if spike_factor <= 1 or loss_factor <= 1:
        raise ValueError("spike_factor and loss_factor must be greater than 1")
    index = [int(s) for s in serials.index]
    empty = ["nonfinite", "update_spike", "l2_jump", "frozen", "update_ratio"]
    rules = variable_rules(h, spike_factor) if len(h) else pd.DataFrame(columns=empty)
    keys = list(zip(h["node"], h["name"]))
    by: dict[str, dict[int, set]] = {k: {} for k in ("nonfinite", "update_spike", "l2_jump",
                                                      "frozen")}  # fmt: skip
    for flag, found in by.items():
        for i in np.flatnonzero(rules[flag].to_numpy(dtype=bool)) if len(h) else []:
            found.setdefault(int(h["serial"].iat[i]), set()).add(keys[i])
    # frozen counts only while most other variables move
    measured = h[np.isfinite(h["update_rel"])]
    moving = (measured["update_rel"] > 0).groupby(measured["serial"]).mean()
    by["frozen"] = {s: v for s, v in by["frozen"].items() if moving.get(s, 0) > 0.5}
    ratio = rules["update_ratio"].groupby(h["serial"]).max() if len(h) else pd.Series()
    loss = _loss_spikes(metrics, index, loss_factor)
    loadable = serials["loadable"] if "loadable" in serials else pd.Series(True, index=index)
    onsets: dict[str, set[int]] = {
        "nonfinite": set(by["nonfinite"]), "update_spike": set(by["update_spike"]),
        "l2_jump": set(by["l2_jump"]), "loss_spike": set(loss), "frozen": set(by["frozen"]),
        "not_loadable": {s for s in index if not loadable.get(s, True)},
    }  # fmt: skip
    first: dict[str, int | None] = {k: min(v) if v else None for k, v in onsets.items()}
    diverged = [f for k in ("nonfinite", "update_spike", "l2_jump", "loss_spike")
                if (f := first[k]) is not None]  # fmt: skip
    divergence = min(diverged) if diverged else None
    complete = serials["complete"] if "complete" in serials else pd.Series(True, index=index)
    if divergence is None:
        rollback = latest
    else:
        ok = [s for s in index if s < divergence and bool(loadable.get(s, True))
              and bool(complete.get(s, True))]  # fmt: skip
        rollback = max(ok) if ok else None
    rows = []
    for s in index:
        text = []
        nonfinite = by["nonfinite"].get(s, set())
        spikes = by["update_spike"].get(s, set()) | by["l2_jump"].get(s, set())
        frozen = by["frozen"].get(s, set())
        if not bool(loadable.get(s, True)):
            text.append("not loadable")
        if nonfinite:
            text.append(f"NaN/inf in {len(nonfinite)}: {_names(nonfinite)}")
        if by["update_spike"].get(s):
            text.append(f"update spike (> {spike_factor:g}x median) in "
                        f"{len(by['update_spike'][s])}: {_names(by['update_spike'][s])}")  # fmt: skip
        if by["l2_jump"].get(s):
            text.append(f"l2 jump (> {spike_factor:g}x) in {len(by['l2_jump'][s])}: "
                        f"{_names(by['l2_jump'][s])}")  # fmt: skip
        if loss.get(s):
            text.append("loss spike: " + ", ".join(loss[s]))
        if frozen:
            text.append(f"frozen (no change for 2+ serials) {len(frozen)}: {_names(frozen)}")
        if not bool(loadable.get(s, True)):
            status = "not_loadable"
        elif nonfinite:
            status = "nonfinite"
        elif spikes or loss.get(s):
            status = "spike"
        elif frozen:
            status = "frozen"
        else:
            status = "ok"
        onset = [k for k, f in first.items() if f == s]
        r = ratio.get(s, math.nan)
        rows.append({"serial": s, "status": status, "findings": "; ".join(text) or None,
                     "onset": ", ".join(onset) or None, "n_nonfinite": len(nonfinite),
                     "n_spike": len(spikes), "n_frozen": len(frozen),
                     "loss_spike": bool(loss.get(s)),
                     "max_update_ratio": float(r) if pd.notna(r) else math.nan,
                     "loadable": bool(loadable.get(s, True))})  # fmt: skip
    table = pd.DataFrame(rows, columns=["serial", *SUMMARY_COLUMNS]).set_index("serial")
    table = table.astype({"n_nonfinite": "int64", "n_spike": "int64", "n_frozen": "int64",
                          "loss_spike": bool, "loadable": bool,
                          "max_update_ratio": "float64"})  # fmt: skip
    table.index = table.index.astype("int64")
    for col in ("findings", "onset"):
        table[col] = table[col].astype(object).where(table[col].notna(), None)
    table.attrs.update(first=first, divergence=divergence, rollback_point=rollback,
                       latest=latest, spike_factor=spike_factor, loss_factor=loss_factor,
                       top=top_spikes(h, rules))  # fmt: skip
    return table


def top_spikes(h: pd.DataFrame, rules: pd.DataFrame, n: int = 10) -> list[dict]:
    """The variables whose update jumped most over their own median (largest first): one
    record each (node, name, serial, update_rel, median, ratio)."""
    if not len(h):
        return []
    df = pd.DataFrame({"node": h["node"], "name": h["name"], "serial": h["serial"],
                       "update_rel": h["update_rel"], "median": rules["update_median"],
                       "ratio": rules["update_ratio"]})  # fmt: skip
    df = df[np.isfinite(df["ratio"])]
    df = df.sort_values("ratio", ascending=False, kind="stable")
    df = df.drop_duplicates(["node", "name"]).head(n)
    return [{"node": r.node, "name": r.name, "serial": int(r.serial),
             "update_rel": float(r.update_rel), "median": float(r.median),
             "ratio": float(r.ratio)} for r in df.itertuples(index=False)]  # fmt: skip


def health_summary(scan: Scan, spike_factor: float = 10.0, kinds: Iterable[str] | None = ("model",),
                   loss_factor: float = 3.0,
                   progress: Callable[[int, int], None] | None = None) -> pd.DataFrame:  # fmt: skip
    """Per serial: ``status`` (ok | nonfinite | spike | frozen | not_loadable), ``findings``,
    ``onset`` (the anomalies first seen at this serial), counts and ``max_update_ratio``;
    ``.attrs``: ``first`` (anomaly -> first serial), ``divergence``, ``rollback_point``,
    ``top`` (the variables with the largest update spikes). See docs/health.md."""
    h = health(scan, kinds=kinds, progress=progress)
    return summarize(h, scan.serials, scan.metrics, scan.latest, spike_factor, loss_factor)
