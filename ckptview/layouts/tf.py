"""TensorFlow checkpoint directories: ``checkpoint`` state file + ``<prefix>.index/.data-*``.

Written by ``tf.train.CheckpointManager`` (``ckpt-N``), TF1 ``Saver`` (``model.ckpt-N``) and
Estimators. The state file names the checkpoint TF resumes from and the managed set; bundles
it no longer lists (kept by ``keep_checkpoint_every_n_hours``) are still catalogued with
``attrs["tracked"] = False``. A SavedModel directory (``variables/variables.index``) is one
serial 0.
"""

from __future__ import annotations

import posixpath
import re
import time
from datetime import datetime, timezone

from ..model import FileRef, Op, SerialInfo, TFHints, TreeScan
from ..tree import Tree
from .base import Layout, LayoutTier

_DATA = re.compile(r"^(?P<prefix>.+)\.data-(?P<shard>\d{5,})-of-(?P<count>\d{5,})$")
_TEMP = re.compile(r"^(?P<prefix>.+?)\.(index|data-\d+-of-\d+).*tempstate.*$")
_SERIAL = re.compile(r"^(?P<base>.*?)-(?P<n>\d+)$")
_STATE_LINE = re.compile(r'^\s*(\w+)\s*:\s*(".*"|\S+)\s*$')
STATE_FILE = "checkpoint"
SAVED_MODEL_INDEX = "variables/variables.index"


def parse_state(text: str) -> dict[str, list]:
    """A text-format CheckpointState proto: field name -> list of values (str or float)."""
    out: dict[str, list] = {}
    for line in text.splitlines():
        m = _STATE_LINE.match(line)
        if not m:
            continue
        key, raw = m.groups()
        if raw.startswith('"'):
            value: str | float = _unescape(raw[1:-1])
        else:
            try:
                value = float(raw)
            except ValueError:
                continue
        out.setdefault(key, []).append(value)
    return out


def format_state(state: dict[str, list]) -> str:
    """``parse_state``'s inverse: the text a ``CheckpointState`` proto prints as."""

    def quote(v: str) -> str:
        return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'

    lines = []
    for key in ("model_checkpoint_path", "all_model_checkpoint_paths"):
        lines += [f"{key}: {quote(v)}" for v in state.get(key, [])]
    for key in ("all_model_checkpoint_timestamps", "last_preserved_timestamp"):
        lines += [f"{key}: {float(v)!r}" for v in state.get(key, [])]
    return "\n".join(lines) + "\n"


def _unescape(s: str) -> str:
    """C-style escapes of protobuf text format (\\", \\\\, \\n, octal)."""
    if "\\" not in s:
        return s
    raw = s.encode("latin-1", "backslashreplace").decode("unicode_escape")
    return raw.encode("latin-1", "replace").decode("utf-8", "replace")


def _ts(value) -> datetime | None:
    try:
        return datetime.fromtimestamp(float(value), tz=timezone.utc)
    except (TypeError, ValueError, OverflowError, OSError):
        return None


class _Prefix:
    """The files of one bundle prefix found in the listing."""

    def __init__(self, prefix: str):
        self.prefix = prefix  # relative to the tree root
        self.index: str | None = None
        self.data: dict[int, str] = {}
        self.counts: set[int] = set()
        self.others: list[str] = []

    @property
    def complete(self) -> bool:
        """The .index and every ``data-*-of-N`` shard are there (one N)."""
        if self.index is None or len(self.counts) != 1:
            return False
        (count,) = self.counts
        return count > 0 and set(self.data) == set(range(count))


