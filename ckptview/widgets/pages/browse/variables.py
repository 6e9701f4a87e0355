"""The variables of one serial: filters, sizes that stand out, totals per kind and node."""

from __future__ import annotations

import pandas as pd
import panel as pn
import param

import ckptview as cv

from ..._base import (
    built_once,
    form_row,
    name_formatter,
    set_min_width,
    share_formatter,
    size_formatter,
    table,
    table_font,
)
from ..._format import (
    badge,
    filter_choices,
    fit_width,
    fit_widths,
    html_choices,
    human_bytes,
    name_width,
    totals_frame,
    variables_frame,
)

SHOWN = ["name", "node", "kind", "dtype", "shape", "numel", "size", "share", "error"]
#: the short columns, each as wide as its longest value and its title; the name takes the
#: rest of the row (wrapping at ``/`` and ``.`` only when it must), an error a fixed share
FITTED = ["node", "kind", "dtype", "shape", "numel", "size"]
VARIABLE_WIDTHS = {"kind": 110, "dtype": 85, "shape": 95, "numel": 80, "size": 90,
                   "share": 110}  # fmt: skip
TITLES = {"share": "% of serial"}
ERROR_WIDTH = 240
SHARE_BAR = 74  # the share's bar (60 px at least) and the cell's padding


def variable_widths(shown: pd.DataFrame, font: str = "wide") -> dict[str, int]:
    """Column widths for a page of the variables table (sizes as text: ``999.9 KiB``) in
    ``font`` (``_format.FONTS``)."""
    sized = shown.assign(size="999.9 KiB") if len(shown) else shown
    share = fit_width([], TITLES["share"], lo=SHARE_BAR, font=font)
    return {**fit_widths(sized, FITTED, TITLES, hi=200, font=font), "share": share,
            "error": ERROR_WIDTH}  # fmt: skip


#: the totals: compact rows, numbers to the right, in the theme's colours
TOTALS_CSS = """
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { padding: 3px 8px; text-align: left; border-bottom: 1px solid rgba(128,128,128,.25); }
td:nth-child(2), td:nth-child(3), th:nth-child(2), th:nth-child(3) { text-align: right; }
"""


def totals_pane(css_class: str) -> pn.pane.DataFrame:
    """A small read-only table of totals (names escaped, as everywhere)."""
    return pn.pane.DataFrame(pd.DataFrame(), index=False, escape=True, border=0,
                             sizing_mode="stretch_width", stylesheets=[TOTALS_CSS],
                             css_classes=[css_class])  # fmt: skip


