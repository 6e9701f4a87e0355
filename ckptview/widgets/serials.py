"""The serials of one run: a paginated status table and a timeline plot."""

from __future__ import annotations

import holoviews as hv
import pandas as pd
import panel as pn
import param

import ckptview as cv

from . import plots
from ._base import table
from ._format import badge, metrics_wide, serials_frame


class SerialsTable(pn.viewable.Viewer):
    """Serials with status at a glance; ``selected`` follows the clicked row."""

    catalog = param.ClassSelector(class_=cv.Catalog)
    selected = param.Integer(default=None, allow_None=True, doc="the clicked serial")
    page_size = param.Integer(default=20, bounds=(5, 500))
    y = param.Selector(default="size", objects=["size"], doc="what the timeline plots")

    def __init__(self, catalog: cv.Catalog, **params):
        super().__init__(catalog=catalog, **params)
        self.frame = serials_frame(catalog)
        metrics = [str(c) for c in metrics_wide(catalog).columns]
        self.param.y.objects = ["size", *metrics]
        self.summary = pn.pane.Markdown(self._summary(), css_classes=["ckptview-summary"],
                                        sizing_mode="stretch_width")  # fmt: skip
        shown = self.frame.copy()
        shown["status"] = [badge(s) for s in shown["status"]]
        self.table = table(
            shown, pagination="remote", page_size=self.page_size, selectable=1,
            hidden_columns=["nbytes"], formatters={"status": {"type": "html"}},
            header_align="left", css_classes=["ckptview-serials"],
            widths={"status": 110, "error": 260},
        )  # fmt: skip
        self.table.param.watch(self._on_select, "selection")
        latest = catalog.latest
        if latest is None and len(self.frame):
            latest = int(self.frame["serial"].iloc[-1])
        if latest is not None:
            self.select(latest)
        self.y_select = pn.widgets.Select.from_param(self.param.y, label="timeline", width=200)

    def _summary(self) -> str:
        cat, f = self.catalog, self.frame
        counts = f["status"].value_counts()
        complete = int(f["status"].isin(["complete", "latest", "error"]).sum())
        parts = [f"{complete} complete"] + [
            f"{counts.get(k, 0)} {k}" for k in ("incomplete", "error") if counts.get(k, 0)
        ]
        latest = cat.latest
        return (
            f"`{cat.url}` · layout **{cat.layout}** · **{len(f)} serials** "
            f"({', '.join(parts)}) · resume point: **{latest if latest is not None else 'none'}**"
        )

    def select(self, serial: int) -> None:
        """Select ``serial`` as if its row had been clicked."""
        hit = self.frame.index[self.frame["serial"] == int(serial)]
        if len(hit):
            self.table.selection = [int(hit[0])]

    def _on_select(self, event) -> None:
        if event.new:
            self.selected = int(self.frame["serial"].iloc[event.new[0]])

    @param.depends("y")
    def timeline(self) -> hv.Element:
        """Size (MiB) or a metric over step (or over serial where steps are unknown)."""
        f = self.frame.copy()
        has_steps = f["step"].notna().all() and f["step"].nunique() == len(f)
        x = "step" if has_steps else "serial"
        if self.y == "size":
            f["MiB"] = f["nbytes"].astype("float64") / 2**20
            return plots.timeline(f, x, "MiB", "size (MiB)", "serials: size")
        m = metrics_wide(self.catalog)
        f[self.y] = [m[self.y].get(s) if self.y in m else None for s in f["serial"]]
        f[self.y] = pd.to_numeric(f[self.y], errors="coerce")
        return plots.timeline(f, x, self.y, self.y, f"serials: {self.y}")

    def __panel__(self):
        plot = pn.pane.HoloViews(self.timeline, sizing_mode="stretch_width", backend="bokeh",
                                 css_classes=["ckptview-timeline"])  # fmt: skip
        return pn.Column(self.summary, self.table, self.y_select, plot,
                         sizing_mode="stretch_width")  # fmt: skip
