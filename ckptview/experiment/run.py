"""One run of an experiment: its catalog, its best serial and its row of the runs table."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ..catalog import Catalog

#: the runs table's columns (index ``run``)
RUN_COLUMNS = ["url", "layout", "n_serials", "latest", "latest_step", "best", "best_metric",
               "metric_name", "nbytes", "first_write", "last_write", "error"]  # fmt: skip
#: a metric a run is best at when it is lowest (when the tree records no best of its own)
LOSS_LIKE = re.compile(r"loss|perplexity|ppl|(^|[_/])err(or)?($|[_/])", re.I)
#: a metric of held-out data, preferred over a training one
HELD_OUT = re.compile(r"^(eval|val|valid|validation|test)[_/]", re.I)


# -- one run --------------------------------------------------------------------------------
@dataclass
class Run:
    """One run of an experiment: its catalog, or the error that kept it from opening."""

    name: str
    url: str
    catalog: Catalog | None = None
    layout: str | None = None
    error: str | None = None


def error_text(e: BaseException) -> str:
    text = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
    return f"{type(e).__name__}: {' '.join(text.split())}"[:300]


def best_of(cat: Catalog) -> tuple[int | None, float, str | None]:
    """The run's best serial, its metric value and the metric's name: the tree's own record
    (HF ``best_model_checkpoint``/``best_metric``, Lightning's best model) where it has one,
    else the loadable serial where a loss-like metric (held-out first) is lowest."""
    serials, attrs = cat.serials, cat.scan.attrs  # the layout's facts (``attrs`` adds warnings)
    best = attrs.get("best_serial")
    if best is not None and int(best) in serials.index:
        value = attrs.get("best_metric", attrs.get("best_model_score"))
        name = attrs.get("metric_for_best_model") or attrs.get("monitor") or "best_metric"
        return int(best), _float(value), str(name)
    metrics = cat.metrics
    if metrics.empty:
        return None, math.nan, None
    names = [n for n in metrics["name"].unique() if LOSS_LIKE.search(str(n))]
    if not names:
        return None, math.nan, None
    name = min(names, key=lambda n: (HELD_OUT.match(n) is None, len(n), n))
    loadable = serials.index[serials["loadable"]]
    rows = metrics[(metrics["name"] == name) & metrics["serial"].isin(loadable)]
    rows = rows[pd.to_numeric(rows["value"], errors="coerce").map(_finite)]
    if rows.empty:
        return None, math.nan, name
    i = rows["value"].astype("float64").idxmin()
    return int(rows.loc[i, "serial"]), float(rows.loc[i, "value"]), name


def _finite(x: Any) -> bool:
    return x is not None and not pd.isna(x) and math.isfinite(float(x))


def _float(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def run_row(run: Run) -> dict:
    """One row of the runs table, from the run's own catalog."""
    row: dict[str, Any] = dict.fromkeys(RUN_COLUMNS)
    row.update(url=run.url, layout=run.layout, error=run.error)
    cat = run.catalog
    if cat is None or run.error:
        return row
    try:
        s = cat.serials
        latest = cat.latest
        best, metric, name = best_of(cat)
        stamps = s["timestamp"].dropna()
        row.update(
            n_serials=len(s), latest=latest, best=best, best_metric=metric, metric_name=name,
            latest_step=None if latest is None else s.loc[latest, "step"],
            nbytes=int(s["nbytes"].sum()),
            first_write=stamps.min() if len(stamps) else pd.NaT,
            last_write=stamps.max() if len(stamps) else pd.NaT,
        )  # fmt: skip
    except Exception as e:  # noqa: BLE001 - a run that cannot be read is a row with error
        row["error"] = error_text(e)
    return row


def runs_frame(rows: dict[str, dict]) -> pd.DataFrame:
    df = pd.DataFrame.from_dict(rows, orient="index", columns=RUN_COLUMNS)
    df.index.name = "run"
    if df.empty:
        df.index = df.index.astype(object)
    for col in ("n_serials", "latest", "latest_step", "best", "nbytes"):
        df[col] = pd.array([None if pd.isna(v) else int(v) for v in df[col]], dtype="Int64")
    df["best_metric"] = df["best_metric"].astype("float64")
    for col in ("first_write", "last_write"):
        df[col] = pd.to_datetime(df[col], utc=True)
    return df
