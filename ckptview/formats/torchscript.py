"""TorchScript archives (``torch.jit.save``): a zip of ``<prefix>/data.pkl`` (the scripted
module), ``constants.pkl`` (the tensor constants its code names ``CONSTANTS.c<i>``),
``code/…`` (TorchScript source), ``data/<key>`` and ``constants/<key>`` (tensor storages),
``version``, ``byteorder`` and ``.data/…``.

The two pickles run through the restricted VM with torch's storage persistent ids; the
``__torch__.*`` classes they name (the scripted modules) stand in as inert
:class:`~ckptview.formats.pickle.Record` objects -- only here, not for ``torch.save`` files --
and ``torch.jit._pickle``'s list helpers as the lists they tag (:class:`ScriptUnpickler`).
Nothing is imported or called.

Requests per archive: the tail and central directory, the small records (``data.pkl``,
``constants.pkl``, ``byteorder``) headers and payloads in one read, and the storages' local
headers in one batch; no tensor bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..io import Blob
from .pickle import Record, RestrictedUnpicklingError, StorageRef, TensorRef, Unpickler
from .torch_pickle import PICKLE_PREFETCH, ZipRecord, payload_offsets, torch_persistent_load
from .zipdir import Directory, read_directory, read_members

#: members only a TorchScript archive has (below its ``<prefix>/``)
MARKERS = ("constants.pkl", "code/", "constants/", "bytecode.pkl")
MAX_MODULE_DEPTH = 256
#: globals of ``torch.jit._pickle`` that tag or build a typed list: the list itself
JIT_LISTS = ("build_intlist", "build_tensorlist", "build_doublelist", "build_boollist")


def _restore_type_tag(value: Any, type_str: Any = None) -> Any:
    """``torch.jit._pickle.restore_type_tag(obj, 'Dict[str, Tensor]')``: the object."""
    if not isinstance(value, (dict, list, tuple)):
        raise RestrictedUnpicklingError(f"restore_type_tag of a {type(value).__name__}")
    return value


def _typed_list(value: Any) -> list:
    if not isinstance(value, (list, tuple)):
        raise RestrictedUnpicklingError(f"torch.jit list helper of a {type(value).__name__}")
    return list(value)


#: the ``allow`` policy of this format's pickles: every scripted class is an inert Record
ALLOW = ("__torch__.",)
#: ``torch.jit._pickle``'s helpers (the allowlist refuses ``torch.jit.*`` as code): each
#: stands in as the container it tags, nothing of torch's is called
JIT_HELPERS: dict[tuple[str, str], Any] = {
    ("torch.jit._pickle", "restore_type_tag"): _restore_type_tag,
    **{("torch.jit._pickle", name): _typed_list for name in JIT_LISTS},
}


class ScriptUnpickler(Unpickler):
    """The restricted VM with ``torch.jit._pickle``'s list and type-tag helpers admitted
    (TorchScript's pickler writes them for typed attributes: ``List[int]``,
    ``Dict[str, Tensor]``); every other global resolves as the VM's allowlist says."""

    __slots__ = ()

    def find_class(self, module: str, name: str) -> Any:
        helper = JIT_HELPERS.get((module, name))
        return helper if helper is not None else super().find_class(module, name)


def archive_prefix(entries: Directory) -> str | None:
    """The archive's ``<prefix>`` when its directory lists TorchScript members, else None."""
    if not entries:
        return None
    prefix = next(iter(entries)).split("/", 1)[0]
    root = f"{prefix}/"
    has_pickle = f"{root}data.pkl" in entries
    for name in entries:
        if name.startswith(root) and name[len(root) :].startswith(MARKERS):
            return prefix if has_pickle else None
    return None


@dataclass
class ScriptArchive:
    """What a TorchScript archive holds: the module and constants as unpickled (tensors as
    unread references) and each storage's bytes (``data/<key>``, ``constants/<key>``)."""

    module: Any
    constants: Any
    records: dict[str, ZipRecord]
    big_endian: bool
    prefix: str


def _persistent(folder: str):
    def load(pid: Any) -> StorageRef:
        ref = torch_persistent_load(pid)
        ref.key = f"{folder}/{ref.key}"
        return ref

    return load


