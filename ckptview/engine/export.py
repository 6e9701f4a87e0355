"""Export a serial's logical tensors as consolidated safetensors (DESIGN.md §3b).

One tensor at a time, streamed chunk by chunk from its pieces (memory: one chunk, or one
piece for tensors whose pieces do not split rows); ``model.safetensors``, or shards of at
most ``max_shard_bytes`` with ``model.safetensors.index.json``. Everything is written into a
staging directory beside the target, journaled there, and committed by renaming it to the
target last: a killed export leaves ``<to>.ckptview-partial-*``, never a half-written target.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from ..changes.journal import Journal
from ..changes.result import ChangeResult
from ..dtypes import is_numeric, np_dtype
from ..fmt import human_bytes
from ..formats.safetensors import CODES, METADATA, header, reference_problems
from ..io import Storage
from ..scan.core import Scan
from ..scan.quant import QUANTIZED

CHUNK_BYTES = 16 << 20
DEFAULT_MAX_SHARD = 5 << 30
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
FILE_COLUMNS = ["file", "n_tensors", "nbytes"]
SKIP_COLUMNS = ["name", "node", "reason"]


@dataclass
class Entry:
    """One tensor of the export: its key, dtype, shape, and how to stream its values."""

    key: str
    dtype: str
    shape: tuple[int, ...]
    chunks: Callable[[], Iterator[np.ndarray]]

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= int(d)
        return n * np_dtype(self.dtype).itemsize


@dataclass(kw_only=True)
class ExportResult(ChangeResult):
    """What an export wrote (or, with ``dry_run``, would write): a :class:`ChangeResult` whose
    table is ``files`` (file, n_tensors, nbytes); ``skipped`` (name, node, reason) lists what
    was left out."""

    action: ClassVar[str] = "export"
    main_table: ClassVar[str] = "files"
    serial: int
    files: pd.DataFrame = field(repr=False)
    skipped: pd.DataFrame = field(repr=False)

    @property
    def nbytes(self) -> int:
        return int(self.files["nbytes"].sum()) if len(self.files) else 0

    @property
    def verb(self) -> str:
        return "would write" if self.dry_run else ("wrote" if self.done else "did not write")

    def headline(self) -> str:
        n = int(self.files["n_tensors"].sum()) if len(self.files) else 0
        head = (f"export serial {self.serial} -> {self.target}: {self.verb} {n} tensors, "
                f"{human_bytes(self.nbytes)} in {len(self.files)} file(s)")  # fmt: skip
        if len(self.skipped):
            head += f"; {len(self.skipped)} skipped"
        return self._with_message(head)

    def to_dict(self) -> dict:
        return {**super().to_dict(), "nbytes": self.nbytes}


def export(scan: Scan, serial: int | None, to: str | os.PathLike, names: list[str] | None = None,
           max_shard_bytes: int = DEFAULT_MAX_SHARD, dequantize: bool = False,
           dry_run: bool = False, force: bool = False, storage_options: dict | None = None,
           progress: Callable[[int], None] | None = None) -> ExportResult:  # fmt: skip
    """Write ``serial`` (default: the latest) as safetensors at ``to`` (a new directory)."""
    serial = _serial(scan, serial, force)
    entries, skipped = plan_entries(scan, serial, names, dequantize, force)
    shards = _shards(entries, max_shard_bytes)
    dest, root = Storage.from_url(os.fspath(to), storage_options)
    fs = dest.fs
    if fs.exists(root) and (not fs.isdir(root) or fs.ls(root)):
        raise FileExistsError(f"{dest.url(root)} exists and is not an empty directory "
                              "(export never overwrites)")  # fmt: skip
    files = pd.DataFrame(
        [(f, len(group), sum(e.nbytes for e in group)) for f, group in shards.items()],
        columns=FILE_COLUMNS,
    ).astype({"n_tensors": "int64", "nbytes": "int64"})
    result = ExportResult(serial=serial, target=dest.url(root), files=files,
                          skipped=pd.DataFrame(skipped, columns=SKIP_COLUMNS), dry_run=dry_run,
                          done=False)  # fmt: skip
    if not entries:
        raise ValueError(f"serial {serial} has no tensor to export")
    check_keys(entries, serial)
    if dry_run:
        return result
    _write(scan, serial, fs, root, shards, result, progress)
    return result


def _serial(scan: Scan, serial: int | None, force: bool) -> int:
    if serial is None:
        serial = scan.latest
        if serial is None:
            raise ValueError("the tree has no loadable serial to export: pass a serial")
    serial = int(serial)
    scan.serial_info(serial)
    row = scan.serials.loc[serial]
    if not bool(row["loadable"]) and not force:
        raise ValueError(f"serial {serial} does not load ({row['error']}); "
                         "exporting what reads needs force=True")  # fmt: skip
    return serial


def plan_entries(scan: Scan, serial: int, names: list[str] | None, dequantize: bool,
                 force: bool) -> tuple[list[Entry], list[tuple[str, str, str]]]:  # fmt: skip
    """The tensors to write, in catalog order, and those left out with why."""
    df = scan.variables
    df = df[df["serial"] == serial]
    if names is not None:
        wanted = set(names)
        missing = wanted - set(df["name"])
        if missing:
            raise KeyError(f"no variable {sorted(missing)[0]!r} in serial {serial}")
        df = df[df["name"].isin(wanted)]
    counts = df["name"].value_counts()
    entries: list[Entry] = []
    skipped: list[tuple[str, str, str]] = []
    for row in df.itertuples(index=False):
        name, node = row.name, row.node
        key = name if counts[name] == 1 or not node else f"{node}/{name}"
        if row.error is not None:
            if not force:
                raise ValueError(f"{name}: {row.error}")
            skipped.append((name, node, str(row.error)))
            continue
        if not is_numeric(row.dtype) or row.dtype not in CODES:
            skipped.append((name, node, f"{row.dtype} has no safetensors dtype"))
            continue
        if row.quant is not None and not dequantize:
            stored = _stored(scan, serial, name, node, key)
            if stored is not None:
                entries += stored
                continue
        entries.append(Entry(key, row.dtype, tuple(row.shape),
                             _chunks(scan, name, serial, node)))  # fmt: skip
    return entries, skipped


def check_keys(entries: list[Entry], serial: int) -> None:
    """ValueError, before anything is written, when the plan would give the safetensors loader
    a file it refuses: two tensors under one name (the header would keep one of them and
    leave the other's bytes unowned), or a tensor named ``__metadata__``."""
    seen: dict[str, int] = {}
    for e in entries:
        seen[e.key] = seen.get(e.key, 0) + 1
    dupes = sorted(k for k, n in seen.items() if n > 1)
    if dupes:
        shown = ", ".join(repr(k) for k in dupes[:5]) + (" ..." if len(dupes) > 5 else "")
        raise ValueError(f"serial {serial}: {len(dupes)} name(s) would be written twice "
                         f"({shown}); safetensors needs unique names: export with names= "
                         "to pick one, or rename")  # fmt: skip
    if METADATA in seen:
        raise ValueError(f"serial {serial}: a variable is named {METADATA!r}, the key "
                         "safetensors keeps for its metadata: export the others with names=")  # fmt: skip


def _chunks(scan: Scan, name: str, serial: int, node: str) -> Callable[[], Iterator[np.ndarray]]:
    return lambda: scan.iter_chunks(name, serial, node, CHUNK_BYTES)


def _stored(scan: Scan, serial: int, name: str, node: str, key: str) -> list[Entry] | None:
    """A quantized group's members under their stored names (FP8 weight and scale, MXFP4
    blocks and scales); None for block formats safetensors cannot hold (GGUF: dequantized)."""
    var, res = scan.resolve(name, serial, node)
    if res.codec != QUANTIZED:
        return None
    prefix = key[: len(key) - len(name)]
    out = []
    for member in (var.locator.data, var.locator.scale):
        stored = scan.piece_name(member.res, member.var)
        if member.var.dtype not in CODES:
            return None
        out.append(Entry(prefix + stored, member.var.dtype, tuple(member.var.shape),
                         _piece_chunks(scan, member.res, member.var)))  # fmt: skip
    return out


def _piece_chunks(scan: Scan, res: Any, var: Any) -> Callable[[], Iterator[np.ndarray]]:
    return lambda: scan.iter_piece(res, var, CHUNK_BYTES)


def _shards(entries: list[Entry], max_bytes: int) -> dict[str, list[Entry]]:
    """Tensors grouped into files of at most ``max_bytes`` (a bigger tensor alone)."""
    groups: list[list[Entry]] = [[]]
    size = 0
    for e in entries:
        if groups[-1] and size + e.nbytes > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append(e)
        size += e.nbytes
    if len(groups) == 1:
        return {SINGLE: groups[0]}
    n = len(groups)
    return {f"model-{i + 1:05d}-of-{n:05d}.safetensors": g for i, g in enumerate(groups)}


def _write(scan: Scan, serial: int, fs: Any, root: str, shards: dict[str, list[Entry]],
           result: ExportResult, progress: Callable[[int], None] | None) -> None:  # fmt: skip
    """Write every file into a staging dir beside ``root``, then rename it to ``root``."""
    staging = f"{root.rstrip('/')}.ckptview-partial-{uuid.uuid4().hex[:8]}"
    fs.makedirs(staging, exist_ok=True)
    journal = Journal(fs, staging)
    journal.write("begin", action="export", serial=serial, source=scan.url,
                  target=result.target, files=list(shards), pid=os.getpid(),
                  host=socket.gethostname())  # fmt: skip
    meta = {"format": "pt", "source": scan.url, "serial": str(serial)}
    try:
        for step, (name, group) in enumerate(shards.items()):
            journal.write("intent", step=step, op={"kind": "write", "path": name,
                                                   "nbytes": sum(e.nbytes for e in group)})  # fmt: skip
            _write_file(fs, f"{staging}/{name}", group, meta, progress)
            check_written(fs, f"{staging}/{name}", group)
            journal.write("done", step=step)
        if len(shards) > 1:
            index = {"metadata": {"total_size": sum(e.nbytes for g in shards.values() for e in g)},
                     "weight_map": {e.key: f for f, g in shards.items() for e in g}}  # fmt: skip
            with fs.open(f"{staging}/{INDEX}", "wb") as f:
                f.write(json.dumps(index, indent=2).encode())
        journal.write("commit", action="export", rename=f"{staging} -> {root}")
        if fs.exists(root):
            fs.rmdir(root)  # checked empty above
        fs.mv(staging, root, recursive=True)
    except BaseException:
        try:
            fs.rm(staging, recursive=True)
        except Exception:  # noqa: BLE001 - the partial dir names itself; recovery can remove it
            pass
        raise
    Journal(fs, root).write("end", action="export", serial=serial)
    result.done = True


def check_written(fs: Any, path: str, group: list[Entry]) -> None:
    """Re-read a written file's header with ckptview's own safetensors parser: it must follow
    every rule of the reference loader (:func:`reference_problems`) and hold exactly the
    planned tensors, back to back in plan order. ValueError otherwise (the export fails and
    its staging dir is removed)."""
    size = int(fs.size(path))
    with fs.open(path, "rb") as f:
        raw8 = f.read(8)
        (n,) = struct.unpack("<Q", raw8) if len(raw8) == 8 else (None,)
        if n is None or 8 + n > size:
            raise ValueError(f"{path}: written header runs past the end of the file")
        raw = f.read(n)
    problems = reference_problems(raw, size - 8 - n)
    head = json.loads(raw)
    head.pop(METADATA, None)
    at = 0
    want = {}
    for e in group:
        want[e.key] = {"dtype": CODES[e.dtype], "shape": [int(d) for d in e.shape],
                       "data_offsets": [at, at + e.nbytes]}  # fmt: skip
        at += e.nbytes
    if set(head) != set(want):
        lost = sorted(set(want) - set(head))[:3]
        extra = sorted(set(head) - set(want))[:3]
        problems.append(f"header holds {len(head)} tensors, {len(want)} planned "
                        f"(missing {lost}, unplanned {extra})")  # fmt: skip
    else:
        bad = [k for k in want if head[k] != want[k]]
        if bad:
            problems.append(f"{bad[0]!r} written as {head[bad[0]]}, planned {want[bad[0]]}")
    if problems:
        raise ValueError(f"{path}: the written file would not load: {'; '.join(problems[:3])}")


def _write_file(fs: Any, path: str, group: list[Entry], meta: dict,
                progress: Callable[[int], None] | None) -> None:  # fmt: skip
    entries = [(e.key, CODES[e.dtype], e.shape, e.nbytes) for e in group]
    with fs.open(path, "wb") as out:
        out.write(header(entries, meta))
        for e in group:
            want = np_dtype(e.dtype)
            written = 0
            for chunk in e.chunks():
                arr = np.ascontiguousarray(chunk, dtype=want.newbyteorder("<")
                                           if want.itemsize > 1 and want.kind in "iufc" else want)  # fmt: skip
                out.write(arr.tobytes())
                written += arr.nbytes
                if progress:
                    progress(arr.nbytes)
            if written != e.nbytes:
                raise ValueError(f"{e.key}: wrote {written} bytes, expected {e.nbytes}")
