"""Display helpers shared by the widgets: sizes, statuses, catalog frames for tables, and the
escaping of names (a tree's names are data: they reach the page as text, never as markup).

Pure pandas/numpy (no panel import), so they are cheap to unit-test.
"""

from __future__ import annotations

import heapq
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


#: the fonts the tables are measured in: ``"roboto"``, the dashboard's (Roboto, served with
#: panel-material-ui), and ``"wide"``, DejaVu Sans, the widest of the usual UI fonts (the
#: Linux default): a notebook's tables take the host's UI font (JupyterLab's ``system-ui``:
#: DejaVu Sans, Segoe UI, San Francisco …), so they are measured as the widest of them
FONTS = ("roboto", "wide")
#: the characters of :data:`GLYPHS` after printable ASCII (space to ``~``)
GLYPH_EXTRA = "×→−…·"
#: advance widths in thousandths of an em (rounded up) of printable ASCII then
#: :data:`GLYPH_EXTRA`, per (font, bold); any other character is taken as 1 em
GLYPHS: dict[tuple[str, bool], tuple[int, ...]] = {
    ("roboto", False): (
        249, 258, 321, 616, 563, 733, 623, 175, 343, 349, 431, 568, 197, 277, 264, 413, 563, 563,
        563, 563, 563, 563, 563, 563, 563, 563, 243, 212, 509, 549, 523, 473, 898, 653, 624, 651,
        657, 569, 553, 682, 714, 272, 552, 628, 539, 874, 714, 688, 631, 688, 617, 594, 597, 649,
        637, 888, 627, 601, 600, 266, 411, 266, 418, 452, 310, 544, 562, 524, 564, 531, 348, 562,
        551, 244, 240, 507, 244, 877, 553, 571, 562, 569, 339, 517, 328, 552, 485, 752, 497, 474,
        497, 339, 245, 339, 681, 534, 444, 572, 669, 262
    ),
    ("roboto", True): (
        249, 271, 319, 593, 574, 740, 658, 162, 350, 352, 455, 545, 247, 395, 291, 372, 574, 574,
        574, 574, 574, 574, 574, 574, 574, 574, 282, 264, 510, 574, 517, 498, 897, 672, 639, 655,
        650, 563, 549, 682, 707, 293, 559, 636, 542, 876, 706, 690, 645, 690, 641, 616, 620, 660,
        654, 875, 635, 620, 607, 277, 422, 277, 438, 445, 331, 536, 563, 521, 563, 541, 358, 572,
        561, 265, 261, 535, 265, 867, 561, 565, 563, 564, 367, 514, 339, 561, 507, 735, 509, 504,
        509, 330, 252, 330, 648, 531, 444, 555, 741, 302
    ),
    ("wide", False): (
        318, 401, 460, 838, 637, 951, 780, 275, 391, 391, 500, 838, 318, 361, 318, 337, 637, 637,
        637, 637, 637, 637, 637, 637, 637, 637, 337, 337, 838, 838, 838, 531, 1000, 685, 687, 699,
        771, 632, 576, 775, 752, 295, 295, 656, 558, 863, 749, 788, 604, 788, 695, 635, 611, 732,
        685, 989, 686, 611, 686, 391, 337, 391, 838, 500, 500, 613, 635, 550, 635, 616, 353, 635,
        634, 278, 278, 580, 278, 975, 634, 612, 635, 635, 412, 521, 393, 634, 592, 818, 592, 592,
        525, 637, 337, 637, 838, 838, 838, 838, 1000, 318
    ),
    ("wide", True): (
        349, 457, 521, 838, 696, 1002, 873, 307, 458, 458, 523, 838, 380, 416, 380, 366, 696, 696,
        696, 696, 696, 696, 696, 696, 696, 696, 400, 400, 838, 838, 838, 581, 1000, 774, 763, 734,
        831, 684, 684, 821, 837, 373, 373, 775, 638, 996, 837, 851, 733, 851, 771, 721, 683, 813,
        774, 1104, 771, 725, 726, 458, 366, 458, 838, 500, 500, 675, 716, 593, 716, 679, 436, 716,
        712, 343, 343, 666, 343, 1042, 712, 688, 716, 716, 494, 596, 479, 712, 652, 924, 646, 652,
        583, 712, 366, 712, 838, 838, 838, 838, 1000, 380
    ),
}  # fmt: skip

