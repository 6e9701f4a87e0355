"""The plots drawn on demand (HoloViews, bokeh backend): a histogram, a difference heatmap,
trajectories across serials. The Browse timeline, drawn for every page, is in :mod:`.figures`."""

from __future__ import annotations

import holoviews as hv
import holoviews.plotting.bokeh  # noqa: F401 - registers the bokeh backend's plot classes
import numpy as np
import pandas as pd

from .figures import integer_ticks

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
                        legend_position="right", xticks=integer_ticks(), xformatter="%d"),
    )  # fmt: skip