class TFLayout(Layout):
    """Serials are bundle prefixes ``<name>-<N>``; the state file decides the latest."""

    name = "tf"
    resume_reads = (
        "``<prefix>.index`` and every ``.data-*`` shard "
        "(``Checkpoint.restore``/``Saver.restore``); not ``.meta``"
    )
    priority = LayoutTier.FRAMEWORK

    def guess_can_open(self, tree: Tree) -> bool:
        if tree.single:
            return tree.single.endswith(".index")
        names = tree.files(depth=1)
        if any(_DATA.match(n) for n in names) and any(n.endswith(".index") for n in names):
            return True
        return tree.exists(SAVED_MODEL_INDEX)

    def _prefixes(self, tree: Tree) -> dict[str, _Prefix]:
        found: dict[str, _Prefix] = {}

        def get(prefix: str) -> _Prefix:
            return found.setdefault(prefix, _Prefix(prefix))

        if tree.single:
            files = [tree.single, *_probe_shards(tree, tree.single[: -len(".index")])]
        elif not any(f.endswith(".index") for f in tree.files(depth=1)):
            files = tree.files("variables", depth=1)  # a SavedModel directory
        else:
            files = tree.files(depth=1)
        for rel in files:
            if rel.endswith(".index"):
                get(rel[: -len(".index")]).index = rel
            elif m := _DATA.match(rel):
                p = get(m["prefix"])
                p.data[int(m["shard"])] = rel
                p.counts.add(int(m["count"]))
            elif rel.endswith(".meta") and rel[:-5] in found:  # TF1 MetaGraphDef
                found[rel[:-5]].others.append(rel)
            elif m := _TEMP.match(rel):  # a save in flight: BundleWriter's temp names
                get(m["prefix"]).others.append(rel)
        for d in tree.dirs():  # TF2 sharded saves write <prefix>_temp/part-* then merge
            if d.endswith("_temp") and _SERIAL.match(d[: -len("_temp")]):
                get(d[: -len("_temp")]).others += tree.files(d)
        return found

    def scan(self, tree: Tree) -> TreeScan:
        prefixes = self._prefixes(tree)
        state = _read_state(tree)
        tracked = [posixpath.basename(p) for p in state.get("all_model_checkpoint_paths", [])]
        stamps = dict(zip(tracked, state.get("all_model_checkpoint_timestamps", [])))
        pointer = state.get("model_checkpoint_path", [""])[-1]
        pointer = posixpath.basename(pointer) if pointer else ""

        by_serial: dict[int, list[_Prefix]] = {}
        for key in sorted(prefixes):
            m = _SERIAL.match(posixpath.basename(key))
            by_serial.setdefault(int(m["n"]) if m else 0, []).append(prefixes[key])
        serials = []
        for serial, group in sorted(by_serial.items()):
            serials.append(self._serial(tree, serial, group, tracked, stamps))
        latest = self._latest(serials, by_serial, pointer) if state else None
        attrs: dict = {}
        if state:
            attrs["state_file"] = tree.url(STATE_FILE)
            attrs["model_checkpoint_path"] = pointer
            if "last_preserved_timestamp" in state:
                attrs["last_preserved_timestamp"] = _ts(state["last_preserved_timestamp"][-1])
        return TreeScan(serials, latest=latest, latest_rule=bool(state), attrs=attrs)

    def _serial(self, tree: Tree, serial: int, group: list[_Prefix], tracked, stamps) -> SerialInfo:
        many = len(group) > 1
        refs, others = [], []
        for p in group:
            data_sizes = {tree.abs(rel): tree.size(rel) for rel in p.data.values()}
            if p.index:
                refs.append(
                    FileRef(
                        tree.abs(p.index),
                        prefix=posixpath.basename(p.prefix) if many else "",
                        codec="tf",
                        hints=TFHints(data_sizes=data_sizes, object_graph=True),
                        size=tree.size(p.index),
                    )
                )
            others += [tree.abs(r) for r in [*p.data.values(), *p.others]]
        main = group[0]
        names = [posixpath.basename(p.prefix) for p in group]
        complete = all(p.complete for p in group)
        stamp = next((stamps[n] for n in names if n in stamps), None)
        error = None
        if not complete:
            missing = [n for n, p in zip(names, group) if not p.complete]
            error = "incomplete: " + ", ".join(
                f"{n} lacks its .index or a data shard" for n in missing
            )
        return SerialInfo(
            serial,
            tree.abs(main.index or main.prefix),
            files=refs,
            other_files=others,
            complete=None if complete else False,  # None: complete unless the index fails to parse
            timestamp=_ts(stamp) if stamp is not None else None,
            error=error,
            attrs={"prefixes": names, "tracked": any(n in tracked for n in names)},
        )

    # -- management: the ``checkpoint`` state file is the pointer; bundles stay where they are
    def commit_markers(self, tree: Tree, info: SerialInfo) -> list[str]:
        """The ``.index`` files (``BundleWriter`` writes the index after the data)."""
        return [f for f in self.serial_files(tree, info) if f.endswith(".index")]

    def _prefix(self, tree: Tree, info: SerialInfo) -> str:
        index = self.commit_markers(tree, info)
        if not index:
            raise ValueError(f"serial {info.serial} has no .index file")
        return index[0][: -len(".index")]

    def promoted_serial(self, tree: Tree, scan: TreeScan, info: SerialInfo) -> int:
        return info.serial

    def promote_ops(self, tree: Tree, scan: TreeScan, info: SerialInfo) -> list[Op]:
        """Rewrite the state file (tmp + rename) to name the serial, moved to the end of
        ``all_model_checkpoint_paths`` with the current time, as ``CheckpointManager`` does."""
        prefix = self._prefix(tree, info)
        state = _without(_read_state(tree), posixpath.basename(prefix))
        state["model_checkpoint_path"] = [prefix]
        state["all_model_checkpoint_paths"].append(prefix)
        if (
            state["all_model_checkpoint_timestamps"]
            or len(state["all_model_checkpoint_paths"]) == 1
        ):
            state["all_model_checkpoint_timestamps"].append(time.time())
        return [_state_op(state)]

    def export_ops(self, tree: Tree, scan: TreeScan, info: SerialInfo) -> list[Op]:
        """The bundle's files (index last), then a fresh state file naming it."""
        ops = self.copy_ops(tree, info)
        prefix = self._prefix(tree, info)
        if "/" not in prefix:  # a SavedModel's variables/ bundle has no state file
            ops.append(_state_op({"model_checkpoint_path": [prefix],
                                  "all_model_checkpoint_paths": [prefix],
                                  "all_model_checkpoint_timestamps": [time.time()]}))  # fmt: skip
        return ops

    def delete_ops(self, tree: Tree, scan: TreeScan, info: SerialInfo) -> list[Op]:
        """Drop the serial from the state file first, then its index, then its data."""
        ops = super().delete_ops(tree, scan, info)
        state = _read_state(tree)
        if state:
            name = posixpath.basename(self._prefix(tree, info))
            kept = _without(state, name)
            pointer = kept.get("model_checkpoint_path", [""])[-1]
            if posixpath.basename(str(pointer)) == name:
                kept["model_checkpoint_path"] = kept["all_model_checkpoint_paths"][-1:]
            ops.insert(0, _state_op(kept))
        return ops

    def _latest(self, serials: list[SerialInfo], by_serial, pointer: str) -> int | None:
        """The state file's ``model_checkpoint_path`` when it is all there; else the newest
        complete serial (TF would fail to restore a missing pointer)."""
        for s in serials:
            if pointer in s.attrs["prefixes"] and all(p.complete for p in by_serial[s.serial]):
                return s.serial
        done = [s.serial for s in serials if all(p.complete for p in by_serial[s.serial])]
        return max(done) if done else None