def open_torchscript(blob: Blob) -> ScriptArchive:
    """Unpickle a TorchScript archive's module and constants and locate their storages.
    ValueError when the archive is not one (no ``data.pkl`` beside ``code/`` or
    ``constants.pkl``)."""
    entries = read_directory(blob)
    prefix = archive_prefix(entries)
    if prefix is None:
        raise ValueError("not a TorchScript archive (no data.pkl beside code/ or constants.pkl)")
    root = f"{prefix}/"
    consts_dir = "constants" if any(n.startswith(f"{root}constants/") for n in entries) else "data"
    pickles = [f"{root}data.pkl"] + [f"{root}{n}" for n in ("constants.pkl",)
                                      if f"{root}{n}" in entries]  # fmt: skip
    small = [*pickles, *(n for n in (f"{root}byteorder",) if n in entries)]
    for name in (*pickles, *(n for n in entries if n.startswith((f"{root}data/",
                                                                f"{root}constants/")))):  # fmt: skip
        e = entries[name]
        if e.compress_type != 0 or e.compress_size != e.file_size:
            raise ValueError(f"zip record {name} is compressed (torch writes stored records)")
    got = dict(zip(small, read_members(blob, [entries[n] for n in small], PICKLE_PREFETCH),
                   strict=True))  # fmt: skip
    big_endian = f"{root}byteorder" in got and got[f"{root}byteorder"][1][:16].strip() == b"big"
    loaded = []
    for name, folder in zip(pickles, ("data", consts_dir), strict=False):
        at, head = got[name]
        u = ScriptUnpickler(blob, offset=at, end=at + entries[name].file_size,
                            persistent_load=_persistent(folder), allow=ALLOW)  # fmt: skip
        u.src.hold(at, head)
        loaded.append(u.load())
    module, constants = loaded[0], loaded[1] if len(loaded) > 1 else ()
    storages = [n for n in entries if n.startswith((f"{root}data/", f"{root}constants/"))]
    found = payload_offsets(blob, entries, storages)
    records = {name[len(root) :]: ZipRecord(*where) for name, where in found.items()}
    return ScriptArchive(module, constants, records, big_endian, prefix)


def is_script_module(node: Any) -> bool:
    return isinstance(node, Record) and node.cls.startswith("__torch__.")


def script_tensors(archive: ScriptArchive) -> list[tuple[str, Any, str | None]]:
    """``(name, tensor, module class)`` of the module's tensors, named as ``state_dict``
    keys (``fc1.weight``; tensors in list/dict attributes as ``attr.0``, ``attr.key``),
    then each tensor constant as ``CONSTANTS.c<i>`` (the name TorchScript code uses)."""
    out: list[tuple[str, Any, str | None]] = []
    module = archive.module
    if is_script_module(module):
        _walk(module, "", out, set(), 0)
    else:
        _values(module, "", None, out, 0)
    consts = archive.constants
    if isinstance(consts, (tuple, list)):
        for i, c in enumerate(consts):
            if isinstance(c, TensorRef):
                out.append((f"CONSTANTS.c{i}", c, None))
    return out


def _walk(module: Record, prefix: str, out: list, active: set[int], depth: int) -> None:
    if depth > MAX_MODULE_DEPTH:
        raise ValueError(f"modules nested more than {MAX_MODULE_DEPTH} deep")
    if id(module) in active:
        raise ValueError(f"module refers to itself at {prefix!r}")
    active.add(id(module))
    for name, value in module.fields().items():
        if is_script_module(value):
            _walk(value, f"{prefix}{name}.", out, active, depth + 1)
        else:
            _values(value, f"{prefix}{name}", module.cls, out, depth + 1)
    active.discard(id(module))


def _values(node: Any, name: str, owner: str | None, out: list, depth: int) -> None:
    """Tensors in an attribute: itself, or inside the lists, tuples and dicts it holds."""
    if depth > MAX_MODULE_DEPTH:
        raise ValueError(f"attribute {name[:80]!r} nests more than {MAX_MODULE_DEPTH} deep")
    if isinstance(node, TensorRef):
        out.append((name, node, owner))
    elif isinstance(node, dict):
        for k, v in node.items():
            _values(v, f"{name}.{k}" if name else str(k), owner, out, depth + 1)
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            _values(v, f"{name}.{i}" if name else str(i), owner, out, depth + 1)
