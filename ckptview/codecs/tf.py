"""TensorFlow tensor bundles (TF2 ``tf.train.Checkpoint``, TF1 Saver V2): ``P.index`` + ``P.data-*``.

``P.index`` is a LevelDB table (read by hand in :mod:`ckptview.formats.sstable`) mapping each key to a
BundleEntryProto; the values live raw in ``P.data-SSSSS-of-NNNNN``. Listing reads the
``.index`` only (plus the data files' sizes).
"""

from __future__ import annotations

import posixpath
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from math import prod

import numpy as np

from ..dtypes import np_dtype
from ..formats import protobuf as pb
from ..formats.crc32c import crc32c
from ..formats.sstable import TABLE_MAGIC, FormatError, TableFile
from ..formats.tf_bundle import (
    DT_STRING,
    OBJECT_GRAPH_KEY,
    TF_DTYPES,
    BundleEntry,
    data_path,
    decode_entry,
    decode_header,
    decode_slice_key,
    object_graph_names,
    plain_entry,
    read_strings,
)
from ..io import Blob, Storage
from ..kinds import guess_kind
from ..model import HintsLike, Span, TFHints, VarColumns, VarInfo
from .base import Codec, CodecTier, read_span

OBJECT_GRAPH_LIMIT = 16 << 20

#: DataType enum -> (numpy name, TF name when it differs)


# -- protos --------------------------------------------------------------------------------


# -- values ----------------------------------------------------------------------------------
@dataclass
class _Strings:
    """A DT_STRING tensor: varint lengths, a masked crc of them, then the bytes."""

    span: Span


@dataclass
class _Sliced:
    """A partitioned tensor: (extents, VarInfo of the slice) pieces."""

    pieces: list[tuple[tuple[tuple[int, int], ...], VarInfo]]


def _read(storage: Storage, var: VarInfo) -> np.ndarray:
    loc = var.locator
    if isinstance(loc, _Strings):
        return read_strings(storage, loc.span, var.shape)
    if isinstance(loc, _Sliced):
        dtype = object if var.dtype == "object" else np_dtype(var.dtype)
        out = np.zeros(var.shape, dtype=dtype)
        for extents, piece in loc.pieces:
            index = tuple(slice(None) if n < 0 else slice(s, s + n) for s, n in extents)
            out[index] = _read(storage, piece)
        return out
    if var.span is None:
        raise NotImplementedError(f"{var.name}: cannot read {var.attrs.get('tf_dtype')} tensors")
    return read_span(storage, var)


# -- the codec -----------------------------------------------------------------------------


@lru_cache(maxsize=1 << 16)  # keys repeat across serials
def tf_kind(key: str, slot: bool = False) -> str:
    """Kind of a bundle key (object paths, TF1 names and Keras 3's optimizer-held weights)."""
    path = key.split("/.ATTRIBUTES/")[0]
    if slot or "/.OPTIMIZER_SLOT/" in key:
        return "optimizer"
    if "/_trainable_variables/" in f"/{path}/":  # Keras 3 weights tracked by the optimizer
        return "model"
    if key == OBJECT_GRAPH_KEY:
        return "other"
    if path in ("save_counter", "global_step") or path.endswith("/save_counter"):
        return "trainer"
    last = path.rsplit("/", 1)[-1]
    if last.startswith(("Adam", "Momentum", "RMSProp", "Adagrad", "Ftrl", "Adadelta")):
        return "optimizer"  # TF1 slot variables: dense/kernel/Adam_1
    if last in ("beta1_power", "beta2_power"):
        return "optimizer"
    return guess_kind(path)