class VariablesTable(pn.viewable.Viewer):
    """Filterable variables of ``serial``; ``selected`` is the clicked ``(node, name)``."""

    catalog = param.ClassSelector(class_=cv.Catalog)
    serial = param.Integer(default=None, allow_None=True)
    name_filter = param.String(default="", doc="substring of the name (case-insensitive)")
    kinds = param.ListSelector(default=[], objects=[])
    nodes = param.ListSelector(default=[], objects=[])
    dtypes = param.ListSelector(default=[], objects=[])
    errors_only = param.Boolean(default=False, doc="only the variables that cannot be read")
    selected = param.Tuple(default=None, allow_None=True, length=2, doc="(node, name)")

    def __init__(self, catalog: cv.Catalog, serial: int | None = None, **params):
        if serial is None:
            serial = catalog.latest
            if serial is None and len(catalog.serials):
                serial = int(catalog.serials.index.max())
        super().__init__(catalog=catalog, serial=serial, **params)
        self._seen = None
        self._font = table_font()  # the dashboard's font, or a notebook's widest likely one
        self._choices()
        self.heading = pn.pane.Markdown(css_classes=["ckptview-vars-heading"],
                                        sizing_mode="stretch_width")  # fmt: skip
        self.table = table(
            pd.DataFrame(columns=SHOWN), pagination="remote", page_size=50, selectable=1,
            formatters={"name": name_formatter(), "share": share_formatter(),
                        "size": size_formatter(), "error": {"type": "textarea"}},
            titles=TITLES, layout="fit_columns", widths=VARIABLE_WIDTHS,
            text_align={"size": "right", "numel": "right"}, css_classes=["ckptview-variables"],
        )  # fmt: skip
        self.table.param.watch(self._on_select, "selection")
        # the totals are a handful of rows: plain tables (a Tabulator each cost the page ~16
        # Bokeh models and a table render); their frames stay in ``kind_totals``/``node_totals``
        self.kind_totals = self.node_totals = pd.DataFrame()
        self.by_kind = totals_pane("ckptview-totals-kind")
        self.by_node = totals_pane("ckptview-totals-node")
        self._full = pd.DataFrame(columns=SHOWN)
        self._update_serial()

    def _choices(self) -> None:
        """The filter choices from the catalog's variables (again after a refresh)."""
        v = self.catalog.variables
        if v is self._seen:
            return
        self._seen = v
        kinds, nodes, dtypes = filter_choices(v)
        # a MultiChoice's dropdown renders its labels as HTML: escaped labels, raw values
        self.param.kinds.objects = html_choices(kinds)
        self.param.nodes.objects = html_choices("(shared)" if n == "" else n for n in nodes)
        self.param.dtypes.objects = html_choices(dtypes)

    @param.depends("serial", watch=True)
    def _update_serial(self) -> None:
        self._choices()
        # no piece of a name (between its / and .) broken: the table scrolls sideways instead
        set_min_width(self.table, "name", name_width(self.catalog, self._font))
        self._full = (
            variables_frame(self.catalog, self.serial)
            if self.serial is not None
            else pd.DataFrame(columns=[*SHOWN, "nbytes"])
        )
        self._refilter()

    def filtered(self) -> pd.DataFrame:
        """The serial's variables that pass the filters, biggest first."""
        f = self._full
        if self.name_filter:
            f = f[f["name"].str.contains(self.name_filter, case=False, regex=False)]
        if self.kinds:
            f = f[f["kind"].isin(self.kinds)]
        if self.nodes:
            f = f[f["node"].replace("", "(shared)").isin(self.nodes)]
        if self.dtypes:
            f = f[f["dtype"].isin(self.dtypes)]
        if self.errors_only:
            f = f[f["error"].astype(str) != ""]
        return f.reset_index(drop=True)

    @param.depends("name_filter", "kinds", "nodes", "dtypes", "errors_only", watch=True)
    def _refilter(self) -> None:
        f = self.filtered()
        self._shown = f
        self.table.selection = []
        shown = f[SHOWN].astype(object)
        shown["size"] = f["nbytes"].astype("int64")  # bytes, shown human-readable: sorts by size
        self.table.param.update(
            value=shown, widths=variable_widths(f[SHOWN], self._font),
            hidden_columns=[c for c in ("node", "error")
                            if not len(f) or (f[c].astype(str) == "").all()],
        )  # fmt: skip  # an empty column takes no room
        total = int(f["nbytes"].sum()) if len(f) else 0
        n_bad = int((self._full["error"].astype(str) != "").sum()) if len(self._full) else 0
        bad = f" · {badge('error')} **{n_bad} unreadable**" if n_bad else ""
        self.heading.object = (
            f"### Serial {self.serial} · {len(f)} variables · {human_bytes(total)}{bad}"
            if self.serial is not None
            else "### No serial"
        )
        self.kind_totals = totals_frame(f, "kind")
        self.node_totals = totals_frame(f, "node")
        self.by_kind.object = self.kind_totals.drop(columns="nbytes")
        self.by_node.object = self.node_totals.drop(columns="nbytes")

    def _on_select(self, event) -> None:
        if event.new:
            row = self._shown.iloc[event.new[0]]
            self.selected = (str(row["node"]), str(row["name"]))

    @built_once
    def __panel__(self):
        filters = form_row(
            pn.widgets.TextInput.from_param(self.param.name_filter, label="name contains",
                                            width=220, css_classes=["ckptview-name-filter"]),
            pn.widgets.MultiChoice.from_param(self.param.kinds, label="kind", width=200),
            pn.widgets.MultiChoice.from_param(self.param.nodes, label="node", width=200,
                                              css_classes=["ckptview-node-filter"]),
            pn.widgets.MultiChoice.from_param(self.param.dtypes, label="dtype", width=200),
            pn.widgets.Checkbox.from_param(self.param.errors_only, label="errors only",
                                           css_classes=["ckptview-errors-only"]),
        )  # fmt: skip
        totals = pn.Row(
            pn.Column("**Per kind**", self.by_kind, sizing_mode="stretch_width"),
            pn.Column("**Per node**", self.by_node, sizing_mode="stretch_width"),
            sizing_mode="stretch_width",
        )
        return pn.Column(self.heading, filters, self.table, totals, sizing_mode="stretch_width")