def _state_op(state: dict[str, list]) -> Op:
    data = format_state(state).encode()
    return Op("write", STATE_FILE, data=data, nbytes=len(data), replace=True, note="state")


def _without(state: dict[str, list], name: str) -> dict[str, list]:
    """``state`` with bundle ``name`` dropped from the managed list (and its timestamp)."""
    paths = state.get("all_model_checkpoint_paths", [])
    stamps = state.get("all_model_checkpoint_timestamps", [])
    pairs = list(zip(paths, stamps if len(stamps) == len(paths) else [None] * len(paths)))
    pairs = [(p, t) for p, t in pairs if posixpath.basename(str(p)) != name]
    out = dict(state)
    out["all_model_checkpoint_paths"] = [p for p, _ in pairs]
    out["all_model_checkpoint_timestamps"] = [t for _, t in pairs if t is not None]
    if len(out["all_model_checkpoint_timestamps"]) != len(pairs):
        out["all_model_checkpoint_timestamps"] = []
    return out


def _read_state(tree: Tree) -> dict[str, list]:
    """The parsed ``checkpoint`` state file, or {} when there is none (or it is unreadable)."""
    if tree.entries.get(STATE_FILE, {}).get("type") != "file":
        return {}
    try:
        return parse_state(tree.read_text(STATE_FILE))
    except (OSError, ValueError):
        return {}


def _probe_shards(tree: Tree, stem: str) -> list[str]:
    """Data shards beside a single ``.index`` file (the tree lists only that file)."""
    fs = tree.storage.fs
    try:
        found = fs.glob(tree.abs(stem) + ".data-*-of-*")
    except (OSError, ValueError):
        return []
    out = []
    for path in found:
        rel = posixpath.basename(path)
        try:
            tree.entries[rel] = tree.storage.info(path)
        except (FileNotFoundError, OSError):
            continue
        out.append(rel)
    return out
