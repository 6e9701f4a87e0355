"""Helpers shared by subcommands: opening a tree, progress bars, JSON output (tables are
in :mod:`._table`)."""

from __future__ import annotations

import functools
import json
import sys
from typing import Any

import pandas as pd

import ckptview as cv
from ckptview.changes.lock import TreeLockedError
from ckptview.changes.result import json_default, records
from ckptview.engine.retention import TreeChangedError

from . import CLIError, _table


def add_open_args(p) -> None:
    p.add_argument("url", metavar="URL",
                   help="checkpoint tree: a directory, file or any fsspec URL")  # fmt: skip
    p.add_argument("--layout", help="force a layout by name (default: detect)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON document (the full data) instead of a table")  # fmt: skip
    add_progress_args(p)


def add_progress_args(p) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--progress", action="store_true", help="progress bars even if not a TTY")
    g.add_argument("--quiet", "-q", action="store_true", help="no progress bars")


def open_tree(args, url: str | None = None, layout: str | None = None):
    """Open ``url`` (default ``args.url``) with a scan progress bar per ``args``; input that
    holds no checkpoint raises (see :func:`require_checkpoint`)."""
    layout = layout if url is not None else getattr(args, "layout", None)
    cat = cv.open(url or args.url, layout=layout, progress=ScanBar(args))
    require_checkpoint(cat)
    return cat


def require_checkpoint(cat) -> None:
    """Raise when the ``files`` fallback found nothing to read: no file of the input parsed
    (a text file, a file whose codec needs a missing extra). The same one-line error, exit
    1, as input no layout recognizes; a missing extra is named in full."""
    if cat.layout != "files":
        return
    results = cat._scan.file_results()
    if any(r.variables or not r.error for r in results):
        return
    errors = [str(r.error).removeprefix("ImportError: ") for r in results]
    hint = next((e for e in errors if "pip install" in e), None)
    if hint is not None:
        raise ImportError(f"{cat.url}: {hint}")
    names = ", ".join(sorted({r.ref.path.rsplit("/", 1)[-1] for r in results})[:3])
    detail = f"no codec recognizes {names}" if names else "no data file"
    raise cv.UnknownTreeError(f"no checkpoint in {cat.url}: {detail}")


def missing_extras(messages) -> list[str]:
    """The distinct install hints (``… needs h5py: pip install 'ckptview[keras]'``) inside
    error messages, whole: a table cuts its messages to fit."""
    out: dict[str, None] = {}
    for message in messages:
        for part in str(message or "").split("; "):
            if "pip install" in part:
                out[part.split("ImportError: ", 1)[-1]] = None
    return list(out)


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


def emit_json(doc: Any) -> None:
    """One JSON document on stdout: a DataFrame as records (its index as a column when it
    has a name), a result object through its ``to_dict()``; the API's types (ints, floats,
    lists, ISO times; NaN/NA as null)."""
    if isinstance(doc, pd.Series):
        doc = doc.to_frame()
    if isinstance(doc, pd.DataFrame):
        doc = records(doc)
    elif hasattr(doc, "to_dict") and not isinstance(doc, dict):
        doc = doc.to_dict()
    json.dump(doc, sys.stdout, indent=1, default=json_default, allow_nan=False)
    sys.stdout.write("\n")


def show_change(result, as_json: bool) -> None:
    """A ChangeResult (restore, recover): its headline, notes and steps, or one JSON document."""
    if as_json:
        emit_json(result)
        return
    out = _table.console()
    out.print(result.headline(), overflow="fold")
    for note in result.notes():
        out.print(f"  {note}", overflow="fold")
    if len(result.ops):
        cols = [_table.Col("kind"),
                _table.Col("path", fmt=_table.relative_to(result.target), fit=_table.CUT),
                _table.Col("nbytes", "size", _table.size, right=True),
                _table.Col("note", fit=_table.CUT, optional=True)]  # fmt: skip
        _table.render(result.ops, cols)


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
