"""Retention: a reviewable plan made with a keep-policy (:mod:`.policies`), a safe apply.

A policy keeps a serial when *any* of its parts keeps it (``AnyOf``); everything else is
planned for deletion, except what is always protected: the latest complete serial, the
serial the framework resumes from, pinned serials, and incomplete serials newer than the
latest complete one (a save may be in flight).
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, ClassVar

import pandas as pd

from ..changes.journal import Journal
from ..changes.lock import TreeLock
from ..changes.ops import OpRunner, describe, ops_frame
from ..changes.result import ChangeResult
from ..fmt import human_bytes
from ..model import META_DIR, Op
from ..scan.core import Scan
from ..scan.slimmed import SLIMMED_FILE, read_slimmed, slimmed_json
from .policies import AnyOf, make_policy, parse_duration

POLICY_FILE = f"{META_DIR}/retention.json"
PLAN_COLUMNS = [
    "action", "reason", "nbytes", "frees", "complete", "loadable", "latest", "timestamp", "step",
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
                   now: datetime | None = None, slim_older_than: Any = None) -> pd.DataFrame:  # fmt: skip
    """Per serial: ``action`` (keep|slim|delete), ``reason``, ``nbytes``, ``frees`` (bytes
    the action frees). Changes nothing.

    With no policy arguments the policy stored with the tree is used; with none stored,
    everything is kept. ``slim_older_than`` (``7d``): kept serials older than that lose their
    optimizer state files (``Layout.optimizer_files``), never the newest loadable serial nor
    the resume point.
    """
    if policy is None:
        policy = make_policy(keep_last, keep_every, keep_best, pinned, older_than, every_by)
        if not policy:
            policy = retention_policy(scan) or policy
    now = now or datetime.now(timezone.utc)
    table = scan.serials
    keeps = policy.keeps(table, scan.metrics, now)
    protected = _protected(scan, table)
    slim_age = None if slim_older_than is None else parse_duration(slim_older_than)
    slimmed = read_slimmed(scan.tree)
    rows = []
    for s, r in zip(table.index, table.itertuples(index=False)):
        reasons = [why for why in (protected.get(s), keeps.get(s)) if why]
        if not policy:
            reasons = reasons or ["no retention policy"]
        action = "keep" if reasons else "delete"
        reason = "; ".join(reasons) if reasons else "not kept by the policy"
        frees = int(r.nbytes) if action == "delete" else 0
        if action == "keep" and slim_age is not None and s not in protected and s not in slimmed:
            age = (now - r.timestamp).total_seconds() if not pd.isna(r.timestamp) else None
            optim = optimizer_bytes(scan, int(s))
            if age is not None and age > slim_age and optim:
                action, frees = "slim", optim
                reason = f"{reason}; optimizer state older than {slim_older_than}"
        rows.append((int(s), action, reason, int(r.nbytes), frees, bool(r.complete),
                     bool(r.loadable), bool(r.latest), r.timestamp, r.step))  # fmt: skip
    plan = pd.DataFrame(rows, columns=["serial", *PLAN_COLUMNS]).set_index("serial")
    plan = plan.astype({"nbytes": "int64", "frees": "int64", "step": "Int64"})
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
    doomed = [int(s) for s in plan.index[plan["action"].isin(["delete", "slim"])]]
    protected = _protected(scan, table)
    for s in doomed:
        why = protected.get(s) or ("pinned" if s in attrs.get("pinned", ()) else None)
        if why:
            raise TreeChangedError(f"serial {s} is now protected ({why}); plan again")
    return doomed


@dataclass(kw_only=True)
class RetentionResult(ChangeResult):
    """What ``apply_retention`` did: a :class:`ChangeResult` whose table ``deleted`` is what
    was deleted, indexed by serial: ``action`` (delete | slim), ``path``, ``nbytes`` freed,
    ``steps``."""

    action: ClassVar[str] = "retention"
    main_table: ClassVar[str] = "deleted"
    deleted: pd.DataFrame = field(repr=False)

    @property
    def nbytes(self) -> int:
        """Bytes freed."""
        return int(self.deleted["nbytes"].sum()) if len(self.deleted) else 0

    def headline(self) -> str:
        n_slim = int((self.deleted["action"] == "slim").sum()) if len(self.deleted) else 0
        n_del = len(self.deleted) - n_slim
        slim = f", slimmed {n_slim}" if n_slim else ""
        return self._with_message(f"retention {self.target}: deleted {n_del} serial(s){slim}, "
                                  f"freed {human_bytes(self.nbytes)}")  # fmt: skip

    def to_dict(self) -> dict:
        return {**super().to_dict(), "nbytes": self.nbytes}


def apply_retention(scan: Scan, plan: pd.DataFrame,
                    progress: Callable[[int], None] | None = None) -> RetentionResult:  # fmt: skip
    """Delete the serials ``plan`` marks ``delete`` and the optimizer state of those it marks
    ``slim``; returns a :class:`RetentionResult` (``.deleted``: serial, action, path, nbytes
    freed, steps; ``.ops``: every step run).

    The plan is checked (:func:`check_plan`) against the tree rescanned under its lock, and
    each serial's delete ops are made there: a change that finished since the plan refuses
    it (:class:`TreeChangedError`). A slim first records the serial in
    ``.ckptview/slimmed.json`` (from then on it is no resume point), then deletes its
    optimizer files: killed in between, the serial is marked slimmed with its files still
    there, never a resume point missing its optimizer state."""
    fs, root = scan.storage.fs, scan.tree.root
    journal = Journal(fs, root)
    done, steps = [], []
    with TreeLock(fs, root, "retention", journal):
        scan.refresh()
        doomed = check_plan(scan, plan)
        layout, tree, found = scan.layout, scan.tree, scan.tree_scan
        slim = [s for s in doomed if plan.loc[s, "action"] == "slim"]
        delete = [s for s in doomed if s not in slim]
        journal.write("begin", action="retention", delete=delete, slim=slim,
                      policy=plan.attrs.get("policy"))  # fmt: skip
        try:
            for s in delete:
                ops = layout.delete_ops(tree, found, scan.serial_info(s))
                journal.write("serial", action="delete", serial=s, steps=len(ops),
                              plan=[describe(o) for o in ops])  # fmt: skip
                OpRunner(fs, root, journal=journal).run(ops)
                steps += ops
                done.append((s, "delete", scan.serials.loc[s, "path"],
                             int(plan.loc[s, "nbytes"]), len(ops)))  # fmt: skip
                if progress:
                    progress(1)
            recorded = read_slimmed(tree)
            for s in slim:
                ops = slim_ops(scan, s, recorded)
                journal.write("serial", action="slim", serial=s, steps=len(ops),
                              plan=[describe(o) for o in ops])  # fmt: skip
                OpRunner(fs, root, journal=journal).run(ops)
                steps += ops
                freed = sum(o.nbytes for o in ops if o.kind == "delete")
                done.append((s, "slim", scan.serials.loc[s, "path"], freed, len(ops)))
                if progress:
                    progress(1)
            journal.write("end", action="retention", deleted=delete, slimmed=slim)
        finally:
            scan.refresh()
    out = pd.DataFrame(done, columns=["serial", "action", "path", "nbytes", "steps"])
    out = out.set_index("serial").astype({"nbytes": "int64", "steps": "int64"})
    return RetentionResult(target=scan.url, dry_run=False, done=True, ops=ops_frame(steps),
                           deleted=out)  # fmt: skip


def optimizer_bytes(scan: Scan, serial: int) -> int:
    """Bytes of the files holding only a serial's optimizer state."""
    tree = scan.tree
    files = scan.layout.optimizer_files(tree, scan.serial_info(serial))
    return sum(tree.size(f) for f in files)


def slim_ops(scan: Scan, serial: int, recorded: dict[int, dict]) -> list[Op]:
    """Record the serial as slimmed (a resume point no more; ``recorded``: the slimmed serials
    so far, updated), then delete its optimizer files, then their emptied directories."""
    tree = scan.tree
    files = scan.layout.optimizer_files(tree, scan.serial_info(serial))
    if not files:
        raise ValueError(f"serial {serial} has no separate optimizer state files to slim")
    record = {"files": files, "nbytes": sum(tree.size(f) for f in files),
              "time": datetime.now(timezone.utc).isoformat()}  # fmt: skip
    recorded[serial] = record
    data = slimmed_json(recorded, {})
    ops = [Op("write", SLIMMED_FILE, data=data, nbytes=len(data), replace=True, note="state")]
    ops += [Op("delete", f, nbytes=tree.size(f)) for f in files]
    dirs = sorted({posixpath.dirname(f) for f in files} - {""}, key=len, reverse=True)
    ops += [Op("rmdir", d) for d in dirs if all(e in files for e in tree.files(under=d))]
    return ops


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
