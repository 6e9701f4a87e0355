"""Orbax (JAX) pytree items: a directory of JSON metadata plus zarr arrays, OCDBT or plain.

The layout hands the codec an item *directory* (``<step>/<item>``). Listing reads the JSON
``_METADATA`` (tree paths) and each array's zarr metadata: plain ``<param>/.zarray`` files, or,
for OCDBT, the manifest and B+tree nodes (:mod:`ckptview.formats.ocdbt`,
tensorstore's ``kvstore/ocdbt/index.rst``); no tensor chunk is read. Values: plain zarr v2
through numpy + zstandard, OCDBT through tensorstore (the ``orbax`` extra).
"""

from __future__ import annotations

import ast
import posixpath
from typing import Any

import numpy as np

from ..dtypes import itemsize, np_dtype
from ..formats.ocdbt import OcdbtIndex
from ..formats.small import loads_json, read_json, read_small
from ..formats.zarr import read_zarr2, zarr_dtype, zarr_shape
from ..io import Blob, Storage
from ..model import HintsLike, OrbaxHints, VarInfo
from .base import Codec, CodecTier

ARRAY_TYPES = ("jax.array", "np.ndarray", "scalar")
EMPTY_TYPES = ("none", "dict", "list", "tuple", "namedtuple", "placeholder")


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
                    found[key[: -len(leaf) - 1]] = loads_json(index.value(entry))
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
        loads_json(read_small(blob.storage, blob.path, blob.size).decode("utf-8"))
        return [VarInfo("", "object", (), blob.size, kind=OrbaxHints.of(hints).kind)]

    def read(self, blob: Blob, var: VarInfo) -> np.ndarray:
        doc = loads_json(read_small(blob.storage, blob.path, blob.size).decode("utf-8"))
        out = np.empty((), dtype=object)
        out[()] = doc
        return out
