"""Display helpers shared by the widgets: sizes, statuses, catalog frames for tables, and the
escaping of names (a tree's names are data: they reach the page as text, never as markup).

Pure pandas/numpy (no panel import), so they are cheap to unit-test.
"""

from __future__ import annotations

import html
import math
import re
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from ..fmt import fmt_number, fmt_shape, human_bytes, serial_status
from ..fmt import text as _text

STATUS_COLORS = {
    "latest": "#1b5e20",
    "complete": "#2e7d32",
    "incomplete": "#b26a00",
    "error": "#c62828",
    "warning": "#b26a00",
    "identical": "#546e7a",
    "changed": "#1565c0",
    "added": "#2e7d32",
    "removed": "#6d4c41",
    "shape_changed": "#ad1457",
    "dtype_changed": "#6a1b9a",
    "keep": "#2e7d32",
    "delete": "#c62828",
    "deleted": "#7f1d1d",
}


# -- names on the page: text, never markup ----------------------------------------------------
_MD_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")  # ASCII punctuation: escapable in Markdown


def html_text(value) -> str:
    """``value`` as HTML text: for what the browser renders as HTML (option labels of a
    MultiChoice, Tabulator ``html`` cells)."""
    return html.escape(str(value), quote=True)


def md_text(value) -> str:
    """``value`` as literal text inside Markdown: every ASCII punctuation character
    backslash-escaped (no tag, emphasis, link or code span can start), lines joined."""
    return _MD_PUNCTUATION.sub(r"\\\1", " ".join(str(value).splitlines()))


def md_code(value) -> str:
    """``value`` in code style inside Markdown (a code span cannot hold a backtick safely)."""
    return f"<code>{md_text(value)}</code>"


def md_error(error: BaseException) -> str:
    """An exception for a Markdown message: its type and its (escaped) text."""
    return f"{type(error).__name__}: {md_text(error)}"


_MD_TICKS = re.compile(r"\\`(.+?)\\`")  # an escaped `command` in a message


def md_problem(error: BaseException, doing: str = "") -> str:
    """An error for a message box: what happened and what to do, in words.

    A refusal reads ``**Refused:** …``; a bad input ``**Cannot <doing>:** …``; anything else
    ``**Could not <doing>:** … (TypeName)``. `Backticked` commands in the text become code.
    """
    text = md_text(error).strip()
    name = type(error).__name__
    low = text.lower()
    if isinstance(error, PermissionError) or low.startswith("refused"):
        body = re.sub(r"^refused\\?:\s*", "", text, flags=re.IGNORECASE)
        if "outside the roots" in body:
            body += ". Only trees under those roots can be opened here"
        head = "Refused"
    elif isinstance(error, (ValueError, KeyError, RuntimeError)):
        body, head = text, f"Cannot {doing}" if doing else "Cannot do that"
    else:
        body, head = f"{text} ({name})", f"Could not {doing}" if doing else "Failed"
    body = _MD_TICKS.sub(r"<code>\1</code>", body)
    return f"**{head}:** {body.rstrip('.')}."


def fmt_cosine(x) -> str:
    """A cosine similarity to six decimals; one within rounding of ±1 says how far it is
    (``1 − 3.2e-08``), so a near-identical direction never reads as exactly 1."""
    if x is None or x is pd.NA or (isinstance(x, float) and math.isnan(x)):
        return ""
    x = float(x)
    text = f"{x:.6f}".rstrip("0").rstrip(".")
    if text in ("1", "-1") and 1 - abs(x) > 1e-12:  # beyond float64 rounding noise
        return f"{text} {'−' if x > 0 else '+'} {1 - abs(x):.1e}"
    return "0" if text == "-0" else text


def html_choices(names) -> dict:
    """Options for a MultiChoice (its dropdown renders labels as HTML): escaped label -> name."""
    return {html_text(n): n for n in names}


#: a status column's width: the longest badge (``shape_changed``) whole
BADGE_WIDTH = 124


def badge(status: str) -> str:
    """An HTML chip for a status word (used with Tabulator's ``html`` formatter); never cut
    or wrapped."""
    color = STATUS_COLORS.get(status, "#455a64")
    word = html_text(status)
    return (
        f'<span class="cv-badge cv-{word}" style="background:{color};color:white;'
        f"border-radius:8px;padding:1px 8px;font-size:12px;white-space:nowrap;"
        f'display:inline-block">{word}</span>'
    )


