"""The ckptview page: ``panel serve app/ckptview_app.py --args URL... [--allow-write]``.

A first, read-only page: for each tree given in ``--args`` (the only roots it will open), a
table of its serials; clicking a serial shows that serial's variables. The full dashboard
(compare, trajectories, restore, retention) will live in ``ckptview.widgets``.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd
import panel as pn

import ckptview as cv

SERIAL_COLUMNS = ["serial", "complete", "latest", "timestamp", "nbytes", "epoch", "step",
                  "nodes", "error"]  # fmt: skip
VARIABLE_COLUMNS = ["node", "name", "kind", "dtype", "shape", "numel", "nbytes", "error"]
TICK = {"type": "tickCross"}
TICK_ONLY = {"type": "tickCross", "crossElement": False}


def parse_args(argv: list[str]) -> tuple[list[str], bool]:
    """The tree URLs and the write flag from ``--args``."""
    p = argparse.ArgumentParser(prog="ckptview_app")
    p.add_argument("urls", nargs="*")
    p.add_argument("--allow-write", action="store_true")
    ns = p.parse_args(argv)
    return ns.urls, ns.allow_write


def _plain(series: pd.Series) -> pd.Series:
    """Nullable values as Python objects with None (what the browser table can show)."""
    return series.astype(object).where(series.notna(), None)


def serials_frame(cat: cv.Catalog) -> pd.DataFrame:
    """``cat.serials`` ready for display: one row per serial, text where JSON needs it."""
    df = cat.serials.reset_index()
    out = pd.DataFrame({"serial": df["serial"].astype("int64")})
    out["complete"] = df["complete"].astype(bool)
    out["latest"] = df["latest"].astype(bool)
    ts = df["timestamp"]
    out["timestamp"] = ts.dt.strftime("%Y-%m-%d %H:%M:%S UTC").where(ts.notna(), "")
    out["nbytes"] = df["nbytes"].astype("int64")
    out["epoch"] = _plain(df["epoch"])
    out["step"] = _plain(df["step"])
    out["nodes"] = [", ".join(n) for n in df["nodes"]]
    out["error"] = df["error"].astype(object).where(df["error"].notna(), "")
    return out[SERIAL_COLUMNS]


def variables_frame(cat: cv.Catalog, serial: int) -> pd.DataFrame:
    """The variables of one serial, ready for display."""
    df = cat.variables
    df = df[df["serial"] == serial].reset_index(drop=True)
    out = df[[c for c in VARIABLE_COLUMNS if c not in ("shape", "error")]].copy()
    out["shape"] = ["[" + ", ".join(str(d) for d in s) + "]" for s in df["shape"]]
    out["error"] = df["error"].astype(object).where(df["error"].notna(), "")
    return out[VARIABLE_COLUMNS]


def _catalog(url: str) -> cv.Catalog:
    """One catalog per tree, shared by every session of this server."""
    return pn.state.as_cached(f"ckptview-catalog:{url}", lambda: cv.open(url))


def tree_view(url: str) -> pn.viewable.Viewable:
    """Serials table plus the variables of the clicked serial, for one tree."""
    try:
        cat = _catalog(url)
        serials = serials_frame(cat)
    except Exception as e:  # noqa: BLE001 - a tree that fails to open is shown, not fatal
        return pn.pane.Alert(f"**{url}**: {type(e).__name__}: {e}", alert_type="danger")
    latest = cat.latest
    summary = pn.pane.Markdown(
        f"`{cat.url}` · layout **{cat.layout}** · {len(serials)} serials · "
        f"latest complete: **{latest if latest is not None else 'none'}**",
        css_classes=["ckptview-summary"],
    )
    table = pn.widgets.Tabulator(
        serials, show_index=False, selectable=1, disabled=True, layout="fit_data_table",
        formatters={"complete": TICK, "latest": TICK_ONLY}, sizing_mode="stretch_width",
        text_align={"epoch": "right", "step": "right"}, widths={"error": 420},
        configuration={"columnDefaults": {"tooltip": True}},
        name="serials", css_classes=["ckptview-serials"],
    )  # fmt: skip
    heading = pn.pane.Markdown(css_classes=["ckptview-vars-heading"])
    variables = pn.widgets.Tabulator(
        pd.DataFrame(columns=VARIABLE_COLUMNS), show_index=False, disabled=True,
        layout="fit_data_table", pagination="local", page_size=50, sizing_mode="stretch_width",
        widths={"error": 420}, configuration={"columnDefaults": {"tooltip": True}},
        name="variables", css_classes=["ckptview-variables"],
    )  # fmt: skip

    def show(serial: int) -> None:
        frame = variables_frame(cat, serial)
        heading.object = f"### Serial {serial} · {len(frame)} variables"
        variables.value = frame

    def on_select(event) -> None:
        if event.new:
            show(int(serials.iloc[event.new[0]]["serial"]))

    table.param.watch(on_select, "selection")
    if len(serials):
        start = latest if latest is not None else int(serials["serial"].iloc[-1])
        table.selection = [int(serials.index[serials["serial"] == start][0])]
    return pn.Column(summary, table, heading, variables, sizing_mode="stretch_width")


def build_app(urls: list[str], allow_write: bool = False) -> pn.viewable.Viewable:
    """The page for the trees at ``urls``; read-only unless ``allow_write``."""
    mode = "write access enabled" if allow_write else "read-only"
    header = pn.pane.Markdown(
        f"# ckptview\nCheckpoint trees, without the framework · *{mode}*",
        css_classes=["ckptview-title"],
    )
    if not urls:
        body = pn.pane.Alert("No tree given: `ckptview serve URL...`", alert_type="warning")
    elif len(urls) == 1:
        body = tree_view(urls[0])
    else:
        body = pn.Tabs(*[(u.rstrip("/").rsplit("/", 1)[-1] or u, tree_view(u)) for u in urls])
    return pn.Column(header, body, sizing_mode="stretch_width", margin=(10, 20))


if __name__.startswith("bokeh"):  # run by ``panel serve``
    pn.extension("tabulator")
    build_app(*parse_args(sys.argv[1:])).servable(title="ckptview")
