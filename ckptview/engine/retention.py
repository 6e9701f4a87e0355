"""Retention: a reviewable plan made with a keep-policy (:mod:`.policies`), a safe apply.

A policy keeps a serial when *any* of its parts keeps it (``AnyOf``); everything else is
planned for deletion, except what is always protected: the latest complete serial, the
serial the framework resumes from, pinned serials, and incomplete serials newer than the
latest complete one (a save may be in flight).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from typing import Any

import pandas as pd

from ..changes.journal import Journal
from ..changes.lock import TreeLock
from ..changes.ops import OpRunner, describe
from ..model import META_DIR, Op
from ..scan.core import Scan
from .policies import AnyOf, make_policy

POLICY_FILE = f"{META_DIR}/retention.json"
PLAN_COLUMNS = [
    "action", "reason", "nbytes", "complete", "loadable", "latest", "timestamp", "step",
]  # fmt: skip


class TreeChangedError(RuntimeError):
    """The tree no longer matches the plan made from it."""


# -- plan ---------------------------------------------------------------------------------
def _fingerprint(table: pd.DataFrame) -> dict:
    return {
        str(s): [r.path, bool(r.complete), int(r.nbytes), int(r.n_files),
                 None if pd.isna(r.timestamp) else r.timestamp.isoformat()]
        for s, r in zip(table.index, table.itertuples(index=False))
    }  # fmt: skip


def _protected(scan: Scan, table: pd.DataFrame) -> dict[int, str]:
    complete = table.index[table["complete"]]
    latest_complete = int(complete.max()) if len(complete) else None
    out = {}
    for s in table.index:
        if not table.loc[s, "complete"] and (latest_complete is None or s > latest_complete):
            out[int(s)] = "in flight (incomplete, newer than the latest complete)"
    if latest_complete is not None:
        out[latest_complete] = "latest complete"
    loadable = table.index[table["loadable"]]
    if len(loadable):  # never deleted: the newest serial the framework can resume from
        s = int(loadable.max())
        why = "newest loadable"
        if latest_complete is not None and s != latest_complete:
            why += f" (the latest complete serial, {latest_complete}, does not load)"
        out[s] = f"{out[s]}, {why}" if s in out else why
    if scan.latest is not None:
        s = int(scan.latest)
        out[s] = f"{out[s]}, resume point" if s in out else "resume point"
    return out


def plan_retention(scan: Scan, keep_last: Any = None, keep_every: Any = None,
                   keep_best: Any = None, pinned: Iterable[int] = (), older_than: Any = None,
                   policy: AnyOf | None = None, every_by: str = "serial",
                   now: datetime | None = None) -> pd.DataFrame:  # fmt: skip
    """Per serial: ``action`` (keep|delete), ``reason``, ``nbytes``. Changes nothing.

    With no policy arguments the policy stored with the tree is used; with none stored,
    everything is kept.
    """
    if policy is None:
        policy = make_policy(keep_last, keep_every, keep_best, pinned, older_than, every_by)
        if not policy:
            policy = retention_policy(scan) or policy
    now = now or datetime.now(timezone.utc)
    table = scan.serials
    keeps = policy.keeps(table, scan.metrics, now)
    protected = _protected(scan, table)
    rows = []
    for s, r in zip(table.index, table.itertuples(index=False)):
        reasons = [why for why in (protected.get(s), keeps.get(s)) if why]
        if not policy:
            reasons = reasons or ["no retention policy"]
        action = "keep" if reasons else "delete"
        reason = "; ".join(reasons) if reasons else "not kept by the policy"
        rows.append((int(s), action, reason, int(r.nbytes), bool(r.complete),
                     bool(r.loadable), bool(r.latest), r.timestamp, r.step))  # fmt: skip
    plan = pd.DataFrame(rows, columns=["serial", *PLAN_COLUMNS]).set_index("serial")
    plan = plan.astype({"nbytes": "int64", "step": "Int64"})
    plan.attrs.update({"tree": scan.url, "layout": scan.layout.name, "fingerprint": _fingerprint(table),
                       "policy": policy.to_dict(), "pinned": sorted(policy.pinned)})  # fmt: skip
    return plan


# -- apply ---------------------------------------------------------------------------------
def check_plan(scan: Scan, plan: pd.DataFrame) -> list[int]:
    """The serials to delete, after checking the (freshly rescanned) tree against the plan."""
    attrs = plan.attrs
    if "fingerprint" not in attrs:
        raise ValueError("not a retention plan (make one with plan_retention)")
    if attrs.get("tree") != scan.url:
        raise ValueError(f"the plan is for {attrs.get('tree')}, not {scan.url}")
    table = scan.serials
    now = _fingerprint(table)
    for s in plan.index:
        if now.get(str(s)) != attrs["fingerprint"].get(str(s)):
            raise TreeChangedError(f"serial {s} changed since the plan was made; plan again")
    doomed = [int(s) for s in plan.index[plan["action"] == "delete"]]
    protected = _protected(scan, table)
    for s in doomed:
        why = protected.get(s) or ("pinned" if s in attrs.get("pinned", ()) else None)
        if why:
            raise TreeChangedError(f"serial {s} is now protected ({why}); plan again")
    return doomed


def apply_retention(scan: Scan, plan: pd.DataFrame,
                    progress: Callable[[int], None] | None = None) -> pd.DataFrame:  # fmt: skip
    """Delete the serials ``plan`` marks ``delete``; returns them (serial, path, nbytes, steps)."""
    fs, root = scan.storage.fs, scan.tree.root
    journal = Journal(fs, root)
    deleted = []
    with TreeLock(fs, root, "retention"):
        scan.refresh()
        doomed = check_plan(scan, plan)
        layout, tree, found = scan.layout, scan.tree, scan.tree_scan
        journal.write("begin", action="retention", delete=doomed, policy=plan.attrs.get("policy"))
        try:
            for s in doomed:
                ops = layout.delete_ops(tree, found, scan.serial_info(s))
                journal.write("serial", action="delete", serial=s, steps=len(ops),
                              plan=[describe(o) for o in ops])  # fmt: skip
                OpRunner(fs, root, journal=journal).run(ops)
                deleted.append(
                    (s, scan.serials.loc[s, "path"], int(plan.loc[s, "nbytes"]), len(ops))
                )
                if progress:
                    progress(1)
            journal.write("end", action="retention", deleted=[d[0] for d in deleted])
        finally:
            scan.refresh()
    out = pd.DataFrame(deleted, columns=["serial", "path", "nbytes", "steps"]).set_index("serial")
    return out.astype({"nbytes": "int64", "steps": "int64"})


# -- stored policy ------------------------------------------------------------------------
def set_retention(scan: Scan, policy: Any = None, **kwargs: Any) -> AnyOf | None:
    """Store a policy (an ``AnyOf``, its dict, or ``plan_retention`` keywords) with the
    tree; ``set_retention(None)`` with no keywords removes the stored policy."""
    if policy is None and kwargs:
        policy = make_policy(**kwargs)
    elif isinstance(policy, dict):
        policy = AnyOf.from_dict(policy) if "policies" in policy else make_policy(**policy)
    fs, root = scan.storage.fs, scan.tree.root
    if policy is None:
        op = Op("delete", POLICY_FILE)
    else:
        data = json.dumps(policy.to_dict(), indent=1).encode()
        op = Op("write", POLICY_FILE, data=data, nbytes=len(data), replace=True)
    with TreeLock(fs, root, "set retention"):
        OpRunner(fs, root).run([op])
    return policy


def retention_policy(scan: Scan) -> AnyOf | None:
    """The policy stored with the tree, or None."""
    fs = scan.storage.fs
    path = scan.tree.root.rstrip("/") + "/" + POLICY_FILE
    try:
        return AnyOf.from_dict(json.loads(fs.cat_file(path)))
    except FileNotFoundError:
        return None


def kept(plan: pd.DataFrame) -> Iterable[int]:
    return [int(s) for s in plan.index[plan["action"] == "keep"]]
