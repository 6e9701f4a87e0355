"""One variable: header facts, statistics on demand and a histogram of its values."""

from __future__ import annotations

from functools import cached_property

import pandas as pd
import panel as pn
import param

import ckptview as cv
from ckptview.dtypes import is_numeric

from ... import plots
from ..._base import BUTTON_CSS, in_background, table, wrapping
from ..._format import (
    fmt_number,
    fmt_shape,
    human_bytes,
    md_code,
    md_problem,
    md_text,
    streamed_histogram,
)

STAT_ORDER = ["min", "max", "mean", "std", "l2", "n_nan", "n_inf", "frac_zero"]


def variable_stats(cat: cv.Catalog, name: str, serial: int, node: str = "") -> dict:
    """``cat.stats`` for one (node, name) as a dict."""
    df = cat.stats(serial, names=[name])
    df = df[df["node"] == node] if (df["node"] == node).any() else df
    return df.iloc[0].to_dict()


def variable_histogram(cat: cv.Catalog, name: str, serial: int, node: str = "", bins: int = 40):
    """``(counts, edges)`` of a variable's finite values, streamed in chunks."""
    return streamed_histogram(lambda: cat.iter_chunks(name, serial=serial, node=node), bins)


class VariableDetail(pn.viewable.Viewer):
    """Shape, dtype, file; ``Compute`` streams the values for statistics and a histogram."""

    catalog = param.ClassSelector(class_=cv.Catalog)
    serial = param.Integer(default=None, allow_None=True)
    node = param.String(default="")
    variable = param.String(default="", doc="the variable's name")

    def __init__(self, catalog: cv.Catalog, **params):
        super().__init__(catalog=catalog, **params)
        self.info = pn.pane.Markdown("*Click a variable to see it here.*",
                                     **wrapping(css_classes=["ckptview-detail-info"]))  # fmt: skip
        self.button = pn.widgets.Button(label="Statistics and histogram", color="primary",
                                        disabled=True, stylesheets=[BUTTON_CSS],
                                        css_classes=["ckptview-stats-button"])  # fmt: skip
        self.button.on_click(self._on_compute)
        # the statistics table and the histogram are built, and join the page, when there is
        # something to show in them (a page that never asks for statistics never builds them)
        self.results = pn.Row(sizing_mode="stretch_width")
        self.body = pn.Column(self.info, self.button, self.results,
                              sizing_mode="stretch_width")  # fmt: skip
        self._describe()

    @cached_property
    def stats(self) -> pn.widgets.Tabulator:
        """The statistics table (built on first use)."""
        return table(pd.DataFrame(columns=["statistic", "value"]),
                     css_classes=["ckptview-stats"], sizing_mode="stretch_width")  # fmt: skip

    @cached_property
    def plot(self) -> pn.pane.HoloViews:
        """The histogram (built on first use)."""
        return pn.pane.HoloViews(plots.empty("histogram: press the button"),
                                 sizing_mode="stretch_width", backend="bokeh",
                                 css_classes=["ckptview-histogram"])  # fmt: skip

    @param.depends("catalog", "serial", "node", "variable", watch=True)
    def _describe(self) -> None:
        if "stats" in self.__dict__:  # built (``cached_property``)
            self.stats.value = pd.DataFrame(columns=["statistic", "value"])
        if "plot" in self.__dict__:
            self.plot.object = plots.empty("histogram: press the button")
        if not self.variable or self.serial is None:
            self.button.disabled = True
            return
        v = self.catalog.variables
        row = v[
            (v["serial"] == self.serial) & (v["name"] == self.variable) & (v["node"] == self.node)
        ]
        if row.empty:
            self.info.object = f"No variable {md_code(self.variable)} in serial {self.serial}."
            self.button.disabled = True
            return
        r = row.iloc[0]
        err = r["error"] if isinstance(r["error"], str) and r["error"] else None
        self.info.object = "\n\n".join(
            [
                f"#### {md_code(self.variable)}"
                + (f" on {md_code(self.node)}" if self.node else ""),
                f"serial **{self.serial}** · kind **{md_text(r['kind'])}** · "
                f"dtype **{md_text(r['dtype'])}** · shape **{fmt_shape(r['shape'])}** · "
                f"{int(r['numel']):,} values · {human_bytes(int(r['nbytes']))}",
                f"file: {md_code(r['file'])}",
                *([f"**error:** {md_text(err)}"] if err else []),
            ]
        )
        self.button.disabled = bool(err) or not is_numeric(r["dtype"])
        if err:  # say why instead of an empty histogram
            self.plot.object = plots.empty(f"cannot be read: {err[:120]}")
            self._reveal()
        elif not is_numeric(r["dtype"]):
            self.plot.object = plots.empty("not a numeric tensor: no histogram")
            self._reveal()

    def _reveal(self) -> None:
        if not self.results.objects:
            self.results.objects = [self.stats, self.plot]

    def compute(self) -> tuple[dict, tuple]:
        """Statistics and histogram of the current variable (blocking; runs in a thread)."""
        st = variable_stats(self.catalog, self.variable, self.serial, self.node)
        hist = variable_histogram(self.catalog, self.variable, self.serial, self.node)
        return st, hist

    def show(self, result: tuple[dict, tuple]) -> None:
        """Put :meth:`compute`'s result on screen."""
        st, (counts, edges) = result
        rows = [(k, fmt_number(st.get(k))) for k in STAT_ORDER if k in st]
        self.stats.value = pd.DataFrame(rows, columns=["statistic", "value"])
        self.plot.object = plots.histogram(counts, edges, f"{self.variable} (serial {self.serial})")
        self._reveal()

    async def _on_compute(self, event=None) -> None:
        try:
            self.show(await in_background(self.body, self.compute))
        except Exception as e:  # noqa: BLE001 - shown to the user, never a dead page
            self.info.object += "\n\n" + md_problem(e, "compute the statistics")

    def __panel__(self):
        return self.body
