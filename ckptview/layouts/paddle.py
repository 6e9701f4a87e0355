"""Paddle tree layouts (specs/paddle.md §4, §5.1, §5.3): the 2018 Fluid checkpoint trees,
``paddle.fluid.incubate.checkpoint`` auto-checkpoints, and static-graph model directories."""

from __future__ import annotations

import posixpath
import re
import time
from datetime import datetime, timezone

from ..formats.small import loads_json
from ..kinds import paddle_kind
from ..model import FileRef, PaddleHints, SerialInfo, TreeScan
from ..tree import Tree
from .base import Layout, LayoutTier, single_serial_refusal

SUCCESS = "_SUCCESS"
MODEL_DIR = "__model__"
LOOKUP_DIR = "__lookup_table__"
STREAM = "paddle"
TEXT_INT = "paddle-text-int"

_SERIAL_DIR = re.compile(r"^checkpoint_(0|[1-9]\d*)$")
_TRAINER_DIR = re.compile(r"^trainer_(0|[1-9]\d*)$")
_TABLE_SHARD = re.compile(r"^(.+)_(\d+)$")
_CTIME = re.compile(r"[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}")


def ctime_stamp(text: str) -> datetime | None:
    """The last ``time.ctime()`` stamp in a marker (append mode may hold several), as UTC.

    ctime has no zone; the writer's local time is taken as UTC.
    """
    found = _CTIME.findall(text)
    if not found:
        return None
    try:
        stamp = datetime.strptime(" ".join(found[-1].split()), "%a %b %d %H:%M:%S %Y")
    except ValueError:
        return None
    return stamp.replace(tzinfo=timezone.utc)


def _int_file(tree: Tree, rel: str) -> int | None:
    """``int(f.read().strip())`` of a small text file; None when absent or not an integer."""
    if not _is_file(tree, rel):
        return None
    try:
        return int(tree.read_text(rel, limit=64).strip())
    except (ValueError, OSError):
        return None


def _is_file(tree: Tree, rel: str) -> bool:
    return tree.entries.get(rel, {}).get("type") == "file"


def _stream_ref(tree: Tree, rel: str, **kw) -> FileRef:
    return FileRef(tree.abs(rel), codec=STREAM, size=tree.size(rel), **kw)


