"""``verify``: what could keep a serial from loading, found from its headers (DESIGN.md §3c).

Header checks (no tensor byte read): files that do not parse, variables in error, byte
ranges outside their file or partly overlapping another's (a range inside another is a view
of a shared storage), dtype x shape against the bytes a
variable's range holds, and ``*.index.json`` indexes against their shards (every indexed
file present, every tensor exactly once, no orphan or duplicate shard, ``total_size``).
``deep=True`` also reads every value (NaN/inf counts, reads that fail) and checks the CRC-32
of every stored zip member (torch, npz, keras files), streamed with bounded memory.
"""

from __future__ import annotations

import posixpath
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator

import numpy as np
import pandas as pd

from .. import registry
from ..dtypes import is_numeric, itemsize, np_dtype, packed_nbytes
from ..formats.small import loads_json
from ..io import READ_BUDGET, WHOLE_FILE, Storage
from ..model import VarInfo
from ..scan.access import touches, unreadable_dirs
from ..scan.checks import checksum_problems
from ..scan.core import Scan
from ..scan.listing import FileResult
from ..scan.tables import var_name
from .reads import file_size

FINDING_COLUMNS = ["serial", "file", "check", "severity", "message"]
MAX_INDEX_BYTES = 64 << 20
CRC_CHUNK = 4 << 20

Finding = tuple[int, str, str, str, str]


def verify(scan: Scan, serials: Iterable[int] | None = None, deep: bool = False) -> pd.DataFrame:
    """Findings (serial, file, check, severity ``error``|``warning``, message) for the given
    serials (default: all); an empty table when they are clean. A local directory this
    process may not read is an error finding (check ``permission``) of the serial it holds
    or belongs to; outside every serial, of serial -1 (the tree) when all are checked."""
    wanted = None if serials is None else {int(s) for s in serials}
    known = set(int(s) for s in scan.serials.index)
    if wanted is not None and wanted - known:
        raise KeyError(f"no serial {sorted(wanted - known)}; serials: {sorted(known)}")
    by_serial: dict[int, list[FileResult]] = defaultdict(list)
    for res in scan.file_results():
        if wanted is None or res.serial in wanted:
            by_serial[res.serial].append(res)
    found: list[Finding] = list(_denied(scan, wanted))
    order = sorted(by_serial)
    # the deep checks run ahead (concurrently on remote storage) while the header checks of
    # each serial are made; their findings come in file order
    deep_found = _deep_all(scan, [(s, res) for s in order for res in by_serial[s]]) if deep else None
    staged = _stage_indexes(scan, by_serial)
    try:
        for serial in order:
            results = by_serial[serial]
            for res in results:
                found += _file_checks(scan, serial, res)
            found += _ranges(scan, serial, results)
            found += _indexes(scan, serial, results)
            if deep_found is not None:
                for _res in results:
                    found += next(deep_found)
    finally:
        for path in staged:
            scan.storage.unstage(path)
    df = pd.DataFrame(found, columns=FINDING_COLUMNS)
    if deep:
        fold(scan, by_serial, found)
    return df.astype({"serial": "int64"})


def _denied(scan: Scan, wanted: set[int] | None) -> Iterator[Finding]:
    """An error finding per directory the tree walk could not enter (no permission)."""
    denied = unreadable_dirs(scan.tree)
    if not denied:
        return
    paths = {int(s): str(p) for s, p in scan.serials["path"].items()}
    for d in denied:
        owners = [s for s, p in paths.items() if touches(d, p)]
        for serial in owners or ([-1] if wanted is None else []):
            if wanted is None or serial in wanted:
                yield (serial, scan.storage.url(d), "permission", "error",
                       "permission denied: this directory cannot be read, so its files "
                       "are neither listed nor checked")  # fmt: skip


