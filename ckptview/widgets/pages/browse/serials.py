"""The serials of one run: a paginated status table and a timeline plot; follows a live run."""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Any

import pandas as pd
import panel as pn
import param

import ckptview as cv

from ... import figures
from ..._base import (
    draw_when_seen,
    drawn,
    in_background,
    notice,
    refresh_if_changed,
    set_notice,
    size_formatter,
    table,
    wrapping,
)
from ..._format import (
    BADGE_WIDTH,
    badge,
    fit_width,
    html_choices,
    md_code,
    md_problem,
    md_text,
    metrics_wide,
    serials_frame,
    shown_metrics,
)

#: columns always offered first; metrics come after ``step``
BASE_COLUMNS = ["serial", "status", "size", "time", "epoch", "step", "files", "variables",
                "nodes"]  # fmt: skip
VERDICT_COLUMNS = ("nbytes", "loadable", "error", "warning")
DEFAULT_METRICS = 2  # metric columns shown by default (the rest via the column chooser)
#: fixed widths of the short columns; the others (time, nodes, metrics, error text) share the
#: rest of the page's width and wrap, so the table fits a 1280-pixel screen and fills a wide one
SERIAL_WIDTHS = {"serial": 74, "status": BADGE_WIDTH, "size": 86, "epoch": 76,
                 "step": 66, "files": 62, "variables": 96, "loadable": 72,
                 "nodes": "16%"}  # fmt: skip
SHORT_TITLES = {"loadable": "loads"}  # the column's width is its values', not its name's


def _empty(col: pd.Series) -> bool:
    return all(v is None or v == "" or (isinstance(v, float) and pd.isna(v)) for v in col)


#: the timeline choice that shows ``cat.usage()`` as stacked bars
BY_KIND = "bytes by kind"
#: timeline choices read from the serials table (label -> column); metrics come after them
TIMELINE = {"size": "nbytes", "epoch": "epoch", "step": "step", "variables": "variables",
            "files": "files"}  # fmt: skip
COUNTS = ("epoch", "step", "variables", "files")  # whole numbers: integer ticks


