"""Orbax ``CheckpointManager`` trees: one directory per step, one sub-directory per item.

Step names follow Orbax's ``standard_name_format``: ``<step>`` or ``<prefix>_<step>``, zero-padded
or not. A step still being written lives in ``<name>.orbax-checkpoint-tmp`` (older Orbax:
``…-tmp-<timestamp>``). Committed: on gs:// ``commit_success.txt`` (``CommitFileTemporaryPath``),
elsewhere the rename (``AtomicRenameTemporaryPath``); a step whose ``_CHECKPOINT_METADATA``
has no commit time and no ``commit_success.txt`` is treated as unfinished too.
"""

from __future__ import annotations

import re
from collections import defaultdict

import pandas as pd

from ..formats.small import loads_json
from ..model import FileRef, OrbaxHints, SerialInfo, TreeScan
from ..tree import Tree
from .base import Layout, LayoutTier

STEP_RE = re.compile(r"^(?P<prefix>.*?)_?(?P<step>\d+)(?P<tmp>\.orbax-checkpoint-tmp(?:-\d+)?)?$")
TMP_RE = re.compile(r"\.orbax-checkpoint-tmp(?:-\d+)?$")
STEP_METADATA = "_CHECKPOINT_METADATA"
COMMIT_FILE = "commit_success.txt"
ITEM_MARKERS = ("_METADATA", "_sharding", "manifest.ocdbt", "array_metadatas", "_strings.json")
DEFAULT_ITEM = "default"
METRICS_ITEM = "metrics"


class OrbaxLayout(Layout):
    """Orbax (JAX) step directories holding pytree (zarr/OCDBT) and JSON items."""

    name = "orbax"
    resume_reads = (
        "every item directory of the step (``CheckpointManager.restore``), its "
        "``_METADATA``/OCDBT and array files"
    )
    priority = LayoutTier.FRAMEWORK
    #: ``AtomicRenameTemporaryPath``: a step is written to ``<step>.orbax-checkpoint-tmp`` and
    #: renamed (the commit); deletion renames it back first, so Orbax ignores a half-deleted step
    staging_suffix = ".orbax-checkpoint-tmp"

    def guess_can_open(self, tree: Tree) -> bool:
        return bool(self._step_dirs(tree))

    def _step_dirs(self, tree: Tree) -> dict[str, re.Match | None]:
        """rel path of each step directory ('' when the root is one) -> its name match."""
        below = _children_index(tree)
        found = {}
        top = below.get("", set())
        if _is_step(top, below, "") or (
            "_METADATA" in top and _looks_like_item(top - {"_METADATA"})
        ):
            names = tree.root.rstrip("/").rsplit("/", 2)[::-1]  # its name, then its parent's
            found[""] = next((m for m in map(STEP_RE.match, names[:2]) if m), None)
            return found
        for rel in tree.dirs():
            m = STEP_RE.match(rel)
            if m and _is_step(below.get(rel, set()), below, rel):
                found[rel] = m
        return found

    def scan(self, tree: Tree) -> TreeScan:
        serials: dict[int, SerialInfo] = {}
        for rel, match in sorted(
            self._step_dirs(tree).items(), key=lambda kv: bool(kv[1] and kv[1]["tmp"])
        ):
            info = self._serial(tree, rel, match)
            kept = serials.get(info.serial)
            if kept is None:
                serials[info.serial] = info
            else:  # a finalized step and a leftover tmp dir of the same step: keep the final one
                kept.attrs.setdefault("shadowed", []).append(info.path)
        ordered = [serials[k] for k in sorted(serials)]
        complete = [s.serial for s in ordered if s.complete]
        attrs = {}
        if tree.exists("metadata/_ROOT_METADATA"):
            try:
                attrs["root_metadata"] = loads_json(tree.read_text("metadata/_ROOT_METADATA"))
            except ValueError:
                pass
        return TreeScan(
            ordered, latest=max(complete) if complete else None, latest_rule=True, attrs=attrs
        )

    def _serial(self, tree: Tree, rel: str, match: re.Match | None) -> SerialInfo:
        step = int(match["step"]) if match else 0
        tmp = bool(match and match["tmp"])
        info = SerialInfo(step, tree.abs(rel), step=step)
        prefix = rel + "/" if rel else ""
        meta = {}
        if tree.exists(prefix + STEP_METADATA):
            try:
                meta = loads_json(tree.read_text(prefix + STEP_METADATA))
                if not isinstance(meta, dict):
                    raise ValueError("not a JSON object")
            except ValueError as e:
                info.error = f"{STEP_METADATA}: {e}"
                meta = {}
        handlers = meta.get("item_handlers")
        item_dirs = [d for d in tree.dirs(rel) if d != rel]
        root_item = not rel and _looks_like_item(set(tree.children()))
        if root_item:  # the root is one item directory
            item_dirs = [""]
        pytrees = [d for d in item_dirs if _item_kind(tree, d, _handler(handlers, d)) == "pytree"]
        for item_rel in item_dirs:
            self._add_item(tree, info, item_rel, _handler(handlers, item_rel), len(pytrees))
        if not root_item:
            info.other_files += [tree.abs(f) for f in tree.files(rel, depth=1)]
        info.metrics.update(_numbers(meta.get("metrics")))
        info.complete = self._committed(tree, prefix, tmp, meta)
        commit = meta.get("commit_timestamp_nsecs")
        if isinstance(commit, int) and commit > 0:
            info.timestamp = pd.Timestamp(commit, unit="ns", tz="UTC")  # exact nanoseconds
        info.attrs["item_handlers"] = handlers
        return info

    def _add_item(
        self, tree: Tree, info: SerialInfo, item_rel: str, handler: str, n_pytrees: int
    ) -> None:
        item = TMP_RE.sub("", item_rel.rsplit("/", 1)[-1])
        files = tree.files(item_rel)
        kind = _item_kind(tree, item_rel, handler)
        if kind == "pytree":
            sizes = {f[len(item_rel) + 1 :] if item_rel else f: tree.size(f) for f in files}
            name = "" if item in (DEFAULT_ITEM, "") and n_pytrees <= 1 else item
            ref = FileRef(
                tree.abs(item_rel),
                prefix=name,
                codec="orbax",
                size=sum(sizes.values()),
                hints=OrbaxHints(files=sizes),
            )
            info.files.append(ref)
            return
        data = [f for f in files if not f.endswith("/" + COMMIT_FILE)]
        if item == METRICS_ITEM and len(data) == 1:
            try:
                info.metrics.update(_numbers(loads_json(tree.read_text(data[0]))))
            except ValueError as e:
                info.error = f"{item}: {e}"
            info.other_files += [tree.abs(f) for f in files]
            return
        if kind == "json":
            for f in data:
                name = item if len(data) == 1 else f"{item}/{f[len(item_rel) + 1 :]}"
                info.files.append(
                    FileRef(
                        tree.abs(f),
                        prefix=name,
                        kind="trainer",
                        codec="orbax-json",
                        size=tree.size(f),
                    )
                )
            info.other_files += [tree.abs(f) for f in files if f not in data]
            return
        info.other_files += [tree.abs(f) for f in files]

    # -- management: copies are staged and renamed; commit_success.txt files written last
    def commit_markers(self, tree: Tree, info: SerialInfo) -> list[str]:
        """The ``commit_success.txt`` files (step and items): current Orbax writes them on
        every filesystem, and on gs:// (``CommitFileTemporaryPath``) they are the commit."""
        files = self.serial_files(tree, info)
        return [f for f in files if f.rsplit("/", 1)[-1] == COMMIT_FILE]

    def staging_for(self, tree: Tree) -> str | None:
        """No staging on gs:// (no atomic rename: ``CommitFileTemporaryPath``): the final dir
        is written directly, ``commit_success.txt`` last, and deleted first."""
        return None if _on_gcs(tree) else self.staging_suffix

    def _committed(self, tree: Tree, prefix: str, tmp: bool, meta: dict) -> bool:
        if tmp:
            return False
        if tree.exists(prefix + COMMIT_FILE):
            return True
        if _on_gcs(tree):
            return False  # CommitFileTemporaryPath: the commit file is the commit
        return not (meta and meta.get("commit_timestamp_nsecs", 0) is None)


