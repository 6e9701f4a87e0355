"""The journal read back: one row per operation, and which ones a crash cut short."""

from __future__ import annotations

import os

import pandas as pd

from .journal import journal_path, open_root, read_journal
from .lock import TreeLock, is_stale

STATUS_COLUMNS = ["op_id", "action", "serial", "serials", "started", "ended", "status", "steps",
                  "detail"]  # fmt: skip
RECOVERABLE = ("restore", "retention", "recover")


def operations(records: list[dict]) -> list[dict]:
    """Journal records grouped per operation (``op_id``), oldest first; each has ``records``,
    ``begin`` (its begin record or None) and ``recovered`` (the recovery's outcome or None)."""
    ops: dict[str | None, dict] = {}  # a record without an op_id is grouped under None
    recovered: dict[str | None, str | None] = {}
    for r in records:
        op = ops.setdefault(r.get("op_id"), {"op_id": r.get("op_id"), "records": []})
        op["records"].append(r)
        if r.get("event") == "recovered":
            recovered[r.get("of")] = r.get("outcome")
    for op in ops.values():
        op["begin"] = next((r for r in op["records"] if r.get("event") == "begin"), None)
        op["recovered"] = recovered.get(op["op_id"])
    return list(ops.values())


def needs_recovery(op: dict) -> bool:
    """An operation that began and neither ended nor was recovered."""
    begin = op["begin"]
    if begin is None or begin.get("action") not in RECOVERABLE or op["recovered"]:
        return False
    return not any(r.get("event") == "end" for r in op["records"])


def _summary(op: dict) -> tuple:
    recs, begin = op["records"], op["begin"]
    events = [r.get("event") for r in recs]
    action = begin.get("action") if begin else ("write" if "intent" in events else events[0])
    serial = begin.get("serial") if begin else None
    serials = [] if serial is None else [int(serial)]
    if action == "retention" and begin:
        serials = [int(x) for x in (begin.get("delete") or []) + (begin.get("slim") or [])]
    done = events.count("done")
    total = (begin or {}).get("steps")
    if action == "retention":
        total = sum(r.get("steps", 0) for r in recs if r.get("event") == "serial") or None
    end = next((r for r in recs if r.get("event") == "end"), None)
    failed = next((r for r in recs if r.get("event") == "failed"), None)
    detail = ""
    if end is not None:
        status = "finished"
    elif op["recovered"]:
        status, detail = "recovered", op["recovered"]
    elif begin is None:
        status = "failed" if failed else "done"
    else:
        status = "failed" if failed else "interrupted"
    if failed and not detail:
        detail = f"step {failed.get('step')}: {failed.get('error', '')}"[:200]
    if action == "recover" and end is not None:
        detail = "; ".join(f"{r.get('of')}: {r.get('outcome')}" for r in recs
                           if r.get("event") == "recovered")  # fmt: skip
    if action == "lock_broken":
        detail = f"holder {recs[0].get('holder')}"
    steps = f"{done}/{total}" if total is not None else str(done)
    return (op["op_id"], action, None if serial is None else int(serial), serials,
            recs[0].get("time"), end.get("time") if end else None, status, steps, detail)  # fmt: skip


def status(url: str | os.PathLike, storage_options: dict | None = None,
           last: int | None = None) -> pd.DataFrame:  # fmt: skip
    """The journal of the tree at ``url``, one row per operation (newest last): ``serial`` is
    the one a restore worked on, ``serials`` every serial the operation touched (a
    retention's deleted and slimmed ones); ``status`` is
    finished, interrupted (cut short: run ``recover``), failed (its own clean-up ran but may be
    partial: ``recover``), recovered, or running (the lock is held by a live process);
    ``steps`` counts done steps of the planned ones (``recover``: :mod:`.recover`)."""
    fs, root = open_root(url, storage_options)
    ops = operations(read_journal(fs, journal_path(root)))
    rows = [_summary(op) for op in ops]
    held = TreeLock(fs, root).holder()
    if held and not is_stale(held):
        for i in range(len(rows) - 1, -1, -1):
            if needs_recovery(ops[i]):
                rows[i] = (*rows[i][:6], "running", rows[i][7],
                           f"lock held by pid {held.get('pid')} on {held.get('host')}")  # fmt: skip
                break
    df = pd.DataFrame(rows, columns=STATUS_COLUMNS).astype({"serial": "Int64"})
    if last is not None:
        df = df.tail(last)
    df.attrs["lock"] = held
    df.attrs["pending"] = [op["op_id"] for op in ops if needs_recovery(op)]
    return df
