"""Paddle binary tensor streams (specs/paddle.md §1-§3): per-variable DenseTensor/LoDTensor
files, SelectedRows files, and ``save_combine`` files (streams back to back, named through the
program desc). Also the 2018 trainer's ``epoch_id``/``step_id`` text files."""

from __future__ import annotations

import posixpath
import struct

import numpy as np

from ..formats import protobuf as pb
from ..formats.cursor import Window
from ..formats.paddle_desc import program_param_names
from ..formats.paddle_stream import (
    MAX_DESC_LEN,
    SR_WINDOW,
    FormatError,
    Stream,
    desc_dims,
    parse_dense,
    parse_selected_rows,
    plain_dense,
    selected_rows_beyond,
    stream_bytes_plausible,
)
from ..io import Blob, TruncatedError
from ..kinds import paddle_kind
from ..model import HintsLike, PaddleHints, VarInfo
from .base import Codec, CodecTier, PartialRead


class PaddleStreamCodec(Codec):
    """Paddle DenseTensor/LoDTensor and SelectedRows streams, single or ``save_combine``d.

    Hints: ``program`` (path of a ``__model__``/``*.pdmodel`` ProgramDesc or PIR ``*.json``
    naming combined streams), ``names`` (explicit names), ``stream`` (``"selected_rows"`` or
    ``"dense"`` to prefer one interpretation of a one-stream file).
    """

    name = "paddle"
    suffixes = (".pdiparams",)
    priority = CodecTier.FORMAT

    def guess_can_open(self, filename: str, head: bytes) -> bool:
        if filename == "__params__" or filename.lower().endswith(self.suffixes):
            return True
        return stream_bytes_plausible(head, len(head) < 4096)

    def guess_can_open_blob(self, filename: str, head: bytes, blob: Blob) -> bool:
        """A loose SelectedRows file whose row index fills the first block: one small read at
        its height (``12 + 8N``) checks the tensor header and that the stream ends the file."""
        at = selected_rows_beyond(head)
        if at is None or at + 16 > blob.size:
            return False
        try:
            tail = blob.read(at, min(SR_WINDOW, blob.size - at))
            found = desc_dims(tail, 8)
            if found is None:  # a TensorDesc longer than the window
                tail = blob.read(at, min(16 + MAX_DESC_LEN, blob.size - at))
                found = desc_dims(tail, 8)
        except (FormatError, pb.DecodeError, struct.error, TruncatedError):
            return False
        if found is None:
            return False
        end, dims = found
        count = (at - 12) // 8
        height = struct.unpack_from("<q", tail)[0]
        return at + end == blob.size and height >= 0 and bool(dims) and dims[0] == count

    def list_variables(self, blob: Blob, hints: HintsLike) -> list[VarInfo]:
        hints = PaddleHints.of(hints)
        if blob.size == 0:
            raise FormatError("empty file (0 bytes)")
        if not (hints.program or hints.names or hints.stream == "selected_rows"):
            var = plain_dense(blob, blob.head())
            if var is not None:  # one plain stream, the whole file: what the parsers give
                return [var]
        r = Window(blob)
        first = self._first_stream(r, hints.stream)
        streams = [first]
        error = None
        while streams[-1].end < r.size:
            try:
                streams.append(parse_dense(r, streams[-1].end))
            except (FormatError, TruncatedError, pb.DecodeError) as e:
                error = f"stream {len(streams)} at byte {streams[-1].end}: {e}"
                break
        variables = [s.var for s in streams]
        if len(variables) > 1 or hints.program or hints.names:
            self._name_combined(blob, variables, hints, error is not None)
        if error:
            raise PartialRead(variables, f"save_combine file cut or corrupt: {error}")
        return variables

    @staticmethod
    def _first_stream(r: Window, prefer: str | None) -> Stream:
        parsers = [parse_dense, parse_selected_rows]
        if prefer == "selected_rows":
            parsers.reverse()
        found, errors = [], []
        for parse in parsers:
            try:
                found.append(parse(r, 0))
            except (FormatError, TruncatedError, pb.DecodeError) as e:
                errors.append(e)
                continue
            if found[-1].end == r.size:
                return found[-1]
        dense = [s for s in found if not s.var.attrs.get("selected_rows")]
        if dense:  # more bytes follow: save_combine
            return dense[0]
        if isinstance(errors[0], TruncatedError):
            raise errors[0]
        raise FormatError(f"not a Paddle tensor stream: {errors[0]}")

    def _name_combined(self, blob: Blob, variables: list[VarInfo], hints: PaddleHints, cut: bool):
        names, source = hints.names, "hint"
        program = hints.program
        if not names and program:
            try:
                names = program_param_names(blob, program, len(variables), cut)
                source = f"program {posixpath.basename(program)}"
            except Exception as e:  # noqa: BLE001 - naming never fails the listing
                names, source = None, f"program {posixpath.basename(program)} unreadable: {e}"
        if len(variables) == 1 and not cut and blob.name in (names or []):
            return  # a per-variable file in a directory with a program: keep the file name
        fits = names is not None and (
            len(names) == len(variables) or (cut and len(names) > len(variables))
        )
        for i, var in enumerate(variables):
            var.attrs["index"] = i
            if fits:
                var.name = names[i]
                var.kind = paddle_kind(var.name)
                var.attrs["name_source"] = source
            else:
                var.name = str(i)
                var.attrs["name_source"] = (
                    "position in save_combine order (sorted names); "
                    + (f"{source} names {len(names)} variables, file has {len(variables)}"
                       if names is not None else source if program else "no program desc found")
                )  # fmt: skip


class PaddleTextIntCodec(Codec):
    """The 2018 trainer's ``epoch_id``/``step_id`` files: ``str(int)`` ASCII, one int64 0-d.

    Never guessed; layouts assign it by name.
    """

    name = "paddle-text-int"
    priority = CodecTier.ASSIGNED

    def guess_can_open(self, filename: str, head: bytes) -> bool:
        return False

    def list_variables(self, blob: Blob, hints: dict) -> list[VarInfo]:
        if blob.size > 64:
            raise FormatError(f"{blob.size} bytes is too long for an integer text file")
        text = blob.read(0, blob.size).decode("ascii", "replace").strip()
        try:
            value = int(text)
        except ValueError:
            raise FormatError(f"not an integer: {text[:40]!r}") from None
        return [VarInfo("", "int64", (), nbytes=blob.size, kind="trainer", locator=value)]

    def read(self, blob: Blob, var: VarInfo) -> np.ndarray:
        return np.array(var.locator, dtype=np.int64)

    def spans(self, blob: Blob, var: VarInfo) -> list[tuple[str, int, int]]:
        return []  # the value was parsed with the header


def read_text_int(text: str) -> int | None:
    """``int(f.read().strip())`` as the trainer does; None when it is not an integer."""
    try:
        return int(text.strip())
    except ValueError:
        return None
