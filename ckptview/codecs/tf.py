"""TensorFlow tensor bundles (TF2 ``tf.train.Checkpoint``, TF1 Saver V2): ``P.index`` + ``P.data-*``.

``P.index`` is a LevelDB table (read by hand in :mod:`._sstable`) mapping each key to a
BundleEntryProto; the values live raw in ``P.data-SSSSS-of-NNNNN``. Listing reads the
``.index`` only (plus the data files' sizes).
"""

from __future__ import annotations

import posixpath
import struct
from dataclasses import dataclass

import numpy as np

from .. import protobuf as pb
from ..dtypes import np_dtype
from ..io import Blob, Storage
from ..kinds import guess_kind
from ..model import HintsLike, Span, TFHints, VarInfo
from ._sstable import (  # noqa: F401 - FormatError, crc32c, TABLE_MAGIC: also public here
    TABLE_MAGIC,
    FormatError,
    TableFile,
    crc32c,
)
from .base import Codec, CodecTier

OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
OBJECT_GRAPH_LIMIT = 16 << 20

#: DataType enum -> (numpy name, TF name when it differs)
TF_DTYPES: dict[int, tuple[str, str | None]] = {
    1: ("float32", None), 2: ("float64", None), 3: ("int32", None), 4: ("uint8", None),
    5: ("int16", None), 6: ("int8", None), 7: ("object", "string"), 8: ("complex64", None),
    9: ("int64", None), 10: ("bool", None), 11: ("int8", "qint8"), 12: ("uint8", "quint8"),
    13: ("int32", "qint32"), 14: ("bfloat16", None), 15: ("int16", "qint16"),
    16: ("uint16", "quint16"), 17: ("uint16", None), 18: ("complex128", None),
    19: ("float16", None), 20: ("object", "resource"), 21: ("object", "variant"),
    22: ("uint32", None), 23: ("uint64", None), 24: ("float8_e5m2", None),
    25: ("float8_e4m3fn", None), 26: ("float8_e4m3fnuz", None), 27: ("float8_e4m3b11fnuz", None),
    28: ("float8_e5m2fnuz", None), 29: ("int4", None), 30: ("uint4", None),
    33: ("float4_e2m1fn", None),
}  # fmt: skip
DT_STRING = 7


# -- OrderedCode slice keys ("EncodeTensorNameSlice") -----------------------------------------
_LENGTH_TO_MASK = [0, 0x80, 0xC000, 0xE00000, 0xF0000000, 0xF800000000, 0xFC0000000000,
                   0xFE000000000000, 0xFF00000000000000, 0x8000000000000000, 0]  # fmt: skip


def _num_increasing(key: bytes, pos: int) -> tuple[int, int]:
    if pos >= len(key) or key[pos] > 8 or pos + 1 + key[pos] > len(key):
        raise FormatError("bad OrderedCode number")
    n = key[pos]
    return int.from_bytes(key[pos + 1 : pos + 1 + n], "big"), pos + 1 + n


def _string(key: bytes, pos: int) -> tuple[bytes, int]:
    out = bytearray()
    while pos + 1 < len(key):
        b, nxt = key[pos], key[pos + 1]
        if b == 0x00 and nxt == 0x01:
            return bytes(out), pos + 2
        if b in (0x00, 0xFF):
            if nxt != (0xFF if b == 0x00 else 0x00):
                raise FormatError("bad OrderedCode string escape")
            out.append(b)
            pos += 2
        else:
            out.append(b)
            pos += 1
    raise FormatError("unterminated OrderedCode string")