#: average glyph width of the tables' 13 px font, and a header's padding and sort arrow
CHAR_PX = 7.6
HEADER_PAD = 34
CELL_PAD = 16
#: a header's padding and sort arrow as measured in Chromium (30 px; the estimate above has
#: room to spare, which a table of many short columns beside a long name cannot afford)
SNUG_HEADER_PAD = 31


def fit_width(values, title: str = "", lo: int = 48, hi: int = 320, snug: bool = False) -> int:
    """Pixels a table column needs for its longest value and its whole title (never cut),
    within ``lo``..``hi`` (a longer value wraps); ``snug``: the title measured tightly."""
    longest = max((len(str(v)) for v in values if v is not None), default=0)
    pad = SNUG_HEADER_PAD if snug else HEADER_PAD
    need = max(longest * CHAR_PX + CELL_PAD, len(str(title)) * CHAR_PX + pad)
    return int(min(max(need, lo), hi))


def fit_widths(frame: pd.DataFrame, columns, titles: dict | None = None,
               hi: int = 320, snug: bool = False) -> dict[str, int]:  # fmt: skip
    """:func:`fit_width` of each of ``columns`` in ``frame`` (title: ``titles`` or the name)."""
    titles = titles or {}
    return {c: fit_width(frame.get(c, []), titles.get(c, c), hi=hi, snug=snug)
            for c in columns}  # fmt: skip


def badge_width(statuses, title: str = "status") -> int:
    """Pixels a column of :func:`badge` chips needs for the longest of ``statuses`` whole
    (12 px text, 8 px padding a side) and its title; at most :data:`BADGE_WIDTH`."""
    longest = max((len(str(s)) for s in statuses), default=0)
    need = max(longest * 7.0 + 30, len(title) * CHAR_PX + SNUG_HEADER_PAD)
    return int(min(need, BADGE_WIDTH))


def metrics_wide(cat) -> pd.DataFrame:
    """``cat.metrics`` pivoted to one column per metric (index: serial)."""
    m = cat.metrics
    if m.empty:
        return pd.DataFrame(index=pd.Index([], name="serial", dtype="int64"))
    return m.pivot_table(index="serial", columns="name", values="value", aggfunc="last")


SERIAL_VIEW_COLUMNS = {"serial", "status", "size", "nbytes", "time", "epoch", "step", "files",
                       "variables", "nodes", "error"}  # fmt: skip
MAX_METRIC_COLUMNS = 6


def shown_metrics(names) -> list:
    """At most :data:`MAX_METRIC_COLUMNS` metric names: loss-like first, then accuracy-like, …"""
    names = list(names)
    key = ("loss", "acc", "score", "metric", "eval", "val")

    def rank(n) -> tuple:
        low = str(n).lower()
        hits = [i for i, k in enumerate(key) if k in low]
        return (min(hits) if hits else len(key), str(n))

    return sorted(names, key=rank)[:MAX_METRIC_COLUMNS]


#: (what, id of each table) -> (weak references to the tables, what was made from them)
_MADE: dict[tuple, tuple[tuple[weakref.ref, ...], Any]] = {}


def once_per_tables(what: str, tables: tuple[pd.DataFrame, ...], make: Callable[[], Any]) -> Any:
    """``make()`` once for these very tables: a served catalog's tables are shared by every
    session (each page of a 1 M-row tree asked its variables for their kinds again); a
    refresh makes new tables, and an entry goes when one of its tables goes."""
    key = (what, *map(id, tables))
    hit = _MADE.get(key)
    if hit is not None and all(ref() is t for ref, t in zip(hit[0], tables)):
        return hit[1]
    value = make()
    refs = tuple(weakref.ref(t, lambda _, key=key: _MADE.pop(key, None)) for t in tables)
    _MADE[key] = (refs, value)
    return value


def serials_frame(cat) -> pd.DataFrame:
    """``cat.serials`` for the serials table: status, human size, time, epoch, step, metrics
    (made once per catalog state; a copy each call)."""
    made = once_per_tables("serials", (cat.serials, cat.metrics), lambda: _serials_frame(cat))
    return made.copy()