def fold(scan: Scan, by_serial: dict[int, list[FileResult]], found: list[Finding]) -> None:
    """A deep verify's error findings become the verdicts of their serials (DESIGN.md §3c):
    each file checked gets its messages ([] when clean) in the scan and its header cache."""
    per: dict[int, dict[str, list[str]]] = {}
    for serial, results in by_serial.items():
        per[serial] = {scan.storage.url(r.ref.path): [] for r in results if r.ref.required}
    for serial, url, check, severity, message in found:
        if severity == "error" and url in per.get(serial, {}):
            name = posixpath.basename(url)
            per[serial].setdefault(url, []).append(f"{name}: {check}: {message}")
    scan.fold_deep(per)


def _file_checks(scan: Scan, serial: int, res: FileResult) -> Iterator[Finding]:
    url = scan.storage.url(res.ref.path)
    severity = "error" if res.ref.required else "warning"
    if res.error:
        yield serial, url, "parse", severity, res.error
    for var in res.variables:
        if var.error:
            yield serial, url, "variable", severity, f"{var_name(res.ref, var)}: {var.error}"
            continue
        expected = _expected_bytes(var)
        if var.span is not None and expected is not None and expected != var.span.length:
            yield (serial, url, "dtype x shape", "error",
                   f"{var_name(res.ref, var)}: {var.dtype}{list(var.shape)} needs {expected} "
                   f"bytes, its range holds {var.span.length}")  # fmt: skip


def _expected_bytes(var: VarInfo) -> int | None:
    disk = var.span.disk_dtype if var.span is not None else None
    if disk and disk.startswith("packed"):
        return packed_nbytes(var.numel, int(disk[6:]))
    try:
        size = np_dtype(disk).itemsize if disk else itemsize(var.dtype)
    except (TypeError, ValueError):
        return None
    return var.numel * size if size else None


def _ranges(scan: Scan, serial: int, results: list[FileResult]) -> Iterator[Finding]:
    """Byte ranges of the variables of each file: inside the file, never overlapping."""
    spans: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    for res in results:
        for var in res.variables:
            if var.span is not None and not var.error and var.span.length:
                a = var.span.offset
                spans[var.span.path].append((a, a + var.span.length, var_name(res.ref, var)))
    for path, ranges in spans.items():
        ranges.sort()
        for (a0, b0, n0), (a1, b1, n1) in zip(ranges, ranges[1:]):
            # a range inside another is a view of the same storage (torch views share their
            # storage); one that starts inside another and runs past it is corrupt
            if a1 < b0 < b1:
                yield (serial, scan.storage.url(path), "overlap", "error",
                       f"{n1} (bytes {a1}..{b1}) overlaps {n0} (bytes {a0}..{b0})")  # fmt: skip


def _indexes(scan: Scan, serial: int, results: list[FileResult]) -> Iterator[Finding]:
    """Each ``*.index.json`` (safetensors / HF bin shards) beside the serial's files against
    the shards it names."""
    for rel in _index_files(scan, results):
        yield from _index(scan, serial, rel, results)


def _index_files(scan: Scan, results: list[FileResult]) -> list[str]:
    """The ``*.index.json`` files beside a serial's files (relative paths)."""
    tree = scan.tree
    dirs = {posixpath.dirname(tree.rel(r.ref.path)) for r in results}
    return [rel for d in sorted(dirs) for rel in (tree.files(under=d, depth=1) if d else
            tree.files(depth=1)) if rel.endswith(".index.json")]  # fmt: skip


def _stage_indexes(scan: Scan, by_serial: dict[int, list[FileResult]]) -> list[str]:
    """On remote storage, every serial's index fetched now, all at once (each read by its
    serial's checks later: no round trip one after another); the paths staged."""
    storage, tree = scan.storage, scan.tree
    if not storage.remote:
        return []
    staged, budget = [], READ_BUDGET
    for results in by_serial.values():
        for rel in _index_files(scan, results):
            size = tree.size(rel)
            if 0 < size <= min(MAX_INDEX_BYTES, budget):
                path = tree.abs(rel)
                storage.stage(path, size)
                staged.append(path)
                budget -= size
    return staged


