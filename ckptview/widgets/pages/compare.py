"""Compare two serials (of one run or of two runs): the diff table and per-variable plots."""

from __future__ import annotations

from functools import partial

import numpy as np
import pandas as pd
import panel as pn
import param

from ...engine.diff import by_change
from .. import plots
from .._base import (
    BUTTON_CSS,
    Workspace,
    as_workspace,
    form_row,
    in_background,
    name_formatter,
    set_min_width,
    table,
    table_font,
)
from .._format import (
    BADGE_WIDTH,
    badge,
    badge_width,
    fit_widths,
    fmt_cosine,
    fmt_number,
    fmt_shape,
    md_code,
    md_problem,
    md_text,
    name_width,
    streamed_histogram,
)

SHOWN = ["status", "name", "node", "shape", "rel_l2", "l2", "max_abs", "cosine", "n_changed",
         "numel", "error"]  # fmt: skip
NUMBERS = ["rel_l2", "l2", "max_abs", "cosine", "n_changed", "numel"]
DIFF_WIDTHS = {"status": BADGE_WIDTH, "node": 64, "shape": 80, "rel_l2": 76, "l2": 76,
               "max_abs": 86, "cosine": 90, "n_changed": 98, "numel": 76}  # fmt: skip
#: columns as wide as their longest value and whole title; the name takes the rest
FITTED = ["node", "shape", *NUMBERS]


def diff_widths(shown: pd.DataFrame, font: str = "wide") -> dict:
    """Column widths for the diff table in ``font`` (``_format.FONTS``): the status badges
    and the short columns whole, the error a fixed share (it wraps); the name is left the
    rest of the row (at 1280 px, ~270 px: room for the widest piece of a Megatron name,
    ~243 px, whole), and never less than its widest piece (the table scrolls sideways)."""
    return {**DIFF_WIDTHS, "status": badge_width(shown.get("status", []), font=font),
            **fit_widths(shown, FITTED, hi=200, font=font), "error": 220}  # fmt: skip


PLOT_LIMIT = 16 << 20  # values read at once for the difference plots


def diff_frame(diff: pd.DataFrame) -> pd.DataFrame:
    """``cat.diff`` output for display: rows that could not be compared first (never lost on
    a later page), then by ``rel_l2`` (biggest change first)."""
    d = by_change(diff)
    failed = d["error"].notna() & (d["error"].astype(str) != "")
    d = pd.concat([d[failed], d[~failed]])
    out = pd.DataFrame(
        {
            "status": d["status"].astype(object),
            "name": d["name"].astype(object),
            "node": d["node"].astype(object),
            "shape": [
                fmt_shape(a) if fmt_shape(a) == fmt_shape(b) else f"{fmt_shape(a)} → {fmt_shape(b)}"
                for a, b in zip(d["shape_a"], d["shape_b"])
            ],
            **{c: [fmt_number(x) for x in d[c]] for c in ("rel_l2", "l2", "max_abs")},
            "cosine": [fmt_cosine(x) for x in d["cosine"]],
            "n_changed": [None if pd.isna(x) else int(x) for x in d["n_changed"]],
            "numel": d["numel"].astype("int64"),
            "error": ["" if pd.isna(e) or e is None else str(e) for e in d["error"]],
        }
    )
    return out.reset_index(drop=True).astype(object)


