"""Opening an experiment: a directory, a glob URL or a list of URLs; runs opened concurrently."""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

from ..catalog import Catalog
from ..io import Storage
from ..scan.cache import resolve
from ..scan.detect import detect, list_tree
from ..tree import Tree
from .experiment import Experiment
from .find import MAX_DEPTH, FoundRun, find_runs
from .run import Run, error_text

#: how many runs are opened at once (the private pool's threads) on a remote store, or with
#: an executor; runs on local disk are opened one after another (:func:`runs_in_flight`)
RUN_WORKERS = 8


# -- opening ------------------------------------------------------------------------------
def _glob_base(path: str) -> str:
    """The directory part of a glob pattern before its first wildcard."""
    head = re.split(r"[*?\[]", path, maxsplit=1)[0]
    return head.rstrip("/") if head.endswith("/") else posixpath.dirname(head)


def _names_for(urls: list[str]) -> list[str]:
    """Run names for a list of URLs: their paths relative to the common parent."""
    paths = [u.rstrip("/") for u in urls]
    if len(paths) == 1:
        return [posixpath.basename(paths[0]) or paths[0]]
    try:
        base = os.path.commonpath(paths)
    except ValueError:
        return paths
    names = [posixpath.relpath(p, base) if base else p for p in paths]
    return names if len(set(names)) == len(names) and "." not in names else paths


def open_experiment(url_or_urls: str | os.PathLike | Iterable | Mapping, *,
                    storage_options: dict | None = None, executor: Executor | None = None,
                    progress: Callable[[int, int], None] | None = None,
                    cache: Any = None, depth: int = MAX_DEPTH) -> Experiment:  # fmt: skip
    """Open many runs: a directory whose descendants (to ``depth``) are
    checkpoint trees, a glob URL (``s3://b/sweep/*/checkpoints``: each match one run), or a
    list / dict (name -> URL). Runs are opened concurrently on a private thread pool;
    ``executor`` reads their headers (as in :func:`ckptview.open`). ``progress(done,
    total)`` is called per run opened. A run that fails to open is a row with ``error``."""
    cache = resolve(cache)

    def from_url(name: str, url: str) -> tuple[str, str, Callable[[], Run]]:
        def job() -> Run:
            tree = list_tree(url, storage_options, cache)
            layout = detect(tree, None, url)
            cat = Catalog(tree, layout, executor, tree.cache)
            return Run(name, cat.url, cat, layout.name)

        return name, url, job

    if isinstance(url_or_urls, Mapping):
        jobs = [from_url(str(n), os.fspath(u)) for n, u in url_or_urls.items()]
        flight = runs_in_flight([u for _, u, _ in jobs], storage_options, executor)
        return Experiment(_open_all(jobs, progress, flight))
    if not isinstance(url_or_urls, (str, os.PathLike)):
        urls = [os.fspath(u) for u in url_or_urls]
        jobs = [from_url(n, u) for n, u in zip(_names_for(urls), urls)]
        return Experiment(_open_all(jobs, progress,
                                    runs_in_flight(urls, storage_options, executor)))  # fmt: skip
    url = os.fspath(url_or_urls)
    storage, path = Storage.from_url(url, storage_options)
    if any(c in path for c in "*?["):
        base = _glob_base(path)
        jobs = []
        for match in sorted(storage.fs.glob(path)):
            jobs.append(from_url(posixpath.relpath(match, base) if base else match, storage.url(match)))
        flight = 1 if storage.plain_local and executor is None else RUN_WORKERS
        return Experiment(_open_all(jobs, progress, flight), storage.url(base))
    tree = list_tree(url, storage_options, cache)
    found, stray = find_runs(tree, depth)
    return _from_found(tree, found, stray, executor, progress)


def experiment_at(url: str | os.PathLike, storage_options: dict | None = None, *,
                  executor: Executor | None = None,
                  progress: Callable[[int, int], None] | None = None) -> Experiment | None:  # fmt: skip
    """The experiment at ``url`` when it is one (a directory whose runs are below its root,
    not the root itself), else None: how ``ckptview ls`` / ``retain`` / ``serve`` tell a
    parent of many runs from one tree."""
    tree = list_tree(url, storage_options)
    if tree.single is not None:
        return None
    found, stray = find_runs(tree)
    if not found or (len(found) == 1 and found[0].name == "."):
        return None
    return _from_found(tree, found, stray, executor, progress)


def _from_found(tree: Tree, found: list[FoundRun], stray: list[str], executor: Executor | None,
                progress: Callable[[int, int], None] | None) -> Experiment:  # fmt: skip
    def job(f: FoundRun) -> Callable[[], Run]:
        return lambda: Run(f.name, f.tree.url(), Catalog(f.tree, f.layout, executor, tree.cache),
                           f.layout.name)  # fmt: skip

    jobs = [(f.name, f.tree.url(), job(f)) for f in found]
    flight = 1 if tree.storage.plain_local and executor is None else RUN_WORKERS
    return Experiment(_open_all(jobs, progress, flight), tree.url(), stray)


def _open_one(name: str, url: str, make: Callable[[], Run]) -> Run:
    try:
        run = make()
    except Exception as e:  # noqa: BLE001 - a run that fails is a row, not the end
        return Run(name, url, None, None, error_text(e))
    try:  # list its headers now, concurrently with the other runs
        if run.catalog is not None:
            run.catalog.serials  # noqa: B018
            run.catalog.metrics  # noqa: B018
    except Exception as e:  # noqa: BLE001
        run.error = error_text(e)
    return run


def runs_in_flight(urls: list[str], storage_options: dict | None,
                   executor: Executor | None) -> int:  # fmt: skip
    """How many runs to open at once: one after another when every run is on local disk and
    no executor reads the headers (opening a run from the page cache is Python work that
    threads cannot overlap; a pool only adds contention, 1.15x slower measured), else
    :data:`RUN_WORKERS` (remote stores: each run waits on round trips)."""
    if executor is not None:
        return RUN_WORKERS
    for url in urls:
        try:
            if not Storage.from_url(url, storage_options)[0].plain_local:
                return RUN_WORKERS
        except Exception:  # noqa: BLE001 - its own open reports the error
            return RUN_WORKERS
    return 1


def _open_all(jobs: list[tuple[str, str, Callable[[], Run]]],
              progress: Callable[[int, int], None] | None, flight: int = RUN_WORKERS) -> list[Run]:  # fmt: skip
    """Each job run, ``flight`` at once on a private thread pool (header reads go to each
    catalog's executor: a run waiting on its own reads never holds a slot they need)."""
    if not jobs:
        return []
    if flight <= 1:
        runs = []
        for i, job in enumerate(jobs):
            runs.append(_open_one(*job))
            if progress is not None:
                progress(i + 1, len(jobs))
        return runs
    runs = []
    workers = min(flight, len(jobs))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ckptview-runs") as pool:
        futures = [pool.submit(_open_one, *job) for job in jobs]
        for i, fut in enumerate(futures):
            runs.append(fut.result())
            if progress is not None:
                progress(i + 1, len(futures))
    return runs
