"""Plain records passed between layouts, codecs and the catalog."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, TypeAlias, TypeVar

#: where ckptview keeps its own bookkeeping under a tree root (journal, lock, policy, staging)
META_DIR = ".ckptview"
#: where copies are staged before the rename that commits them
STAGE_DIR = f"{META_DIR}/tmp"

KINDS = ("model", "optimizer", "trainer", "lookup_table", "rng", "scheduler", "other")


@dataclass(slots=True)
class Span:
    """Where a variable's raw values lie: ``length`` bytes at ``offset`` of file ``path``.

    ``dtype`` is the on-disk numpy dtype string (byte order included, e.g. ``>f4``) when it
    differs from the variable's dtype; ``order`` is 'C' or 'F'.
    """

    path: str
    offset: int
    length: int
    order: str = "C"
    disk_dtype: str | None = None


@dataclass(slots=True)
class VarInfo:
    """One variable as a codec lists it from a header (no values read)."""

    name: str  # "" for a file holding one unnamed tensor: the catalog names it after the file
    dtype: str
    shape: tuple[int, ...]
    nbytes: int | None = None
    kind: str | None = None
    error: str | None = None
    span: Span | None = None  # contiguous raw values, read generically when set
    locator: Any = None  # codec-private: how to read values when there is no span
    attrs: dict = field(default_factory=dict)  # extras (lod, rows, height, metadata …)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= int(d)
        return n


@dataclass
class Piece:
    """What makes a listed tensor one stored piece of a larger logical tensor (DESIGN.md §3b).

    ``shape``: the full tensor's shape, None when only the pieces tell (the union of their
    extents). ``offsets``: where the piece sits, None when derived from ``shard`` on
    assembly. ``shard``: per sharded tensor dim, ``(dim, coordinate, mesh size or None)`` (a
    DTensor ``Shard(dim)`` on a mesh dim): torch's chunking places coordinate ``c`` at
    ``c * ceil(size / n)``. ``replica``: pieces with the same key hold the same values (a
    ``Replicate()`` mesh dim); one of them is read. ``name``: the logical name when it is
    not the listed one. ``placement``: free text for the shards table. ``blocks``: the piece
    is that many equal parts along its (first) sharded dim, part ``j`` landing in the ``j``-th
    equal part of the full tensor (Megatron's SwiGLU ``linear_fc1``: rank ``r`` holds
    ``[gate_r; up_r]``). With ``shape`` None, coordinate ``c`` starts at ``c`` times the
    piece's extent (Megatron's even tensor-parallel split)."""

    shape: tuple[int, ...] | None = None
    offsets: tuple[int, ...] | None = None
    shard: tuple[tuple[int, int, int | None], ...] = ()
    replica: tuple = ()
    placement: str = ""
    role: str = "data"
    name: str | None = None
    blocks: int = 1


class VarColumns(Sequence):
    """A file's variables as columns (a codec's fast path for big, well-formed headers): one
    list per field instead of a ``VarInfo``, ``Span`` and attrs dict per variable. The
    catalog's tables are built from the columns; ``VarInfo`` records are made on first item
    access (a read, a diff, a verify), for the whole file at once, and kept.

    Every variable is plain and readable: no error, no kind, no piece, a C-order span in
    ``path`` at ``offsets[i]`` of ``nbytes[i]`` bytes stored as ``disks[i]`` (``numels``,
    ``nbytes`` and ``offsets`` are int64 numpy arrays); ``attrs`` is
    ``{key: codes[i]}`` plus ``{"metadata": meta}`` when there is one (shared by the
    file's variables, as a codec's per-file metadata is).

    Optional per-row columns (None: as above), for codecs whose variables differ row by row
    (TF bundles): ``kinds`` (each row's kind, None for the catalog's guess), ``aliases``
    (the variables table's ``alias``: what ``attrs["full_name"]``/``["param_name"]`` give),
    ``paths`` (each span's file: a bundle's data shards), ``fields`` (attrs as columns:
    row ``i`` holds ``{k: fields[k][i]}`` for the values that are not None, in place of
    ``{key: codes[i]}``), ``extras`` (a dict or None per row, merged into its attrs after
    ``fields``) and ``others`` (row index -> the row's ``VarInfo``, for a variable read
    through a locator, such as a string tensor: still without error; the columns hold its
    name, dtype, shape, numel, nbytes, kind and alias)."""

    def __init__(self, path: str, names: list[str], dtypes: list[str],
                 shapes: list[tuple[int, ...]], numels: Any, nbytes: Any, offsets: Any,
                 disks: list[str | None], codes: list[str], key: str,
                 meta: dict | None = None, *, kinds: list[str | None] | None = None,
                 aliases: list[str | None] | None = None, paths: list[str] | None = None,
                 fields: dict[str, list] | None = None, extras: list[dict | None] | None = None,
                 others: dict[int, VarInfo] | None = None):  # fmt: skip
        self.path = path
        self.names, self.dtypes, self.shapes, self.numels = names, dtypes, shapes, numels
        self.nbytes, self.offsets, self.disks, self.codes = nbytes, offsets, disks, codes
        self.key, self.meta = key, meta
        self.kinds, self.aliases, self.paths = kinds, aliases, paths
        self.fields, self.extras, self.others = fields, extras, others
        self._vars: list[VarInfo] | None = None

    @property
    def materialized(self) -> list[VarInfo] | None:
        """The ``VarInfo`` records once made (then they are the truth: they may have been
        changed), else None."""
        return self._vars

    def records(self) -> list[VarInfo]:
        """The variables as ``VarInfo`` records (made once)."""
        if self._vars is None and (self.fields is not None or self.others or self.kinds
                                   or self.paths or self.extras):  # fmt: skip
            self._vars = self._rows()
        if self._vars is None:
            path, key, meta = self.path, self.key, self.meta
            out = []
            for name, dtype, shape, nbytes, offset, disk, code in zip(
                self.names, self.dtypes, self.shapes, self.nbytes.tolist(),
                self.offsets.tolist(), self.disks, self.codes,
            ):  # fmt: skip
                attrs = {key: code, "metadata": meta} if meta else {key: code}
                out.append(VarInfo(name, dtype, shape, nbytes, None, None,
                                   Span(path, offset, nbytes, "C", disk), None, attrs))  # fmt: skip
            self._vars = out
        return self._vars

    def _rows(self) -> list[VarInfo]:
        """``records`` with the per-row columns."""
        nbytes, offsets = self.nbytes.tolist(), self.offsets.tolist()
        kinds, paths, fields, extras = self.kinds, self.paths, self.fields, self.extras
        others = self.others or {}
        key, meta, codes = self.key, self.meta, self.codes
        out = []
        for i, name in enumerate(self.names):
            var = others.get(i)
            if var is not None:
                out.append(var)
                continue
            if fields is not None:
                attrs = {k: col[i] for k, col in fields.items() if col[i] is not None}
            else:
                attrs = {key: codes[i], "metadata": meta} if meta else {key: codes[i]}
            extra = extras[i] if extras is not None else None
            if extra:
                attrs.update(extra)
            n = nbytes[i]
            span = Span(paths[i] if paths is not None else self.path, offsets[i], n, "C",
                        self.disks[i])  # fmt: skip
            out.append(VarInfo(name, self.dtypes[i], self.shapes[i], n,
                               kinds[i] if kinds is not None else None, None, span, None,
                               attrs))  # fmt: skip
        return out

    def __len__(self) -> int:
        return len(self.names) if self._vars is None else len(self._vars)

    def __getitem__(self, i):  # type: ignore[override]
        return self.records()[i]

    def __iter__(self):
        return iter(self.records())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, VarColumns)):
            return self.records() == list(other)
        return NotImplemented

    def __add__(self, other: Sequence) -> list[VarInfo]:
        return [*self.records(), *other]

    def __repr__(self) -> str:
        return f"VarColumns({self.path!r}, {len(self)} variables)"


def as_columns(variables: Sequence[VarInfo]) -> VarColumns | None:
    """``variables`` when they are columns not yet made into records, else None (a list,
    the common case, answers without the ABC ``isinstance`` check)."""
    if type(variables) is list or not isinstance(variables, VarColumns):
        return None
    return variables if variables.materialized is None else None


def with_errors(variables: Sequence[VarInfo]) -> list[VarInfo]:
    """The variables that carry an error (none in columns not yet made into records)."""
    if as_columns(variables) is not None:
        return []
    return [v for v in variables if v.error]


def inline_value(var: VarInfo) -> Any:
    """The value of a plain (non-tensor) variable a codec kept in the listing (a pickled
    ``int``, ``bool`` or ``str``), else None."""
    loc = var.locator
    if not (isinstance(loc, tuple) and len(loc) == 2 and loc[0] == "value"):
        return None
    value = loc[1]
    if getattr(value, "shape", None) == ():  # a 0-d numpy array or scalar
        return value.item()
    return value


# -- codec hints: what a layout knows about a file that helps its codec ---------------------
_H = TypeVar("_H", bound="Hints")


@dataclass(frozen=True)
class Hints:
    """Options a layout hands the codec of one file (``FileRef.hints``): one subclass per
    codec family, a field at its default meaning "not known".

    A codec reads its family's with ``TFHints.of(hints)``, which also takes None, another
    family's hints (none of them apply) or a plain mapping of field names
    (``codec.list_variables(blob, {"object_graph": True})``; unknown keys are ignored).
    """

    @classmethod
    def of(cls: type[_H], hints: Hints | Mapping[str, Any] | None) -> _H:
        if isinstance(hints, cls):
            return hints
        if hints is None or isinstance(hints, Hints):
            default = _DEFAULT_HINTS.get(cls)  # frozen: one default per family, shared
            if default is None:
                default = _DEFAULT_HINTS[cls] = cls()
            return default
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in hints.items() if k in names})

    def items(self) -> list[tuple[str, Any]]:
        """``(field, value)`` of every option set (not at its default), like a dict's items:
        what the header cache keys a listing on."""
        return [(f.name, getattr(self, f.name)) for f in fields(self)
                if getattr(self, f.name) != f.default]  # fmt: skip


_DEFAULT_HINTS: dict[type, Hints] = {}


@dataclass(frozen=True)
class PaddleHints(Hints):
    """Paddle streams and pickles (codecs ``paddle`` and ``paddle-pickle``)."""

    #: path of the ProgramDesc (``__model__``/``*.pdmodel``) or PIR ``*.json`` that names
    #: combined streams and gives the dtypes of pickled tensors
    program: str | None = None
    #: explicit names of the streams of a combined file, in order
    names: Sequence[str] | None = None
    #: ``"selected_rows"`` or ``"dense"``: the reading to prefer for a one-stream file
    stream: str | None = None
    #: variable name -> dtype (bfloat16 pickled as uint16 bit patterns)
    dtypes: Mapping[str, str] | None = None


@dataclass(frozen=True)
class PaddleDcpHints(Hints):
    """One Paddle distributed-checkpoint shard (codec ``paddle-dcp``), from its metadata."""

    #: variable name -> dtype
    dtypes: Mapping[str, str] | None = None
    #: variable name -> shape of the whole (unsharded) tensor
    global_shapes: Mapping[str, Sequence[int]] | None = None
    #: variable name -> offset of this file's piece in the whole tensor
    offsets: Mapping[str, Sequence[int]] | None = None


@dataclass(frozen=True)
class TFHints(Hints):
    """A TensorFlow tensor bundle (codec ``tf``)."""

    #: data shard path -> size, from the layout's listing (else each shard is stat'ed)
    data_sizes: Mapping[str, int] | None = None
    #: True: also read the ``_CHECKPOINTABLE_OBJECT_GRAPH`` for readable names (a read of
    #: the data file; off, a listing reads the ``.index`` only)
    object_graph: bool = False


@dataclass(frozen=True)
class TorchHints(Hints):
    """A ``torch.save`` file (codec ``torch``): how the framework's resume loads it."""

    #: True: the resume reads it with ``torch.load(weights_only=True)``: a pickled global
    #: outside torch's default allowlist (plus ``extra_globals``) makes the file fail to load
    weights_only: bool = False
    #: globals the framework adds for this file (transformers' numpy RNG state allowlist)
    extra_globals: tuple[str, ...] = ()


@dataclass(frozen=True)
class OrbaxHints(Hints):
    """Orbax items (codecs ``orbax`` and ``orbax-json``)."""

    #: path relative to the item dir -> size, from the layout's listing (else it is listed)
    files: Mapping[str, int] | None = None
    #: the kind of a JSON item's one variable (default: the FileRef's)
    kind: str | None = None


#: what ``Codec.list_variables`` accepts as hints
HintsLike: TypeAlias = "Hints | Mapping[str, Any] | None"


@dataclass
class FileRef:
    """A file a layout assigns to a serial: which node wrote it and how to name its variables."""

    path: str
    node: str = ""
    prefix: str = ""  # joined before every variable name with "/"
    kind: str | None = None  # default kind for its variables
    codec: str | None = None  # force a codec by name
    hints: Hints | None = None  # what the layout knows that helps the codec (a program path …)
    size: int | None = None
    optional: bool = False  # True: maybe not a checkpoint file; unrecognized is a warning
    #: False: the framework's resume path does not read it (HF ``training_args.bin``): its
    #: problems are the serial's ``warning``, never a reason it is not ``loadable``
    required: bool = True
    #: the tensor names an index (``*.index.json``) puts in this file: its listing must hold
    #: exactly these (both ways), or the serial does not load; None: no index names them
    expects: tuple[str, ...] | None = None


@dataclass
class SerialInfo:
    """One serial as a layout found it."""

    serial: int
    path: str
    files: list[FileRef] = field(default_factory=list)  # files holding variables
    other_files: list[str] = field(default_factory=list)  # markers, configs: counted, not parsed
    complete: bool | None = None  # None: complete when every file parses without error
    timestamp: datetime | None = None
    epoch: int | None = None
    step: int | None = None
    nodes: tuple[str, ...] | None = None  # None: derived from the files' nodes
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    aliases: tuple[str, ...] = ()  # other paths naming this serial (Lightning last.ckpt)
    attrs: dict = field(default_factory=dict)


@dataclass
class TreeScan:
    """What a layout returns for a tree."""

    serials: list[SerialInfo]
    latest: int | None = None  # the serial the framework resumes from
    latest_rule: bool = False  # True: ``latest`` is set by the layout (even when None)
    metrics: list[tuple[int, str, float]] = field(default_factory=list)
    attrs: dict = field(default_factory=dict)  # tree facts (best_model_checkpoint, …)
    # files outside every serial that the layout could not place, and why (root-relative)
    file_errors: dict[str, str] = field(default_factory=dict)


@dataclass
class Op:
    """One step of a change: ``copy`` (src: absolute path on the source storage), ``write``
    (data), ``rename`` (src: relative path), ``delete`` (a file) or ``rmdir`` (an empty dir)."""

    kind: str
    path: str
    src: str | None = None
    data: bytes | None = None
    nbytes: int = 0
    atomic: bool = True  # copy/write: via a temp file under .ckptview/tmp, then a rename
    replace: bool = False  # write: may replace an existing file (state files: atomic rename)
    note: str = ""
