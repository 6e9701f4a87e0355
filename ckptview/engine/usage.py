"""Bytes by role: how much of each serial is model, optimizer, trainer, rng, … state."""

from __future__ import annotations

import pandas as pd

from ..scan.core import Scan

#: column order: the usual big ones first, then the rest alphabetically, ``other`` last
FIRST = ("model", "optimizer", "scheduler", "trainer", "rng")


def usage(scan: Scan) -> pd.DataFrame:
    """Index serial, one int64 column per variable kind (bytes stored, pieces included), and
    ``other``: the serial's file bytes no variable accounts for (headers, pickles, metadata,
    replicas); the columns add up to the serial's ``nbytes``."""
    serials = scan.serials
    v = scan.variables
    by_kind = v.groupby(["serial", "kind"])["nbytes"].sum().unstack("kind", fill_value=0)
    by_kind = by_kind.reindex(serials.index, fill_value=0)
    kinds = [k for k in FIRST if k in by_kind.columns]
    kinds += sorted(c for c in by_kind.columns if c not in FIRST and c != "other")
    out = by_kind[kinds].astype("int64")
    out["other"] = (serials["nbytes"] - out.sum(axis=1)).clip(lower=0).astype("int64")
    out.columns.name = None
    return out