def _index(scan: Scan, serial: int, rel: str, results: list[FileResult]) -> Iterator[Finding]:
    tree, url = scan.tree, scan.tree.url(rel)
    try:
        doc = loads_json(tree.read_bytes(rel, MAX_INDEX_BYTES))
        weight_map = doc["weight_map"]
        assert isinstance(weight_map, dict)
    except Exception as e:  # noqa: BLE001 - an unreadable index is itself the finding
        yield serial, url, "index", "error", f"unreadable index: {type(e).__name__}: {e}"
        return
    base = posixpath.dirname(rel)
    shard_rels = {posixpath.join(base, f) for f in set(weight_map.values()) if isinstance(f, str)}
    for shard in sorted(shard_rels):
        if not tree.exists(shard):
            yield serial, url, "index", "error", f"names {posixpath.basename(shard)}, absent"
    suffix = ".safetensors" if rel.endswith(".safetensors.index.json") else ".bin"
    beside = tree.files(under=base, depth=1) if base else tree.files(depth=1)
    for other in beside:
        if other.endswith(suffix) and other not in shard_rels:
            yield (serial, tree.url(other), "index", "error",
                   f"a shard the index does not name (orphan or duplicate of {rel})")  # fmt: skip
    listed = [r for r in results if posixpath.dirname(tree.rel(r.ref.path)) == base]
    held: Counter[str] = Counter()
    where: dict[str, str] = {}
    total = 0
    for r in listed:
        name = posixpath.basename(r.ref.path)
        if not name.endswith(suffix):
            continue
        if tree.rel(r.ref.path) not in shard_rels:
            continue  # reported above
        for var in r.variables:
            held[var.name] += 1
            where[var.name] = name
            total += var.nbytes or 0
    for tensor, shard in sorted(weight_map.items()):
        if held[tensor] == 0 and tree.exists(posixpath.join(base, str(shard))):
            yield serial, url, "index", "error", f"{tensor}: not in {shard}"
        elif held[tensor] > 1:
            yield serial, url, "index", "error", f"{tensor}: in {held[tensor]} shards"
    for tensor in sorted(set(held) - set(weight_map)):
        yield serial, url, "index", "warning", f"{tensor} (in {where[tensor]}) not indexed"
    stated = (doc.get("metadata") or {}).get("total_size")
    if isinstance(stated, int) and held and stated != total:
        yield (serial, url, "index", "warning",
               f"metadata total_size {stated} != {total} bytes of indexed tensors")  # fmt: skip


def _deep_all(scan: Scan, files: list[tuple[int, FileResult]]) -> Iterator[list[Finding]]:
    """Each file's deep findings, in order. On local disk one file after another; on remote
    storage ``ckptview_max_concurrency`` files at once, each file (and the files its
    variables' spans lie in) of at most ``WHOLE_FILE`` bytes fetched whole in one request
    (a deep check reads every byte: CRC-32s, then the values), larger ones streamed with
    their chunks read ahead; working memory within the Storage's read budget."""
    storage = scan.storage

    def check(item: tuple[int, FileResult]) -> list[Finding]:
        return list(_deep(scan, *item))

    if not storage.remote:
        return (check(item) for item in files)

    planned: dict[int, tuple[list[tuple[Storage, str, int]], bool]] = {}

    def plan(item: tuple[int, FileResult]) -> tuple[list[tuple[Storage, str, int]], bool]:
        """The files fetched whole for a file's checks, and whether they are all it reads."""
        res = item[1]
        if id(res) in planned:
            return planned[id(res)]
        out: dict[str, int] = {}
        # a file with values to read (not a marker or a note)
        if res.codec and not res.error and any(
            not v.error and is_numeric(v.dtype) for v in res.variables
        ):
            data = _data_files(scan, res)
            size = int(res.ref.size or 0)  # its first bytes are looked at (a zip?) from 4 on
            if (size >= 4 or res.ref.path in data) and not scan.tree.is_dir(
                scan.tree.rel(res.ref.path)
            ):
                out[res.ref.path] = size
            for path in data:
                if path not in out:
                    out[path] = file_size(scan, path)
        whole = [(storage, path, size) for path, size in out.items() if 0 < size <= WHOLE_FILE]
        planned[id(res)] = whole, bool(whole) and len(whole) == len(out)
        return planned[id(res)]

    def cost(item: tuple[int, FileResult]) -> int:  # a streamed file: chunks and copies
        return 0 if plan(item)[1] else 3 * CRC_CHUNK

    return storage.map_window(check, files, cost=cost, files=lambda item: plan(item)[0],
                              inline=lambda item: plan(item)[1])  # fmt: skip


