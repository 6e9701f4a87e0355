"""Reading many values of a tree at once (DESIGN.md §5): the plan stats, diff and verify share.

On remote storage, with no executor of the caller's, their jobs (a variable, a pair, a file)
go through :meth:`ckptview.io.Storage.map_window`: up to ``ckptview_max_concurrency`` in
flight, results in order, working memory within the Storage's read budget. A small file most
of whose bytes the jobs read is fetched whole in one request and shared by the jobs reading
it (one GET per file instead of one per variable). On local disk, or with an executor given
(a Dask client), jobs run as before (:func:`ckptview.engine.stats.bounded_map`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from .. import registry
from ..io import SPECULATIVE_BLOCK, WHOLE_FILE, Storage
from ..scan.core import Scan
from ..scan.logical import ASSEMBLED

#: (scan, name, serial, node): one variable a job reads
Wanted = tuple[Scan, str, int, str]
#: (path, size of its file, bytes of the span): where a variable's values lie
Where = tuple[str, int, int]


def concurrent(scan: Scan) -> bool:
    """Jobs on ``scan`` go through ``Storage.map_window``: remote storage and no executor of
    the caller's (one that isolates listings only does not count)."""
    executor = scan.executor
    return scan.storage.remote and (executor is None or getattr(executor, "lists_only", False))


def spans_of(scan: Scan, name: str, serial: int, node: str) -> list[Where]:
    """Where a variable's values lie (the codec's :meth:`~ckptview.codecs.base.Codec.spans`;
    an assembled tensor's, its pieces'); empty when not known (quantized groups)."""
    try:
        var, res = scan.resolve(name, serial, node or None)
    except (KeyError, ValueError):
        return []
    if var.error:
        return []
    if res.codec == ASSEMBLED:
        parts = [(p.res, p.var) for p in var.locator if not p.copy]
    elif res.codec is None or res.codec.startswith("("):
        return []
    else:
        parts = [(res, var)]
    out = []
    for r, v in parts:
        if r.codec is None or r.codec.startswith("(") or v.error:
            continue
        try:
            codec = registry.get_codec(r.codec)
            found = codec.spans(scan.storage.blob(r.ref.path, r.ref.size), v)
        except Exception:  # noqa: BLE001 - a plan only: the read itself reports
            continue
        for path, _offset, length in found or ():
            size = int(r.ref.size) if path == r.ref.path and r.ref.size else file_size(scan, path)
            if size:
                out.append((path, size, int(length)))
    return out


def file_size(scan: Scan, path: str) -> int:
    """A file's size from the tree's listing (0 when it is not listed)."""
    try:
        return int(scan.tree.size(scan.tree.rel(path)) or 0)
    except (KeyError, ValueError):
        return 0


def worth_whole(size: int, wanted: int) -> bool:
    """Fetch a file whole when it is small and the jobs read most of it (or it is one first
    block long anyway)."""
    return 0 < size <= WHOLE_FILE and (2 * wanted >= size or size <= SPECULATIVE_BLOCK)


def run_jobs(scan: Scan, fn: Callable[..., Any], jobs: Sequence[tuple],
             reads: Callable[[tuple], Iterable[Wanted]], memory: Callable[[int | None], int],
             fallback: Callable[[], Iterator]) -> Iterator:  # fmt: skip
    """``fn(*job)`` for each job, in order. On remote storage (:func:`concurrent`) through
    ``Storage.map_window``: ``reads(job)`` names the variables a job reads, ``memory(n)`` the
    working memory a job needs for ``n`` bytes of values (None: not known); files most of
    whose bytes the jobs read come whole, one request each. Otherwise ``fallback()`` (the executor's path)."""
    if not concurrent(scan):
        return fallback()
    where: list[list[tuple[Storage, Where]]] = []
    wanted: dict[tuple[int, str], int] = {}
    sizes: dict[tuple[int, str], int] = {}
    for job in jobs:
        found = []
        for s, name, serial, node in reads(job):
            for at in spans_of(s, name, serial, node):
                key = (id(s.storage), at[0])
                wanted[key] = wanted.get(key, 0) + at[2]
                sizes[key] = at[1]
                found.append((s.storage, at))
        where.append(found)
    whole = {key for key, n in wanted.items() if worth_whole(sizes[key], n)}

    def files(i: int) -> list[tuple[Storage, str, int]]:
        out = {(id(storage), path): (storage, path, size) for storage, (path, size, _n) in where[i]
               if (id(storage), path) in whole}  # fmt: skip
        return list(out.values())

    def cost(i: int) -> int:
        return memory(sum(n for _s, (_p, _size, n) in where[i]) if where[i] else None)

    def call(i: int) -> Any:
        return fn(*jobs[i])

    def inline(i: int) -> bool:  # all its values in files fetched whole: no thread needed
        return all((id(storage), path) in whole for storage, (path, _n, _w) in where[i])

    # jobs reading the same files run next to each other (each file fetched once, held
    # while they run), their results put back in the callers' order
    keys = [tuple(sorted({path for _s, (path, _n, _w) in where[i]
                          if (id(_s), path) in whole})) for i in range(len(jobs))]  # fmt: skip
    order = sorted(range(len(jobs)), key=lambda i: (keys[i], i))
    results: list[Any] = [None] * len(jobs)
    run = scan.storage.map_window(call, order, cost=cost, files=files, inline=inline)
    for i, result in zip(order, run):
        results[i] = result
    return iter(results)
