"""Orbax (JAX) pytree items: a directory of JSON metadata plus zarr arrays, OCDBT or plain.

The layout hands the codec an item *directory* (``<step>/<item>``). Listing reads the JSON
``_METADATA`` (tree paths) and each array's zarr metadata: plain ``<param>/.zarray`` files, or,
for OCDBT, the manifest and B+tree nodes, decoded here with ``zstandard``
(tensorstore's ``kvstore/ocdbt/index.rst``); no tensor chunk is read. Values: plain zarr v2
through numpy + zstandard, OCDBT through tensorstore (the ``orbax`` extra).
"""

from __future__ import annotations

import ast
import io
import json
import posixpath
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import _ML_NAMES, dtype_name, itemsize, np_dtype
from ..io import Blob, Storage
from ..model import HintsLike, OrbaxHints, VarInfo
from .base import Codec, CodecTier

MAX_JSON_BYTES = 256 << 20
MAX_NODE_BYTES = 64 << 20
MAX_NODES = 100_000
MANIFEST_MAGIC, BTREE_MAGIC = 0x0CDB3A2A, 0x0CDB20DE
ARRAY_TYPES = ("jax.array", "np.ndarray", "scalar")
EMPTY_TYPES = ("none", "dict", "list", "tuple", "namedtuple", "placeholder")


def read_small(storage: Storage, path: str, size: int | None = None) -> bytes:
    """A whole small file (JSON, marker); refuses files above ``MAX_JSON_BYTES``."""
    blob = Blob(storage, path, size)
    if blob.size > MAX_JSON_BYTES:
        raise ValueError(f"{blob.name}: {blob.size} bytes is too large for a metadata file")
    return blob.read(0, blob.size)


def read_json(storage: Storage, path: str, size: int | None = None) -> Any:
    return json.loads(read_small(storage, path, size).decode("utf-8"))


