"""``ckptview.open``: detect a tree's layout and return its Catalog."""

from __future__ import annotations

import os
from concurrent.futures import Executor

from .catalog import Catalog
from .experiment import Experiment, open_experiment
from .scan.access import denied_message, denied_root
from .scan.detect import UnknownTreeError, detect, list_tree

__all__ = ["Experiment", "UnknownTreeError", "open", "open_experiment"]


def open(  # noqa: A001 - the public name is ckptview.open
    url: str | os.PathLike,
    *,
    layout: str | None = None,
    storage_options: dict | None = None,
    executor: Executor | None = None,
    cache=None,
    progress=None,
) -> Catalog:
    """Open a checkpoint tree (a directory, a file, or a file prefix) at any fsspec URL.

    ``layout``: force a layout by name (default: detect it). ``storage_options``: passed to
    fsspec (credentials, endpoints). ``executor``: where header listings and reads run
    (default: a shared thread pool). ``cache``: None uses the process-wide header cache, a
    directory path adds an on-disk cache there, False keeps the catalog's cache private; a
    rescan of unchanged files reads no header again. ``progress(done, total)``: called once
    per file while the catalog lists headers (the CLI passes a progress bar).

    Raises :class:`FileNotFoundError` for a missing path, :class:`PermissionError` (naming
    the path) for a local root this process may not read, :class:`UnknownTreeError` when no
    layout recognizes the tree.
    """
    tree = list_tree(url, storage_options, cache)
    denied = denied_root(tree)
    if denied is not None:
        raise PermissionError(denied_message(denied))
    return Catalog(tree, detect(tree, layout, url), executor, tree.cache, progress)