def signed_num_increasing(key: bytes, pos: int) -> tuple[int, int]:
    """Decode OrderedCode ``WriteSignedNumIncreasing`` (1..10 bytes) at ``pos``."""
    if pos >= len(key):
        raise FormatError("truncated OrderedCode signed number")
    xor = 0xFF if not key[pos] & 0x80 else 0
    first = key[pos] ^ xor
    if first != 0xFF:
        length = 7 - ((first ^ 0xFF).bit_length() - 1)
        if pos + length > len(key):
            raise FormatError("truncated OrderedCode signed number")
        x = int.from_bytes(key[pos : pos + length], "big")
        if xor:
            x |= ((1 << 64) - 1) ^ ((1 << (8 * length)) - 1)
    else:
        length = 8
        if pos + 2 > len(key):
            raise FormatError("truncated OrderedCode signed number")
        second = key[pos + 1] ^ xor
        if second >= 0x80:
            if second < 0xC0:
                length = 9
            elif second == 0xC0 and pos + 2 < len(key) and key[pos + 2] ^ xor < 0x80:
                length = 10
            else:
                raise FormatError("OrderedCode signed number too long")
        if pos + length > len(key):
            raise FormatError("truncated OrderedCode signed number")
        x = int.from_bytes(key[pos + length - 8 : pos + length], "big")
    x ^= _LENGTH_TO_MASK[length]
    return pb.signed(x & ((1 << 64) - 1)), pos + length


def decode_slice_key(key: bytes) -> tuple[str, tuple[tuple[int, int], ...]]:
    """(tensor name, ((start, length or -1 for full), …)) of a partitioned tensor's slice key."""
    zero, pos = _num_increasing(key, 0)
    if zero != 0:
        raise FormatError("slice key does not start with 0")
    name, pos = _string(key, pos)
    rank, pos = _num_increasing(key, pos)
    extents = []
    for _ in range(rank):
        start, pos = signed_num_increasing(key, pos)
        length, pos = signed_num_increasing(key, pos)
        extents.append((start, length))
    return name.decode("utf-8", "replace"), tuple(extents)


# -- protos --------------------------------------------------------------------------------
@dataclass
class BundleEntry:
    """A decoded BundleEntryProto."""

    dtype: int
    shape: tuple[int, ...]
    shard_id: int
    offset: int
    size: int
    crc32c: int | None
    slices: list[tuple[tuple[int, int], ...]]


def _shape(buf) -> tuple[int, ...]:
    fields = pb.decode(buf)
    if fields.get(3) and fields[3][-1]:
        raise FormatError("tensor of unknown rank")
    dims = []
    for dim in fields.get(2, []):
        size = pb.signed(pb.decode(dim).get(1, [0])[-1])
        if size < 0:
            raise FormatError("tensor with an unknown dimension")
        dims.append(size)
    return tuple(dims)


