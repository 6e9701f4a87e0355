"""HoloViews plots used by the widgets (bokeh backend)."""

from __future__ import annotations

import holoviews as hv
import holoviews.plotting.bokeh  # noqa: F401 - registers the bokeh backend's plot classes
import numpy as np
import pandas as pd

from ._format import STATUS_COLORS

hv.Store.set_current_backend("bokeh")

PLOT = dict(responsive=True, height=260, tools=["hover"], toolbar="above", default_tools=[])


def empty(message: str = "nothing to plot") -> hv.Element:
    """A blank plot carrying a title (a pane is never left without content)."""
    return hv.Curve([]).opts(title=message, responsive=True, height=200, toolbar=None)


def histogram(counts: np.ndarray, edges: np.ndarray, title: str, color: str = "#1565c0",
              kdim: str = "value"):  # fmt: skip
    """A histogram from precomputed ``counts`` and bin ``edges``."""
    if len(counts) == 0:
        return empty(f"{title}: no finite values")
    return hv.Histogram((edges, counts), kdims=[kdim], vdims=["count"]).opts(
        title=title, color=color, line_color=None, xformatter="%.3g", xticks=5, **PLOT
    )


def heatmap(values: np.ndarray, title: str):
    """A 2-D array as an image (diverging colours centred on zero)."""
    values = np.asarray(values, dtype=np.float64)
    h, w = values.shape
    lim = float(np.nanmax(np.abs(values))) if values.size else 1.0
    lim = lim or 1.0
    img = hv.Image(values[::-1], bounds=(0, 0, w, h), kdims=["column", "row"], vdims=["delta"])
    return img.opts(title=title, cmap="RdBu_r", clim=(-lim, lim), colorbar=True, **PLOT)


def _integer_ticks():
    """Ticks on whole numbers only (a serial, a step or a count is never 3.5)."""
    from bokeh.models import BasicTicker

    return BasicTicker(min_interval=1, desired_num_ticks=8)


def _around(values: pd.Series, integer: bool) -> tuple[float, float]:
    """Axis limits for a single value: itself in the middle (a whole number: its own tick
    only), never a bare −1..1."""
    v = float(values.iloc[0])
    if integer:
        return v - 0.5, v + 0.5
    half = abs(v) * 0.1 or 1.0
    return v - half, v + half


def timeline(frame: pd.DataFrame, x: str, y: str, ylabel: str, title: str,
             integer_y: bool = False):  # fmt: skip
    """Serials over ``x`` (step or serial): a line plus status-coloured points.

    ``x`` (and ``y`` when ``integer_y``) is ticked on whole numbers; one point is centred on
    axes around its own values."""
    extra = [] if x == "serial" else ["serial"]
    data = frame[list(dict.fromkeys([x, y, "serial", "status"]))].dropna(subset=[x, y])
    if data.empty:
        return empty(f"{title}: no values")
    data = data.astype({x: "float64", y: "float64"})
    curve = hv.Curve(data, x, [y, *extra]).opts(color="#90a4ae")
    points = hv.Scatter(data, x, [y, *extra, "status"]).opts(
        color=hv.dim("status").categorize(STATUS_COLORS, default="#455a64"), size=9,
        tools=["hover"],
    )  # fmt: skip
    opts = dict(title=title, ylabel=ylabel, xlabel=x, responsive=True, height=240,
                padding=0.08, xticks=_integer_ticks(), xformatter="%d")  # fmt: skip
    if integer_y:
        opts.update(yticks=_integer_ticks(), yformatter="%d")
    if data[x].nunique() == 1:
        opts["xlim"] = _around(data[x], integer=True)
    if data[y].nunique() == 1:
        opts["ylim"] = _around(data[y], integer=integer_y)
    return (curve * points).opts(**opts)


def trajectories(series: list[pd.Series], stat: str):
    """One curve per variable: ``stat`` across serials."""
    if not series:
        return empty("pick one or more variables")
    curves = [
        hv.Curve((s.index.to_numpy(), s.to_numpy()), "serial", stat, label=str(s.name))
        * hv.Scatter((s.index.to_numpy(), s.to_numpy()), "serial", stat, label=str(s.name))
        for s in series
    ]
    return hv.Overlay(curves).opts(
        hv.opts.Curve(tools=["hover"]), hv.opts.Scatter(size=6, tools=["hover"]),
        hv.opts.Overlay(title=f"{stat} across serials", responsive=True, height=320,
                        legend_position="right", xticks=_integer_ticks(), xformatter="%d"),
    )  # fmt: skip


KIND_COLORS = {"model": "#1565c0", "optimizer": "#c62828", "scheduler": "#6a1b9a",
               "trainer": "#2e7d32", "rng": "#b26a00", "other": "#90a4ae"}  # fmt: skip


def usage_bars(usage: pd.DataFrame):
    """``cat.usage()`` as bars over serials stacked by kind (MiB): why a checkpoint is big."""
    if usage.empty:
        return empty("bytes by kind: no serials")
    long = usage.rename_axis("serial").reset_index().melt("serial", var_name="kind",
                                                           value_name="bytes")  # fmt: skip
    long["serial"] = long["serial"].astype(str)
    long["MiB"] = long["bytes"].astype("float64") / 2**20
    kinds = list(usage.columns)
    colors = [KIND_COLORS.get(k, "#455a64") for k in kinds]
    bars = hv.Bars(long, ["serial", "kind"], ["MiB", "bytes"])
    return bars.opts(stacked=True, cmap=colors, title="serials: bytes by kind", ylabel="MiB",
                     xlabel="serial", legend_position="right", **PLOT)  # fmt: skip
