"""Generators of the extreme headers of issue 25 item 5 (GGUF dims and entry counts, a DCP
``.metadata`` with very many chunks), shared by tests/test_gguf_extremes.py, tests/test_fuzz.py
and benchmarks/bench_hostile.py. Each returns the bytes of one file."""

from __future__ import annotations

import struct

import numpy as np
from test_deepspeed import Glob, Obj, _Emitter, torch_zip

DCP = "torch.distributed.checkpoint.metadata"
FS = "torch.distributed.checkpoint.filesystem"


def gguf_string(s: str) -> bytes:
    raw = s.encode()
    return struct.pack("<Q", len(raw)) + raw


def gguf(infos: list[tuple[str, tuple[int, ...], int, int]], data: bytes = b"",
         n_tensors: int | None = None) -> bytes:  # fmt: skip
    """A GGUF v3 file: ``(name, ggml dims, ggml type, offset)`` tensor infos, then the data
    section (aligned to 32)."""
    kv = gguf_string("general.alignment") + struct.pack("<II", 4, 32)
    out = [b"GGUF", struct.pack("<IQQ", 3, len(infos) if n_tensors is None else n_tensors, 1), kv]
    for name, dims, ggml_type, offset in infos:
        out.append(gguf_string(name) + struct.pack(f"<I{len(dims)}Q", len(dims), *dims)
                   + struct.pack("<IQ", ggml_type, offset))  # fmt: skip
    head = b"".join(out)
    return head + b"\0" * (-len(head) % 32) + data


def gguf_huge_dims(n_dims: int = 8) -> bytes:
    """One F32 tensor of ``n_dims`` dims of 2**64 - 1 beside a valid one."""
    ok = np.arange(4, dtype="<f4").tobytes()
    return gguf([("ok", (4,), 0, 0), ("huge", (2**64 - 1,) * n_dims, 0, 32)], ok + bytes(28))


def gguf_zero_and_huge_dims() -> bytes:
    """A tensor with a zero dim beside dims of 2**64 - 1 (0 values, dims no file can hold)."""
    return gguf([("z", (0, 2**64 - 1, 2**63), 0, 0)], bytes(32))


def gguf_many_tensors(n: int = 1_500_000) -> bytes:
    """``n`` one-value F32 tensors (the header alone is ~40 bytes per tensor)."""
    kv = gguf_string("general.alignment") + struct.pack("<II", 4, 32)
    tail = struct.pack("<IQ", 1, 1)
    parts = [b"GGUF", struct.pack("<IQQ", 3, n, 1), kv]
    parts += [gguf_string(f"t{i:09d}") + tail + struct.pack("<IQ", 0, 4 * i) for i in range(n)]
    head = b"".join(parts)
    return head + b"\0" * (-len(head) % 32) + bytes(4 * n)


def dcp_many_chunks(n: int = 200_000) -> tuple[bytes, bytes]:
    """(``.metadata``, ``__0_0.distcp``): one float32 tensor of ``n`` rows stored as ``n``
    one-row chunks, every chunk's storage entry naming the same small item."""
    item = torch_zip(np.zeros((1, 4), np.float32))
    props = Obj(DCP, "TensorProperties", (Glob("torch", "float32"), "torch.strided", False, 0,
                                          False))  # fmt: skip
    chunks = [Obj(DCP, "ChunkStorageMetadata", {"offsets": (r, 0), "sizes": (1, 4)})
              for r in range(n)]  # fmt: skip
    entries = {"w": Obj(DCP, "TensorStorageMetadata",
                        {"properties": props, "size": (n, 4), "chunks": chunks})}  # fmt: skip
    storage = {}
    where = Obj(FS, "_StorageInfo", {"relative_path": "__0_0.distcp", "offset": 0,
                                     "length": len(item)})  # fmt: skip
    for r in range(n):
        storage[Obj(DCP, "MetadataIndex", {"fqn": "w", "offset": (r, 0), "index": 0})] = where
    state = {"state_dict_metadata": entries, "planner_data": {"w": ("w",)},
             "storage_data": storage, "storage_meta": None, "version": "1.0.0"}  # fmt: skip
    return _Emitter().dump(Obj(DCP, "Metadata", state)), item