class PaddleFluidLayout(Layout):
    """2018 Fluid ``save_checkpoint`` trees: ``checkpoint_N/`` serials.

    V3/V4 (v0.14/v0.15): ``__model__/<vars>`` (chief), ``trainer_<id>/{epoch_id,step_id}``,
    ``__lookup_table__/<table>_<pserver>``; complete iff ``__model__/_SUCCESS`` is a file.
    V2 (develop, May 2018): flat ``checkpoint_N/<vars>``; complete iff ``checkpoint_N/_SUCCESS``.
    Latest = the highest complete serial (``_get_latest_checkpoint_serial``).
    """

    name = "paddle-fluid"
    resume_reads = (
        "every variable file of ``__model__/`` (or the flat serial) and the trainer's "
        "``epoch_id``/``step_id`` (``load_persistables``)"
    )
    priority = LayoutTier.SPECIFIC

    def _serial_dirs(self, tree: Tree) -> dict[int, str]:
        out = {}
        for rel in tree.dirs():
            m = _SERIAL_DIR.match(rel)
            if m:
                out[int(m.group(1))] = rel
        return out

    def guess_can_open(self, tree: Tree) -> bool:
        for rel in self._serial_dirs(tree).values():
            children = tree.children(rel)
            if MODEL_DIR in children or SUCCESS in children or LOOKUP_DIR in children:
                return True
            if any(_TRAINER_DIR.match(c) and tree.is_dir(f"{rel}/{c}") for c in children):
                return True
        return False

    def _nested(self, tree: Tree, dirs: dict[int, str]) -> bool:
        for rel in dirs.values():
            for child in tree.dirs(rel):
                base = posixpath.basename(child)
                if base in (MODEL_DIR, LOOKUP_DIR) or _TRAINER_DIR.match(base):
                    return True
        return False

    def scan(self, tree: Tree) -> TreeScan:
        dirs = self._serial_dirs(tree)
        nested = self._nested(tree, dirs)
        serials = [
            self._nested_serial(tree, n, rel) if nested else self._flat_serial(tree, n, rel)
            for n, rel in sorted(dirs.items())
        ]
        complete = [s.serial for s in serials if s.complete]
        attrs = {"version": "v0.14/v0.15 (nested)" if nested else "develop 2018 (flat)"}
        return TreeScan(serials, max(complete, default=None), latest_rule=True, attrs=attrs)

    def _flat_serial(self, tree: Tree, serial: int, rel: str) -> SerialInfo:
        marker = f"{rel}/{SUCCESS}"
        files, others = [], []
        for f in tree.files(rel):
            if f == marker:
                others.append(tree.abs(f))
            else:
                files.append(_var_ref(tree, f, rel))
        info = SerialInfo(serial, tree.abs(rel), files, others, complete=_is_file(tree, marker))
        info.timestamp = self._stamp(tree, marker)
        info.nodes = ()
        return info

    def _nested_serial(self, tree: Tree, serial: int, rel: str) -> SerialInfo:
        marker = f"{rel}/{MODEL_DIR}/{SUCCESS}"
        files, others, trainers, pservers = [], [], {}, set()
        for f in tree.files(rel):
            parts = f[len(rel) + 1 :].split("/")
            top = parts[0]
            if parts[-1] == SUCCESS:
                others.append(tree.abs(f))
            elif top == MODEL_DIR and len(parts) >= 2:
                files.append(_var_ref(tree, f, f"{rel}/{MODEL_DIR}"))
            elif _TRAINER_DIR.match(top) and len(parts) == 2:
                node = top
                trainers[int(top.split("_")[1])] = top
                if parts[1] in ("epoch_id", "step_id"):
                    ref = FileRef(tree.abs(f), node=node, prefix=parts[1], kind="trainer",
                                  codec=TEXT_INT, size=tree.size(f))  # fmt: skip
                    files.append(ref)
                else:
                    files.append(FileRef(tree.abs(f), node=node, prefix=parts[1],
                                         size=tree.size(f), optional=True))  # fmt: skip
            elif top == LOOKUP_DIR and len(parts) == 2 and _TABLE_SHARD.match(parts[1]):
                table, pserver = _TABLE_SHARD.match(parts[1]).groups()
                node = f"pserver_{int(pserver)}"
                pservers.add(int(pserver))
                files.append(_stream_ref(tree, f, node=node, prefix=table, kind="lookup_table",
                                         hints=PaddleHints(stream="selected_rows")))  # fmt: skip
            else:
                others.append(tree.abs(f))
        for d in tree.dirs(rel):
            m = _TRAINER_DIR.match(posixpath.basename(d))
            if m:
                trainers.setdefault(int(m.group(1)), posixpath.basename(d))
        info = SerialInfo(serial, tree.abs(rel), files, others, complete=_is_file(tree, marker))
        info.timestamp = self._stamp(tree, marker)
        info.nodes = tuple(trainers[k] for k in sorted(trainers)) + tuple(
            f"pserver_{k}" for k in sorted(pservers)
        )
        if trainers:
            first = trainers[min(trainers)]
            info.epoch = _int_file(tree, f"{rel}/{first}/epoch_id")
            info.step = _int_file(tree, f"{rel}/{first}/step_id")
        return info

    @staticmethod
    def _stamp(tree: Tree, marker: str) -> datetime | None:
        if not _is_file(tree, marker):
            return None
        return ctime_stamp(tree.read_text(marker, limit=4096))

    # -- management: a promoted serial is copied as max+1, its _SUCCESS files written last
    def commit_markers(self, tree: Tree, info: SerialInfo) -> list[str]:
        """Every ``_SUCCESS``; the one that commits the serial (``__model__/_SUCCESS``, or the
        flat 2018 ``checkpoint_N/_SUCCESS``) last, as ``save_checkpoint`` writes them."""
        base = tree.rel(info.path)
        final = {f"{base}/{MODEL_DIR}/{SUCCESS}", f"{base}/{SUCCESS}"}
        found = [f for f in self.serial_files(tree, info) if posixpath.basename(f) == SUCCESS]
        return sorted(found, key=lambda f: (f in final, f))

    def marker_data(self, tree: Tree, info: SerialInfo, rel: str) -> bytes | None:
        """What ``_write_success`` records: ``time.ctime()``, no newline (spec §4)."""
        return time.ctime().encode()


def _var_ref(tree: Tree, rel: str, var_dir: str) -> FileRef:
    """A per-variable stream file; its variable is named by its path below ``var_dir``."""
    name = rel[len(var_dir) + 1 :] if var_dir else rel
    prefix = name if "/" in name else ""  # else the catalog names it after the file
    return _stream_ref(tree, rel, prefix=prefix, kind=paddle_kind(name))


_INCUBATE_DIR = re.compile(r"^__paddle_checkpoint__\.(\d+)(\.tmp)?$")
STATUS_FILES = ("exe_train_status", "range_train_status")


