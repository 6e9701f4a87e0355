"""Retention across runs: sizes as people write them, pinned serials, the result."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from ..fmt import human_bytes

if TYPE_CHECKING:
    from ..engine.retention import RetentionResult

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
          "gb": 10**9, "t": 10**12, "tb": 10**12, "p": 10**15, "pb": 10**15, "kib": 2**10,
          "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50}  # fmt: skip


def parse_bytes(value: int | float | str) -> int:
    """``2TB``, ``500 GB``, ``1.5TiB``, ``4096`` (decimal units; ``KiB``… binary) as bytes."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"a size cannot be negative: {value}")
        return int(value)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(value))
    unit = m[2].lower() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(f"not a size: {value!r} (e.g. 2TB, 500GB, 1.5TiB or bytes)")
    return int(float(m[1]) * _UNITS[unit])


@dataclass
class ExperimentRetention:
    """What :meth:`Experiment.apply_retention` did: each run's :class:`RetentionResult`,
    and the runs it refused (a lock held, the tree changed) with why."""

    results: dict[str, RetentionResult] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def deleted(self) -> pd.DataFrame:
        """What was deleted (and slimmed), indexed (run, serial)."""
        frames = {run: r.deleted for run, r in self.results.items()}
        cols = ["action", "path", "nbytes", "steps"]
        if not frames:
            return pd.DataFrame(columns=cols, index=pd.MultiIndex.from_tuples([], names=["run", "serial"]))
        return pd.concat(frames, names=["run", "serial"])

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self.results.values())

    def headline(self) -> str:
        n = sum(len(r.deleted) for r in self.results.values())
        text = f"retention: {n} serial(s) in {len(self.results)} run(s), freed {human_bytes(self.nbytes)}"
        if self.errors:
            text += f"; refused in {len(self.errors)} run(s): " + "; ".join(
                f"{run}: {why}" for run, why in self.errors.items())
        return text

    def to_dict(self) -> dict:
        return {"nbytes": self.nbytes, "runs": {r: res.to_dict() for r, res in self.results.items()},
                "errors": dict(self.errors)}  # fmt: skip


def pins_of(pins: Any, run: str) -> list[int]:
    """A run's pinned serials from ``pinned``: ``{run: serials}``, ``(run, serial)`` pairs,
    or serial numbers (pinned in every run that has them)."""
    if isinstance(pins, Mapping):
        got = pins.get(run, ())
        return [int(got)] if isinstance(got, int) else [int(s) for s in got]
    out = []
    for p in pins or ():
        if isinstance(p, tuple) and len(p) == 2:
            if p[0] == run:
                out.append(int(p[1]))
        else:
            out.append(int(p))
    return out
