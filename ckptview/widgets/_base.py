"""Shared plumbing: the set of open runs, background work with a loading indicator, tables."""

from __future__ import annotations

import asyncio
import functools
import os
import posixpath
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import pandas as pd
import panel as pn
import param
from panel.reactive import ReactiveHTML

import ckptview as cv
from ckptview.tree import Tree

from ._format import md_problem
from .guard import Guard

#: tables in either theme: compact cells, titles never ellipsized (a title of several words
#: wraps at its spaces), the selected row a translucent tint (its text keeps the theme's
#: colour), tooltips in the theme's colours (Tabulator's box is white, its text took the
#: page's colour: white on white in the dark theme), long words (paths, names) broken inside
#: their cell instead of widening it. The selectors outrank the Tabulator theme's and the
#: Material design's own (``_format``'s column widths count on these paddings: ``CELL_PAD``,
#: ``HEADER_PAD``)
TABLE_CSS = """
.pnx-tabulator.tabulator { font-size: 13px; max-width: 100%; }
.pnx-tabulator .tabulator-header .tabulator-col { font-size: 13px; }
.pnx-tabulator.tabulator .tabulator-tableholder .tabulator-table .tabulator-row
  .tabulator-cell.tabulator-cell { padding: 4px 6px; overflow-wrap: anywhere; }
.pnx-tabulator.tabulator .tabulator-header .tabulator-col .tabulator-col-content
  .tabulator-col-title { white-space: normal; text-overflow: clip; overflow-wrap: normal; }
.pnx-tabulator .cv-name { white-space: normal; overflow-wrap: anywhere; }
.pnx-tabulator .cv-name > span { white-space: nowrap; }
.tabulator-row.tabulator-selected { background-color: rgba(33, 150, 243, 0.28) !important;
  color: var(--panel-on-background-color, inherit) !important; }
.pnx-tabulator .tabulator-popup-container.tabulator-popup-container {
  background: var(--panel-surface-color, #fff); color: var(--panel-on-surface-color, #212121);
  border-color: var(--panel-border-color, #ddd); }
"""

#: the share of a total as a bar behind its number (the number in the theme's text colour)
SHARE_FORMATTER_TEMPLATE = (
    '<div style="position:relative;min-width:60px">'
    '<div style="position:absolute;left:0;top:0;bottom:0;'
    "width:<%= Math.max(0, Math.min(100, Number(value) || 0)) %>%;"
    'background:rgba(33,150,243,0.35);border-radius:2px"></div>'
    '<span style="position:relative;padding-left:3px">'
    "<%= (value === null || value === undefined || value === '') ? '' : Number(value).toFixed(1) %>"
    "</span></div>"
)


def share_formatter():
    """A Tabulator cell formatter: a percentage as a bar with its number, readable in any theme."""
    from bokeh.models.widgets.tables import HTMLTemplateFormatter

    return HTMLTemplateFormatter(template=SHARE_FORMATTER_TEMPLATE)


#: a filled primary button's text in the colour its design pairs with the fill (Bokeh's own is
#: always white: white on the light blue primary of JupyterLab's dark theme)
BUTTON_CSS = """
:host(.solid) .bk-btn.bk-btn-primary { color: var(--button-primary-text-color, #fff); }
"""


def table_font() -> str:
    """The font the tables are measured in (``_format.FONTS``): the dashboard's, served;
    else the widest of the usual UI fonts (a notebook's tables take its host's UI font)."""
    return "roboto" if served() else "wide"


def set_min_width(tab: pn.widgets.Tabulator, field: str, px: int) -> None:
    """Keep ``field``'s column at least ``px`` wide (on a page narrower than its columns need
    the table scrolls sideways). Panel takes Tabulator column options from the configuration
    given when the table was made (``_configuration``, sent again with every column change);
    only a new ``px`` sends it."""
    config = getattr(tab, "_configuration", None)
    if not isinstance(config, dict):
        return  # a Panel without per-column options: the widths alone
    columns = [dict(c) for c in config.get("columns", [])]
    if any(c.get("field") == field and c.get("minWidth") == int(px) for c in columns):
        return
    columns = [c for c in columns if c.get("field") != field]
    tab._configuration = {**config, "columns": [*columns, {"field": field, "minWidth": int(px)}]}
    tab.param.trigger("widths")  # the columns, and with them the configuration, sent again


