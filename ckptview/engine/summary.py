"""A catalog at a glance: what ``repr(cat)`` prints and what a notebook shows for ``cat``
(layout, root, serials by status, latest, sizes, warnings), as xarray does for a Dataset."""

from __future__ import annotations

import html
from collections import Counter
from dataclasses import dataclass, field

import pandas as pd

from ..fmt import fmt_time, human_bytes, serial_status, text
from ..scan.core import Scan

#: the serials listed in the HTML summary's table (the newest ones)
SHOWN_SERIALS = 10


@dataclass
class Summary:
    layout: str
    url: str
    n_serials: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    first: int | None = None
    last: int | None = None
    latest: int | None = None
    latest_facts: str = ""
    nbytes: int = 0
    n_files: int = 0
    n_variables: int = 0  # of the latest (else the newest) serial
    framework_latest: str = ""
    with_error: int = 0  # serials whose error column says something
    with_warning: int = 0
    warnings: list[str] = field(default_factory=list)
    serials: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)
    failure: str = ""  # the tree could not be catalogued


def summarize(scan: Scan) -> Summary:
    """The facts shown; a tree whose scan fails gives a summary saying why, never a raise."""
    out = Summary(scan.layout.name, scan.url)
    try:
        table = scan.serials
        attrs = scan.tree_scan.attrs
        out.warnings = list(scan.warnings)
    except Exception as e:  # noqa: BLE001 - a repr must not raise
        out.failure = f"{type(e).__name__}: {e}"
        return out
    out.n_serials = len(table)
    out.statuses = dict(Counter(serial_status(r) for _, r in table.iterrows()))
    out.with_error = int(table["error"].notna().sum())
    out.with_warning = int(table["warning"].notna().sum())
    if len(table):
        out.first, out.last = int(table.index.min()), int(table.index.max())
        out.nbytes, out.n_files = int(table["nbytes"].sum()), int(table["n_files"].sum())
    hit = table.index[table["latest"]]
    out.latest = int(hit[0]) if len(hit) else None
    shown = out.latest if out.latest is not None else out.last
    if shown is not None:
        row = table.loc[shown]
        out.n_variables = int(row["n_variables"])
        facts = [f"{k} {int(row[k])}" for k in ("epoch", "step") if not pd.isna(row[k])]
        facts += [human_bytes(row["nbytes"]), fmt_time(row["timestamp"])]
        out.latest_facts = ", ".join(f for f in facts if f)
    if "framework_latest" in attrs:
        pointer = attrs["framework_latest"]
        out.framework_latest = "no loadable serial" if pointer is None else f"serial {pointer}"
    out.serials = table
    return out


def _status_counts(s: Summary) -> str:
    order = ["latest", "complete", "incomplete", "error"]
    parts = [f"{s.statuses[k]} {k}" for k in order if s.statuses.get(k)]
    return ", ".join(parts)


def _lines(s: Summary) -> list[tuple[str, str]]:
    """(label, value) pairs shared by the text and the HTML form."""
    rows = [("layout", s.layout), ("root", s.url)]
    if s.failure:
        return [*rows, ("error", s.failure)]
    span = f" ({s.first} … {s.last})" if s.n_serials > 1 else ""
    counts = _status_counts(s)
    rows.append(("serials", f"{s.n_serials}{span}" + (f": {counts}" if counts else "")))
    if s.latest is not None:
        rows.append(("latest", f"{s.latest}" + (f" ({s.latest_facts})" if s.latest_facts else "")))
    else:
        rows.append(("latest", "none (no serial loads)" if s.n_serials else "none"))
    if s.framework_latest:
        rows.append(("framework", f"its own pointer names {s.framework_latest}"))
    if s.n_serials:
        rows.append(("size", f"{human_bytes(s.nbytes)} in {s.n_files} files; "
                             f"{s.n_variables} variables per serial"))  # fmt: skip
    problems = [f"{n} serial(s) with {what}" for n, what in
                ((s.with_error, "errors"), (s.with_warning, "warnings")) if n]  # fmt: skip
    if problems:
        rows.append(("problems", "; ".join(problems) + " (see cat.serials)"))
    rows += [("warning", w) for w in s.warnings]
    return rows


def as_text(s: Summary) -> str:
    rows = _lines(s)
    width = max(len(k) for k, _ in rows)
    return "\n".join(["<ckptview.Catalog>", *(f"{k + ':':<{width + 1}} {v}" for k, v in rows)])


def as_html(s: Summary) -> str:
    """Every name escaped: paths, layouts and warnings come from the tree."""
    cell = 'style="text-align:left;padding:1px 8px"'
    body = "".join(f"<tr><th {cell}>{html.escape(k)}</th><td {cell}>{html.escape(v)}</td></tr>"
                   for k, v in _lines(s))  # fmt: skip
    out = f"<div class='ckptview-catalog'><b>ckptview.Catalog</b><table>{body}</table>"
    if len(s.serials):
        out += (f"<details><summary>serials (newest {min(SHOWN_SERIALS, len(s.serials))})"
                f"</summary>{_serials_html(s.serials)}</details>")  # fmt: skip
    return out + "</div>"


def _serials_html(table: pd.DataFrame) -> str:
    shown = table.tail(SHOWN_SERIALS)
    view = pd.DataFrame({
        "status": [serial_status(r) for _, r in shown.iterrows()],
        "written": [fmt_time(t) for t in shown["timestamp"]],
        "size": [human_bytes(n) for n in shown["nbytes"]],
        "step": [text(v) for v in shown["step"]],
        "variables": shown["n_variables"].astype("int64"),
        "error": [text(e) for e in shown["error"]],
    }, index=shown.index)  # fmt: skip
    if not view["error"].any():
        view = view.drop(columns="error")
    return view.to_html(escape=True)
