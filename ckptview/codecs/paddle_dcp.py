"""Paddle distributed checkpoints: a ``{rank}_{id}.distcp`` shard file is a ``paddle.save``
flat pickle of the rank's local shards; its ``{id}.metadata``
(:mod:`ckptview.formats.paddle_dcp_meta`) gives dtypes (bfloat16 known, not guessed), global
shapes and each shard's global offset. See specs/paddle.md §5.4.
"""

from __future__ import annotations

import posixpath

import numpy as np

from ..formats.paddle_dcp_meta import DISTCP, metadata_hints, read_metadata
from ..formats.paddle_pickle import looks_like_pickle, paddle_variables, read_paddle
from ..formats.pickle import Unpickler
from ..io import Blob
from ..model import HintsLike, PaddleDcpHints, Piece, VarInfo
from .base import Codec, CodecTier


class PaddleDcpCodec(Codec):
    """A ``{rank}_{id}.distcp`` shard file (a ``paddle.save`` pickle)."""

    name = "paddle-dcp"
    priority = CodecTier.CONTAINER

    def guess_can_open(self, filename: str, head: bytes) -> bool:
        return bool(DISTCP.match(posixpath.basename(filename))) and looks_like_pickle(head)

    def list_variables(self, blob: Blob, hints: HintsLike) -> list[VarInfo]:
        hints = PaddleDcpHints.of(hints)
        if hints.dtypes is None:
            hints = self._hints_from_sibling(blob)
        obj = Unpickler(blob, encoding="latin1").load()
        variables = paddle_variables(obj, blob, dict(hints.dtypes or {}))
        shapes = hints.global_shapes or {}
        offsets = hints.offsets or {}
        for var in variables:
            if var.name in shapes:
                var.attrs["global_shape"] = tuple(shapes[var.name])
            if var.name in offsets:
                var.attrs["global_offset"] = tuple(offsets[var.name])
            full, at = var.attrs.get("global_shape"), var.attrs.get("global_offset")
            if full and at is not None and tuple(full) != tuple(var.shape):
                var.attrs["piece"] = Piece(tuple(full), tuple(at), placement="paddle dist shard")
        return variables

    def _hints_from_sibling(self, blob: Blob) -> PaddleDcpHints:
        m = DISTCP.match(blob.name)
        if not m:
            return PaddleDcpHints()
        path = posixpath.join(posixpath.dirname(blob.path), f"{m.group(2)}.metadata")
        try:
            meta = read_metadata(blob.storage.blob(path))
        except (FileNotFoundError, OSError, ValueError):
            return PaddleDcpHints()
        return metadata_hints(meta, blob.name)

    def read(self, blob: Blob, var: VarInfo) -> np.ndarray:
        if var.span is not None:
            return super().read(blob, var)
        return read_paddle(blob, var)