def form_row(*items, **kwargs) -> pn.FlexBox:
    """A row of form widgets that wraps onto more lines when the page is narrow."""
    kwargs.setdefault("sizing_mode", "stretch_width")
    return pn.FlexBox(*items, flex_wrap="wrap", align_items="flex-end", **kwargs)


#: bytes as "1.5 KiB" in the browser (same rule as ``_format.human_bytes``): a size column
#: holds the integer byte count, so it sorts by bytes (in the browser and server-side alike)
SIZE_FORMATTER_TEMPLATE = (
    "<%= (function (n) { if (n === null || n === undefined || n === '') return '';"
    " n = Number(n); if (isNaN(n)) return ''; var u = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];"
    " if (Math.abs(n) < 1024) return Math.trunc(n) + ' B'; var i = 0;"
    " while (Math.abs(n) >= 1024 && i < 5) { n /= 1024; i++; }"
    " return n.toFixed(1) + ' ' + u[i]; })(value) %>"
)


#: a name as text that wraps after its path separators (``/`` and ``.``) only: each piece up
#: to a separator is a span that never wraps (a browser would break ``model-parallel-rng``
#: after a hyphen first), the name column is as wide as its widest piece (``set_min_width``)
NAME_FORMATTER_TEMPLATE = (
    "<span class=\"cv-name\"><span><%= String(value === null || value === undefined ? '' : value)"
    ".replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;')"
    ".replace(/\"/g, '&quot;').replace(/'/g, '&#39;')"
    ".replace(/([\\/.])/g, '$1</span><wbr><span>') %></span></span>"
)


def name_formatter():
    """A Tabulator cell formatter for names: escaped text, wrapped at ``/`` and ``.`` (its
    tooltip, the table's default, is the whole name)."""
    from bokeh.models.widgets.tables import HTMLTemplateFormatter

    return HTMLTemplateFormatter(template=NAME_FORMATTER_TEMPLATE)


def size_formatter():
    """A Tabulator cell formatter showing an integer byte count as a human-readable size."""
    from bokeh.models.widgets.tables import HTMLTemplateFormatter

    return HTMLTemplateFormatter(template=SIZE_FORMATTER_TEMPLATE)


#: a cell's tooltip: its value as text (Tabulator's own ``tooltip: true`` inserts it as HTML)
TEXT_TOOLTIP = (
    "function (e, cell) { var v = cell.getValue();"
    " if (v === null || v === undefined || v === '') return '';"
    " var tip = document.createElement('div'); tip.textContent = String(v); return tip; }"
)


class LeanTabulator(pn.widgets.Tabulator):
    """A read-only Tabulator whose columns share their cell models.

    Panel gives every column its own editor and formatter (three Bokeh models a column: half a
    page's models for a wide table, each one built, serialised and walked again on every
    document change). Read-only, every column can use one plain editor, and columns whose
    formatters are alike one formatter; and only those are built (Panel's own column
    definitions build an editor and a formatter per column, most of them then dropped)."""

    def _get_column_definitions(self, col_names, df):
        from bokeh.models.widgets.tables import CellEditor, CellFormatter, TableColumn

        if (self.hierarchical or self.editors or len(self.indexes) > 1
                or any(isinstance(c, tuple) for c in col_names)):  # fmt: skip
            return self._share(super()._get_column_definitions(col_names, df))
        editor = CellEditor()
        formatters: dict = {}
        columns = []
        for col in col_names:
            data = df[col] if col in df.columns else df.index
            if isinstance(data, pd.DataFrame):
                raise ValueError("DataFrame contains duplicate column names.")
            given = self.formatters.get(col)
            if isinstance(given, CellFormatter):
                kind, options = given, {}
            else:  # none, or Tabulator's own (a dict or a name): Panel's default model
                kind, options = _default_formatter(data)
            if isinstance(self.text_align, str):
                options["text_align"] = self.text_align
            elif col in self.text_align:
                options["text_align"] = self.text_align[col]
            elif col in self.indexes:
                options["text_align"] = "left"
            alike = (type(kind), repr(sorted(kind.properties_with_values(include_defaults=False)
                                             .items()))) if isinstance(given, CellFormatter) else kind  # fmt: skip
            key = (alike, repr(sorted(options.items())))
            formatter = formatters.get(key)
            if formatter is None:
                formatter = formatters[key] = _make_formatter(kind, options)
            width = self.widths if isinstance(self.widths, int) else self.widths.get(str(col))
            columns.append(TableColumn(field=str(col), title=self.titles.get(col, str(col)),
                                       editor=editor, formatter=formatter,
                                       width=width if isinstance(width, int) else 0))  # fmt: skip
        return columns

    @staticmethod
    def _share(columns: list) -> list:
        """``columns`` (Panel's definitions) sharing one editor and their alike formatters."""
        from bokeh.models.widgets.tables import CellEditor

        editor = CellEditor()
        formatters: dict = {}
        for column in columns:
            column.editor = editor
            f = column.formatter
            key = (type(f), repr(sorted(f.properties_with_values(include_defaults=False).items())))
            column.formatter = formatters.setdefault(key, f)
        return columns


