"""The table contract of DESIGN.md §3/§3c as assertions, for any catalog of any layout."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..dtypes import np_dtype
from ..scan.tables import FILE_COLUMNS, ROLES, SERIAL_COLUMNS, VARIABLE_COLUMNS

KINDS = {"model", "optimizer", "trainer", "lookup_table", "rng", "scheduler", "other"}


def _none_or_text(col: pd.Series) -> bool:
    return all(e is None or (isinstance(e, str) and e) for e in col)


def check_serials(df: pd.DataFrame) -> None:
    """Columns, dtypes and verdict rules of ``cat.serials``."""
    assert list(df.columns) == SERIAL_COLUMNS, list(df.columns)
    assert df.index.name == "serial" and df.index.dtype == np.int64
    assert df.index.is_monotonic_increasing and df.index.is_unique
    for col in ("complete", "latest", "loadable"):
        assert df[col].dtype == bool, col
    assert df["timestamp"].dtype == "datetime64[ns, UTC]"
    for col in ("nbytes", "n_files", "n_variables"):
        assert df[col].dtype == np.int64 and (df[col] >= 0).all(), col
    assert df["epoch"].dtype == "Int64" and df["step"].dtype == "Int64"
    assert all(isinstance(p, str) and p for p in df["path"])
    assert all(isinstance(n, tuple) and all(isinstance(x, str) for x in n) for n in df["nodes"])
    assert _none_or_text(df["error"]) and _none_or_text(df["warning"])
    assert not (df["loadable"] & ~df["complete"]).any(), "loadable but not complete"
    assert not (df["loadable"] & df["error"].notna()).any(), "loadable with an error"
    empty = df["complete"] & (df["n_variables"] == 0) & df["error"].isna()
    assert not empty.any(), f"complete with no variables and no error: {list(df.index[empty])}"
    assert df["latest"].sum() <= 1
    if df["latest"].any():
        assert df.loc[df["latest"], "loadable"].all(), "the latest serial does not load"
    if df["loadable"].any():
        assert df["latest"].sum() == 1, "loadable serials but none is latest"


def check_variables(df: pd.DataFrame, serials: pd.DataFrame) -> None:
    """Columns, dtypes and consistency of ``cat.variables`` with ``cat.serials``."""
    assert list(df.columns[: len(VARIABLE_COLUMNS)]) == VARIABLE_COLUMNS
    for col in ("serial", "numel", "nbytes"):
        assert df[col].dtype == np.int64, col
    for col in ("node", "name", "kind", "dtype", "file"):
        assert all(isinstance(x, str) for x in df[col]), col
    assert set(df["kind"]) <= KINDS
    assert _none_or_text(df["error"])
    assert df["alias"].map(lambda a: a is None or isinstance(a, str)).all()
    for row in df.itertuples():
        assert isinstance(row.shape, tuple) and all(type(d) is int and d >= 0 for d in row.shape)
        if row.error is not None:
            continue
        assert row.numel == math.prod(row.shape), (row.name, row.shape, row.numel)
        if row.dtype != "object":
            np_dtype(row.dtype)  # a known numpy / ml_dtypes name
    assert set(df["serial"]) <= set(serials.index)
    counts = df.groupby("serial").size().reindex(serials.index, fill_value=0)
    assert (counts == serials["n_variables"]).all(), "n_variables != variable rows"
    assert not df.duplicated(["serial", "node", "name"]).any(), "duplicate variable rows"


def check_files(df: pd.DataFrame, on_disk: list[str] | None = None) -> None:
    """Columns of ``cat.files``; with ``on_disk`` (every file under the root), one row each."""
    assert list(df.columns) == FILE_COLUMNS, list(df.columns)
    assert set(df["role"]) <= set(ROLES)
    assert df["serial"].dtype == "Int64" and df["size"].dtype == np.int64
    assert _none_or_text(df["error"]) and not df["path"].duplicated().any()
    if on_disk is not None:
        missing = sorted(set(on_disk) - set(df["path"]))
        assert not missing, f"files not accounted for: {missing[:5]}"