def _on_gcs(tree: Tree) -> bool:
    protocols = tree.storage.fs.protocol
    protocols = protocols if isinstance(protocols, tuple) else (protocols,)
    return bool({"gs", "gcs"} & set(protocols))


def _children_index(tree: Tree) -> dict[str, set[str]]:
    """parent rel path -> names directly below it."""
    below: dict[str, set[str]] = defaultdict(set)
    for rel in tree.entries:
        parent, _, name = rel.rpartition("/")
        below[parent].add(name)
    return below


def _is_step(names: set[str], below: dict[str, set[str]], rel: str) -> bool:
    if STEP_METADATA in names:
        return True
    prefix = rel + "/" if rel else ""
    return any(_looks_like_item(below.get(prefix + n, set())) for n in names)


def _looks_like_item(names: set[str]) -> bool:
    return any(n in ITEM_MARKERS or n.startswith("ocdbt.process_") for n in names)


def _handler(handlers, item_rel: str) -> str:
    item = TMP_RE.sub("", item_rel.rsplit("/", 1)[-1])
    if isinstance(handlers, dict):
        return str(handlers.get(item) or "")
    return str(handlers or "") if item == DEFAULT_ITEM else ""


def _item_kind(tree: Tree, item_rel: str, handler: str) -> str:
    """'pytree', 'json' or 'other' from the item's files (and its handler class when recorded)."""
    names = set(tree.children(item_rel))
    if _looks_like_item(names) or any(tree.exists(f"{item_rel}/{n}/.zarray") for n in names):
        return "pytree"
    if "Json" in handler or (not handler and names - {COMMIT_FILE} and _all_small(tree, item_rel)):
        return "json"
    return "other"


def _all_small(tree: Tree, item_rel: str) -> bool:
    files = tree.files(item_rel)
    return bool(files) and all(tree.size(f) <= 1 << 20 for f in files) and len(files) <= 4


def _numbers(doc) -> dict[str, float]:
    if not isinstance(doc, dict):
        return {}
    return {
        k: float(v)
        for k, v in doc.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