class SerialsTable(pn.viewable.Viewer):
    """Serials with status at a glance; ``selected`` follows the clicked row.

    ``poll_seconds`` > 0: while shown, the tree is checked that often (one listing) and new or
    changed serials are added in place, keeping the selection and the page.
    """

    catalog = param.ClassSelector(class_=cv.Catalog)
    selected = param.Integer(default=None, allow_None=True, doc="the clicked serial")
    page_size = param.Integer(default=20, bounds=(5, 500))
    y = param.Selector(default="size", objects=["size"], doc="what the timeline plots")
    columns = param.ListSelector(default=[], objects=[], doc="columns shown in the table")
    poll_seconds = param.Number(default=5.0, bounds=(0, None), doc="live polling period; 0: off")
    version = param.Integer(default=0, doc="bumped each time new serials were taken in")

    def __init__(self, catalog: cv.Catalog, **params):
        super().__init__(catalog=catalog, **params)
        self._column: pn.Column | None = None  # what __panel__ shows, once built
        self._toggle: pn.widgets.Button | None = None  # the chooser's button in _column
        self._seen = catalog.serials
        self.frame = serials_frame(catalog)
        self._fields: dict[str, str] = {}  # metric name -> its column's field in the table
        self._set_choices()
        self.summary = pn.pane.Markdown(self._summary(),
                                        **wrapping(css_classes=["ckptview-summary"]))  # fmt: skip
        latest = catalog.latest
        if latest is None and len(self.frame):
            latest = int(self.frame["serial"].iloc[-1])
        row = self._row(latest)
        self.table = table(
            self._shown(), titles=self._titles(), pagination="remote", page_size=self.page_size,
            selectable=1, selection=[] if row is None else [row],
            header_align="left", css_classes=["ckptview-serials"],
            formatters={"status": {"type": "html"}, "size": size_formatter(),
                        **{c: {"type": "textarea"} for c in ("nodes", "error", "warning")}},
                **self._sizing(), text_align={"size": "right"},
        )  # fmt: skip
        self.table.param.watch(self._on_select, "selection")
        if row is not None:  # selected as the table was made (no second update of it)
            self.selected = latest
        self._callback = None
        self.updated: list[int] = []  # serials new or changed at the last sync

    @cached_property
    def live(self) -> pn.pane.Markdown:
        """The notice of new or changed serials: built when there is news (most pages never
        get any), then under the summary."""
        live = notice("", kind="info", visible=False, css_classes=["ckptview-live"])
        if self._column is not None:
            self._column.insert(self._column.objects.index(self.summary) + 1, live)
        return live

    # -- columns ------------------------------------------------------------------------------
    def _metric_columns(self) -> list[str]:
        return [c for c in self.frame.columns if c not in (*BASE_COLUMNS, *VERDICT_COLUMNS)]

    def _field(self, column: str) -> str:
        """The table's field for a column: a metric gets ``metric_<n>`` (its name is the
        title), as a name from a tree is no identifier (Tabulator reads dots as nesting)."""
        if column in (*BASE_COLUMNS, *VERDICT_COLUMNS):
            return column
        return self._fields.setdefault(column, f"metric_{len(self._fields)}")

    def _titles(self) -> dict[str, str]:
        return {**SHORT_TITLES, **{self._field(c): c for c in self._metric_columns()}}

    def _set_choices(self) -> None:
        recorded = [k for k, c in TIMELINE.items() if not _empty(self.frame[c])]
        self._metric_y = {
            (str(c) if str(c) not in (*TIMELINE, BY_KIND) else f"{c} (metric)"): c
            for c in metrics_wide(self.catalog).columns
        }  # label -> metric name
        self.param.y.objects = ["size", BY_KIND, *[k for k in recorded if k != "size"],
                                *self._metric_y]  # fmt: skip
        if self.y not in self.param.y.objects:
            self.y = "size"
        optional = [*BASE_COLUMNS[2:], *self._metric_columns(), "loadable", "error", "warning"]
        self.param.columns.objects = html_choices(optional)  # the chooser renders HTML labels
        if not self.columns:  # default: the essentials, the first metrics, no empty columns
            ranked = shown_metrics(self._metric_columns())[:DEFAULT_METRICS]
            default = ["size", "time", "epoch", "step", *ranked, "nodes", "loadable", "error",
                       "warning"]  # fmt: skip
            self.columns = [c for c in default if c in optional and not _empty(self.frame[c])]
        else:
            self.columns = [c for c in self.columns if c in optional]

    def _hidden(self) -> list[str]:
        """The frame's columns the table leaves out (the table holds only the shown ones: a
        column costs the page three Bokeh models whether it is shown or not)."""
        keep = {"serial", "status", *self.columns}
        return [self._field(c) for c in self.frame.columns if c not in keep]

    def _sizing(self) -> dict:
        """Column widths and layout: with nodes, metrics or error text shown, they share what
        the short columns (:data:`SERIAL_WIDTHS`) leave of the page's width, wrapping; with
        short columns only, each is as wide as its data and the last one fills the row."""
        if any(c not in (*SERIAL_WIDTHS, "time") for c in self.columns):
            nodes = fit_width(self.frame["nodes"], "nodes", hi=240)  # wraps at ", " beyond
            return {"widths": {**SERIAL_WIDTHS, "time": 150, "nodes": nodes},
                    "layout": "fit_columns"}  # fmt: skip
        return {"widths": {}, "layout": "fit_data_stretch"}

    @param.depends("columns", watch=True)
    def _on_columns(self) -> None:
        if hasattr(self, "table"):
            self.table.param.update(value=self._shown(), **self._sizing())

    def _shown(self) -> pd.DataFrame:
        shown = self.frame.rename(columns=self._field)
        shown["status"] = [badge(s) for s in shown["status"]]
        shown["size"] = shown["nbytes"]  # bytes, shown human-readable: sorts by size
        return shown.drop(columns=self._hidden())

    def _summary(self) -> str:
        cat, f = self.catalog, self.frame
        counts = f["status"].value_counts()
        complete = int(f["status"].isin(["complete", "latest", "error"]).sum())
        loadable = int((f["loadable"] == "yes").sum())
        parts = [f"{complete} complete", f"{loadable} loadable"] + [
            f"{counts.get(k, 0)} {k}" for k in ("incomplete",) if counts.get(k, 0)
        ]
        latest, attrs = cat.latest, cat.attrs
        text = (
            f"{md_code(cat.url)} · layout **{md_text(cat.layout)}** · **{len(f)} serials** "
            f"({', '.join(parts)}) · resume point: **{latest if latest is not None else 'none'}**"
        )
        if "framework_latest" in attrs:  # the framework's own pointer disagrees: say so
            named = attrs["framework_latest"]
            text += (
                f"\n\n{badge('error')} the framework's own pointer names serial **{named}**, "
                "which does not load; ckptview's resume point is the newest serial that does"
                if named is not None
                else f"\n\n{badge('error')} the framework's pointer names no serial"
            )
        for w in attrs.get("warnings", [])[:5]:
            text += f"\n\n{badge('warning')} {md_text(w)}"
        return text

    # -- selection ----------------------------------------------------------------------------
    def _row(self, serial: int | None) -> int | None:
        """The table's row of ``serial``, if shown."""
        hit = self.frame.index[self.frame["serial"] == int(serial)] if serial is not None else []
        return int(hit[0]) if len(hit) else None

    def select(self, serial: int) -> None:
        """Select ``serial`` as if its row had been clicked."""
        row = self._row(serial)
        if row is not None:
            self.table.selection = [row]

    def _on_select(self, event) -> None:
        if event.new and event.new[0] < len(self.frame):
            self.selected = int(self.frame["serial"].iloc[event.new[0]])

    # -- live runs ----------------------------------------------------------------------------
    def check(self) -> bool:
        """Refresh the catalog when the tree changed on storage (blocking; one listing)."""
        return refresh_if_changed(self.catalog, min_interval=self.poll_seconds / 2)

    def sync(self) -> list[int]:
        """Take in the catalog's current serials, in place; returns the serials that are new.

        Keeps the selected serial and the page; a short notice names the new serials.
        """
        serials = self.catalog.serials
        if serials is self._seen:
            return []
        self._seen = serials
        old = self.frame
        before = dict(zip(old["serial"], old["status"]))
        self.frame = serials_frame(self.catalog)
        new = [int(s) for s in self.frame["serial"] if s not in before]
        changed = [
            int(s) for s, st in zip(self.frame["serial"], self.frame["status"])
            if s in before and before[s] != st
        ]  # fmt: skip
        self.updated = new + changed
        page, selected = self.table.page, self.selected
        self._set_choices()
        self.table.param.update(titles=self._titles(),
                                **self._sizing(),
                                value=self._shown())  # fmt: skip
        if selected is not None and selected in set(self.frame["serial"]):
            self.select(selected)
        elif selected is not None:
            self.table.selection = []
        n_pages = max(1, -(-len(self.frame) // self.table.page_size))
        self.table.page = min(page or 1, n_pages)
        self.summary.object = self._summary()
        if new or changed:
            parts = []
            if new:
                noun = "serial" if len(new) == 1 else "serials"
                shown = ", ".join(map(str, new[-5:]))
                parts.append(f"new {noun} {'… ' if len(new) > 5 else ''}{shown}")
            if changed:
                parts.append("updated " + ", ".join(map(str, changed[-5:])))
            status = self.frame.set_index("serial")["status"]
            if new:
                parts[0] += f" ({status[new[-1]]})"
            set_notice(self.live, " · ".join(parts), "info")
            self.live.visible = True
        self.version += 1
        return new

    def poll(self) -> list[int]:
        """:meth:`check` then :meth:`sync` (blocking): the serials that appeared."""
        self.check()
        return self.sync()

    async def _tick(self) -> None:
        if self.poll_seconds <= 0:
            return
        try:
            await in_background(None, self.check)
        except Exception as e:  # noqa: BLE001 - a storage hiccup: shown, polling goes on
            set_notice(self.live, md_problem(e, "check the tree for new serials"), "warning")
            self.live.visible = True
            return
        self.sync()

    def start_polling(self) -> None:
        """Poll every ``poll_seconds`` from now on (called when the table is shown)."""
        if self.poll_seconds <= 0 or self._callback is not None:
            return
        self._callback = pn.state.add_periodic_callback(self._tick,
                                                        period=int(self.poll_seconds * 1000))  # fmt: skip

    def stop_polling(self) -> None:
        if self._callback is not None:
            self._callback.stop()
            self._callback = None
        self.updated: list[int] = []  # serials new or changed at the last sync

    @param.depends("poll_seconds", watch=True)
    def _on_poll_seconds(self) -> None:
        if self._callback is None:
            return
        if self.poll_seconds <= 0:
            self.stop_polling()
        else:
            self._callback.period = int(self.poll_seconds * 1000)

    # -- view ---------------------------------------------------------------------------------
    def timeline(self):
        """Size (MiB), epoch, step, counts or a metric over step (or over serial where steps
        are unknown or are what is plotted)."""
        f = self.frame.copy()
        has_steps = f["step"].notna().all() and f["step"].nunique() == len(f)
        x = "step" if has_steps and self.y not in ("epoch", "step") else "serial"
        if self.y == "size":
            f["MiB"] = f["nbytes"].astype("float64") / 2**20
            return figures.timeline(f, x, "MiB", "size (MiB)", "serials: size")
        if self.y == BY_KIND:
            return figures.usage_bars(self.catalog.usage())
        if self.y in TIMELINE:
            column = TIMELINE[self.y]
            f[self.y] = pd.to_numeric(f[column], errors="coerce")
            return figures.timeline(f, x, self.y, self.y, f"serials: {self.y}",
                                  integer_y=self.y in COUNTS)  # fmt: skip
        m = metrics_wide(self.catalog)
        name = self._metric_y.get(self.y, self.y)
        f[self.y] = [m[name].get(s) if name in m else None for s in f["serial"]]
        f[self.y] = pd.to_numeric(f[self.y], errors="coerce")
        return figures.timeline(f, x, self.y, self.y, f"serials: {self.y}")

    def __panel__(self):
        return self.view()

    def _timeline_pane(self) -> pn.pane.Bokeh:
        """The timeline, drawn again when what it plots or the serials change."""
        pane = pn.pane.Bokeh(self.timeline(), sizing_mode="stretch_width")

        def redraw(event=None) -> None:
            pane.object = self.timeline()

        self.param.watch(redraw, ["y", "version"])
        return pane

    def _timeline_part(self) -> pn.Column:
        """What the timeline plots, and the timeline."""
        self.y_select = pn.widgets.Select.from_param(self.param.y, label="timeline", width=200,
                                                     css_classes=["ckptview-timeline-y"])  # fmt: skip
        return pn.Column(self.y_select, self._timeline_pane(), sizing_mode="stretch_width",
                         css_classes=["ckptview-timeline"])  # fmt: skip

    @cached_property
    def chooser(self) -> pn.widgets.MultiChoice:
        """The column chooser (built when first asked for: :meth:`show_chooser`)."""
        return pn.widgets.MultiChoice.from_param(  # its label says it: no tooltip model
            self.param.columns, label="columns", sizing_mode="stretch_width",
            css_classes=["ckptview-columns"], description=None,
        )  # fmt: skip

    def _chooser_toggle(self) -> pn.widgets.Button:
        """A button that shows the column chooser in its place. The chooser (Choices.js) on
        every page cost each visitor's browser ~0.12 s of compositing, its chips painted one by
        one (and more while a busy machine is still drawing the page), for a control few use;
        the table's headers say which columns are shown."""
        button = pn.widgets.Button(label="Columns…", variant="outline", width=120,
                                   css_classes=["ckptview-columns-toggle"])  # fmt: skip
        button.on_click(lambda event: self.show_chooser())
        self._toggle = button
        return button

    def show_chooser(self) -> pn.widgets.MultiChoice:
        """Show the column chooser in place of its button (what the button does)."""
        chooser = self.chooser
        if self._column is not None and self._toggle in self._column.objects:
            self._column.objects = [chooser if o is self._toggle else o
                                    for o in self._column.objects]  # fmt: skip
        return chooser

    def view(self, *later: Callable[[], Any]) -> pn.Column:
        """The summary, the column chooser's button, the table and the timeline, then what each of
        ``later`` makes (what a page shows under them: in the same Column, not one more
        nested); built once (a second call returns it as built), polling started.

        Served, the timeline and ``later``'s parts are built once the visitor scrolls to them
        (their placeholder sits in the Column: no Column waits for them)."""
        self.start_polling()
        if self._column is None:
            news = [self.live] if "live" in self.__dict__ else []  # built before it was shown
            self._column = pn.Column(self.summary, *news, self._chooser_toggle(), self.table,
                                     sizing_mode="stretch_width")  # fmt: skip
            draw_when_seen(self._column, lambda: [part for make in (self._timeline_part, *later)
                                                  for part in drawn(make)],
                           text="Loading…", at=len(self._column.objects))  # fmt: skip
        return self._column