def _default_formatter(data) -> tuple[type, dict]:
    """Panel's default Bokeh formatter for a column of ``data``: its class and options."""
    import datetime as dt

    from bokeh.models.widgets.tables import DateFormatter, NumberFormatter, StringFormatter
    from panel.util import isdatetime

    kind = data.dtype.kind
    if kind == "i":
        return NumberFormatter, {"text_align": "right"}
    if kind == "b":
        return StringFormatter, {"text_align": "center"}
    if kind == "f":
        return NumberFormatter, {"format": "0,0.0[00000]", "text_align": "right"}
    if isdatetime(data) or kind == "M":
        dated = len(data) and isinstance(data.values[0], dt.date)
        return DateFormatter, {"format": "%Y-%m-%d" if dated else "%Y-%m-%d %H:%M:%S",
                               "text_align": "right"}  # fmt: skip
    return StringFormatter, {"null_format": ""}


def _make_formatter(kind, options: dict):
    """A formatter of class ``kind`` with ``options``, or a copy of the model ``kind``."""
    from panel.util import clone_model

    if isinstance(kind, type):
        return kind(**options)
    formatter = clone_model(kind)
    if "text_align" in options and hasattr(formatter, "text_align"):
        formatter.text_align = options["text_align"]
    return formatter


def table(value: pd.DataFrame, **kwargs) -> pn.widgets.Tabulator:
    """A read-only Tabulator with the package's defaults (fits the page width).

    Titles and tooltips are text (names from a tree are data, never markup); a column holds
    HTML only where its ``formatters`` entry says ``html`` (the package's own badges).
    """
    from panel.io.model import JSCode

    defaults = {
        "resizable": "header",  # resize from the header only: a click on a row selects it
        "titleFormatter": "plaintext",  # Tabulator sets titles as HTML otherwise
        "tooltip": JSCode(TEXT_TOOLTIP),
    }
    opts = dict(
        show_index=False, disabled=True, layout="fit_data_stretch", sizing_mode="stretch_width",
        stylesheets=[TABLE_CSS], theme="simple", configuration={"columnDefaults": defaults},
    )  # fmt: skip
    opts.update(kwargs)
    return LeanTabulator(value, **opts)


def rule() -> pn.Spacer:
    """A thin horizontal line between sections (a Divider's stylesheet, loaded by a part that
    joins the page late, would be fetched from the CDN: blocked by the page's CSP, offline)."""
    return pn.Spacer(height=1, sizing_mode="stretch_width", margin=(12, 5),
                     styles={"border-top": "1px solid rgba(128, 128, 128, 0.35)"})  # fmt: skip


def served() -> bool:
    """Whether the code runs for a browser session of a Panel server: not in a notebook, nor
    in the session ``panel serve --warm`` runs the app in at startup (no server behind it)."""
    doc = pn.state.curdoc
    context = doc.session_context if doc is not None else None
    return context is not None and getattr(context, "server_context", None) is not None


#: the attribute of a served Document: the fills :func:`draw_when_seen` queued for it, None
#: once they were drawn (on the Document itself: they go when it goes, even if the page never
#: got ready)
_SEEN = "_ckptview_draw_when_seen"


def drawn(make: Callable[[], Any]) -> list:
    """``make()`` as a list of parts (it may return one or several), or a notice of why it
    could not be drawn."""
    try:
        made = make()
    except Exception as e:  # noqa: BLE001 - the page's other parts still drawn
        return [notice(md_problem(e, "draw this part"), "danger")]
    return list(made) if isinstance(made, list) else [made]