# -- OCDBT (pure Python, metadata only) ------------------------------------------------------
class _Reader:
    """Cursor over bytes with varint decoding; every read is bounds-checked."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ValueError(f"OCDBT: record ends early (need {n} bytes at {self.pos})")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def u8(self) -> int:
        return self.take(1)[0]

    def varint(self) -> int:
        value = shift = 0
        while True:
            byte = self.u8()
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
            shift += 7
            if shift > 63:
                raise ValueError("OCDBT: varint too long")

    def count(self, per_item: int = 1) -> int:
        n = self.varint()
        if n * per_item > len(self.data) - self.pos:
            raise ValueError(f"OCDBT: count {n} exceeds the record")
        return n

    def varints(self, n: int) -> list[int]:
        return [self.varint() for _ in range(n)]


def _decode_envelope(data: bytes, magic: int) -> _Reader:
    """Check magic/length, strip the crc footer, decompress the body."""
    if len(data) < 17 or struct.unpack(">I", data[:4])[0] != magic:
        raise ValueError(f"OCDBT: bad magic (want {magic:#x})")
    length = struct.unpack("<Q", data[4:12])[0]
    if length != len(data):
        raise ValueError(f"OCDBT: length field {length} != {len(data)} bytes")
    head = _Reader(data[:-4])
    head.pos = 12
    version, compression = head.varint(), head.varint()
    if version != 0:
        raise ValueError(f"OCDBT: unsupported version {version}")
    body = data[head.pos : -4]
    if compression == 1:
        import zstandard

        reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(body))
        body = reader.read(MAX_NODE_BYTES + 1)
        if len(body) > MAX_NODE_BYTES:
            raise ValueError("OCDBT: node decompresses beyond the size limit")
    elif compression != 0:
        raise ValueError(f"OCDBT: unknown compression {compression}")
    return _Reader(body)


def _file_table(r: _Reader, transitive: str) -> list[tuple[str, str]]:
    """(full path, base path for children) per data file, relative to the database root."""
    n = r.count()
    prefix_len = r.varints(max(0, n - 1))
    suffix_len = r.varints(n)
    base_len = r.varints(n)
    out, prev = [], b""
    for i in range(n):
        keep = prefix_len[i - 1] if i else 0
        path = prev[:keep] + r.take(suffix_len[i])
        prev = path
        full = transitive + path.decode("utf-8")
        out.append((full, transitive + path[: base_len[i]].decode("utf-8")))
    return out


@dataclass
class _Ref:
    file: str  # relative to the database root
    base: str  # transitive path for nodes reached through it
    offset: int
    length: int


class OcdbtIndex:
    """Keys of an OCDBT database (one directory) and their small values, from its B+tree."""

    def __init__(self, storage: Storage, root: str, sizes: dict[str, int] | None = None):
        self.storage, self.root, self.sizes = storage, root.rstrip("/"), sizes or {}
        self._nodes = 0

    def _read(self, rel: str, offset: int, length: int) -> bytes:
        blob = Blob(self.storage, f"{self.root}/{rel}", self.sizes.get(rel))
        return blob.read(offset, length)

    def root_ref(self) -> tuple[_Ref | None, int]:
        """The latest version's root node (None for an empty tree) and its height."""
        size = self.sizes.get("manifest.ocdbt")
        r = _decode_envelope(
            read_small(self.storage, f"{self.root}/manifest.ocdbt", size), MANIFEST_MAGIC
        )
        r.take(16)  # uuid
        if r.varint() != 0:
            raise ValueError("OCDBT: numbered manifests are not supported; use tensorstore")
        r.varint(), r.varint()  # max inline value bytes, max decoded node bytes
        r.u8()  # version tree arity log2
        if r.varint() == 1:
            r.take(4)  # zstd level
        files = _file_table(r, "")
        n = r.count(4)
        gens = r.varints(n)
        heights = [r.u8() for _ in range(n)]
        ids, offsets, lengths = r.varints(n), r.varints(n), r.varints(n)
        if not n or not gens:
            return None, 0
        fid = ids[-1]
        if fid >= len(files):
            raise ValueError("OCDBT: root refers to a missing data file")
        if lengths[-1] == 0:
            return None, 0
        return _Ref(files[fid][0], files[fid][1], offsets[-1], lengths[-1]), heights[-1]

    def items(self) -> dict[str, bytes | _Ref]:
        """key -> inline value bytes, or a _Ref for an out-of-line value."""
        ref, height = self.root_ref()
        out: dict[str, bytes | _Ref] = {}
        if ref is not None:
            self._walk(ref, height, b"", out)
        return out

    def _walk(self, ref: _Ref, height: int, prefix: bytes, out: dict) -> None:
        self._nodes += 1
        if self._nodes > MAX_NODES:
            raise ValueError("OCDBT: too many B+tree nodes")
        r = _decode_envelope(self._read(ref.file, ref.offset, ref.length), BTREE_MAGIC)
        if r.u8() != height:
            raise ValueError("OCDBT: B+tree node height mismatch")
        files = _file_table(r, ref.base)
        n = r.count()
        keys = _keys(r, n, with_subtree=height > 0)
        if height > 0:
            ids, offsets, lengths = r.varints(n), r.varints(n), r.varints(n)
            r.varints(3 * n)  # statistics
            for (key, common), fid, off, ln in zip(keys, ids, offsets, lengths):
                full, base = files[fid]
                self._walk(_Ref(full, base, off, ln), height - 1, prefix + key[:common], out)
            return
        lengths = r.varints(n)
        kinds = r.varints(n)
        indirect = [i for i in range(n) if kinds[i] == 1]
        ids, offsets = r.varints(len(indirect)), r.varints(len(indirect))
        for j, i in enumerate(indirect):
            full, base = files[ids[j]]
            out[(prefix + keys[i][0]).decode("utf-8", "replace")] = _Ref(
                full, base, offsets[j], lengths[i]
            )
        for i in range(n):
            if kinds[i] == 0:
                out[(prefix + keys[i][0]).decode("utf-8", "replace")] = r.take(lengths[i])

    def value(self, entry: bytes | _Ref) -> bytes:
        return (
            entry
            if isinstance(entry, bytes)
            else self._read(entry.file, entry.offset, entry.length)
        )


def _keys(r: _Reader, n: int, with_subtree: bool) -> list[tuple[bytes, int]]:
    prefix_len = r.varints(max(0, n - 1))
    suffix_len = r.varints(n)
    common = r.varints(n) if with_subtree else [0] * n
    out, prev = [], b""
    for i in range(n):
        keep = prefix_len[i - 1] if i else 0
        key = prev[:keep] + r.take(suffix_len[i])
        prev = key
        out.append((key, common[i]))
    return out


# -- zarr metadata and chunks -----------------------------------------------------------------
def zarr_dtype(meta: dict) -> str:
    """The ckptview dtype name of a zarr v2 (``dtype``) or v3 (``data_type``) array."""
    dt = _np_zarr_dtype(meta.get("data_type", meta.get("dtype")))
    if dt.kind == "V" and dt.names is None and dt.name in _ML_NAMES:
        return dt.name  # bfloat16, float8_* (ml_dtypes)
    name = dtype_name(dt)
    if name == "object":
        raise ValueError(f"unsupported zarr dtype {dt}")
    return name


