"""Retention keep-policies (Orbax-style): small composable parts, combined with ``AnyOf``.

A policy keeps a serial when *any* of its parts keeps it; each part maps the serials table
(and the metrics table) to ``{serial: reason}``.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta

import pandas as pd


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


def describe_policy(policy: AnyOf | None) -> str:
    """A policy in words: ``keep the last 3 complete, every 5th serial, pinned 7``."""
    if not policy:
        return "keep everything (no policy)"
    return "keep " + ", ".join(_describe(p) for p in policy.policies)


def _describe(part) -> str:
    """One part of a policy in words."""
    if isinstance(part, KeepLast):
        return f"the last {part.n} complete"
    if isinstance(part, KeepEvery):
        return f"every serial whose {part.by} is divisible by {part.k}"
    if isinstance(part, KeepBest):
        missing = " (and those without it)" if part.keep_missing else ""
        return f"the best {part.n} by {part.metric} ({part.mode}){missing}"
    if isinstance(part, Pinned):
        return "pinned " + ", ".join(map(str, part.serials))
    if isinstance(part, KeepNewerThan):
        return f"those written within {pd.Timedelta(seconds=part.seconds)}"
    return f"{type(part).__name__}({', '.join(map(str, asdict(part).values()))})"
