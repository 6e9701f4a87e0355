"""The Runs page of an experiment (DESIGN.md §3d): the runs table with status badges, size
and a chosen metric over step for every run (one line per run), and the runs compared at a
matched point (latest, best or a step).

In the dashboard (``ckptview serve DIR`` on an experiment) a click on a run opens it in the
usual tabs; in a notebook, ``RunsView(exp)`` shows the clicked run's browser below the table.
Names from the trees (runs, metrics, variables) reach the page as text only: table cells and
titles are plain text, plot labels are drawn on the canvas, the Markdown is escaped.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pandas as pd
import panel as pn
import param
from bokeh.models import ColumnDataSource, HoverTool, Legend, LegendItem, PrintfTickFormatter
from bokeh.palettes import Category10_10
from bokeh.plotting import figure

from ckptview.engine.stats import STAT_COLUMNS
from ckptview.experiment import Experiment, open_experiment

from .. import figures
from .._base import (
    BUTTON_CSS,
    TABLE_CSS,
    Workspace,
    built_once,
    form_row,
    in_background,
    label_for,
    notice,
    rule,
    set_notice,
    size_formatter,
    table,
    wrapping,
)
from .._format import badge, fmt_number, human_bytes, md_code, md_problem, md_text

__all__ = ["RunsView", "add_runs", "run_status", "runs_frame"]

#: the runs table's columns (field -> title); every field is ours, never a name from a tree
RUN_TITLES = {"run": "run", "status": "status", "layout": "layout", "serials": "serials",
              "latest": "latest", "step": "step", "best": "best", "metric": "best metric",
              "size": "size", "last_write": "last write (UTC)", "error": "error"}  # fmt: skip
#: shares of the table's width (they add up to 100%: the table fits any page, cells wrap)
RUN_WIDTHS = {"run": "15%", "status": "12%", "layout": "9%", "serials": "8%", "latest": "7%",
              "step": "7%", "best": "6%", "metric": "11%", "size": "10%",
              "last_write": "15%"}  # fmt: skip
#: the widths with an error column: the error takes from the run, layout and metric columns
ERROR_WIDTHS = {**RUN_WIDTHS, "run": "11%", "layout": "7%", "metric": "7%", "error": "10%"}
#: the ways to pick each run's serial to compare (``exp.compare(at=...)``)
AT_CHOICES = ["latest", "best", "step"]
#: the compare table shows at most this many variables per page
COMPARE_PAGE = 15
#: beyond this many runs the compare table's columns share the page's width (and wrap)
WIDE_RUNS = 6
#: runs beyond this many share the plots without a legend (the table's colour swatches tell)
LEGEND_RUNS = 12
#: rows of the runs table look clickable: a click opens the run
CLICKABLE_CSS = ".tabulator-row { cursor: pointer; }"


def colour(i: int) -> str:
    """The colour of the ``i``-th run, in the plots and the runs table alike."""
    return Category10_10[i % len(Category10_10)]


def swatch(i: int) -> str:
    """HTML: a square of the ``i``-th run's colour (before its status badge in the table)."""
    return (f'<span class="cv-run-colour" style="display:inline-block;width:12px;height:12px;'
            f'border-radius:3px;margin-right:6px;vertical-align:-1px;background:{colour(i)}">'
            "</span>")  # fmt: skip


def run_status(exp: Experiment, run: str, row: pd.Series) -> str:
    """A run's status word: ``error`` (it did not open, or no serial loads), ``incomplete``
    (its newest save did not finish or does not load: a crash mid-save), ``warning`` (a serial
    has a warning), else ``complete``."""
    if not pd.isna(row["error"]) or pd.isna(row["latest"]):
        return "error"
    serials = exp[run].serials
    newest = serials.loc[serials.index.max()]
    if not (bool(newest["complete"]) and bool(newest["loadable"])):
        return "incomplete"
    if serials["warning"].notna().any():
        return "warning"
    return "complete"


def _int(value: Any) -> int | None:
    return None if pd.isna(value) else int(value)


