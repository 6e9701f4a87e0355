"""Human-readable values shared by every face (terminal tables, notebook reprs, widgets):
sizes, numbers, shapes, times, a serial's one-word status. Pure Python and pandas."""

from __future__ import annotations

import math

import pandas as pd

_UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]


def missing(value) -> bool:
    """None, NaN, NaT or pd.NA."""
    if value is None or value is pd.NA or value is pd.NaT:
        return True
    return isinstance(value, float) and math.isnan(value)


def text(value) -> str:
    """``str(value)``, or ``""`` when it is missing."""
    return "" if missing(value) else str(value)


def human_bytes(n) -> str:
    """``1536`` -> ``"1.5 KiB"``; missing -> ``""``."""
    if missing(n):
        return ""
    n = float(n)
    for unit in _UNITS:
        if abs(n) < 1024 or unit == _UNITS[-1]:
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"  # pragma: no cover


def fmt_number(x, digits: int = 4) -> str:
    """A compact, readable number: ``1.234e-07``, ``0.01234``, ``123.4``; NaN -> ``""``."""
    if x is None or x is pd.NA:
        return ""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return str(x)
    if math.isnan(x):
        return ""
    if x == 0:
        return "0"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if 1e-3 <= abs(x) < 1e5:
        return f"{x:.{digits}g}"
    return f"{x:.{max(digits - 1, 1)}e}"


def fmt_shape(shape) -> str:
    """``(3, 4)`` -> ``"3×4"``; ``()`` -> ``"scalar"``."""
    shape = tuple(shape) if shape is not None else ()
    return "×".join(str(int(d)) for d in shape) if shape else "scalar"


def fmt_time(ts) -> str:
    """A timestamp to the second, always the same precision (UTC when it has a zone)."""
    if missing(ts):
        return ""
    ts = pd.Timestamp(ts)
    if ts.tzinfo is not None:
        ts = ts.tz_convert("UTC")
    return ts.strftime("%Y-%m-%d %H:%M:%S")


def serial_status(row) -> str:
    """One word for a serial: ``latest``, else ``incomplete``, else ``error`` (complete but
    it does not load), else ``complete``.

    Why is in the ``error`` column (a save cut short, a file that does not parse)."""
    if bool(row["latest"]):
        return "latest"
    if not bool(row["complete"]):
        return "incomplete"
    return "error" if text(row["error"]) or not bool(row.get("loadable", True)) else "complete"