def _np_zarr_dtype(raw: Any) -> np.dtype:
    if not isinstance(raw, str):
        raise ValueError(f"unsupported zarr dtype {raw!r}")
    try:
        return np.dtype(raw)
    except TypeError:
        return np_dtype(raw)


def zarr_shape(meta: dict) -> tuple[int, ...]:
    shape = meta.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ValueError(f"bad zarr shape {shape!r}")
    return tuple(shape)


def read_zarr2(storage: Storage, root: str, meta: dict) -> np.ndarray:
    """A plain zarr v2 array directory, read with numpy (+ zstandard for zstd chunks)."""
    if meta.get("filters"):
        raise ValueError("zarr filters are not supported without tensorstore")
    comp = meta.get("compressor")
    if comp is not None and comp.get("id") != "zstd":
        raise ImportError(
            f"zarr compressor {comp.get('id')!r} needs tensorstore: install ckptview[orbax]"
        )
    dt = _np_zarr_dtype(meta.get("dtype"))
    shape = zarr_shape(meta)
    chunks = tuple(meta.get("chunks") or ())
    if len(chunks) != len(shape) or any(c <= 0 for c in chunks):
        raise ValueError(f"bad zarr chunks {chunks!r} for shape {shape!r}")
    order = meta.get("order", "C")
    sep = meta.get("dimension_separator", ".")
    fill = meta.get("fill_value")
    out = np.zeros(shape, dtype=dt) if fill in (None, 0) else np.full(shape, fill, dtype=dt)
    grid = [range(-(-s // c)) for s, c in zip(shape, chunks)]
    chunk_bytes = int(np.prod(chunks, dtype=np.int64)) * dt.itemsize
    for idx in np.ndindex(*[len(g) for g in grid]) if shape else [()]:
        key = sep.join(str(i) for i in idx) if idx else "0"
        path = f"{root}/{key}"
        if not storage.fs.exists(path):
            continue
        blob = Blob(storage, path)
        data = blob.read(0, blob.size)
        if comp is not None:
            import zstandard

            data = (
                zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)).read(chunk_bytes + 1)
            )
        if len(data) != chunk_bytes:
            raise ValueError(f"{key}: chunk has {len(data)} bytes, expected {chunk_bytes}")
        block = np.frombuffer(data, dtype=dt).reshape(chunks, order=order)
        sel = tuple(slice(i * c, min((i + 1) * c, s)) for i, c, s in zip(idx, chunks, shape))
        out[sel] = block[tuple(slice(0, x.stop - x.start) for x in sel)]
    return out


def _tensorstore():
    try:
        import tensorstore
    except ImportError as e:
        raise ImportError(
            "reading Orbax OCDBT arrays needs tensorstore: install ckptview[orbax]"
        ) from e
    return tensorstore


def _ts_base(storage: Storage, path: str) -> str:
    url = storage.url(path).rstrip("/")
    if "://" not in url:
        return f"file://{url}/"
    if url.split("://", 1)[0] in ("gs", "gcs", "s3"):
        return url.replace("gcs://", "gs://", 1) + "/"
    raise ValueError(f"tensorstore cannot open {url}; only local, gs:// and s3:// are supported")


# -- the codec ---------------------------------------------------------------------------------
def tree_leaves(metadata: dict) -> list[tuple[list[str], dict]]:
    """(key path, value metadata) for every leaf of an Orbax ``_METADATA`` tree."""
    tree = metadata.get("tree_metadata")
    if not isinstance(tree, dict):
        raise ValueError("_METADATA has no tree_metadata")
    out = []
    for text, leaf in tree.items():
        keys = leaf.get("key_metadata") if isinstance(leaf, dict) else None
        if isinstance(keys, list):
            path = [str(k["key"]) for k in keys]
        else:
            path = [str(k) for k in ast.literal_eval(text)]
        out.append((path, (leaf or {}).get("value_metadata") or {}))
    return out


class OrbaxCodec(Codec):
    """One Orbax pytree item directory (``_METADATA`` + zarr arrays, OCDBT or plain)."""

    name = "orbax"
    priority = CodecTier.FORMAT

    def guess_can_open(self, filename: str, head: bytes) -> bool:
        return False  # item directories are handed over by the orbax layout

    def list_variables(self, blob: Blob, hints: HintsLike) -> list[VarInfo]:
        storage, root = blob.storage, blob.path.rstrip("/")
        sizes: dict[str, int] = dict(OrbaxHints.of(hints).files or {})
        if not sizes:
            for path, inf in storage.fs.find(root, detail=True).items():
                sizes[path[len(root) + 1 :]] = int(inf.get("size") or 0)
        if "_METADATA" not in sizes:
            raise ValueError("no _METADATA: the item was not finalized")
        meta = read_json(storage, f"{root}/_METADATA", sizes["_METADATA"])
        ocdbt = bool(meta.get("use_ocdbt", "manifest.ocdbt" in sizes))
        zarr3 = bool(meta.get("use_zarr3", False))
        arrays = self._array_metas(storage, root, sizes, ocdbt, zarr3)
        out = []
        for path, value in sorted(tree_leaves(meta), key=lambda leaf: leaf[0]):
            kind = str(value.get("value_type", "")).lower()
            if kind in EMPTY_TYPES or value.get("skip_deserialize"):
                continue
            param = ".".join(path)
            name = "/".join(path)
            if kind == "string":
                out.append(VarInfo(name, "object", (), 0, locator={"param": param, "string": True}))
                continue
            loc = {"param": param, "ocdbt": ocdbt, "zarr3": zarr3}
            zmeta = arrays.get(param)
            try:
                if zmeta is None:
                    raise ValueError(f"no zarr metadata for {param}")
                if isinstance(zmeta, Exception):
                    raise zmeta
                dtype, shape = zarr_dtype(zmeta), zarr_shape(zmeta)
            except Exception as e:  # noqa: BLE001 - one bad array is one error row
                shape = tuple(value.get("write_shape") or ())
                out.append(VarInfo(name, "object", shape, 0, error=f"{type(e).__name__}: {e}"))
                continue
            loc["zarr"] = zmeta
            nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize(dtype)
            out.append(VarInfo(name, dtype, shape, nbytes, locator=loc))
        return out

    def _array_metas(self, storage, root, sizes, ocdbt, zarr3) -> dict[str, Any]:
        """param name -> zarr metadata dict (or the exception that prevented reading it)."""
        leaf = "zarr.json" if zarr3 else ".zarray"
        found: dict[str, Any] = {}
        if not ocdbt:
            for rel, size in sizes.items():
                if posixpath.basename(rel) == leaf:
                    param = posixpath.dirname(rel)
                    try:
                        found[param] = read_json(storage, f"{root}/{rel}", size)
                    except Exception as e:  # noqa: BLE001
                        found[param] = e
            return found
        if "manifest.ocdbt" not in sizes:
            raise ValueError("no manifest.ocdbt: the OCDBT database was not finalized")
        index = OcdbtIndex(storage, root, sizes)
        for key, entry in index.items().items():
            if key.endswith("/" + leaf):
                try:
                    found[key[: -len(leaf) - 1]] = json.loads(index.value(entry))
                except Exception as e:  # noqa: BLE001
                    found[key[: -len(leaf) - 1]] = e
        return found

    def read(self, blob: Blob, var: VarInfo) -> np.ndarray:
        loc = var.locator or {}
        storage, root = blob.storage, blob.path.rstrip("/")
        if loc.get("string"):
            strings = read_json(storage, f"{root}/_strings.json")
            return np.array(strings[loc["param"]], dtype=object)
        zmeta = loc.get("zarr") or {}
        if not loc.get("ocdbt") and not loc.get("zarr3"):
            comp = (zmeta.get("compressor") or {}).get("id")
            if comp in (None, "zstd"):
                arr = read_zarr2(storage, f"{root}/{loc['param']}", zmeta)
                return arr.astype(np_dtype(var.dtype), copy=False)
        ts = _tensorstore()
        base = _ts_base(storage, root)
        param = loc["param"] + "/"
        kvstore = (
            {"driver": "ocdbt", "base": base, "path": param} if loc.get("ocdbt") else base + param
        )
        spec = {"driver": "zarr3" if loc.get("zarr3") else "zarr", "kvstore": kvstore}
        arr = np.asarray(ts.open(spec, open=True, read=True).result().read().result())
        return arr.astype(np_dtype(var.dtype), copy=False)


class OrbaxJsonCodec(Codec):
    """A JSON item file (``JsonSave``: ``<item>/metadata``): one object variable, the document."""

    name = "orbax-json"
    priority = CodecTier.FORMAT

    def guess_can_open(self, filename: str, head: bytes) -> bool:
        return False  # forced by the orbax layout

    def list_variables(self, blob: Blob, hints: HintsLike) -> list[VarInfo]:
        json.loads(read_small(blob.storage, blob.path, blob.size).decode("utf-8"))
        return [VarInfo("", "object", (), blob.size, kind=OrbaxHints.of(hints).kind)]

    def read(self, blob: Blob, var: VarInfo) -> np.ndarray:
        doc = json.loads(read_small(blob.storage, blob.path, blob.size).decode("utf-8"))
        out = np.empty((), dtype=object)
        out[()] = doc
        return out