class TFBundleCodec(Codec):
    """``.index`` of a TensorFlow tensor bundle; values from its ``.data-*`` shards.

    Hints: ``data_sizes`` ({data path: size}, from the layout's listing; otherwise each shard
    is stat'ed), ``object_graph`` (True: also read the ``_CHECKPOINTABLE_OBJECT_GRAPH``
    string from the data file for readable names in ``attrs["full_name"]``; off by default
    so that listing reads the ``.index`` only).
    """

    name = "tf"
    checked_on_load = True  # TF's reader checks each entry's crc32c
    suffixes = (".index",)
    priority = CodecTier.FORMAT

    def guess_can_open(self, filename: str, head: bytes) -> bool:
        # the first data-block entry is the header: shared=0, non_shared=0 (key "")
        return filename.lower().endswith(".index") and head[:2] == b"\x00\x00"

    def guess_can_open_blob(self, filename: str, head: bytes, blob: Blob) -> bool:
        """A snappy-compressed first block (TF Serving's SavedModels): the table's footer
        magic, in the file's last 8 bytes, settles it (one small read)."""
        if not filename.lower().endswith(".index") or blob.size < 48:
            return False
        return blob.read(blob.size - 8, 8) == struct.pack("<Q", TABLE_MAGIC)

    def list_variables(self, blob: Blob, hints: HintsLike) -> list[VarInfo]:
        hints = TFHints.of(hints)
        table = TableFile(blob)
        num_shards, big_endian = 1, False
        # in key order: (name, PlainEntry) from the fast decoder, else (name, BundleEntry or
        # the error decode_entry raised)
        entries: list[tuple[str, tuple | BundleEntry | Exception]] = []
        slices: dict[tuple[str, tuple], BundleEntry] = {}
        shapes: dict[bytes, tuple[int, ...]] = {}
        for block, spans in table.blocks():
            view = memoryview(block)
            for key, start, end in spans:
                if not key:
                    num_shards, big_endian = decode_header(view[start:end])
                    continue
                if key[0] == 0:
                    slices[decode_slice_key(key)] = decode_entry(view[start:end])
                    continue
                name = key.decode("utf-8", "replace")
                plain = plain_entry(block, start, end, shapes)
                if plain is not None:
                    entries.append((name, plain))
                    continue
                try:
                    entries.append((name, decode_entry(view[start:end])))
                except (pb.DecodeError, FormatError) as e:
                    entries.append((name, e))
        if num_shards < 1:
            raise FormatError(f"bundle header claims {num_shards} shards")
        ctx = _Context(blob, hints, num_shards, big_endian)
        if not slices:  # the usual bundle: every entry plain and sound -> columns
            cols = ctx.columns(entries)
            if cols is not None:
                if hints.object_graph:
                    _graph_columns(blob.storage, cols)
                return cols
        out = []
        for name, entry in entries:
            if type(entry) is tuple:
                out.append(ctx.var(name, *entry))
            elif isinstance(entry, Exception):
                out.append(VarInfo(name, "object", (), error=f"bad entry: {entry}"))
            elif entry.slices:
                out.append(ctx.sliced(name, entry, slices))
            else:
                out.append(ctx.entry_var(name, entry))
        used = ctx.used_slices
        out += [
            ctx.entry_var(f"{n}/.slice{list(e)}", s)
            for (n, e), s in slices.items()
            if (n, e) not in used
        ]
        if hints.object_graph:
            _add_object_graph(blob.storage, out)
        return out

    def read(self, blob: Blob, var: VarInfo) -> np.ndarray:
        return _read(blob.storage, var)

    def spans(self, blob: Blob, var: VarInfo) -> list[tuple[str, int, int]] | None:
        """A string tensor's bytes, or each slice's of a partitioned one, else its span."""
        loc = var.locator
        if isinstance(loc, _Strings):
            return [(loc.span.path, loc.span.offset, loc.span.length)]
        if isinstance(loc, _Sliced):
            out: list[tuple[str, int, int]] = []
            for _, piece in loc.pieces:
                got = self.spans(blob, piece)
                if got is None:
                    return None
                out += got
            return out
        return super().spans(blob, var)

    def checksums(self, blob: Blob, variables) -> Iterator[tuple[str, str]]:
        """Each entry's masked crc32c against its bytes (TF's reader refuses a mismatch)."""
        for var in variables:
            if var.error:
                continue
            pieces = var.locator.pieces if isinstance(var.locator, _Sliced) else [((), var)]
            for _, piece in pieces:
                problem = _crc_problem(blob.storage, piece)
                if problem:
                    yield var.name, problem
                    break

    def iter_chunks(self, blob: Blob, var: VarInfo, max_bytes: int):
        if var.locator is None:
            yield from super().iter_chunks(blob, var, max_bytes)
        else:
            yield np.asarray(self.read(blob, var)).reshape(-1)


