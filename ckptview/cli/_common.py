"""Helpers shared by subcommands: opening a tree, printing tables."""

from __future__ import annotations

import json
import sys

import pandas as pd


def add_open_args(p) -> None:
    p.add_argument("url", help="checkpoint tree: a directory, file or any fsspec URL")
    p.add_argument("--layout", help="force a layout by name (default: detect)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def open_tree(args):
    import ckptview as cv

    return cv.open(args.url, layout=getattr(args, "layout", None))


def print_table(df: pd.DataFrame, as_json: bool, index: bool = True) -> None:
    """A DataFrame as an aligned table, or as JSON records (index included)."""
    if as_json:
        out = df.reset_index() if index else df
        json.dump(
            json.loads(out.to_json(orient="records", date_format="iso")), sys.stdout, indent=1
        )
        sys.stdout.write("\n")
        return
    with pd.option_context("display.max_rows", None, "display.max_columns", None,
                           "display.width", 200, "display.max_colwidth", 60):  # fmt: skip
        print(df.to_string(index=index))


def progress(total: int | None, desc: str, unit: str = "B"):
    """A tqdm bar on stderr (silent when stderr is not a terminal); use ``.update(n)``."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, file=sys.stderr,
                disable=None, leave=False)  # fmt: skip


def guarded(run):
    """Turn the engine's refusals (a locked or changed tree) into one-line CLI errors."""
    import functools

    @functools.wraps(run)
    def wrapper(args) -> int:
        from ckptview.journal import TreeLockedError
        from ckptview.retention import TreeChangedError

        from . import CLIError

        try:
            return run(args)
        except (TreeLockedError, TreeChangedError) as e:
            raise CLIError(str(e)) from None

    return wrapper