def runs_frame(exp: Experiment) -> pd.DataFrame:
    """The runs table as shown: one row per run (in ``exp.runs`` order), sizes in bytes."""
    runs = exp.runs
    rows = []
    for run, r in runs.iterrows():
        best = _int(r["best"])
        metric = "" if best is None else f"{r['metric_name']} {fmt_number(r['best_metric'])}"
        when = r["last_write"]
        rows.append({
            "run": str(run), "status": run_status(exp, run, r),
            "layout": r["layout"] or "", "serials": _int(r["n_serials"]),
            "latest": _int(r["latest"]), "step": _int(r["latest_step"]), "best": best,
            "metric": metric, "size": _int(r["nbytes"]),
            "last_write": "" if pd.isna(when) else when.strftime("%Y-%m-%d %H:%M"),
            "error": "" if pd.isna(r["error"]) else str(r["error"]),
        })  # fmt: skip
    df = pd.DataFrame(rows, columns=list(RUN_TITLES)).astype(object)
    return df.where(df.notna(), None)  # an empty cell, never "NaN"


def add_runs(workspace: Workspace, exp: Experiment) -> dict[str, str]:
    """Add the runs that opened to ``workspace`` (each checked against its guard), labelled
    by their run names; run name -> label. The views stay where they are."""
    runs = dict(workspace.runs)
    labels = {}
    for name, cat in exp.catalogs().items():
        workspace.guard.check_catalog(cat)
        label = name if name not in runs else label_for(name, runs)
        runs[label] = cat
        labels[name] = label
    workspace.show_added = False
    workspace.runs = runs
    return labels


def _x_of(serials: pd.DataFrame) -> tuple[np.ndarray, bool]:
    """A run's x values: its steps where every serial has its own, else its serial numbers."""
    steps = serials["step"]
    if steps.notna().all() and steps.nunique() == len(steps):
        return steps.to_numpy(dtype="float64"), True
    return serials.index.to_numpy(dtype="float64"), False


def over_step(exp: Experiment, metric: str | None) -> dict[str, pd.DataFrame]:
    """Per run (that opened): ``x`` (step, or serial), ``y`` (size in bytes, or ``metric``),
    ``serial``; runs without the metric are left out."""
    out = {}
    metrics = exp.metrics if metric is not None else None
    for run, cat in exp.catalogs().items():
        try:
            s = cat.serials
        except Exception:  # noqa: BLE001, S112 - shown as an error row in the table
            continue
        if s.empty:
            continue
        x, _ = _x_of(s)
        if metric is None:
            y = s["nbytes"].to_numpy(dtype="float64")
        else:
            m = metrics[(metrics["run"] == run) & (metrics["name"] == metric)]
            values = pd.to_numeric(m.set_index("serial")["value"], errors="coerce")
            values = values[~values.index.duplicated()]
            if values.empty:
                continue
            y = values.reindex(s.index).to_numpy(dtype="float64")
        frame = pd.DataFrame({"x": x, "y": y, "serial": s.index.to_numpy(dtype="int64")})
        out[run] = frame.dropna(subset=["x"])
    return out


def size_unit(series: dict[str, pd.DataFrame]) -> tuple[str, int, bool]:
    """The unit of a size plot (that of its largest size), its bytes, and whether its axis is
    logarithmic (the sizes span more than a factor of 20: a small run stays visible)."""
    values = pd.concat([f["y"] for f in series.values()]) if series else pd.Series([], dtype=float)
    values = values[values > 0]
    if values.empty:
        return "B", 1, False
    top = float(values.max())
    units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]
    i = 0
    while i < len(units) - 1 and top >= 1024 ** (i + 1):
        i += 1
    return units[i], 1024**i, top / float(values.min()) > 20


def runs_figure(series: dict[str, pd.DataFrame], colours: dict[str, str], ylabel: str,
                title: str, kind: str, legend: bool = True, log: bool = False) -> figure:  # fmt: skip
    """One line (and points) per run over step (each line named ``ckptview-<kind>-line``);
    hover names the run, serial and value; the legend hides a run on click. Run names are
    canvas text and escaped tooltip values."""
    if not series or all(f["y"].isna().all() for f in series.values()):
        return blank(f"{title}: no values")
    fig = figures._figure(title, "step (serial where a run records none)", ylabel, height=260,
                          y_axis_type="log" if log else "linear")  # fmt: skip
    items = []
    for run, frame in series.items():
        source = ColumnDataSource({"x": frame["x"].to_numpy(), "y": frame["y"].to_numpy(),
                                   "serial": frame["serial"].to_numpy(),
                                   "run": [run] * len(frame)})  # fmt: skip
        c = colours.get(run, figures.OTHER_COLOR)
        line = fig.line("x", "y", source=source, color=c, line_width=2, name=f"ckptview-{kind}-line")
        points = fig.scatter("x", "y", source=source, color=c, size=6)
        items.append(LegendItem(label=run[-40:], renderers=[line, points]))
        fig.add_tools(HoverTool(renderers=[points], tooltips=[
            ("run", "@run"), ("serial", "@serial"), ("step", "@x{0,0}"),
            ("value", "@y{0,0.[0000]}"),
        ]))  # fmt: skip
    if legend and len(items) <= LEGEND_RUNS:
        fig.add_layout(Legend(items=items, click_policy="hide", label_text_font_size="11px",
                              spacing=0, padding=4), "right")  # fmt: skip
    fig.xaxis.formatter = PrintfTickFormatter(format="%d")
    fig.x_range.range_padding = 0.05
    return fig