CRC_CHUNK = 4 << 20


def mask_crc(crc: int) -> int:
    """LevelDB/TF's masking of a stored crc32c."""
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def _crc_problem(storage: Storage, var: VarInfo) -> str | None:
    """Why ``var``'s bytes fail its entry's crc32c (None: they match, or none is stored)."""
    stored = var.attrs.get("crc32c") if var.attrs else None
    span = var.locator.span if isinstance(var.locator, _Strings) else var.span
    if stored is None or span is None:
        return None
    if isinstance(var.locator, _Strings):
        data = storage.read_range(span.path, span.offset, span.offset + span.length)
        numel = int(np.prod(var.shape, dtype=np.int64)) if var.shape else 1
        crc, pos, lengths = 0, 0, 0
        for _ in range(numel):
            n, pos = pb.read_varint(data, pos)
            lengths += n
            crc = crc32c(struct.pack("<I", n & 0xFFFFFFFF), crc)  # TF: each length as uint32
        head = data[pos : pos + 4]
        if len(head) < 4 or struct.unpack("<I", head)[0] != mask_crc(crc):
            return "the length checksum of the strings does not match (TF refuses it)"
        crc = crc32c(data[pos + 4 : pos + 4 + lengths], crc32c(head, crc))
    else:
        crc = 0
        for at in range(0, span.length, CRC_CHUNK):
            n = min(CRC_CHUNK, span.length - at)
            crc = crc32c(storage.read_range(span.path, span.offset + at, span.offset + at + n), crc)
    if mask_crc(crc) != stored:
        return (f"crc32c checksum does not match: stored {stored}, computed {mask_crc(crc)} "
                "(TF refuses it)")  # fmt: skip
    return None


