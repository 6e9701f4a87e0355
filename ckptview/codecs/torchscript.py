"""TorchScript archives (``torch.jit.save`` of a scripted or traced module), opened by
:func:`ckptview.formats.torchscript.open_torchscript`: the module's parameters and buffers
named as its ``state_dict`` would (``fc1.weight``), then its tensor constants
(``CONSTANTS.c0``), values read from the ``data/`` and ``constants/`` storages. The
``__torch__.*`` classes of the archive stand in as inert records; any other global outside the
allowlist (``os.system``) fails the file with an error naming it.

Claimed before the torch codec (a ``.pt`` TorchScript archive is a torch-like zip): from the
first bytes when the first member is a storage (``<prefix>/data/0``) or a TorchScript-only
member shows in them, else by a second look at the zip directory (``code/``,
``constants.pkl``) for zips no codec claimed.
"""

from __future__ import annotations

import re

import numpy as np

from ..io import Blob
from ..model import VarInfo
from .base import Codec, CodecTier

ZIP_MAGIC = b"PK\x03\x04"
#: a zip local header naming a TorchScript-only member
_LOCAL_NAME = re.compile(rb"PK\x03\x04.{22}(?P<n>..)..(?P<name>[^/\x00]{1,200}/"
                         rb"(?:code/|constants\.pkl|constants/))", re.S)  # fmt: skip
#: the first member ``<prefix>/data/<n>``: torch.jit.save writes the storages before
#: data.pkl, torch.save writes data.pkl first
_FIRST_STORAGE = re.compile(rb"PK\x03\x04.{22}(?P<n>..)..(?P<name>[^/\x00]{1,200}/data/\d)",
                            re.S)  # fmt: skip


def head_says_torchscript(head: bytes) -> bool:
    """From the first bytes alone: a zip whose first local header names ``<prefix>/data/<n>``
    or that shows a TorchScript-only member (``code/``, ``constants.pkl``) in its head."""
    if not head.startswith(ZIP_MAGIC):
        return False
    first = _FIRST_STORAGE.match(head)
    if first and int.from_bytes(first["n"], "little") >= len(first["name"]):
        return True
    return any(int.from_bytes(m["n"], "little") >= len(m["name"])
               for m in _LOCAL_NAME.finditer(head))  # fmt: skip


class TorchScriptCodec(Codec):
    """``torch.jit.save`` archives: ``data.pkl`` + ``constants.pkl`` + ``code/`` + storages."""

    name = "torchscript"
    #: before the torch codec (SIGNATURE), which takes any ``.pt`` zip
    priority = CodecTier.SIGNATURE - 1

    def guess_can_open(self, filename: str, head: bytes) -> bool:
        return head_says_torchscript(head)

    def guess_can_open_blob(self, filename: str, head: bytes, blob: Blob) -> bool:
        if not head.startswith(ZIP_MAGIC):
            return False
        from ..formats.torchscript import archive_prefix  # the pickle VM: only for zips
        from ..formats.zipdir import read_directory

        try:
            return archive_prefix(read_directory(blob)) is not None
        except (ValueError, OSError):
            return False

    def list_variables(self, blob: Blob, hints: dict) -> list[VarInfo]:
        from ..formats.pickle_vars import leaf_var
        from ..formats.torchscript import open_torchscript, script_tensors

        archive = open_torchscript(blob)
        out = []
        for name, tensor, owner in script_tensors(archive):
            var = leaf_var(name, tensor, blob, archive.records, archive.big_endian)
            if var is None:
                continue
            if owner is not None:
                var.attrs["module_class"] = owner
            if name.startswith("CONSTANTS."):
                var.attrs["constant"] = True
            out.append(var)
        return out

    def read(self, blob: Blob, var: VarInfo) -> np.ndarray:
        if var.span is not None:
            return super().read(blob, var)
        from ..formats.pickle_vars import read_locator

        return read_locator(blob, var)