def _fill(doc, fills: list) -> None:
    """Build every part of ``fills`` (``(put, make)``) into its place in one batch: one walk
    of the document's models and one message to the browser for all of them."""
    from panel.io.document import hold

    with hold(doc, freeze=True):
        for put, make in fills:
            put(drawn(make))


class SeenMarker(ReactiveHTML):
    """A placeholder that tells the server once the visitor sees it (its top within the
    browser's viewport: the page scrolled to it, or the page short enough to show it)."""

    seen = param.Boolean(default=False, doc="set by the browser, once")
    text = param.String(default="", doc="what the placeholder says meanwhile (plain text)")

    _child_config = {"text": "literal"}  # noqa: RUF012 - Panel's class attribute

    _template = (
        '<div id="mark" class="ckptview-later" style="min-height: 24px; padding: 4px 0;'
        ' opacity: 0.6; font-size: 13px">${text}</div>'
    )
    #: seen once it has stayed in view a moment: while the page is first laid out (a table
    #: before its rows are drawn) what is below the first screen passes through it
    _scripts = {  # noqa: RUF012 - Panel's class attribute
        "render": """
            if (data.seen) return
            const fire = () => {
              if (state.observer) state.observer.disconnect()
              data.seen = true
            }
            if (!("IntersectionObserver" in window)) { fire(); return }
            state.observer = new IntersectionObserver((entries) => {
              clearTimeout(state.timer)
              if (!entries.some((e) => e.isIntersecting)) return
              state.timer = setTimeout(() => {
                const r = mark.getBoundingClientRect()
                if (r.height > 0 && r.top < window.innerHeight && r.bottom > 0) fire()
              }, 500)
            })
            state.observer.observe(mark)
        """,
        "remove": """
            clearTimeout(state.timer)
            if (state.observer) state.observer.disconnect()
        """,
    }
    #: what Panel makes of ``_template`` (the same for every marker: it holds no Jinja and no
    #: child), made once rather than compiled and parsed again for each page
    _made_template: tuple | None = None

    def _get_template(self) -> tuple:
        cls = type(self)
        if cls.__dict__.get("_made_template") is None:
            cls._made_template = super()._get_template()
        html, nodes, attrs = cls._made_template
        return html, list(nodes), {node: list(a) for node, a in attrs.items()}


def draw_when_seen(area: pn.layout.ListLike, make: Callable[[], Any], text: str = "",
                   marker: bool = True, at: int | None = None) -> None:  # fmt: skip
    """Fill ``area`` with ``make()`` (a part or a list of parts), or with ``at`` put them into
    ``area`` at that index, beside what it holds (no Column of their own): served, while a
    page is first built, once the visitor sees them (scrolled to their place, or the page short
    enough to show it) or :func:`reveal` asks for it; otherwise (a notebook, a page already
    shown) at once.

    What is below the first screen of a page (the timeline and the variables under the
    serials table) is not built for a visitor who never looks at it: the server's work per
    page is then what the first screen shows. Every part queued for the page is built in one
    batch when the first is seen (they are next to each other).
    ``text`` stands in the placeholder meanwhile; ``marker=False``: ``area`` waits for a part
    queued before it on the page (just above it) to be seen, with no placeholder of its own."""
    mark = None

    def put(parts: list) -> None:
        if at is None:
            area.objects = parts
            return
        objects = list(area.objects)
        i = next((k for k, o in enumerate(objects) if o is mark), None)
        objects[slice(at, at) if i is None else slice(i, i + 1)] = parts
        area.objects = objects

    doc = pn.state.curdoc
    if not served() or pn.state.loaded or getattr(doc, _SEEN, []) is None:
        put(drawn(make))
        return
    queued = getattr(doc, _SEEN, None)
    if queued is None:
        queued = []
        setattr(doc, _SEEN, queued)
    queued.append((put, make))
    if not marker and len(queued) > 1:
        if at is None:
            area.objects = []
        return
    mark = SeenMarker(text=text, sizing_mode="stretch_width", margin=(5, 10))
    mark.param.watch(lambda event: doc.add_next_tick_callback(lambda: reveal(doc)), "seen")
    put([mark])


def reveal(doc=None) -> bool:
    """Build now what :func:`draw_when_seen` queued for ``doc`` (default: the current
    document), e.g. when the visitor asks for something shown there; whether anything was."""
    doc = doc if doc is not None else pn.state.curdoc
    fills = getattr(doc, _SEEN, None) if doc is not None else None
    if not fills:
        return False
    setattr(doc, _SEEN, None)
    _fill(doc, fills)
    return True


