"""The stand-ins of torch's pickle globals: storage classes, dtypes and the tensor rebuild
functions (``torch._utils._rebuild_tensor_v2`` & co.) as inert references that read nothing.
The allowlist (:mod:`.allowlist`) maps each torch global to one of these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...dtypes import np_dtype
from .standins import ArrayRef, Marker, RecordClass, RestrictedUnpicklingError, ints, prod


@dataclass(eq=False)
class StorageType:
    """A torch storage class (``torch.FloatStorage``): only its element dtype."""

    name: str
    dtype: str  # numpy name; UntypedStorage: uint8 (numel counts bytes)


@dataclass(eq=False)
class TorchDtype:
    """A ``torch.<dtype>`` global, as a numpy dtype name."""

    torch_name: str
    dtype: str


@dataclass(eq=False)
class StorageRef:
    """A torch storage named by a persistent id; nothing is read."""

    key: str
    dtype: str
    numel: int
    location: str = "cpu"
    storage_type: str = ""

    @property
    def nbytes(self) -> int:
        return self.numel * np_dtype(self.dtype).itemsize


@dataclass(eq=False)
class TensorRef:
    """A torch tensor: a view (offset, size, stride in elements) into a storage."""

    storage: StorageRef | None
    storage_offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str
    requires_grad: bool = False
    is_parameter: bool = False
    array: ArrayRef | None = None  # _rebuild_device_tensor_from_numpy
    metadata: Any = None

    @property
    def shape(self) -> tuple[int, ...]:
        return self.size

    @property
    def numel(self) -> int:
        return prod(self.size)


TORCH_DTYPES = {
    "float32": "float32", "float": "float32", "float64": "float64", "double": "float64",
    "float16": "float16", "half": "float16", "bfloat16": "bfloat16", "int64": "int64",
    "long": "int64", "int32": "int32", "int": "int32", "int16": "int16", "short": "int16",
    "int8": "int8", "uint8": "uint8", "bool": "bool", "complex64": "complex64",
    "cfloat": "complex64", "complex128": "complex128", "cdouble": "complex128",
    "uint16": "uint16", "uint32": "uint32", "uint64": "uint64", "bits8": "uint8",
    "bits16": "uint16", "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2",
    "float8_e4m3fnuz": "float8_e4m3fnuz", "float8_e5m2fnuz": "float8_e5m2fnuz",
    "float8_e8m0fnu": "float8_e8m0fnu", "qint8": "int8", "quint8": "uint8", "qint32": "int32",
    "complex32": "complex32", "chalf": "complex32",
}  # fmt: skip
STORAGE_DTYPES = {
    "FloatStorage": "float32", "DoubleStorage": "float64", "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
    "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8",
    "BoolStorage": "bool", "ComplexFloatStorage": "complex64",
    "ComplexDoubleStorage": "complex128", "QInt8Storage": "int8", "QUInt8Storage": "uint8",
    "QInt32Storage": "int32", "QUInt4x2Storage": "uint8", "QUInt2x4Storage": "uint8",
    "UntypedStorage": "uint8", "TypedStorage": "uint8", "_UntypedStorage": "uint8",
}  # fmt: skip


def _tensor(storage: Any, offset: Any, size: Any, stride: Any, dtype: str | None,
            requires_grad: Any = False, metadata: Any = None) -> TensorRef:  # fmt: skip
    if type(storage) is not StorageRef and not isinstance(storage, StorageRef):
        raise RestrictedUnpicklingError(f"tensor rebuilt from a {type(storage).__name__}")
    if type(offset) is not int:
        if not isinstance(offset, int):
            raise RestrictedUnpicklingError("tensor storage_offset is not an int")
        offset = int(offset)
    return TensorRef(storage, offset, ints(size, "size"), ints(stride, "stride"),
                     dtype or storage.dtype, requires_grad is True or bool(requires_grad),
                     False, None, metadata)  # fmt: skip


def _rebuild_tensor(storage, offset, size, stride, *rest):
    return _tensor(storage, offset, size, stride, None)


def _rebuild_tensor_v2(storage, offset, size, stride, requires_grad=False, hooks=None,
                       metadata=None):  # fmt: skip
    return _tensor(storage, offset, size, stride, None, requires_grad, metadata)


def _rebuild_tensor_v3(storage, offset, size, stride, requires_grad, hooks, dtype,
                       metadata=None):  # fmt: skip
    if not isinstance(dtype, TorchDtype):
        raise RestrictedUnpicklingError("_rebuild_tensor_v3 without a torch dtype")
    return _tensor(storage, offset, size, stride, dtype.dtype, requires_grad, metadata)


def _rebuild_parameter(data, requires_grad=True, hooks=None, state=None):
    if isinstance(data, TensorRef):
        data.is_parameter = True
        data.requires_grad = bool(requires_grad)
    return data


def _rebuild_meta(dtype, size, stride, requires_grad=False, *rest):
    d = dtype.dtype if isinstance(dtype, TorchDtype) else "float32"
    return TensorRef(None, 0, ints(size, "size"), ints(stride, "stride"), d, bool(requires_grad))


def _rebuild_from_numpy(data, dtype, device=None, requires_grad=False):
    if not isinstance(data, ArrayRef):
        raise RestrictedUnpicklingError("_rebuild_device_tensor_from_numpy without an array")
    d = dtype.dtype if isinstance(dtype, TorchDtype) else str(data.dtype)
    t = TensorRef(None, 0, data.shape, (), d, bool(requires_grad), array=data)
    return t


@dataclass(eq=False)
class WrapperSubclass:
    """``torch._utils._rebuild_wrapper_subclass``: a tensor subclass's outer shell (its
    class, dtype and full size); the state applied by ``_rebuild_from_type_v2`` fills it."""

    cls: Any
    dtype: str
    size: tuple[int, ...]


@dataclass(eq=False)
class DTensorRef:
    """A pickled ``torch.distributed.tensor.DTensor``: this rank's local tensor and where it
    sits in the global one (placements per mesh dim, the mesh's shape and this rank's
    coordinate on it, when the pickle says)."""

    local: TensorRef
    global_shape: tuple[int, ...]
    placements: tuple[str, ...]
    mesh_shape: tuple[int, ...] | None
    coordinate: tuple[int, ...] | None
    dtype: str


def _rebuild_wrapper_subclass(cls, dtype, size, stride, storage_offset, layout, device,
                              requires_grad=False, *rest):  # fmt: skip
    d = dtype.dtype if isinstance(dtype, TorchDtype) else "float32"
    return WrapperSubclass(cls, d, ints(size, "size"))


_OURS = (__name__, __name__.rsplit(".", 1)[0] + ".allowlist")  # the stand-in functions' modules


def _rebuild_from_type_v2(func, new_type, args, state):
    if not callable(func) or isinstance(func, (Marker, RecordClass)):
        raise RestrictedUnpicklingError("_rebuild_from_type_v2 of a non-rebuild function")
    if getattr(func, "__module__", None) not in _OURS:
        raise RestrictedUnpicklingError("_rebuild_from_type_v2 of a foreign function")
    out = func(*args)
    if isinstance(out, WrapperSubclass):
        return _dtensor(out, state)
    return out


def _dtensor(shell: WrapperSubclass, state: Any) -> DTensorRef:
    """The DTensor a wrapper shell and its state dict (``_local_tensor``, ``_spec``) make."""
    name = getattr(shell.cls, "qualname", "")
    if isinstance(state, tuple) and len(state) == 2:  # (__dict__, slots)
        state = {**(state[0] or {}), **(state[1] or {})} if all(
            isinstance(s, dict) or s is None for s in state) else None  # fmt: skip
    local = state.get("_local_tensor") if isinstance(state, dict) else None
    if not name.endswith(".DTensor") or not isinstance(local, TensorRef):
        raise RestrictedUnpicklingError(f"tensor subclass {name or shell.cls!r} is not read")
    spec = _fields(state.get("_spec"))
    placements = tuple(_placement(p) for p in spec.get("placements") or ())
    mesh = _fields(spec.get("mesh"))
    coordinate = mesh.get("_coordinate_on_dim")
    coordinate = tuple(coordinate) if isinstance(coordinate, (tuple, list)) else None
    return DTensorRef(local, shell.size, placements, _mesh_shape(mesh), coordinate, shell.dtype)


def _fields(rec: Any) -> dict:
    fields = getattr(rec, "fields", None)
    return fields() if callable(fields) else {}


def _placement(p: Any) -> str:
    """``Shard(dim=0)`` -> "Shard(0)"; ``Replicate()``; ``Partial(sum)``; else the class name."""
    kind = getattr(p, "cls", "").rsplit(".", 1)[-1]
    f = _fields(p)
    if kind in ("Shard", "_StridedShard") and isinstance(f.get("dim"), int):
        return f"Shard({f['dim']})" if kind == "Shard" else f"_StridedShard({f['dim']})"
    if kind == "Partial":
        return f"Partial({f.get('reduce_op', 'sum')})"
    return f"{kind or type(p).__name__}()"


def _mesh_shape(mesh: dict) -> tuple[int, ...] | None:
    """The device mesh's shape: its ``mesh`` tensor (torch < 2.10) or its layout's axes."""
    t = mesh.get("mesh")
    if isinstance(t, TensorRef):
        return t.size
    axes = _fields(mesh.get("_layout")).get("axes")
    if isinstance(axes, (tuple, list)):
        shape: tuple[int, ...] = ()
        for axis in axes:
            dims = _fields(axis).get("shape")
            if not isinstance(dims, (tuple, list)) or not all(isinstance(d, int) for d in dims):
                return None
            shape += tuple(dims)
        return shape or None
    return None


def _str_of(*args) -> str:
    return ":".join(str(a) for a in args)


def _size(*args: Any) -> tuple:
    for a in args:
        if not isinstance(a, (tuple, list)):
            raise RestrictedUnpicklingError(f"tuple() of a {type(a).__name__}")
    return tuple(*args)


def torch_globals() -> dict[str, Any]:
    """The allowlist's ``torch.*`` entries: qualname -> stand-in."""
    table: dict[str, Any] = {}
    table["torch._utils._rebuild_tensor"] = _rebuild_tensor
    table["torch._utils._rebuild_tensor_v2"] = _rebuild_tensor_v2
    table["torch._utils._rebuild_tensor_v3"] = _rebuild_tensor_v3
    table["torch._utils._rebuild_parameter"] = _rebuild_parameter
    table["torch._utils._rebuild_parameter_with_state"] = _rebuild_parameter
    table["torch._utils._rebuild_meta_tensor_no_storage"] = _rebuild_meta
    table["torch._utils._rebuild_device_tensor_from_numpy"] = _rebuild_from_numpy
    table["torch._tensor._rebuild_from_type_v2"] = _rebuild_from_type_v2
    table["torch._utils._rebuild_wrapper_subclass"] = _rebuild_wrapper_subclass
    for cls, dt in STORAGE_DTYPES.items():
        for mod in ("torch", "torch.cuda", "torch.storage"):
            table[f"{mod}.{cls}"] = StorageType(cls, dt)
    for name, dt in TORCH_DTYPES.items():
        table[f"torch.{name}"] = TorchDtype(name, dt)
    table["torch.Size"] = _size
    table["torch.device"] = _str_of
    table["torch.serialization._get_layout"] = _str_of
    table["torch.memory_format"] = _str_of
    return table