class _Context:
    """Turns entries into VarInfos, checking each against its data file's size."""

    def __init__(self, blob: Blob, hints: TFHints, num_shards: int, big_endian: bool):
        self.blob = blob
        self.sizes: dict = dict(hints.data_sizes or {})
        self.num_shards = num_shards
        self.big_endian = big_endian
        self.used_slices: set = set()
        self.shards: dict[int, tuple[str, int | None]] = {}  # shard id -> (path, size)

    def data_size(self, path: str) -> int | None:
        if path not in self.sizes:
            try:
                self.sizes[path] = self.blob.storage.info(path)["size"]
            except (FileNotFoundError, OSError):
                self.sizes[path] = None
        return self.sizes[path]

    def shard(self, shard_id: int) -> tuple[str, int | None]:
        """(path, size or None when missing) of a data shard."""
        found = self.shards.get(shard_id)
        if found is None:
            path = data_path(self.blob.path, shard_id, self.num_shards)
            found = self.shards[shard_id] = (path, self.data_size(path))
        return found

    def columns(self, entries: list) -> VarColumns | None:
        """The entries as columns when every one decoded plain and passes ``var``'s checks
        (a string or other object tensor is a record among them, ``VarColumns.others``);
        None at the first that does not: the records path then says why."""
        rows = []  # one tuple per row, transposed into columns at the end
        others: dict[int, VarInfo] = {}
        here = self.blob.path
        big = self.big_endian
        layouts: dict[int, tuple] = {}  # dtype enum -> (dtype, tf name, itemsize, disk dtype)
        for i, (name, entry) in enumerate(entries):
            if type(entry) is not tuple:
                return None
            dtype_enum, shape, shard_id, offset, size, crc = entry
            numel = prod(shape)
            if numel >= 1 << 62:
                return None
            known = layouts.get(dtype_enum)
            if known is None:
                found = TF_DTYPES.get(dtype_enum)
                if found is None:
                    return None
                dtype, tf_name = found
                if dtype == "object":
                    known = (dtype, tf_name or dtype, 0, None)
                else:
                    item = np_dtype(dtype).itemsize
                    disk = np_dtype(dtype).newbyteorder(">").str if big and item > 1 else None
                    known = layouts[dtype_enum] = (dtype, tf_name or dtype, item, disk)
            dtype, tf_name, item, disk = known
            if not item or dtype_enum == DT_STRING:  # read through a locator: a record
                var = self.var(name, *entry)
                if var.error:
                    return None
                others[i] = var
                path, offset, kind = here, 0, var.kind
            else:
                if not 0 <= shard_id < self.num_shards or offset < 0 or size < 0:
                    return None
                path, file_size = self.shard(shard_id)
                if file_size is None or offset + size > file_size or size != numel * item:
                    return None
                kind = tf_kind(name)
            rows.append((name, dtype, shape, numel, size, offset, path, disk, tf_name, shard_id,
                         crc, kind))  # fmt: skip
        columns = [list(c) for c in zip(*rows)] if rows else [[] for _ in range(12)]
        names, dtypes, shapes, numels, sizes, offsets, paths, disks = columns[:8]
        tf_names, shard_ids, crcs, kinds = columns[8:]
        as_int = np.array
        return VarColumns(here, names, dtypes, shapes, as_int(numels, np.int64),
                          as_int(sizes, np.int64), as_int(offsets, np.int64), disks, [], "",
                          kinds=kinds, paths=paths,
                          fields={"tf_dtype": tf_names, "shard": shard_ids, "crc32c": crcs},
                          others=others)  # fmt: skip

    def entry_var(self, name: str, entry: BundleEntry) -> VarInfo:
        return self.var(
            name, entry.dtype, entry.shape, entry.shard_id, entry.offset, entry.size, entry.crc32c
        )

    def var(
        self, name: str, dtype_enum: int, shape: tuple[int, ...], shard_id: int, offset: int,
        size: int, crc: int | None,
    ) -> VarInfo:  # fmt: skip
        known = TF_DTYPES.get(dtype_enum)
        dtype, tf_name = known or ("object", f"DT_{dtype_enum}")
        attrs = {"tf_dtype": tf_name or dtype, "shard": shard_id}
        if crc is not None:
            attrs["crc32c"] = crc
        var = VarInfo(name, dtype, shape, size if size > 0 else 0, tf_kind(name), None, None,
                      None, attrs)  # fmt: skip
        # the checks, in order; the first that fails is the variable's error
        if known is None:
            var.error = f"unsupported TF dtype enum {dtype_enum}"
            return var
        if not 0 <= shard_id < self.num_shards:
            var.error = f"shard {shard_id} outside 0..{self.num_shards - 1}"
            return var
        if offset < 0 or size < 0:
            var.error = "negative offset or size"
            return var
        path, file_size = self.shard(shard_id)
        if file_size is None:
            var.error = f"data file missing: {posixpath.basename(path)}"
            return var
        if offset + size > file_size:
            var.error = (
                f"entry claims bytes {offset}..{offset + size} "
                f"but {posixpath.basename(path)} has {file_size}"
            )
            return var
        if dtype != "object":
            itemsize = np_dtype(dtype).itemsize
            if size != prod(shape) * itemsize:
                var.error = f"entry size {size} != {var.numel} x {dtype}"
                return var
        elif dtype_enum == DT_STRING and size < prod(shape) + 4:
            var.error = f"entry size {size} too small for {var.numel} strings"
            return var
        span = Span(path, offset, size)
        if dtype_enum == DT_STRING:
            var.locator = _Strings(span)
        elif dtype != "object":
            if self.big_endian and itemsize > 1:
                span.disk_dtype = np_dtype(dtype).newbyteorder(">").str
            var.span = span
        return var

    def sliced(self, name: str, entry: BundleEntry, slices: dict) -> VarInfo:
        dtype, tf_name = TF_DTYPES.get(entry.dtype, ("object", f"DT_{entry.dtype}"))
        var = VarInfo(name, dtype, entry.shape, kind=tf_kind(name))
        var.attrs = {"tf_dtype": tf_name or dtype, "partitioned": len(entry.slices)}
        pieces, covered, nbytes = [], 0, 0
        for extents in entry.slices:
            piece = slices.get((name, extents))
            if piece is None:
                var.error = f"slice {list(extents)} has no entry"
                return var
            self.used_slices.add((name, extents))
            lengths = []
            for (start, n), dim in zip(extents, entry.shape):
                n = dim - start if n < 0 else n
                if start < 0 or start + n > dim:
                    var.error = f"slice {list(extents)} outside shape {entry.shape}"
                    return var
                lengths.append(n)
            if piece.shape != tuple(lengths):
                var.error = f"slice {list(extents)} stored as shape {piece.shape}"
                return var
            info = self.entry_var(name, piece)
            if info.error:
                var.error = f"slice {list(extents)}: {info.error}"
                return var
            pieces.append((extents, info))
            covered += info.numel
            nbytes += info.nbytes or 0
        if covered != var.numel:
            var.error = f"slices cover {covered} of {var.numel} elements"
            return var
        var.nbytes = nbytes
        var.locator = _Sliced(pieces)
        return var


