"""Follow one or more variables' statistic across the serials of a run."""

from __future__ import annotations

import pandas as pd
import panel as pn
import param

import ckptview as cv
from ckptview.dtypes import is_numeric

from .. import plots
from .._base import form_row, in_background
from .._format import html_choices, md_code, md_problem, md_text

STATS = ["l2", "mean", "std", "min", "max", "frac_zero", "n_nan", "n_inf"]


class TrajectoryPlot(pn.viewable.Viewer):
    """``cat.trajectory`` for the chosen variables, one curve each."""

    catalog = param.ClassSelector(class_=cv.Catalog)
    names = param.ListSelector(default=[], objects=[], doc="variables to follow")
    stat = param.Selector(default="l2", objects=STATS)

    def __init__(self, catalog: cv.Catalog, names=None, **params):
        v = catalog.variables
        v = v[v["error"].isna() & v["dtype"].map(is_numeric)]
        choices = sorted(set(v["name"]))
        super().__init__(catalog=catalog, **params)
        self.param.names.objects = html_choices(choices)  # its dropdown renders HTML
        if names is None:
            model = v[v["kind"] == "model"].sort_values("nbytes", ascending=False)
            names = list(dict.fromkeys(model["name"]))[:2] or choices[:1]
        self.series: list[pd.Series] = []
        self.plot = pn.pane.HoloViews(plots.empty("pick variables"), sizing_mode="stretch_width",
                                      backend="bokeh", css_classes=["ckptview-trajectory"])  # fmt: skip
        self.message = pn.pane.Markdown(sizing_mode="stretch_width")
        self.names = list(names)
        self.show(self.compute())  # first curves right away (the page is never empty)
        self.param.watch(self._update, ["names", "stat"])

    def compute(self) -> list[pd.Series]:
        """One Series per chosen variable (blocking)."""
        out = []
        for name in self.names:
            try:
                out.append(self.catalog.trajectory(name, stat=self.stat))
            except KeyError as e:  # on several nodes: follow the first one
                nodes = sorted(set(self.catalog.variables.query("name == @name")["node"]))
                if not nodes:
                    raise
                s = self.catalog.trajectory(name, stat=self.stat, node=nodes[0])
                out.append(s.rename(f"{nodes[0]}/{s.name}"))
                self.message.object = f"{md_text(e.args[0])}; showing {md_code(nodes[0])}"
        return out

    def show(self, series: list[pd.Series]) -> None:
        """Plot :meth:`compute`'s result."""
        self.series = series
        self.plot.object = plots.trajectories(series, self.stat)

    async def _update(self, event=None) -> None:
        try:
            self.show(await in_background(self.plot, self.compute))
        except Exception as e:  # noqa: BLE001 - shown to the user
            self.message.object = md_problem(e, "compute the trajectory")

    def __panel__(self):
        controls = form_row(
            pn.widgets.MultiChoice.from_param(
                self.param.names,
                label="variables",
                width=520,
                css_classes=["ckptview-trajectory-names"],
            ),
            pn.widgets.Select.from_param(self.param.stat, label="statistic", width=140),
        )
        return pn.Column(controls, self.message, self.plot, sizing_mode="stretch_width")