def built_once(method: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A viewer's ``__panel__`` that builds its layout once: showing it again (a tab switch, the
    same run picked again) reuses the widgets and their state instead of building new ones."""

    @functools.wraps(method)
    def layout(self):
        built = self.__dict__.get("_built_layout")
        if built is None:
            built = self.__dict__["_built_layout"] = method(self)
        return built

    return layout


async def in_background(target: pn.viewable.Viewable | None, fn: Callable[..., Any], *args):
    """Run ``fn(*args)`` in a worker thread while ``target`` shows a loading indicator.

    The event loop (the browser connection, the Jupyter kernel) stays responsive meanwhile.
    """
    if target is not None:
        target.loading = True
    try:
        return await asyncio.to_thread(fn, *args)
    finally:
        if target is not None:
            target.loading = False


def label_for(url: str, taken) -> str:
    """A short, unique label for a run: the tree's last path component."""
    base = posixpath.basename(os.fspath(url).rstrip("/")) or os.fspath(url)
    label, n = base, 2
    while label in taken:
        label, n = f"{base} ({n})", n + 1
    return label


class Workspace(param.Parameterized):
    """The runs (checkpoint trees) open at once, keyed by label, and what may be done to them."""

    runs = param.Dict(default={}, doc="label -> ckptview.Catalog")
    guard = param.ClassSelector(class_=Guard, doc="roots and write access")
    changed = param.Integer(default=0, doc="bumped after a restore or retention changed a tree")
    grown = param.Integer(default=0, doc="bumped when polling found new or changed serials")
    executor = param.Parameter(
        default=None,
        doc="lists the files of the trees opened here "
        "(served: an IsolatedExecutor, so a parser crash is one error row)",
    )

    def __init__(self, catalogs=None, guard: Guard | None = None, **params):
        super().__init__(guard=guard or Guard(restrict=False, allow_write=True), **params)
        #: label -> why the last check of that tree for new serials failed (see :meth:`poll`)
        self.failures: dict[str, str] = {}
        #: whether the views should switch to the run added last (see :meth:`add`)
        self.show_added = True
        for item in catalogs or []:
            self.add(item)

    def add(self, catalog: cv.Catalog | str | os.PathLike, storage_options=None, *,
            show: bool = True) -> str:  # fmt: skip
        """Open (if a URL) and add a run; trees outside the guard's roots are refused (the URL
        and options before anything is opened, the opened tree after). ``show``: the views
        switch to it (a tree the visitor opened), else it only joins the run lists (a tree
        catalogued in the background)."""
        if not isinstance(catalog, cv.Catalog):
            self.guard.check_url(catalog, storage_options)
            catalog = cv.open(catalog, storage_options=storage_options or None,
                              executor=self.executor)  # fmt: skip
        self.guard.check_catalog(catalog)
        for label, cat in self.runs.items():
            if cat.url == catalog.url:
                return label
        label = label_for(catalog.url, self.runs)
        self.show_added = show
        self.runs = {**self.runs, label: catalog}
        return label

    def poll(self) -> list[str]:
        """Refresh the runs whose trees changed on storage (blocking); their labels.

        A tree whose check or rescan fails keeps its last catalog; why is in ``failures``
        (the other trees are checked all the same)."""
        refreshed, failures = [], {}
        for label, cat in list(self.runs.items()):
            try:
                if refresh_if_changed(cat):
                    refreshed.append(label)
            except Exception as e:  # noqa: BLE001 - shown on that tree, never fatal
                failures[label] = f"{type(e).__name__}: {e}"
        self.failures = failures
        return refreshed

    def touch(self) -> None:
        """Tell the views that a tree changed (they rebuild from the refreshed catalog)."""
        self.changed += 1

    @property
    def allow_write(self) -> bool:
        return self.guard.allow_write


def as_workspace(source) -> Workspace:
    """A :class:`Workspace` from a Workspace, a Catalog, a URL, or a list of those."""
    if isinstance(source, Workspace):
        return source
    if isinstance(source, (list, tuple)):
        return Workspace(list(source))
    return Workspace([source])