def _deep(scan: Scan, serial: int, res: FileResult) -> Iterator[Finding]:
    """Every value read (NaN/inf counted), and the CRC-32 of the stored zip members."""
    url = scan.storage.url(res.ref.path)
    if res.codec is None or res.error:
        return
    is_file = not scan.tree.is_dir(scan.tree.rel(res.ref.path))  # Orbax items are directories
    silent = res.codec in ("torch", "torch_dcp")  # torch's zip reader skips the CRC-32s
    problems = checksum_problems(scan.storage, res, registry.get_codec(res.codec),
                                 any_zip=is_file, silent=silent, chunk=CRC_CHUNK, transient=())  # fmt: skip
    for check, severity, message in problems:
        yield serial, url, check, severity, message
    numeric = [var for var in res.variables if not var.error and is_numeric(var.dtype)]

    def values(var: VarInfo) -> Finding | None:
        name = var_name(res.ref, var)
        try:
            n_nan = n_inf = 0
            for chunk in scan.iter_piece(res, var, CRC_CHUNK):  # the stored variable itself
                if chunk.dtype.kind in "fc":
                    n_nan += int(np.isnan(chunk).sum())
                    n_inf += int(np.isinf(chunk).sum())
        except Exception as e:  # noqa: BLE001 - a failed read is the finding
            return serial, url, "read", "error", f"{name}: {type(e).__name__}: {e}"
        if n_nan or n_inf:
            return serial, url, "values", "warning", f"{name}: {n_nan} NaN, {n_inf} inf"
        return None

    def memory(var: VarInfo) -> int:  # a chunk and its NaN/inf masks
        return 2 * min(var.nbytes or CRC_CHUNK, CRC_CHUNK)

    # on remote storage variables whose values are not in memory (a file fetched whole)
    # are read at once: DCP ranks, Orbax arrays, files too large to fetch whole
    storage = scan.storage
    held = not storage.remote or all(storage.held(p) for p in _data_files(scan, res, numeric))
    run = (values(v) for v in numeric) if held else storage.map_window(values, numeric, cost=memory)
    for finding in run:
        if finding is not None:
            yield finding


def _data_files(scan: Scan, res: FileResult, variables: list[VarInfo] | None = None) -> list[str]:
    """The files the values of a file's variables lie in (its codec's spans), in order; a
    variable whose codec cannot say is taken to be in its own file."""
    out: dict[str, None] = {}
    try:
        codec = registry.get_codec(res.codec) if res.codec else None
    except Exception:  # noqa: BLE001 - a plan only
        codec = None
    blob = scan.storage.blob(res.ref.path, res.ref.size)
    for var in res.variables if variables is None else variables:
        if var.error:
            continue
        try:
            spans = codec.spans(blob, var) if codec is not None else None
        except Exception:  # noqa: BLE001 - a plan only: the read itself reports
            spans = None
        for path, _offset, _length in [(res.ref.path, 0, 0)] if spans is None else spans:
            out[path] = None
    return list(out)