class PaddleIncubateLayout(Layout):
    """``paddle.fluid.incubate.checkpoint`` (fleet / auto-checkpoint) trees (spec §5.1).

    ``__paddle_checkpoint__.N/`` is committed by renaming ``__paddle_checkpoint__.N.tmp``; a
    leftover ``.tmp`` is listed as an uncommitted (incomplete) serial, which Paddle ignores.
    Latest = the highest committed N. Epoch from the ``*_train_status`` JSON's ``epoch_no``.
    """

    name = "paddle-incubate"
    resume_reads = (
        "every variable file of the committed ``__paddle_checkpoint__.N`` "
        "(``auto_checkpoint`` restore)"
    )
    priority = LayoutTier.SPECIFIC
    #: ``save_checkpoint`` writes ``__paddle_checkpoint__.N.tmp`` and renames it (the commit);
    #: deletion renames a committed dir back first, so a half-deleted one is never listed
    staging_suffix = ".tmp"

    def _dirs(self, tree: Tree) -> dict[int, tuple[str, bool]]:
        out: dict[int, tuple[str, bool]] = {}
        for rel in tree.dirs():
            m = _INCUBATE_DIR.match(rel)
            if not m:
                continue
            serial, committed = int(m.group(1)), m.group(2) is None
            if committed or serial not in out:
                out[serial] = (rel, committed)
        return out

    def guess_can_open(self, tree: Tree) -> bool:
        return bool(self._dirs(tree))

    def scan(self, tree: Tree) -> TreeScan:
        serials = []
        for serial, (rel, committed) in sorted(self._dirs(tree).items()):
            files, others, status = [], [], {}
            for f in tree.files(rel):
                base = f[len(rel) + 1 :]
                if base in STATUS_FILES:
                    others.append(tree.abs(f))
                    status.update(_status(tree, f))
                else:
                    files.append(_var_ref(tree, f, rel))
            info = SerialInfo(serial, tree.abs(rel), files, others, complete=committed, nodes=())
            info.epoch = status.get("epoch_no")
            info.attrs = {k: v for k, v in status.items() if k != "epoch_no"}
            if not committed:
                info.error = "uncommitted: the .tmp directory was never renamed"
            serials.append(info)
        committed = [s.serial for s in serials if s.complete]
        return TreeScan(serials, max(committed, default=None), latest_rule=True)


def _status(tree: Tree, rel: str) -> dict:
    """``epoch_no`` and identifying fields of an ExeTrainStatus / TrainEpochRange JSON."""
    try:
        doc = loads_json(tree.read_text(rel))
    except (ValueError, OSError):
        return {}
    if not isinstance(doc, dict):
        return {}
    out = {k: doc[k] for k in ("checkpoint_no", "exe_name", "program_name", "name") if k in doc}
    epoch = doc.get("epoch_no")
    if isinstance(epoch, int) and not isinstance(epoch, bool) and epoch >= 0:
        out["epoch_no"] = epoch
    return out


#: static-graph program files and params files by name
PROGRAM_SUFFIXES = (".pdmodel", ".json")
PICKLE_SUFFIXES = (".pdparams", ".pdopt")
COMBINED_SUFFIXES = (".pdiparams",)
OTHER_SUFFIXES = (
    ".md", ".txt", ".yaml", ".yml", ".log", ".lock", ".csv", ".py", ".sh", ".info", ".json",
    ".pdmodel", ".nb", ".onnx", ".pbtxt", ".cfg", ".ini", ".tar", ".gz", ".zip",
)  # fmt: skip
#: files of other frameworks' formats (by name): never forced through the Paddle stream codec
FOREIGN_SUFFIXES = (
    ".safetensors", ".npy", ".npz", ".pt", ".pth", ".ckpt", ".minidb", ".h5", ".hdf5",
    ".keras", ".index", ".distcp", ".metadata", ".msgpack", ".pkl", ".pickle",
)  # fmt: skip
_PARAM_NAME = re.compile(r"^[A-Za-z_][\w]*_\d+\.(w|b)_\d+$")