def _slice(buf, shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    extents = []
    for ext in pb.decode(buf).get(1, []):
        f = pb.decode(ext)
        start = pb.signed(f.get(1, [0])[-1])
        extents.append((start, pb.signed(f[2][-1]) if 2 in f else -1))
    if len(extents) != len(shape):
        raise FormatError("slice rank differs from the tensor's")
    return tuple(extents)


def decode_entry(value) -> BundleEntry:
    f = pb.decode(value)
    shape = _shape(f[2][-1]) if 2 in f else ()
    crc = f.get(6)
    return BundleEntry(
        dtype=f.get(1, [0])[-1],
        shape=shape,
        shard_id=pb.signed(f.get(3, [0])[-1]),
        offset=pb.signed(f.get(4, [0])[-1]),
        size=pb.signed(f.get(5, [0])[-1]),
        crc32c=struct.unpack("<I", crc[-1])[0] if crc else None,
        slices=[_slice(s, shape) for s in f.get(7, [])],
    )


def decode_header(value) -> tuple[int, bool]:
    """(num_shards, big_endian) from a BundleHeaderProto."""
    f = pb.decode(value)
    return pb.signed(f.get(1, [0])[-1]), f.get(2, [0])[-1] == 1


def object_graph_names(graph: bytes) -> dict[str, dict]:
    """checkpoint_key -> {full_name, slot_name?, original_key?} from a TrackableObjectGraph."""
    nodes = [pb.decode(n) for n in pb.decode(graph).get(1, [])]
    keys: dict[int, str] = {}
    out: dict[str, dict] = {}
    for i, node in enumerate(nodes):
        for attr in node.get(2, []):
            a = pb.decode(attr)
            key = pb.string(a.get(3, []))
            if key and pb.string(a.get(1, [])) == "VARIABLE_VALUE":
                keys[i] = key
            if key:
                out.setdefault(key, {"full_name": pb.string(a.get(2, []))})
    for node in nodes:
        for ref in node.get(3, []):
            r = pb.decode(ref)
            slot_key = keys.get(r.get(3, [-1])[-1])
            if slot_key in out:
                out[slot_key]["slot_name"] = pb.string(r.get(2, []))
                original = keys.get(r.get(1, [-1])[-1])
                if original:
                    out[slot_key]["original_key"] = original
    return out


# -- values ----------------------------------------------------------------------------------
@dataclass
class _Strings:
    """A DT_STRING tensor: varint lengths, a masked crc of them, then the bytes."""

    span: Span


@dataclass
class _Sliced:
    """A partitioned tensor: (extents, VarInfo of the slice) pieces."""

    pieces: list[tuple[tuple[tuple[int, int], ...], VarInfo]]


def read_strings(storage: Storage, span: Span, shape: tuple[int, ...]) -> np.ndarray:
    numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
    data = storage.read_range(span.path, span.offset, span.offset + span.length)
    if len(data) < span.length:
        raise FormatError(f"{posixpath.basename(span.path)} ends early")
    if numel > len(data):
        raise FormatError(f"{numel} strings cannot fit in {len(data)} bytes")
    pos, lengths = 0, []
    for _ in range(numel):
        n, pos = pb.read_varint(data, pos)
        lengths.append(n)
    pos += 4  # masked crc32c of the lengths
    if pos + sum(lengths) != len(data):
        raise FormatError("string lengths do not add up to the entry's size")
    out = np.empty(numel, dtype=object)
    for i, n in enumerate(lengths):
        out[i] = data[pos : pos + n]
        pos += n
    return out.reshape(shape)


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
    from .base import read_span

    return read_span(storage, var)


# -- the codec -----------------------------------------------------------------------------
def data_path(index_path: str, shard: int, num_shards: int) -> str:
    prefix = index_path[: -len(".index")] if index_path.endswith(".index") else index_path
    return f"{prefix}.data-{shard:05d}-of-{num_shards:05d}"


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
    suffixes = (".index",)
    priority = CodecTier.FORMAT

    def guess_can_open(self, filename: str, head: bytes) -> bool:
        # the first data-block entry is the header: shared=0, non_shared=0 (key "")
        return filename.lower().endswith(".index") and head[:2] == b"\x00\x00"

    def list_variables(self, blob: Blob, hints: HintsLike) -> list[VarInfo]:
        hints = TFHints.of(hints)
        table = TableFile(blob)
        num_shards, big_endian = 1, False
        entries: list[tuple[str, BundleEntry | Exception]] = []
        slices: dict[tuple[str, tuple], BundleEntry] = {}
        for key, value in table.entries():
            if key == b"":
                num_shards, big_endian = decode_header(value)
                continue
            if key[:1] == b"\x00":
                slices[decode_slice_key(key)] = decode_entry(value)
                continue
            name = key.decode("utf-8", "replace")
            try:
                entries.append((name, decode_entry(value)))
            except (pb.DecodeError, FormatError) as e:
                entries.append((name, e))
        if num_shards < 1:
            raise FormatError(f"bundle header claims {num_shards} shards")
        ctx = _Context(blob, hints, num_shards, big_endian)
        out = []
        for name, entry in entries:
            if isinstance(entry, Exception):
                out.append(VarInfo(name, "object", (), error=f"bad entry: {entry}"))
            elif entry.slices:
                out.append(ctx.sliced(name, entry, slices))
            else:
                out.append(ctx.var(name, entry))
        used = ctx.used_slices
        out += [
            ctx.var(f"{n}/.slice{list(e)}", s) for (n, e), s in slices.items() if (n, e) not in used
        ]
        if hints.object_graph:
            _add_object_graph(blob.storage, out)
        return out

    def read(self, blob: Blob, var: VarInfo) -> np.ndarray:
        return _read(blob.storage, var)

    def iter_chunks(self, blob: Blob, var: VarInfo, max_bytes: int):
        if var.locator is None:
            yield from super().iter_chunks(blob, var, max_bytes)
        else:
            yield np.asarray(self.read(blob, var)).reshape(-1)


class _Context:
    """Turns entries into VarInfos, checking each against its data file's size."""

    def __init__(self, blob: Blob, hints: TFHints, num_shards: int, big_endian: bool):
        self.blob = blob
        self.sizes: dict = dict(hints.data_sizes or {})
        self.num_shards = num_shards
        self.big_endian = big_endian
        self.used_slices: set = set()

    def data_size(self, path: str) -> int | None:
        if path not in self.sizes:
            try:
                self.sizes[path] = self.blob.storage.info(path)["size"]
            except (FileNotFoundError, OSError):
                self.sizes[path] = None
        return self.sizes[path]

    def var(self, name: str, entry: BundleEntry) -> VarInfo:
        dtype, tf_name = TF_DTYPES.get(entry.dtype, ("object", f"DT_{entry.dtype}"))
        attrs = {"tf_dtype": tf_name or dtype, "shard": entry.shard_id}
        if entry.crc32c is not None:
            attrs["crc32c"] = entry.crc32c
        var = VarInfo(name, dtype, entry.shape, nbytes=max(entry.size, 0), attrs=attrs)
        var.kind = tf_kind(name)
        var.error = self._check(var, entry)
        if var.error:
            return var
        span = Span(
            data_path(self.blob.path, entry.shard_id, self.num_shards), entry.offset, entry.size
        )
        if entry.dtype == DT_STRING:
            var.locator = _Strings(span)
        elif dtype != "object":
            if self.big_endian and np_dtype(dtype).itemsize > 1:
                span.disk_dtype = np_dtype(dtype).newbyteorder(">").str
            var.span = span
        return var

    def _check(self, var: VarInfo, entry: BundleEntry) -> str | None:
        if entry.dtype not in TF_DTYPES:
            return f"unsupported TF dtype enum {entry.dtype}"
        if not 0 <= entry.shard_id < self.num_shards:
            return f"shard {entry.shard_id} outside 0..{self.num_shards - 1}"
        if entry.offset < 0 or entry.size < 0:
            return "negative offset or size"
        path = data_path(self.blob.path, entry.shard_id, self.num_shards)
        size = self.data_size(path)
        if size is None:
            return f"data file missing: {posixpath.basename(path)}"
        if entry.offset + entry.size > size:
            return (
                f"entry claims bytes {entry.offset}..{entry.offset + entry.size} "
                f"but {posixpath.basename(path)} has {size}"
            )
        if var.dtype != "object" and entry.size != var.numel * np_dtype(var.dtype).itemsize:
            return f"entry size {entry.size} != {var.numel} x {var.dtype}"
        if entry.dtype == DT_STRING and entry.size < var.numel + 4:
            return f"entry size {entry.size} too small for {var.numel} strings"
        return None

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
            info = self.var(name, piece)
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


def _add_object_graph(storage: Storage, variables: list[VarInfo]) -> None:
    """Readable names (``attrs["full_name"]``) and slot facts from the object graph."""
    graph = next((v for v in variables if v.name == OBJECT_GRAPH_KEY and not v.error), None)
    if graph is None or not isinstance(graph.locator, _Strings):
        return
    if graph.locator.span.length > OBJECT_GRAPH_LIMIT:
        return
    try:
        names = object_graph_names(bytes(read_strings(storage, graph.locator.span, ()).item()))
    except (pb.DecodeError, FormatError) as e:
        graph.attrs["error"] = str(e)
        return
    for var in variables:
        found = names.get(var.name)
        if found:
            var.attrs.update(found)
            if "slot_name" in found:
                var.kind = "optimizer"