#: message boxes: a translucent tint of the kind's colour over the page and the theme's own
#: text colour, so they read in the light and the dark theme alike
NOTICE_STYLES = {
    "info": {"background": "rgba(25, 118, 210, 0.14)", "border-left": "4px solid #1976d2"},
    "success": {"background": "rgba(46, 125, 50, 0.16)", "border-left": "4px solid #2e7d32"},
    "warning": {"background": "rgba(249, 168, 37, 0.18)", "border-left": "4px solid #f9a825"},
    "danger": {"background": "rgba(198, 40, 40, 0.16)", "border-left": "4px solid #c62828"},
}
NOTICE_TEXT = {"color": "var(--panel-on-background-color, inherit)"}


#: text with long paths or names: they break anywhere rather than run out of their box
WRAP_CSS = (
    ":host { overflow-wrap: anywhere; } code { white-space: normal; overflow-wrap: anywhere; }"
)


def wrapping(**kwargs) -> dict:
    """``kwargs`` for a Markdown pane whose long words (paths) wrap inside it."""
    kwargs["stylesheets"] = [*kwargs.get("stylesheets", []), WRAP_CSS]
    kwargs.setdefault("sizing_mode", "stretch_width")
    return kwargs


def notice(text: str = "", kind: str = "info", **kwargs) -> pn.pane.Markdown:
    """A readable message box (dark text on a light tint) in any design or theme."""
    kwargs = wrapping(**kwargs)
    classes = [c for c in kwargs.pop("css_classes", []) if not c.startswith("cv-notice-")]
    return pn.pane.Markdown(text, styles=_notice_style(kind),
                            css_classes=[*classes, f"cv-notice-{kind}"], **kwargs)  # fmt: skip


def _notice_style(kind: str) -> dict:
    return {**NOTICE_STYLES[kind], **NOTICE_TEXT, "padding": "2px 12px", "border-radius": "4px"}


def set_notice(pane: pn.pane.Markdown, text: str, kind: str = "info") -> None:
    """Change a :func:`notice`'s text and kind; the kind is also a CSS class (for tests)."""
    classes = [c for c in pane.css_classes if not c.startswith("cv-notice-")]
    pane.param.update(object=text, styles=_notice_style(kind),
                      css_classes=[*classes, f"cv-notice-{kind}"])  # fmt: skip


# -- live runs: pick up new serials while a view is open -----------------------------------------
_LIVE_LOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LIVE_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LIVE_GUARD = threading.Lock()


def _signature(entries: dict) -> dict:
    return {rel: (inf.get("type"), inf.get("size"), str(inf.get("mtime")), inf.get("etag"))
            for rel, inf in entries.items()}  # fmt: skip


def changed_on_storage(cat: cv.Catalog) -> bool:
    """True when the tree's listing (names, sizes, mtimes) differs from the catalog's.

    One listing of the tree; no file is opened. A one-file tree never changes here.
    """
    tree = cat.tree
    if tree.single is not None or not tree.listed:
        return False  # one file, or not listed yet (the next access lists it anyway)
    try:
        cat.storage.fs.invalidate_cache(tree.root)
    except Exception:  # noqa: BLE001 - a filesystem without a listing cache
        pass
    fresh = Tree(cat.storage, tree.root).entries
    return _signature(fresh) != _signature(tree.entries)


def refresh_if_changed(cat: cv.Catalog, min_interval: float = 0.0) -> bool:
    """``cat.refresh()`` when the tree changed on storage; True when it did.

    Several views (and several browser sessions sharing one catalog) may poll the same catalog:
    one check at a time, and none when another ran less than ``min_interval`` seconds ago.
    ``refresh`` then rereads only the new or changed files' headers (the header cache).
    """
    with _LIVE_GUARD:
        lock = _LIVE_LOCKS.setdefault(cat, threading.Lock())
    with lock:
        if time.monotonic() - _LIVE_CHECKED.get(cat, -1e9) < min_interval:
            return False
        _LIVE_CHECKED[cat] = time.monotonic()
        if not changed_on_storage(cat):
            return False
        cat.refresh()
        cat.serials  # noqa: B018 - rebuild now, in the polling thread
        return True


def offer_runs(view) -> None:
    """Offer the workspace's runs in ``view.run`` (keeping the choice while it still exists)."""
    labels = list(view.workspace.runs)
    view.param.run.objects = labels
    if labels:
        view.run = view.run if view.run in labels else labels[0]
