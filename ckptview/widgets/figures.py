"""The Browse tab's timeline as plain Bokeh figures.

Every served page draws one, so it is built straight in Bokeh: a HoloViews pane of the same
plot cost ~4× the server time and ~2× the models per page. The plots drawn on demand (the
histogram, the difference heatmap, trajectories) stay in :mod:`.plots`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from bokeh.models import (
    BasicTicker,
    ColumnDataSource,
    CustomJS,
    HoverTool,
    Legend,
    PrintfTickFormatter,
)
from bokeh.plotting import figure

from ._format import STATUS_COLORS

TOOLS = "pan,wheel_zoom,box_zoom,reset,save"
KIND_COLORS = {"model": "#1565c0", "optimizer": "#c62828", "scheduler": "#6a1b9a",
               "trainer": "#2e7d32", "rng": "#b26a00", "other": "#90a4ae"}  # fmt: skip
OTHER_COLOR = "#455a64"


#: BokehJS lays out every plot below a container that resizes (``PlotView._measure_layout``
#: and ``_after_layout``), even a plot view built but not drawn yet, which has no layout: a tab
#: of ``panel_material_ui.Tabs(dynamic=True)`` shown again (Compare -> Browse) builds its
#: content's views at once and draws them a moment later, and the tabs resizing in between
#: threw "Cannot read properties of undefined (reading 'top_panel')" (panel-material-ui issue
#: 548). Once a plot has been laid out, this makes both skip a plot not drawn yet (drawing a
#: plot lays it out anyway).
LAYOUT_GUARD_JS = """
for (const name of ["_measure_layout", "_after_layout"]) {
  let base = cb_obj.default_view && cb_obj.default_view.prototype;
  while (base && !Object.prototype.hasOwnProperty.call(base, name)) {
    base = Object.getPrototypeOf(base);
  }
  const original = base && base[name];
  if (original && !original._ckptview_guarded) {
    const guarded = function () {
      if (this.layout != null) return original.call(this);
    };
    guarded._ckptview_guarded = true;
    base[name] = guarded;
  }
}
"""


def guard_layout(fig) -> None:
    """Make ``fig`` install :data:`LAYOUT_GUARD_JS` in the page once it is laid out."""
    fig.js_on_change("inner_width", CustomJS(code=LAYOUT_GUARD_JS))


def _figure(title: str, xlabel: str, ylabel: str, height: int = 240, **kw) -> figure:
    kw.setdefault("toolbar_location", "above")
    fig = figure(title=title, x_axis_label=xlabel, y_axis_label=ylabel, height=height,
                 sizing_mode="stretch_width", tools=TOOLS, **kw)  # fmt: skip
    guard_layout(fig)
    return fig


def blank(message: str) -> figure:
    """An empty plot carrying ``message`` as its title (a pane never shows nothing)."""
    fig = _figure(message, "", "", height=200, toolbar_location=None)
    fig.scatter([], [])  # a renderer: Bokeh warns about a figure without one
    return fig


def integer_ticks() -> BasicTicker:
    """Ticks on whole numbers only (a serial, a step or a count is never 3.5)."""
    return BasicTicker(min_interval=1, desired_num_ticks=8)


def around(value: float, integer: bool) -> tuple[float, float]:
    """Axis limits for a single value: itself in the middle (a whole number: its own tick
    only), never a bare −1..1."""
    if integer:
        return value - 0.5, value + 0.5
    half = abs(value) * 0.1 or 1.0
    return value - half, value + half


def timeline(frame: pd.DataFrame, x: str, y: str, ylabel: str, title: str,
             integer_y: bool = False) -> figure:  # fmt: skip
    """Serials over ``x`` (step or serial): a line plus status-coloured points, hover naming
    the serial. ``x`` (and ``y`` when ``integer_y``) is ticked on whole numbers; one point is
    centred on axes around its own values."""
    data = frame[list(dict.fromkeys([x, y, "serial", "status"]))].dropna(subset=[x, y])
    if data.empty:
        return blank(f"{title}: no values")
    xs = data[x].to_numpy(dtype="float64")
    ys = data[y].to_numpy(dtype="float64")
    status = data["status"].astype(str).to_numpy()
    source = ColumnDataSource({
        "x": xs, "y": ys, "serial": data["serial"].to_numpy(dtype="int64"), "status": status,
        "color": [STATUS_COLORS.get(s, OTHER_COLOR) for s in status],
    })  # fmt: skip
    kw = {}
    if len(np.unique(xs)) == 1:
        kw["x_range"] = around(float(xs[0]), integer=True)
    if len(np.unique(ys)) == 1:
        kw["y_range"] = around(float(ys[0]), integer=integer_y)
    fig = _figure(title, x, ylabel, **kw)
    fig.line("x", "y", source=source, color="#90a4ae", line_width=2)
    points = fig.scatter("x", "y", source=source, color="color", size=9)
    fig.add_tools(HoverTool(renderers=[points], tooltips=[
        ("serial", "@serial"), (x, "@x{0,0}"), (ylabel, "@y{0,0.[000]}"), ("status", "@status"),
    ]))  # fmt: skip
    fig.xaxis.ticker = integer_ticks()
    fig.xaxis.formatter = PrintfTickFormatter(format="%d")
    if integer_y:
        fig.yaxis.ticker = integer_ticks()
        fig.yaxis.formatter = PrintfTickFormatter(format="%d")
    if "x_range" not in kw:
        fig.x_range.range_padding = 0.08
    if "y_range" not in kw:
        fig.y_range.range_padding = 0.08
    return fig


def usage_bars(usage: pd.DataFrame) -> figure:
    """``cat.usage()`` as bars over serials stacked by kind (MiB): why a checkpoint is big."""
    if usage.empty:
        return blank("bytes by kind: no serials")
    serials = [str(s) for s in usage.index]
    kinds = [str(k) for k in usage.columns]
    columns = {"serial": serials}
    for kind in kinds:
        column = usage[kind].to_numpy(dtype="float64")
        columns[kind] = column / 2**20
        columns[f"{kind} bytes"] = column
    fig = _figure("serials: bytes by kind", "serial", "MiB", height=260, x_range=serials)
    bars = fig.vbar_stack(kinds, x="serial", source=ColumnDataSource(columns), width=0.8,
                          color=[KIND_COLORS.get(k, OTHER_COLOR) for k in kinds],
                          line_color=None)  # fmt: skip
    for kind, bar in zip(kinds, bars, strict=True):
        fig.add_tools(HoverTool(renderers=[bar], tooltips=[
            ("serial", "@serial"), ("kind", kind), ("bytes", f"@{{{kind} bytes}}{{0,0}}"),
        ]))  # fmt: skip
    fig.add_layout(Legend(items=[(k, [b]) for k, b in zip(kinds, bars, strict=True)]), "right")
    fig.y_range.start = 0
    fig.xgrid.grid_line_color = None
    return fig
