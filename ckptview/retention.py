"""Retention: small composable keep-policies (Orbax-style), a reviewable plan, a safe apply.

A policy keeps a serial when *any* of its parts keeps it (``AnyOf``); everything else is
planned for deletion, except what is always protected: the latest complete serial, the
serial the framework resumes from, pinned serials, and incomplete serials newer than the
latest complete one (a save may be in flight).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone

import pandas as pd

from .journal import META_DIR, Journal, OpRunner, TreeLock, describe
from .model import Op
from .restore import serial_info

POLICY_FILE = f"{META_DIR}/retention.json"
PLAN_COLUMNS = ["action", "reason", "nbytes", "complete", "latest", "timestamp", "step"]


class TreeChangedError(RuntimeError):
    """The tree no longer matches the plan made from it."""


# -- policies ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class KeepLast:
    """The ``n`` most recent complete serials."""

    n: int

    def keeps(self, table: pd.DataFrame, metrics: pd.DataFrame, now: datetime) -> dict:
        done = sorted(table.index[table["complete"]])[-self.n :] if self.n > 0 else []
        return dict.fromkeys(done, f"last {self.n}")


@dataclass(frozen=True)
class KeepEvery:
    """Serials (``by="serial"``) or steps (``by="step"``) divisible by ``k``."""

    k: int
    by: str = "serial"

    def keeps(self, table: pd.DataFrame, metrics: pd.DataFrame, now: datetime) -> dict:
        if self.by not in ("serial", "step"):
            raise ValueError(f"keep_every by must be 'serial' or 'step', not {self.by!r}")
        values = table.index.to_series() if self.by == "serial" else table["step"]
        return {
            s: f"every {self.k} {self.by}s"
            for s, v in values.items()
            if not pd.isna(v) and int(v) % self.k == 0
        }


@dataclass(frozen=True)
class KeepBest:
    """The ``n`` best complete serials by ``metric`` (``mode`` "min" or "max"); serials
    without the metric are kept when ``keep_missing`` (Orbax's default)."""

    metric: str
    n: int = 1
    mode: str = "min"
    keep_missing: bool = True

    def keeps(self, table: pd.DataFrame, metrics: pd.DataFrame, now: datetime) -> dict:
        if self.mode not in ("min", "max"):
            raise ValueError(f"keep_best mode must be 'min' or 'max', not {self.mode!r}")
        m = metrics[metrics["name"] == self.metric].groupby("serial")["value"].last()
        m = m[m.index.isin(table.index[table["complete"]])].dropna()
        best = m.sort_values(ascending=self.mode == "min", kind="stable").index[: self.n]
        out = dict.fromkeys(best, f"best {self.n} by {self.metric} ({self.mode})")
        if self.keep_missing:
            out.update({s: f"no {self.metric} recorded" for s in table.index if s not in m.index})
        return out


@dataclass(frozen=True)
class Pinned:
    """Serials kept whatever else says."""

    serials: tuple[int, ...]

    def keeps(self, table: pd.DataFrame, metrics: pd.DataFrame, now: datetime) -> dict:
        return {s: "pinned" for s in self.serials if s in table.index}


@dataclass(frozen=True)
class KeepNewerThan:
    """Serials committed less than ``seconds`` ago."""

    seconds: float

    def keeps(self, table: pd.DataFrame, metrics: pd.DataFrame, now: datetime) -> dict:
        cutoff = pd.Timestamp(now) - pd.Timedelta(seconds=self.seconds)
        label = f"newer than {pd.Timedelta(seconds=self.seconds)}"
        return {s: label for s, t in table["timestamp"].items() if not pd.isna(t) and t >= cutoff}


POLICY_TYPES = {"keep_last": KeepLast, "keep_every": KeepEvery, "keep_best": KeepBest,
                "pinned": Pinned, "keep_newer_than": KeepNewerThan}  # fmt: skip


@dataclass(frozen=True)
class AnyOf:
    """A serial is kept when any policy keeps it (Orbax ``AnyPreservationPolicy``)."""

    policies: tuple = field(default_factory=tuple)

    def keeps(self, table: pd.DataFrame, metrics: pd.DataFrame, now: datetime) -> dict:
        out: dict[int, list[str]] = {}
        for p in self.policies:
            for s, why in p.keeps(table, metrics, now).items():
                out.setdefault(int(s), []).append(why)
        return {s: ", ".join(r) for s, r in out.items()}

    def to_dict(self) -> dict:
        names = {v: k for k, v in POLICY_TYPES.items()}
        return {"policies": [{"type": names[type(p)], **asdict(p)} for p in self.policies]}

    @classmethod
    def from_dict(cls, data: dict) -> AnyOf:
        parts = []
        for item in data.get("policies", []):
            item = dict(item)
            kind = POLICY_TYPES.get(item.pop("type", None))
            if kind is None:
                raise ValueError(f"unknown retention policy in {data!r}")
            if kind is Pinned:
                item["serials"] = tuple(int(s) for s in item["serials"])
            parts.append(kind(**item))
        return cls(tuple(parts))

    @property
    def pinned(self) -> set[int]:
        return {s for p in self.policies if isinstance(p, Pinned) for s in p.serials}

    def __bool__(self) -> bool:
        return bool(self.policies)


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(value) -> float:
    """Seconds from a timedelta, a number of seconds, or text like ``7d``, ``12h``, ``90m``."""
    if isinstance(value, (timedelta, pd.Timedelta)):
        return value.total_seconds()
    if isinstance(value, (int, float)):
        return float(value)
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", str(value))
    if m:
        return float(m.group(1)) * _UNITS[m.group(2)]
    try:
        return pd.Timedelta(str(value)).total_seconds()
    except ValueError:
        raise ValueError(f"not a duration: {value!r} (try 7d, 12h, 30m)") from None


def parse_best(value) -> KeepBest:
    """``KeepBest`` from itself, a dict, ``(metric, n[, mode])`` or ``"metric:n[:mode]"``."""
    if isinstance(value, KeepBest):
        return value
    if isinstance(value, dict):
        return KeepBest(**value)
    parts = value.split(":") if isinstance(value, str) else list(value)
    if not parts or len(parts) > 3:
        raise ValueError(f"keep_best needs metric, n and optionally min|max, not {value!r}")
    n = int(parts[1]) if len(parts) > 1 else 1
    return KeepBest(str(parts[0]), n, str(parts[2]) if len(parts) > 2 else "min")


def make_policy(keep_last=None, keep_every=None, keep_best=None, pinned=(),
                older_than=None, every_by: str = "serial") -> AnyOf:  # fmt: skip
    """An ``AnyOf`` from ``plan_retention``'s keyword arguments."""
    parts: list = []
    if keep_last is not None:
        if int(keep_last) < 1:
            raise ValueError("keep_last must be at least 1")
        parts.append(KeepLast(int(keep_last)))
    if keep_every is not None:
        every = keep_every if isinstance(keep_every, KeepEvery) else None
        if every is None and isinstance(keep_every, (tuple, list)):
            every = KeepEvery(int(keep_every[0]), str(keep_every[1]))
        every = every or KeepEvery(int(keep_every), every_by)
        if every.k < 1:
            raise ValueError("keep_every must be at least 1")
        parts.append(every)
    if keep_best is not None:
        parts.append(parse_best(keep_best))
    if pinned:
        parts.append(Pinned(tuple(sorted(int(s) for s in pinned))))
    if older_than is not None:
        parts.append(KeepNewerThan(parse_duration(older_than)))
    return AnyOf(tuple(parts))


# -- plan ---------------------------------------------------------------------------------
def _fingerprint(table: pd.DataFrame) -> dict:
    return {
        str(s): [r.path, bool(r.complete), int(r.nbytes), int(r.n_files),
                 None if pd.isna(r.timestamp) else r.timestamp.isoformat()]
        for s, r in zip(table.index, table.itertuples(index=False))
    }  # fmt: skip


def _protected(cat, table: pd.DataFrame) -> dict[int, str]:
    complete = table.index[table["complete"]]
    latest_complete = int(complete.max()) if len(complete) else None
    out = {}
    for s in table.index:
        if not table.loc[s, "complete"] and (latest_complete is None or s > latest_complete):
            out[int(s)] = "in flight (incomplete, newer than the latest complete)"
    if latest_complete is not None:
        out[latest_complete] = "latest complete"
    if cat.latest is not None:
        s = int(cat.latest)
        out[s] = f"{out[s]}, resume point" if s in out else "resume point"
    return out


def plan_retention(cat, keep_last=None, keep_every=None, keep_best=None, pinned=(),
                   older_than=None, policy: AnyOf | None = None, every_by: str = "serial",
                   now: datetime | None = None) -> pd.DataFrame:  # fmt: skip
    """Per serial: ``action`` (keep|delete), ``reason``, ``nbytes``. Changes nothing.

    With no policy arguments the policy stored with the tree is used; with none stored,
    everything is kept.
    """
    if policy is None:
        policy = make_policy(keep_last, keep_every, keep_best, pinned, older_than, every_by)
        if not policy:
            policy = retention_policy(cat) or policy
    now = now or datetime.now(timezone.utc)
    table = cat.serials
    keeps = policy.keeps(table, cat.metrics, now)
    protected = _protected(cat, table)
    rows = []
    for s, r in zip(table.index, table.itertuples(index=False)):
        reasons = [why for why in (protected.get(s), keeps.get(s)) if why]
        if not policy:
            reasons = reasons or ["no retention policy"]
        action = "keep" if reasons else "delete"
        reason = "; ".join(reasons) if reasons else "not kept by the policy"
        rows.append((int(s), action, reason, int(r.nbytes), bool(r.complete), bool(r.latest),
                     r.timestamp, r.step))  # fmt: skip
    plan = pd.DataFrame(rows, columns=["serial", *PLAN_COLUMNS]).set_index("serial")
    plan = plan.astype({"nbytes": "int64", "step": "Int64"})
    plan.attrs.update({"tree": cat.url, "layout": cat.layout, "fingerprint": _fingerprint(table),
                       "policy": policy.to_dict(), "pinned": sorted(policy.pinned)})  # fmt: skip
    return plan


# -- apply ---------------------------------------------------------------------------------
def check_plan(cat, plan: pd.DataFrame) -> list[int]:
    """The serials to delete, after checking the (freshly rescanned) tree against the plan."""
    attrs = plan.attrs
    if "fingerprint" not in attrs:
        raise ValueError("not a retention plan (make one with plan_retention)")
    if attrs.get("tree") != cat.url:
        raise ValueError(f"the plan is for {attrs.get('tree')}, not {cat.url}")
    table = cat.serials
    now = _fingerprint(table)
    for s in plan.index:
        if now.get(str(s)) != attrs["fingerprint"].get(str(s)):
            raise TreeChangedError(f"serial {s} changed since the plan was made; plan again")
    doomed = [int(s) for s in plan.index[plan["action"] == "delete"]]
    protected = _protected(cat, table)
    for s in doomed:
        why = protected.get(s) or ("pinned" if s in attrs.get("pinned", ()) else None)
        if why:
            raise TreeChangedError(f"serial {s} is now protected ({why}); plan again")
    return doomed


def apply_retention(cat, plan: pd.DataFrame,
                    progress: Callable[[int], None] | None = None) -> pd.DataFrame:  # fmt: skip
    """Delete the serials ``plan`` marks ``delete``; returns them (serial, path, nbytes, steps)."""
    fs, root = cat.storage.fs, cat.tree.root
    journal = Journal(fs, root)
    deleted = []
    with TreeLock(fs, root, "retention"):
        cat.refresh()
        doomed = check_plan(cat, plan)
        layout, tree, scan = cat._layout, cat.tree, cat.scan
        journal.write("begin", action="retention", delete=doomed, policy=plan.attrs.get("policy"))
        try:
            for s in doomed:
                ops = layout.delete_ops(tree, scan, serial_info(cat, s))
                journal.write("serial", action="delete", serial=s, steps=len(ops),
                              plan=[describe(o) for o in ops])  # fmt: skip
                OpRunner(fs, root, journal=journal).run(ops)
                deleted.append(
                    (s, cat.serials.loc[s, "path"], int(plan.loc[s, "nbytes"]), len(ops))
                )
                if progress:
                    progress(1)
            journal.write("end", action="retention", deleted=[d[0] for d in deleted])
        finally:
            cat.refresh()
    out = pd.DataFrame(deleted, columns=["serial", "path", "nbytes", "steps"]).set_index("serial")
    return out.astype({"nbytes": "int64", "steps": "int64"})


# -- stored policy ------------------------------------------------------------------------
def set_retention(cat, policy=None, **kwargs) -> AnyOf | None:
    """Store a policy (an ``AnyOf``, its dict, or ``plan_retention`` keywords) with the
    tree; ``set_retention(None)`` with no keywords removes the stored policy."""
    if policy is None and kwargs:
        policy = make_policy(**kwargs)
    elif isinstance(policy, dict):
        policy = AnyOf.from_dict(policy) if "policies" in policy else make_policy(**policy)
    fs, root = cat.storage.fs, cat.tree.root
    if policy is None:
        op = Op("delete", POLICY_FILE)
    else:
        data = json.dumps(policy.to_dict(), indent=1).encode()
        op = Op("write", POLICY_FILE, data=data, nbytes=len(data), replace=True)
    with TreeLock(fs, root, "set retention"):
        OpRunner(fs, root).run([op])
    return policy


def retention_policy(cat) -> AnyOf | None:
    """The policy stored with the tree, or None."""
    fs = cat.storage.fs
    path = cat.tree.root.rstrip("/") + "/" + POLICY_FILE
    try:
        return AnyOf.from_dict(json.loads(fs.cat_file(path)))
    except FileNotFoundError:
        return None


def describe_policy(policy: AnyOf | None) -> str:
    if not policy:
        return "keep everything (no policy)"
    return " | ".join(f"{type(p).__name__}({', '.join(map(str, asdict(p).values()))})"
                      for p in policy.policies)  # fmt: skip


def kept(plan: pd.DataFrame) -> Iterable[int]:
    return [int(s) for s in plan.index[plan["action"] == "keep"]]