def blank(message: str) -> figure:
    """An empty plot carrying ``message`` as its title."""
    fig = figure(title=message, height=200, sizing_mode="stretch_width", toolbar_location=None)
    fig.scatter([], [])  # a renderer: Bokeh warns about a figure without one
    return fig


def default_metric(exp: Experiment, names: list[str]) -> str | None:
    """The metric most runs rank their best by, else the first recorded one."""
    ranked = exp.runs["metric_name"].dropna().astype(str).value_counts()
    for name in ranked.index:
        if name in names:
            return name
    return names[0] if names else None


class RunsView(pn.viewable.Viewer):
    """The runs of an experiment side by side: the runs table (status, latest, best, size,
    last write), size and ``metric`` over step for every run, and ``exp.compare`` at the
    matched point ``at``. A click on a run calls ``on_open(run)`` (the dashboard opens it in
    its tabs); without ``on_open`` the run's browser is shown below the table."""

    metric = param.Selector(default=None, objects=[], allow_None=True,
                            doc="the metric plotted over step")  # fmt: skip
    at = param.Selector(default="latest", objects=AT_CHOICES,
                        doc="compare each run's latest, best, or serial at or before ``step``")  # fmt: skip
    step = param.Integer(default=0, bounds=(0, None), doc="the step compared at (at='step')")
    stat = param.Selector(default="l2", objects=list(STAT_COLUMNS), doc="what is compared")
    opened = param.String(default=None, allow_None=True, doc="the run last clicked")
    version = param.Integer(default=0, doc="bumped when the runs were read again")

    def __init__(self, experiment: Experiment | str | os.PathLike,
                 on_open: Callable[[str], Awaitable[None] | None] | None = None,
                 workspace: Workspace | None = None, **params):  # fmt: skip
        if not isinstance(experiment, Experiment):
            experiment = open_experiment(experiment)
        self.experiment = experiment
        self.on_open = on_open
        self.workspace = workspace
        self._panes: dict[str, pn.pane.Bokeh] = {}  # the plots, once shown
        super().__init__(**params)
        names = sorted(map(str, experiment.metrics["name"].unique()))
        self.param.metric.objects = names
        self.metric = default_metric(experiment, names)
        steps = experiment.runs["latest_step"].dropna()
        steps = steps[steps > 0]
        self.step = int(steps.min()) if len(steps) else 0  # a step every training run reached
        self.frame = runs_frame(experiment)
        self.summary = pn.pane.Markdown(self._summary(),
                                        **wrapping(css_classes=["ckptview-runs-summary"]))  # fmt: skip
        self.table = table(
            self._shown(), titles=RUN_TITLES, selectable=False, header_align="left",
            css_classes=["ckptview-runs-table"], stylesheets=[TABLE_CSS, CLICKABLE_CSS],
            formatters={"status": {"type": "html"},
                        "size": size_formatter(), "error": {"type": "textarea"}},
            widths=self._widths(), text_align={"size": "right"}, layout="fit_columns",
        )  # fmt: skip
        self.table.on_click(self._on_click)
        self.detail = pn.Column(sizing_mode="stretch_width", css_classes=["ckptview-run-detail"])
        self.browser = None  # the clicked run's browser (without ``on_open``)
        self.compare_button = pn.widgets.Button(label="Compare", color="primary",
                                                stylesheets=[BUTTON_CSS],
                                                css_classes=["ckptview-runs-compare-button"])  # fmt: skip
        self.compare_button.on_click(self._on_compare)
        self.compare_message = notice(
            "Compare the runs' variables at a matched point: each run's **latest** serial, its "
            "**best**, or the serial at or before a **step**.",
            kind="info", css_classes=["ckptview-runs-compare-message"],
        )  # fmt: skip
        self.compare_table = table(pd.DataFrame({"variable": []}), pagination="local",
                                   page_size=COMPARE_PAGE, header_align="left", visible=False,
                                   css_classes=["ckptview-runs-compare"])  # fmt: skip

    # -- the runs table -----------------------------------------------------------------------
    def _widths(self) -> dict[str, str]:
        return ERROR_WIDTHS if any(self.frame["error"]) else RUN_WIDTHS

    def _shown(self) -> pd.DataFrame:
        shown = self.frame.copy()
        shown["status"] = [swatch(i) + badge(s) for i, s in enumerate(shown["status"])]
        if not any(shown["error"]):
            shown = shown.drop(columns="error")
        return shown

    def _summary(self) -> str:
        exp, runs = self.experiment, self.experiment.runs
        errors = int(runs["error"].notna().sum())
        counts = self.frame["status"].value_counts()
        parts = [f"{counts.get(k, 0)} {k}" for k in ("complete", "warning", "incomplete", "error")
                 if counts.get(k, 0)]  # fmt: skip
        total = human_bytes(int(runs["nbytes"].fillna(0).sum()))
        text = (f"Experiment {md_code(exp.root or '')} · **{len(runs)} runs** "
                f"({', '.join(parts) or 'none'}) · {total} · click a run to open it")  # fmt: skip
        if errors:
            text += f"\n\n{badge('error')} {errors} run(s) could not be read: see their error"
        for f in exp.attrs.get("stray", [])[:5]:
            text += f"\n\n{badge('warning')} {md_code(f)} is in no run"
        return text

    def colours(self) -> dict[str, str]:
        """Run name -> its colour (the table's swatches and the plots' lines)."""
        return {r: colour(i) for i, r in enumerate(self.frame["run"])}

    async def _on_click(self, event) -> None:
        await self.open(str(self.table.value["run"].iloc[event.row]))

    async def open(self, run: str) -> None:
        """Open ``run``: ``on_open(run)``, or its browser below the table."""
        if run not in self.experiment.catalogs():
            why = self.frame.loc[self.frame["run"] == run, "error"]
            self.detail.objects = [notice(f"**{md_text(run)}** did not open: "
                                          f"{md_text(why.iloc[0] if len(why) else '')}",
                                          kind="danger")]  # fmt: skip
            return
        self.opened = run
        if self.on_open is not None:
            result = self.on_open(run)
            if result is not None:
                await result
            return
        from .browse.browser import RunBrowser  # a notebook: the run below the table

        heading = pn.pane.Markdown(f"#### Run {md_code(run)}", **wrapping())
        self.browser = RunBrowser(self.experiment[run], poll_seconds=0)
        self.detail.objects = [heading, self.browser]

    # -- the plots ----------------------------------------------------------------------------
    def size_plot(self) -> figure:
        """The size of every serial over step, one line per run (a log axis when the sizes
        span more than a factor of 100)."""
        series = over_step(self.experiment, None)
        unit, size, log = size_unit(series)
        series = {run: f.assign(y=f["y"] / size) for run, f in series.items()}
        return runs_figure(series, self.colours(), f"size ({unit})" + (", log" if log else ""),
                           "runs: size", "size", legend=False, log=log)  # fmt: skip

    def metric_plot(self) -> figure:
        """``metric`` over step, one line per run that records it."""
        if self.metric is None:
            return blank("no metric recorded in any run")
        return runs_figure(over_step(self.experiment, self.metric), self.colours(),
                           self.metric, f"runs: {self.metric}", "metric")  # fmt: skip

    def _plots(self) -> pn.Row:
        """Both plots in new panes (new Bokeh models)."""
        size = pn.pane.Bokeh(self.size_plot(), sizing_mode="stretch_width")
        metric = pn.pane.Bokeh(self.metric_plot(), sizing_mode="stretch_width")
        self._panes = {"size": size, "metric": metric}
        return pn.Row(
            pn.Column(size, sizing_mode="stretch_width", css_classes=["ckptview-runs-size"]),
            pn.Column(metric, sizing_mode="stretch_width", css_classes=["ckptview-runs-metric"]),
            sizing_mode="stretch_width",
        )  # fmt: skip

    @param.depends("metric", "version", watch=True)
    def _redraw(self) -> None:
        if self._panes:
            self._panes["size"].object = self.size_plot()
            self._panes["metric"].object = self.metric_plot()


    # -- compare at a matched point -----------------------------------------------------------
    def compare(self) -> pd.DataFrame:
        """``exp.compare`` at ``at`` (``step`` for a step) with ``stat`` (blocking)."""
        at = self.step if self.at == "step" else self.at
        return self.experiment.compare(at=at, stat=self.stat)

    def compare_frame(self, df: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, str]]:
        """The compare table as shown: one row per variable, one column per run (fields
        ``run_<i>``; the run names are the titles); field -> title."""
        runs = list(df.index)
        fields = {f"run_{i}": str(run) for i, run in enumerate(runs)}
        order = df.notna().sum().sort_values(ascending=False, kind="stable").index
        df = df[order]  # the variables most runs have first
        shown = pd.DataFrame({"variable": [str(c) for c in df.columns]})
        for (field, _), run in zip(fields.items(), runs, strict=True):
            shown[field] = [fmt_number(v) for v in df.loc[run].to_numpy()]
        return shown, fields

    def _describe(self, df: pd.DataFrame) -> str:
        used = df.attrs.get("serial", {})
        where = {"latest": "each run's latest serial", "best": "each run's best serial"}.get(
            self.at, f"each run's serial at or before step {self.step}")  # fmt: skip
        parts = [f"{md_text(run)}: {'no serial' if s is None else f'serial {s}'}"
                 for run, s in used.items()]  # fmt: skip
        head = f"**{md_text(self.stat)}** of {df.shape[1]} variables at {where}"
        return " · ".join([head, *parts])

    async def _on_compare(self, event=None) -> None:
        try:
            df = await in_background(self.compare_button, self.compare)
        except Exception as e:  # noqa: BLE001 - shown, the page goes on
            set_notice(self.compare_message, md_problem(e, "compare the runs"), "danger")
            self.compare_table.visible = False
            return
        shown, titles = self.compare_frame(df)
        layout = "fit_data_stretch" if len(titles) <= WIDE_RUNS else "fit_columns"
        self.compare_table.param.update(value=shown, titles=titles, layout=layout,
                                        visible=not shown.empty)  # fmt: skip
        set_notice(self.compare_message, self._describe(df), "info" if len(shown) else "warning")

    # -- live runs ----------------------------------------------------------------------------
    def sync(self) -> None:
        """Read the runs table again from the (already refreshed) catalogs and redraw."""
        self.experiment._table = None  # the runs table is remade from the catalogs
        self.frame = runs_frame(self.experiment)
        self.table.param.update(value=self._shown(), widths=self._widths())
        self.summary.object = self._summary()
        self.version += 1

    # -- view ---------------------------------------------------------------------------------
    @built_once
    def __panel__(self):
        # the plots are this page's content (a few lines per run): built with it, not later
        plots = pn.Column(self._plots(), sizing_mode="stretch_width",
                          css_classes=["ckptview-runs-plots"])  # fmt: skip
        at = pn.widgets.RadioButtonGroup.from_param(self.param.at, label="compare at",
                                                    css_classes=["ckptview-runs-at"])  # fmt: skip
        step = pn.widgets.IntInput.from_param(self.param.step, width=120,
                                              css_classes=["ckptview-runs-step"])  # fmt: skip
        step.disabled = self.at != "step"
        self.param.watch(lambda e: setattr(step, "disabled", e.new != "step"), "at")
        controls = form_row(
            at, step,
            pn.widgets.Select.from_param(self.param.stat, width=110,
                                         css_classes=["ckptview-runs-stat"]),
            self.compare_button,
        )  # fmt: skip
        metric = pn.widgets.Select.from_param(self.param.metric, label="metric", width=240,
                                              css_classes=["ckptview-runs-metric-select"])  # fmt: skip
        return pn.Column(
            self.summary, self.table, self.detail, metric, plots, rule(),
            pn.pane.Markdown("#### Compare the runs"), controls, self.compare_message,
            self.compare_table, sizing_mode="stretch_width", css_classes=["ckptview-runs"],
        )  # fmt: skip