#: the last object graph decoded and its names (read only): the serials of one run, listed
#: one after another, hold the same graph bytes (kept only for graphs up to this size)
_LAST_GRAPH: tuple[bytes, dict[str, dict]] = (b"", {})
GRAPH_MEMO_LIMIT = 1 << 20


def _graph_columns(storage: Storage, cols: VarColumns) -> None:
    """``_add_object_graph`` for columns: the graph's facts as each row's ``extras``, its
    ``full_name`` as the row's alias, slots as optimizer kinds."""
    others = cols.others or {}
    graph = next((v for v in others.values() if v.name == OBJECT_GRAPH_KEY), None)
    names = _graph_names(storage, graph)
    if not names:
        return
    n = len(cols.names)
    extras: list[dict | None] = [None] * n
    aliases: list[str | None] = [None] * n
    kinds = cols.kinds if cols.kinds is not None else [None] * n
    for i, name in enumerate(cols.names):
        found = names.get(name)
        if not found:
            continue
        var = others.get(i)
        if var is not None:
            var.attrs.update(found)
        else:
            extras[i] = found
        alias = found.get("full_name") or found.get("param_name") or None
        aliases[i] = alias if isinstance(alias, str) else None
        if "slot_name" in found:
            kinds[i] = "optimizer"
            if var is not None:
                var.kind = "optimizer"
    cols.extras, cols.aliases, cols.kinds = extras, aliases, kinds


def _add_object_graph(storage: Storage, variables: list[VarInfo]) -> None:
    """Readable names (``attrs["full_name"]``) and slot facts from the object graph."""
    graph = next((v for v in variables if v.name == OBJECT_GRAPH_KEY and not v.error), None)
    names = _graph_names(storage, graph)
    if not names:
        return
    for var in variables:
        found = names.get(var.name)
        if found:
            var.attrs.update(found)
            if "slot_name" in found:
                var.kind = "optimizer"


def _graph_names(storage: Storage, graph: VarInfo | None) -> dict[str, dict] | None:
    """The object graph's facts by bundle key (a decode error goes in the graph's attrs)."""
    if graph is None or not isinstance(graph.locator, _Strings):
        return None
    if graph.locator.span.length > OBJECT_GRAPH_LIMIT:
        return None
    global _LAST_GRAPH
    try:
        data = bytes(read_strings(storage, graph.locator.span, ()).item())
        last = _LAST_GRAPH
        if data == last[0]:
            names = last[1]
        else:
            names = object_graph_names(data)
            if len(data) <= GRAPH_MEMO_LIMIT:
                _LAST_GRAPH = (data, names)
    except (pb.DecodeError, FormatError) as e:
        graph.attrs["error"] = str(e)
        return None
    return names