def _serials_frame(cat) -> pd.DataFrame:
    df = cat.serials
    out = pd.DataFrame(index=df.index.astype("int64"))
    out["status"] = [serial_status(r) for _, r in df.iterrows()]
    out["size"] = [human_bytes(n) for n in df["nbytes"]]
    out["nbytes"] = df["nbytes"].astype("int64")
    ts = df["timestamp"]
    out["time"] = [t.strftime("%Y-%m-%d %H:%M:%S") if not pd.isna(t) else "" for t in ts]
    out["epoch"] = [None if pd.isna(v) else int(v) for v in df["epoch"]]
    out["step"] = [None if pd.isna(v) else int(v) for v in df["step"]]
    out["files"] = df["n_files"].astype("int64")
    out["variables"] = df["n_variables"].astype("int64")
    out["nodes"] = [", ".join(n) for n in df["nodes"]]
    wide = metrics_wide(cat)
    for name in shown_metrics(wide.columns):
        col = wide[name]
        label = str(name) if str(name) not in SERIAL_VIEW_COLUMNS else f"{name} (metric)"
        out[label] = [fmt_number(col.get(s)) for s in out.index]
    out["loadable"] = ["yes" if v else "no" for v in df["loadable"]]
    out["error"] = [_text(e) for e in df["error"]]
    out["warning"] = [_text(e) for e in df["warning"]]
    out.index.name = "serial"
    return out.reset_index().astype(object)


def filter_choices(variables: pd.DataFrame) -> tuple[list[str], list[str], list[str]]:
    """The sorted kinds, nodes and dtypes of a variables table (once per table)."""

    def make() -> tuple[list[str], list[str], list[str]]:
        kinds, nodes, dtypes = (sorted(map(str, variables[c].unique()))
                                for c in ("kind", "node", "dtype"))  # fmt: skip
        return kinds, nodes, dtypes

    return once_per_tables("choices", (variables,), make)


def variables_frame(cat, serial: int) -> pd.DataFrame:
    """The variables of one serial for the variables table, biggest first."""
    df = cat.variables
    df = df[df["serial"] == serial]
    total = max(int(df["nbytes"].sum()), 1)
    out = pd.DataFrame(
        {
            "node": df["node"].astype(object),
            "name": df["name"].astype(object),
            "kind": df["kind"].astype(object),
            "dtype": df["dtype"].astype(object),
            "shape": [fmt_shape(s) for s in df["shape"]],
            "numel": df["numel"].astype("int64"),
            "size": [human_bytes(n) for n in df["nbytes"]],
            "nbytes": df["nbytes"].astype("int64"),
            "share": (100.0 * df["nbytes"] / total).round(1),
            "error": [_text(e) for e in df["error"]],
        }
    )
    return out.sort_values(["nbytes", "name"], ascending=[False, True]).reset_index(drop=True)


def totals_frame(variables: pd.DataFrame, by: str) -> pd.DataFrame:
    """Count and bytes of ``variables`` (a :func:`variables_frame`) per ``by`` column."""
    if variables.empty:
        return pd.DataFrame(columns=[by, "count", "size", "nbytes"])
    g = variables.groupby(by, sort=False)
    out = pd.DataFrame({"count": g.size(), "nbytes": g["nbytes"].sum()}).reset_index()
    out[by] = out[by].replace("", "(shared)")
    out["size"] = [human_bytes(n) for n in out["nbytes"]]
    out = out.sort_values("nbytes", ascending=False)
    return out[[by, "count", "size", "nbytes"]].reset_index(drop=True).astype(object)


def as_float(chunk: np.ndarray) -> np.ndarray:
    """Values as float64 for plotting (complex -> magnitude, bool/int -> float)."""
    chunk = np.asarray(chunk).reshape(-1)
    if np.iscomplexobj(chunk):
        return np.abs(chunk).astype(np.float64)
    return chunk.astype(np.float64, copy=False)


def streamed_histogram(chunks_factory, bins: int = 40) -> tuple[np.ndarray, np.ndarray]:
    """Histogram of finite values over chunks, in bounded memory (two passes).

    ``chunks_factory()`` returns a fresh iterable of array chunks each time it is called.
    """
    lo, hi = math.inf, -math.inf
    for chunk in chunks_factory():
        x = as_float(chunk)
        x = x[np.isfinite(x)]
        if x.size:
            lo, hi = min(lo, float(x.min())), max(hi, float(x.max()))
    if lo > hi:
        return np.zeros(0), np.zeros(1)
    if lo == hi:
        lo, hi = lo - 0.5, hi + 0.5
    edges = np.linspace(lo, hi, bins + 1)
    counts = np.zeros(bins, dtype=np.int64)
    for chunk in chunks_factory():
        x = as_float(chunk)
        counts += np.histogram(x[np.isfinite(x)], bins=edges)[0]
    return counts, edges
