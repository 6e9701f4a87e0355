"""The entry budget of a torch DCP ``.metadata`` (docs/budgets.md).

A DCP ``.metadata`` pickle holds, per stored chunk, three small objects (its
``ChunkStorageMetadata``, the ``MetadataIndex`` key and the ``_StorageInfo`` value of
``storage_data``), and the restricted unpickler builds each at a few microseconds; a 70 MB
file naming 200,000 chunks took 16 s and 700 MB before anything was listed. Two checks keep a
hostile file to an error row within the parsers' budget (under 2 s and 256 MiB):

- :func:`check_metadata_bytes`, before unpickling: every class instance a protocol-2+ pickle
  builds is one ``NEWOBJ``/``NEWOBJ_EX`` opcode, so the count of those opcode bytes in the file
  (a C-speed scan; a byte of data that happens to equal them only raises the count) bounds the
  objects from above: more than :data:`OBJECTS_PER_CHUNK` x :data:`MAX_CHUNKS` (with a little
  slack for such bytes) is refused without unpickling;
- :func:`check_entries`, after unpickling, with the exact counts (chunks of every tensor,
  entries of ``storage_data``).

:data:`MAX_CHUNKS` (100,000) is a trade-off: at this VM's speed a file at the limit still
takes seconds to unpickle; a save with more chunks in one ``.metadata`` (a very large model
over many ranks with optimizer state) is an error row that names the budget.
"""

from __future__ import annotations

from typing import Any

from .pickle.machine import BudgetError

#: the most chunks (and the most ``storage_data`` entries) one ``.metadata`` may name
MAX_CHUNKS = 100_000
#: class instances the metadata builds per chunk (chunk, index key, storage info)
OBJECTS_PER_CHUNK = 3
#: bytes counted per read when scanning the file
SCAN_BYTES = 16 << 20
_NEWOBJ, _NEWOBJ_EX = b"\x81", b"\x92"


def object_bound(data: bytes) -> int:
    """An upper bound of the class instances a pickle can build (its NEWOBJ opcodes)."""
    return data.count(_NEWOBJ) + data.count(_NEWOBJ_EX)


def max_objects(max_chunks: int = MAX_CHUNKS) -> int:
    """The object bound :func:`check_metadata_bytes` allows: the chunks' objects plus 1/8
    for data bytes that equal an opcode, plus room for the tensors' own entries."""
    base = OBJECTS_PER_CHUNK * max_chunks
    return base + base // 8 + 4096


def check_metadata_bytes(name: str, read: Any, size: int, max_chunks: int = MAX_CHUNKS) -> None:
    """BudgetError when the ``size`` bytes of a ``.metadata`` (``read(offset, length)``, e.g.
    ``blob.read``) could build more objects than :data:`MAX_CHUNKS` chunks need. Reads the
    file once, :data:`SCAN_BYTES` at a time; a file too small to exceed is not read."""
    limit = max_objects(max_chunks)
    if size <= limit:
        return
    found = 0
    for at in range(0, size, SCAN_BYTES):
        found += object_bound(read(at, min(SCAN_BYTES, size - at)))
        if found > limit:
            raise BudgetError(f"{name}: DCP metadata builds more than {limit:,} objects (over "
                              f"the {max_chunks:,}-chunk budget)")  # fmt: skip


def count_chunks(state_dict_metadata: Any) -> int:
    """Chunks named by the unpickled ``state_dict_metadata`` (Records with ``chunks``)."""
    if not isinstance(state_dict_metadata, dict):
        return 0
    n = 0
    for entry in state_dict_metadata.values():
        fields = entry.fields() if hasattr(entry, "fields") else {}
        chunks = fields.get("chunks") if isinstance(fields, dict) else None
        if isinstance(chunks, (list, tuple)):
            n += len(chunks)
    return n


def check_entries(name: str, fields: dict, max_chunks: int = MAX_CHUNKS) -> None:
    """BudgetError when an unpickled Metadata's ``fields()`` name more than ``max_chunks``
    chunks or ``storage_data`` entries (before any per-entry work)."""
    storage = fields.get("storage_data")
    n_storage = len(storage) if isinstance(storage, dict) else 0
    n_chunks = count_chunks(fields.get("state_dict_metadata"))
    n = max(n_storage, n_chunks)
    if n > max_chunks:
        what = "chunks" if n_chunks >= n_storage else "storage entries"
        raise BudgetError(f"{name}: DCP metadata names {n:,} {what}, over the "
                          f"{max_chunks:,}-chunk budget")  # fmt: skip