class PaddleStaticLayout(Layout):
    """A static-graph model directory (one serial, 0): per-variable files, ``save_combine``
    (``__params__``, ``*.pdiparams``) named through the program (``__model__``, ``*.pdmodel``,
    PIR ``*.json``), and ``paddle.static.save`` pickles beside their program."""

    name = "paddle-static"
    resume_reads = (
        "the program and every parameter file it names (``load_inference_model``/``static.load``)"
    )
    priority = LayoutTier.CONVENTION

    def guess_can_open(self, tree: Tree) -> bool:
        names = [posixpath.basename(f) for f in tree.files(depth=1)]
        lower = [n.lower() for n in names]
        if "__params__" in names or any(
            n.endswith(COMBINED_SUFFIXES + (".pdmodel",)) for n in lower
        ):
            return True
        if MODEL_DIR in names and _is_file(tree, MODEL_DIR):
            return True
        stems = {n.rsplit(".", 1)[0] for n in lower if n.endswith(".json")}
        if any(n.endswith(PICKLE_SUFFIXES) and n.rsplit(".", 1)[0] in stems for n in lower):
            return True
        return any(_PARAM_NAME.match(n) for n in names)

    def scan(self, tree: Tree) -> TreeScan:
        rels = [f for f in tree.files() if not posixpath.basename(f).startswith(".")]
        programs = [f for f in rels if _is_program(tree, f)]
        combined = [f for f in rels if _is_combined(f)]
        pickles = [f for f in rels if f.lower().endswith(PICKLE_SUFFIXES)]
        foreign = [f for f in rels if f.lower().endswith(FOREIGN_SUFFIXES)]
        per_var = [
            f for f in rels
            if f not in programs and f not in combined and f not in pickles
            and f not in foreign and not f.lower().endswith(OTHER_SUFFIXES)
        ]  # fmt: skip
        mixed = bool(per_var) and bool(combined or pickles) or bool(foreign)
        files = []
        for f in combined:
            program = _program_for(tree, f, programs)
            program_path = tree.abs(program) if program else _sibling_program(tree, f)
            hints = PaddleHints(program=program_path) if program_path else None
            files.append(_stream_ref(tree, f, prefix=f if mixed else "", hints=hints))
        for f in pickles:  # codec=None: the pickle codec claims them by suffix
            program = _program_for(tree, f, programs, exact=True)
            hints = PaddleHints(program=tree.abs(program)) if program else None
            ref = FileRef(tree.abs(f), prefix=f if mixed else "", size=tree.size(f), hints=hints)
            files.append(ref)
        files += [_var_ref(tree, f, "") for f in per_var]
        # another format beside the model: detected by content, never forced to Paddle
        files += [FileRef(tree.abs(f), prefix=f, size=tree.size(f), optional=True) for f in foreign]
        used = {ref.path for ref in files}
        others = [tree.abs(f) for f in rels if tree.abs(f) not in used]
        root = tree.abs(tree.single or "")
        serial = SerialInfo(0, root, files, others, nodes=())
        attrs = {"programs": [tree.abs(p) for p in programs]}
        return TreeScan([serial], 0, latest_rule=True, attrs=attrs)

    def promote_ops(self, tree: Tree, scan: TreeScan, info: SerialInfo) -> list:
        raise single_serial_refusal(self.name)


def _is_program(tree: Tree, rel: str) -> bool:
    base = posixpath.basename(rel).lower()
    if base == MODEL_DIR or base.endswith(".pdmodel"):
        return True
    return base.endswith(".json") and b'"base_code"' in tree.read_bytes(rel, 256)


def _sibling_program(tree: Tree, rel: str) -> str | None:
    """For a one-file tree: the program next to the combined file on storage, if any."""
    if not tree.single:
        return None
    base = posixpath.basename(rel)
    stem = base.rsplit(".", 1)[0]
    names = [MODEL_DIR] if base == "__params__" else [stem + ".pdmodel", stem + ".json"]
    for name in names:
        path = tree.abs(name)
        try:
            if tree.storage.info(path)["type"] == "file":
                return path
        except (FileNotFoundError, OSError):
            continue
    return None


def _is_combined(rel: str) -> bool:
    base = posixpath.basename(rel)
    return base == "__params__" or base.lower().endswith(COMBINED_SUFFIXES)


def _program_for(tree: Tree, rel: str, programs: list[str], exact: bool = False) -> str | None:
    """The program naming a combined file: same stem, ``__model__`` beside ``__params__``,
    else (unless ``exact``) the only program in its directory."""
    folder, base = posixpath.split(rel)
    here = [p for p in programs if posixpath.dirname(p) == folder]
    stem = base.rsplit(".", 1)[0] if "." in base else base
    wanted = ["__model__"] if base == "__params__" else []
    wanted += [stem + ".pdmodel", stem + ".json"]
    for name in wanted:
        for p in here:
            if posixpath.basename(p) == name:
                return p
    legacy = [p for p in here if not p.lower().endswith(".json")]
    if exact:
        return None
    if len(here) == 1:
        return here[0]
    return legacy[0] if len(legacy) == 1 else None