#: the tables' text (13 px; a header's title bold) and a status badge's (12 px)
FONT_PX = 13
BADGE_PX = 12
#: a cell's padding (6 px a side, ``_base.TABLE_CSS``), its border and 1 px to spare
CELL_PAD = 14
#: a header's padding (10 px a side), its sort arrow's room (10 px), border and 1 px to spare
HEADER_PAD = 32
#: a badge's own padding (8 px a side)
BADGE_PAD = 16
#: pixels a title of several words may widen its column by to stay on one line
TITLE_SLACK = 24


def text_px(text, font: str = "wide", bold: bool = False, size: int = FONT_PX) -> float:
    """The width in pixels of ``text`` set in ``font`` (one of :data:`FONTS`) at ``size``."""
    table = GLYPHS[(font, bool(bold))]
    total = 0
    for ch in str(text):
        code = ord(ch)
        if 32 <= code < 127:
            total += table[code - 32]
        else:
            at = GLYPH_EXTRA.find(ch)
            total += table[95 + at] if at >= 0 else 1000
    return total * size / 1000


def widest(texts, font: str = "wide", bold: bool = False, size: int = FONT_PX) -> float:
    """:func:`text_px` of the widest of ``texts`` (measured: the 64 longest distinct ones)."""
    distinct = {str(t) for t in texts if t is not None}
    longest = heapq.nlargest(64, distinct, key=len)
    return max((text_px(t, font, bold, size) for t in longest), default=0.0)


def fit_width(values, title: str = "", lo: int = 48, hi: int = 320, font: str = "wide") -> int:
    """Pixels a table column needs for its widest value and its whole title (never cut),
    within ``lo``..``hi`` (a wider value wraps). A title of several words takes one line
    unless that widens the column by more than :data:`TITLE_SLACK`; it then wraps at spaces."""
    values_px = max(widest(values, font) + CELL_PAD, lo)
    title_px = text_px(title, font, bold=True) + HEADER_PAD
    if " " in str(title) and title_px > values_px + TITLE_SLACK:
        title_px = widest(str(title).split(), font, bold=True) + HEADER_PAD
    return int(min(max(values_px, title_px), hi) + 0.999)


def fit_widths(frame: pd.DataFrame, columns, titles: dict | None = None,
               hi: int = 320, font: str = "wide") -> dict[str, int]:  # fmt: skip
    """:func:`fit_width` of each of ``columns`` in ``frame`` (title: ``titles`` or the name)."""
    titles = titles or {}
    return {c: fit_width(frame.get(c, []), titles.get(c, c), hi=hi, font=font)
            for c in columns}  # fmt: skip


def badge_width(statuses, title: str = "status", font: str = "wide") -> int:
    """Pixels a column of :func:`badge` chips needs for the widest of ``statuses`` whole
    (12 px text, 8 px padding a side) and its title; at most :data:`BADGE_WIDTH`."""
    need = max(widest(statuses, font, size=BADGE_PX) + BADGE_PAD + CELL_PAD,
               text_px(title, font, bold=True) + HEADER_PAD)  # fmt: skip
    return int(min(need + 0.999, BADGE_WIDTH))


def name_pieces(name: str) -> list[str]:
    """A name's pieces as a table shows it: it may wrap after each ``/`` and ``.`` only."""
    return [p for p in re.split(r"(?<=[/.])", str(name)) if p]


def name_min_width(names, font: str = "wide") -> int:
    """Pixels a name column needs so that no piece of any of ``names`` (see
    :func:`name_pieces`) breaks over two lines: the widest piece and the cell's padding
    (the distinct pieces of a million distinct names: two seconds)."""
    text = "\n".join({str(n) for n in names if n is not None})
    pieces = set(text.replace("/", "/\n").replace(".", ".\n").split("\n")) - {""}
    return int(widest(pieces, font) + CELL_PAD + 0.999)


def metrics_wide(cat) -> pd.DataFrame:
    """``cat.metrics`` pivoted to one column per metric (index: serial); made once per catalog
    state and shared (every page's serials table asks): read it, do not change it."""
    m = cat.metrics

    def make() -> pd.DataFrame:
        if m.empty:
            return pd.DataFrame(index=pd.Index([], name="serial", dtype="int64"))
        return m.pivot_table(index="serial", columns="name", values="value", aggfunc="last")

    return once_per_tables("metrics wide", (m,), make)


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


def name_width(cat, font: str = "wide") -> int:
    """:func:`name_min_width` of every name of ``cat`` (once per catalog state and font)."""
    v = cat.variables

    def make() -> int:
        return name_min_width(v["name"].unique(), font)

    return once_per_tables(f"name width {font}", (v,), make)


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