class CompareView(pn.viewable.Viewer):
    """Pick A and B (run and serial each), diff them, click a row for its plots."""

    run_a = param.Selector(objects=[])
    serial_a = param.Selector(objects=[])
    run_b = param.Selector(objects=[])
    serial_b = param.Selector(objects=[])
    hide_identical = param.Boolean(default=False)

    def __init__(self, workspace, **params):
        self.workspace: Workspace = as_workspace(workspace)
        super().__init__(**params)
        self.diff: pd.DataFrame | None = None
        self._shown = pd.DataFrame(columns=SHOWN)
        self._font = table_font()  # the dashboard's font, or a notebook's widest likely one
        self.button = pn.widgets.Button(label="Compare", color="primary", align="end",
                                        stylesheets=[BUTTON_CSS],
                                        css_classes=["ckptview-compare-button"])  # fmt: skip
        self.button.on_click(self._on_compare)
        self.heading = pn.pane.Markdown("*Pick A and B, then Compare.*",
                                        css_classes=["ckptview-compare-heading"],
                                        sizing_mode="stretch_width")  # fmt: skip
        self.table = table(
            pd.DataFrame(columns=SHOWN), pagination="remote", page_size=20, selectable=1,
            formatters={"status": {"type": "html"},
                        "name": name_formatter(),
                        **{c: {"type": "textarea"} for c in ("node", "shape", "error")}},
            layout="fit_columns", widths=DIFF_WIDTHS, text_align=dict.fromkeys(NUMBERS, "right"),
            css_classes=["ckptview-diff"],
        )  # fmt: skip
        self.table.param.watch(self._on_select, "selection")
        self.plots = pn.Column(sizing_mode="stretch_width", css_classes=["ckptview-diff-plots"])
        self.body = pn.Column(self.heading, self.table, self.plots, sizing_mode="stretch_width")
        self.workspace.param.watch(lambda e: self._runs(), ["runs", "changed", "grown"])
        self._runs()

    # -- choices ----------------------------------------------------------------------------
    def _runs(self) -> None:
        labels = list(self.workspace.runs)
        for p in ("run_a", "run_b"):
            self.param[p].objects = labels
        if labels:
            self.run_a = self.run_a if self.run_a in labels else labels[0]
            self.run_b = self.run_b if self.run_b in labels else labels[0]
        self._serials_a()
        self._serials_b()
        self._name_width()  # a run refreshed: its names may have changed

    def _serial_choices(self, run: str | None) -> list[int]:
        if run is None:
            return []
        return [int(s) for s in self.workspace.runs[run].serials.index]

    @param.depends("run_a", "run_b", watch=True)
    def _name_width(self) -> None:
        """No piece of a name of either run (between its / and .) broken over two lines."""
        runs = [self.workspace.runs[r] for r in (self.run_a, self.run_b)
                if r in self.workspace.runs]  # fmt: skip
        if runs:
            px = max(name_width(cat, self._font) for cat in runs)
            set_min_width(self.table, "name", px)

    @param.depends("run_a", watch=True)
    def _serials_a(self) -> None:
        choices = self._serial_choices(self.run_a)
        self.param.serial_a.objects = choices
        if choices and self.serial_a not in choices:
            cat = self.workspace.runs[self.run_a]
            complete = [int(s) for s in cat.serials.index[cat.serials["complete"]]]
            self.serial_a = complete[0] if complete else choices[0]

    @param.depends("run_b", watch=True)
    def _serials_b(self) -> None:
        choices = self._serial_choices(self.run_b)
        self.param.serial_b.objects = choices
        if choices and self.serial_b not in choices:
            latest = self.workspace.runs[self.run_b].latest
            self.serial_b = latest if latest is not None else choices[-1]

    # -- diff -------------------------------------------------------------------------------
    def compute(self) -> pd.DataFrame:
        """``cat.diff`` of the chosen pair (blocking; runs in a thread from the button)."""
        cat_a = self.workspace.runs[self.run_a]
        cat_b = self.workspace.runs[self.run_b]
        other = None if cat_b is cat_a else cat_b
        return cat_a.diff(int(self.serial_a), int(self.serial_b), other=other)

    def show(self, diff: pd.DataFrame) -> None:
        """Put a diff on screen."""
        self.diff = diff
        self._refresh()

    @param.depends("hide_identical", watch=True)
    def _refresh(self) -> None:
        if self.diff is None:
            return
        d = self.diff
        if self.hide_identical:
            d = d[d["status"] != "identical"]
        self._shown = diff_frame(d)
        shown = self._shown.copy()
        shown["status"] = [badge(s) for s in shown["status"]]
        self.table.selection = []
        self.table.param.update(
            value=shown, widths=diff_widths(self._shown, self._font),
            hidden_columns=[c for c in ("node", "error")
                            if (self._shown[c].astype(str) == "").all()],
        )  # fmt: skip  # an empty column takes no room
        self.table.visible = True
        counts = self.diff["status"].value_counts()
        summary = ", ".join(f"{n} {s}" for s, n in counts.items())
        n_failed = int((self._shown["error"] != "").sum())
        if n_failed:
            summary += f" · {n_failed} could not be compared (listed first)"
        self.heading.object = (
            f"### {md_text(self.run_a)}:{self.serial_a} → {md_text(self.run_b)}:{self.serial_b} · "
            f"{summary}"
        )
        self.plots.objects = []

    async def _on_compare(self, event=None) -> None:
        try:
            self.show(await in_background(self.body, self.compute))
        except Exception as e:  # noqa: BLE001 - shown to the user
            self.diff = None
            self.table.value = pd.DataFrame(columns=SHOWN)
            self.table.visible = False
            self.plots.objects = []
            self.heading.object = md_problem(e, "compare")

    # -- one variable -----------------------------------------------------------------------
    def _on_select(self, event) -> None:
        if event.new:
            row = self._shown.iloc[event.new[0]]
            pn.state.execute(partial(self._show_variable_async, str(row["node"]), str(row["name"])))

    async def _show_variable_async(self, node: str, name: str) -> None:
        try:
            self._place(
                node, name, await in_background(self.plots, self.variable_plots, node, name)
            )
        except Exception as e:  # noqa: BLE001 - shown to the user
            self.plots.objects = [pn.pane.Markdown(md_problem(e, f"plot {md_text(name)}"))]

    def variable_plots(self, node: str, name: str) -> list:
        """Histograms of A, B and B−A, and a heatmap of B−A for 2-D variables."""
        cat_a = self.workspace.runs[self.run_a]
        cat_b = self.workspace.runs[self.run_b]
        a, b = int(self.serial_a), int(self.serial_b)
        out = []
        for cat, serial, tag, color in ((cat_a, a, "A", "#1565c0"), (cat_b, b, "B", "#ef6c00")):
            try:
                counts, edges = streamed_histogram(
                    lambda cat=cat, serial=serial: cat.iter_chunks(name, serial=serial, node=node)
                )
                out.append(plots.histogram(counts, edges, f"{tag}: {name} @ {serial}", color))
            except (KeyError, ValueError) as e:
                out.append(plots.empty(f"{tag}: {e}"))
        va, vb = cat_a.variables, cat_b.variables
        ra = va[(va["serial"] == a) & (va["name"] == name) & (va["node"] == node)]
        rb = vb[(vb["serial"] == b) & (vb["name"] == name) & (vb["node"] == node)]
        if ra.empty or rb.empty or tuple(ra.iloc[0]["shape"]) != tuple(rb.iloc[0]["shape"]):
            return out
        if int(ra.iloc[0]["numel"]) > PLOT_LIMIT:
            return [*out, plots.empty("difference: too large to plot at once")]
        try:
            delta = np.asarray(cat_b.read(name, b, node), dtype=np.float64) - np.asarray(
                cat_a.read(name, a, node), dtype=np.float64
            )
        except (TypeError, ValueError) as e:
            return [*out, plots.empty(f"difference: {e}")]
        counts, edges = streamed_histogram(lambda: [delta])
        out.append(plots.histogram(counts, edges, f"B − A: {name}", "#6a1b9a", "B − A"))
        if delta.ndim == 2:
            out.append(plots.heatmap(delta, f"B − A heatmap ({delta.shape[0]}×{delta.shape[1]})"))
        return out

    def show_variable(self, node: str, name: str) -> None:
        """Fill the plot area for one variable."""
        self._place(node, name, self.variable_plots(node, name))

    def _place(self, node: str, name: str, items: list) -> None:
        panes = [pn.pane.HoloViews(p, sizing_mode="stretch_width", backend="bokeh") for p in items]
        title = pn.pane.Markdown(f"#### {md_code(name)}" + (f" on {md_code(node)}" if node else ""),
                                 css_classes=["ckptview-diff-variable"])  # fmt: skip
        grid = pn.GridBox(*panes, ncols=2, sizing_mode="stretch_width")
        self.plots.objects = [title, grid]

    def __panel__(self):
        pickers = form_row(
            pn.widgets.Select.from_param(self.param.run_a, label="A: run", width=170,
                                         css_classes=["ckptview-run-a"]),
            pn.widgets.Select.from_param(self.param.serial_a, label="A: serial", width=110,
                                         css_classes=["ckptview-serial-a"]),
            pn.widgets.Select.from_param(self.param.run_b, label="B: run", width=170),
            pn.widgets.Select.from_param(self.param.serial_b, label="B: serial", width=110,
                                         css_classes=["ckptview-serial-b"]),
            self.button,
            pn.widgets.Checkbox.from_param(self.param.hide_identical, label="hide identical",
                                           align="end"),
        )  # fmt: skip
        return pn.Column(pickers, self.body, sizing_mode="stretch_width")
