"""``paddle.save`` pickles: ``.pdparams``, ``.pdopt``, ``.pdckpt`` and other array pickles,
read through the restricted unpickler with array payloads left on disk
(:mod:`ckptview.formats.paddle_pickle`: the forms handled, the bfloat16 rule).
"""

from __future__ import annotations

import numpy as np

from ..formats.paddle_pickle import (
    PADDLE_SUFFIXES,
    PICKLE_SUFFIXES,
    load_program_dtypes,
    looks_like_pickle,
    paddle_variables,
    read_paddle,
)
from ..formats.pickle import Unpickler
from ..io import Blob
from ..model import HintsLike, VarInfo
from .base import Codec, CodecTier


class PaddlePickleCodec(Codec):
    """``paddle.save`` pickles: ``.pdparams``, ``.pdopt``, ``.pdckpt`` and other array pickles."""

    name = "paddle-pickle"
    save_suffixes = (".pdparams", ".pdopt", ".pkl")
    priority = CodecTier.CONTAINER

    def guess_can_open(self, filename: str, head: bytes) -> bool:
        name = filename.lower()
        if name.endswith(PADDLE_SUFFIXES + PICKLE_SUFFIXES):
            return looks_like_pickle(head)
        return False

    def list_variables(self, blob: Blob, hints: HintsLike) -> list[VarInfo]:
        if blob.size == 0:
            raise ValueError("empty file")
        obj = Unpickler(blob, encoding="latin1").load()
        return paddle_variables(obj, blob, load_program_dtypes(blob, hints))

    def read(self, blob: Blob, var: VarInfo) -> np.ndarray:
        if var.span is not None:
            return super().read(blob, var)
        return read_paddle(blob, var)
