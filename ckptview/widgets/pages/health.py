"""Health over serials (DESIGN.md §3e): a variables × serials heatmap of ``update_rel`` (or
``l2``), anomalies marked, the rollback point highlighted, one click to its restore plan.

The heatmap never sends more than :data:`MAX_ROWS` × :data:`MAX_COLS` cells to the browser:
a long run's serials are binned (each cell the bin's largest value, anomalies kept), and only
the variables with findings or the largest updates are shown, the rest counted.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import panel as pn
import param
from bokeh.models import (
    ColorBar,
    ColumnDataSource,
    HoverTool,
    Legend,
    LegendItem,
    LinearColorMapper,
)
from bokeh.palettes import Viridis256
from bokeh.plotting import figure

from ckptview.health import summarize, variable_rules

from .._base import (
    BUTTON_CSS,
    Workspace,
    as_workspace,
    form_row,
    notice,
    offer_runs,
    set_notice,
)
from .._format import md_problem

MAX_ROWS = 60  # variables shown
MAX_COLS = 200  # serial columns shown (more serials are binned)
METRICS = {"update_rel (‖W−W_prev‖/‖W_prev‖)": "update_rel", "l2 (‖W‖)": "l2"}
START = "Press **Compute health**: it reads every weight of every serial once (then cached)."


def heatmap_data(h: pd.DataFrame, metric: str = "update_rel", spike_factor: float = 10.0,
                 max_rows: int = MAX_ROWS, max_cols: int = MAX_COLS) -> dict:  # fmt: skip
    """The cells of the heatmap: ``cells`` (row, col, value, log10 value, variable, serials,
    anomaly), the ``rows`` (variable labels, top to bottom), ``cols`` (the first serial of
    each column), ``bins`` (serial -> column) and ``hidden`` (variables left out)."""
    rules = variable_rules(h, spike_factor)
    label = np.where(h["node"] == "", h["name"], h["node"] + "/" + h["name"])
    anomaly = np.select(
        [rules["nonfinite"], rules["update_spike"] | rules["l2_jump"], rules["frozen"]],
        ["nonfinite", "spike", "frozen"], default="",
    )  # fmt: skip
    df = pd.DataFrame({"var": label, "serial": h["serial"].to_numpy(),
                       "value": h[metric].to_numpy(dtype=np.float64), "anomaly": anomaly,
                       "ratio": rules["update_ratio"].to_numpy(dtype=np.float64)})  # fmt: skip
    serials = np.sort(df["serial"].unique())
    n_cols = min(len(serials), max_cols)
    col_of = (np.arange(len(serials)) * n_cols // max(len(serials), 1)).astype(int)
    bins = dict(zip(serials.tolist(), col_of.tolist()))
    firsts = [int(serials[col_of == c][0]) for c in range(n_cols)]
    lasts = [int(serials[col_of == c][-1]) for c in range(n_cols)]
    df["col"] = df["serial"].map(bins)
    score = df.groupby("var").agg(bad=("anomaly", lambda a: int((a != "").any())),
                                  ratio=("ratio", "max"))  # fmt: skip
    score = score.fillna({"ratio": 0}).sort_values(["bad", "ratio"], ascending=False)
    shown = list(score.index[:max_rows])
    hidden = len(score) - len(shown)
    df = df[df["var"].isin(shown)]
    rank = {"nonfinite": 3, "spike": 2, "frozen": 1, "": 0}
    df = df.assign(rank=df["anomaly"].map(rank))
    cells = df.groupby(["var", "col"], sort=False).agg(
        value=("value", lambda v: float(np.nanmax(v)) if np.isfinite(v).any() else math.nan),
        rank=("rank", "max"),
    ).reset_index()  # fmt: skip
    rows = {v: i for i, v in enumerate(reversed(shown))}  # the worst on top
    cells["row"] = cells["var"].map(rows)
    with np.errstate(divide="ignore", invalid="ignore"):
        cells["log"] = np.where(cells["value"] > 0, np.log10(cells["value"]), np.nan)
    names = {v: k for k, v in rank.items()}
    cells["anomaly"] = cells["rank"].map(names)
    cells["serials"] = [f"{firsts[c]}" if firsts[c] == lasts[c] else f"{firsts[c]}–{lasts[c]}"
                        for c in cells["col"]]  # fmt: skip
    return {"cells": cells.drop(columns="rank"), "rows": list(reversed(list(rows))),
            "cols": firsts, "bins": bins, "hidden": hidden}  # fmt: skip


def heatmap_figure(data: dict, metric: str, rollback: int | None) -> figure:
    """The heatmap as a Bokeh figure: colour = log10 of the value, anomalies ringed
    (red: NaN/inf, orange: spike, grey: frozen), the rollback point's column outlined in green;
    the legend sits above the cells, never over them."""
    cells, rows, cols = data["cells"], data["rows"], data["cols"]
    top = len(rows) - 1  # rows[0] (the worst) is drawn on top: cell row top - i
    height = max(220, min(920, 80 + 14 * len(rows)))
    fig = figure(height=height, sizing_mode="stretch_width", tools="pan,wheel_zoom,box_zoom,reset",
                 toolbar_location="above", x_range=(-0.5, len(cols) - 0.5),
                 y_range=(-0.5, len(rows) - 0.5), x_axis_label="serial",
                 title=f"{metric} per variable and serial (log10 colour)")  # fmt: skip
    finite = cells["log"][np.isfinite(cells["log"])]
    low, high = (float(finite.min()), float(finite.max())) if len(finite) else (0.0, 1.0)
    mapper = LinearColorMapper(palette=Viridis256, low=low, high=max(high, low + 1e-9),
                               nan_color="#bdbdbd")  # fmt: skip
    source = ColumnDataSource({"x": cells["col"].to_numpy(), "y": cells["row"].to_numpy(),
                               "log": cells["log"].to_numpy(), "value": cells["value"].to_numpy(),
                               "var": cells["var"].to_numpy(), "serials": cells["serials"].to_numpy(),
                               "anomaly": cells["anomaly"].to_numpy()})  # fmt: skip
    heat = fig.rect("x", "y", 1, 1, source=source, fill_color={"field": "log", "transform": mapper},
                    line_color=None)  # fmt: skip
    items = []
    if rollback is not None and rollback in data["bins"]:
        c = data["bins"][rollback]
        box = fig.rect([c], [top / 2], 1, len(rows), fill_color="#00e676", fill_alpha=0.18,
                       line_color="#00c853", line_width=3)  # fmt: skip
        items.append(LegendItem(label=f"rollback point ({rollback})", renderers=[box]))
    colours = {"nonfinite": ("#d32f2f", "NaN/inf"), "spike": ("#ff9800", "spike"),
               "frozen": ("#607d8b", "frozen")}  # fmt: skip
    for kind, (colour, label) in colours.items():
        hit = cells[cells["anomaly"] == kind]
        if len(hit):
            ring = fig.rect(hit["col"].to_numpy(), hit["row"].to_numpy(), 0.86, 0.86, fill_alpha=0,
                            line_color=colour, line_width=2)  # fmt: skip
            items.append(LegendItem(label=label, renderers=[ring]))
    fig.add_tools(HoverTool(renderers=[heat],
                            tooltips=[("variable", "@var"), ("serial", "@serials"),
                                      (metric, "@value{0.000e}"), ("anomaly", "@anomaly")]))  # fmt: skip
    step = max(1, len(cols) // 12)
    fig.xaxis.ticker = list(range(0, len(cols), step))
    fig.xaxis.major_label_overrides = {i: str(cols[i]) for i in range(0, len(cols), step)}
    fig.yaxis.ticker = list(range(len(rows)))
    fig.yaxis.major_label_overrides = {top - i: r[-40:] for i, r in enumerate(rows)}
    fig.add_layout(ColorBar(color_mapper=mapper, title="log10"), "right")
    if items:
        fig.add_layout(Legend(items=items, orientation="horizontal", location="top_left",
                              border_line_alpha=0, background_fill_alpha=0, padding=2,
                              margin=2, label_text_font_size="12px"), "above")  # fmt: skip
    return fig


class HealthView(pn.viewable.Viewer):
    """``cat.health_summary()`` of a run and its heatmap; the rollback point's restore plan
    one click away (``on_restore(run, serial)``, else a Restore view shown below)."""

    run = param.Selector(objects=[])
    metric = param.Selector(default="update_rel", objects=METRICS)
    spike_factor = param.Number(default=10.0, bounds=(1.0001, None))

    def __init__(self, workspace, on_restore: Callable[[str, int], Any] | None = None,
                 **params):  # fmt: skip
        self.workspace: Workspace = as_workspace(workspace)
        super().__init__(**params)
        self.on_restore = on_restore
        self.table: pd.DataFrame | None = None
        self.summary: pd.DataFrame | None = None
        self.message = notice(START, kind="info", sizing_mode="stretch_width",
                              css_classes=["ckptview-health-message"])  # fmt: skip
        self.progress = pn.indicators.Progress(value=0, max=1, visible=False,
                                               sizing_mode="stretch_width",
                                               css_classes=["ckptview-health-progress"])  # fmt: skip
        self.compute_button = pn.widgets.Button(label="Compute health", color="primary",
                                                align="end", stylesheets=[BUTTON_CSS],
                                                css_classes=["ckptview-health-compute"])  # fmt: skip
        self.compute_button.on_click(self._on_compute)
        self.restore_button = pn.widgets.Button(label="Plan restore", visible=False,
                                                color="success",
                                                css_classes=["ckptview-health-restore"])  # fmt: skip
        self.restore_button.on_click(self._on_restore)
        self.plot = pn.pane.Bokeh(sizing_mode="stretch_width", visible=False,
                                  css_classes=["ckptview-health-heatmap"])  # fmt: skip
        self.restore_area = pn.Column(sizing_mode="stretch_width")
        self.restore_view = None  # the Restore view shown below (without on_restore)
        self.workspace.param.watch(lambda e: offer_runs(self), ["runs"])
        offer_runs(self)

    @param.depends("run", watch=True)
    def _forget(self) -> None:
        self.table = self.summary = None
        self.plot.visible = self.restore_button.visible = False
        set_notice(self.message, START, "info")

    def compute(self, progress: Callable[[int, int], None] | None = None) -> pd.DataFrame:
        """The health table and summary of the chosen run (model weights)."""
        cat = self.workspace.runs[self.run]
        self.table = cat.health(kinds=["model"], progress=progress)
        return self.summarize()

    def summarize(self) -> pd.DataFrame:
        """The per-serial verdicts of the last table at the current spike factor."""
        cat = self.workspace.runs[self.run]
        self.summary = summarize(self.table, cat.serials, cat.metrics, cat.latest,
                                 self.spike_factor)  # fmt: skip
        return self.summary

    def _progress(self, done: int, total: int) -> None:
        self.progress.param.update(max=max(total, 1), value=min(done, max(total, 1)))

    async def _on_compute(self, event=None) -> None:
        self.progress.param.update(visible=True, value=0)
        self.compute_button.disabled = True
        try:
            await asyncio.to_thread(self.compute, self._progress)
            self.show()
        except Exception as e:  # noqa: BLE001 - shown to the user
            set_notice(self.message, md_problem(e, "compute health"), "danger")
        finally:
            self.progress.visible = False
            self.compute_button.disabled = False

    @param.depends("metric", "spike_factor", watch=True)
    def show(self) -> None:
        """Draw the summary and the heatmap of the last computation."""
        if self.table is None:
            return
        a = self.summarize().attrs
        rb, div = a["rollback_point"], a["divergence"]
        if div is None:
            text = f"**Healthy:** no divergence. Rollback point: the latest, serial **{rb}**."
            kind = "success"
        else:
            found = self.summary.loc[div, "findings"]  # type: ignore[union-attr]
            text = (f"**First divergence at serial {div}:** {found}. "
                    f"Rollback point: **{rb if rb is not None else 'none'}**.")  # fmt: skip
            kind = "warning"
        frozen = a["first"].get("frozen")
        if frozen is not None:
            text += f"\n\nA weight stopped changing at serial {frozen} (reported only)."
        if not len(self.table):
            set_notice(self.message, text + "\n\nNo floating-point model weights.", kind)
            return
        data = heatmap_data(self.table, self.metric, self.spike_factor)
        if data["hidden"]:
            text += f"\n\n{data['hidden']} quieter variables not shown."
        set_notice(self.message, text, kind)
        self.plot.visible = True  # before the object: the pane takes the figure's visibility
        self.plot.object = heatmap_figure(data, self.metric, rb)
        self.restore_button.param.update(label=f"Plan restore of serial {rb}",
                                         visible=rb is not None)  # fmt: skip

    async def _on_restore(self, event=None) -> None:
        if self.summary is None or self.summary.attrs["rollback_point"] is None:
            return
        serial = int(self.summary.attrs["rollback_point"])
        if self.on_restore is not None:
            done = self.on_restore(self.run, serial)
            if inspect.isawaitable(done):
                await done
            return
        from .restore import RestoreView

        view = self.restore_view = RestoreView(self.workspace)
        view.param.update(run=self.run, serial=serial)
        self.restore_area.objects = [view]
        await view._on_plan()

    def __panel__(self):
        return pn.Column(
            form_row(pn.widgets.Select.from_param(self.param.run, name="Run"),
                     pn.widgets.Select.from_param(self.param.metric, name="Colour"),
                     pn.widgets.FloatInput.from_param(self.param.spike_factor,
                                                      name="Spike factor"),
                     self.compute_button),  # fmt: skip
            self.progress, self.message, self.restore_button, self.plot, self.restore_area,
            sizing_mode="stretch_width", css_classes=["ckptview-health"],
        )  # fmt: skip
