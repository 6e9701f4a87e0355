"""Helpers shared by subcommands: opening a tree, printing tables."""

from __future__ import annotations

import functools
import json
import sys

import pandas as pd

import ckptview as cv
from ckptview.changes.lock import TreeLockedError
from ckptview.engine.retention import TreeChangedError

from . import CLIError


def add_open_args(p) -> None:
    p.add_argument("url", help="checkpoint tree: a directory, file or any fsspec URL")
    p.add_argument("--layout", help="force a layout by name (default: detect)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_progress_args(p)


def add_progress_args(p) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--progress", action="store_true", help="progress bars even if not a TTY")
    g.add_argument("--quiet", "-q", action="store_true", help="no progress bars")


def open_tree(args, url: str | None = None, layout: str | None = None):
    """Open ``url`` (default ``args.url``) with a scan progress bar per ``args``."""
    layout = layout if url is not None else getattr(args, "layout", None)
    return cv.open(url or args.url, layout=layout, progress=ScanBar(args))


class ScanBar:
    """A ``progress(done, total)`` callback for ``ckptview.open``: a tqdm bar of files whose
    header was listed, opened on the first call and closed when done reaches total."""

    def __init__(self, args, desc: str = "scan"):
        self.args = args
        self.desc = desc
        self.bar = None

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            self.bar = progress(total, self.desc, unit="file", args=self.args)
        self.bar.update(done - self.bar.n)
        if done >= total:
            self.bar.close()
            self.bar = None


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


def progress(total: int | None, desc: str, unit: str = "B", args=None):
    """A tqdm bar on stderr; use ``.update(n)``. Silent when stderr is not a terminal unless
    ``args.progress``; always silent with ``args.quiet``."""
    from tqdm.auto import tqdm

    disable = None  # tqdm: off when the stream is not a TTY
    if getattr(args, "quiet", False):
        disable = True
    elif getattr(args, "progress", False):
        disable = False
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=unit == "B", file=sys.stderr,
                disable=disable, leave=False)  # fmt: skip


def guarded(run):
    """Turn the engine's refusals (a locked or changed tree) into one-line CLI errors."""

    @functools.wraps(run)
    def wrapper(args) -> int:
        try:
            return run(args)
        except (TreeLockedError, TreeChangedError) as e:
            raise CLIError(str(e)) from None

    return wrapper
