"""Restore a serial: as a copy in another tree, or in place so the framework resumes from it.

Layouts say *what* to do as Op lists (``Layout.export_ops`` / ``promote_ops``); this module
checks, journals, locks and runs them. Until a layout overrides a hook itself, the small
per-family fallbacks below (keyed by layout name) supply what its framework needs.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

from .io import Storage
from .journal import Journal, OpRunner, TreeLock
from .layouts.base import Layout, Op
from .model import SerialInfo, TreeScan
from .tree import Tree

OP_COLUMNS = ["kind", "path", "src", "nbytes", "note"]


def ops_frame(ops: list[Op]) -> pd.DataFrame:
    df = pd.DataFrame([(o.kind, o.path, o.src, o.nbytes, o.note) for o in ops], columns=OP_COLUMNS)
    df.index.name = "step"
    return df.astype({"nbytes": "int64"})


@dataclass
class RestoreResult:
    """What a restore did (or, with ``dry_run``, would do)."""

    serial: int
    target: str  # URL of the tree that changes
    new_serial: int | None  # the serial number the restored copy has there
    ops: pd.DataFrame = field(repr=False)
    dry_run: bool
    done: bool
    message: str = ""

    def __str__(self) -> str:
        verb = "would" if self.dry_run else ("did" if self.done else "did not")
        head = f"restore serial {self.serial} -> {self.target}: {verb} run {len(self.ops)} steps"
        if self.message:
            head += f" ({self.message})"
        with pd.option_context("display.max_colwidth", 80, "display.width", 200):
            return head + ("\n" + self.ops.to_string() if len(self.ops) else "")

    def _repr_html_(self) -> str:
        return f"<p>{str(self).splitlines()[0]}</p>" + self.ops.to_html()


# -- per-family fallbacks (used only where the layout does not override the hook) ----------
class _PaddleFluid:
    def commit_markers(self, tree: Tree, info: SerialInfo) -> list[str]:
        found = [f for f in self.serial_files(tree, info) if f.rsplit("/", 1)[-1] == "_SUCCESS"]
        return sorted(found, key=lambda f: ("/__model__/" in f, f))  # __model__/_SUCCESS last

    def marker_data(self, tree: Tree, info: SerialInfo, rel: str) -> bytes | None:
        return time.ctime().encode()  # what fluid's _write_success records


class _PaddleIncubate:
    staging_suffix = ".tmp"  # __paddle_checkpoint__.N.tmp renamed to __paddle_checkpoint__.N


class _HF:
    def commit_markers(self, tree: Tree, info: SerialInfo) -> list[str]:
        return [f for f in self.serial_files(tree, info) if f.endswith("/trainer_state.json")]


class _DCP:
    def commit_markers(self, tree: Tree, info: SerialInfo) -> list[str]:
        return [f for f in self.serial_files(tree, info) if f.endswith(".metadata")]


class _Orbax:
    staging_suffix = ".orbax-checkpoint-tmp"

    def commit_markers(self, tree: Tree, info: SerialInfo) -> list[str]:
        files = self.serial_files(tree, info)
        return [f for f in files if f.rsplit("/", 1)[-1] == "commit_success.txt"]

    def delete_ops(self, tree: Tree, scan: TreeScan, info: SerialInfo) -> list[Op]:
        """Rename the step to its tmp name first (Orbax then ignores it), then delete."""
        base = tree.rel(info.path)
        ops = Layout.delete_ops(self, tree, scan, info)
        if not (base and tree.is_dir(base)):
            return ops
        gone = base + self.staging_suffix

        def moved(rel: str) -> str:
            return gone + rel[len(base) :]

        rest = [Op(o.kind, moved(o.path), nbytes=o.nbytes, note=o.note) for o in ops]
        return [Op("rename", gone, src=base, note="uncommit"), *rest]


class _DeepSpeed:
    def _latest(self, tree: Tree, info: SerialInfo) -> Op:
        tag = tree.rel(info.path).rsplit("/", 1)[-1]
        return Op("write", "latest", data=tag.encode(), replace=True, note="state")

    def promote_ops(self, tree: Tree, scan: TreeScan, info: SerialInfo) -> list[Op]:
        return [self._latest(tree, info)]

    def export_ops(self, tree: Tree, scan: TreeScan, info: SerialInfo) -> list[Op]:
        return [*self.copy_ops(tree, info), self._latest(tree, info)]


class _TF:
    def commit_markers(self, tree: Tree, info: SerialInfo) -> list[str]:
        return [f for f in self.serial_files(tree, info) if f.endswith(".index")]

    def _prefix(self, tree: Tree, info: SerialInfo) -> str:
        index = self.commit_markers(tree, info)
        if not index:
            raise ValueError(f"serial {info.serial} has no .index file")
        return index[0][: -len(".index")]

    def _state(self, tree: Tree, prefix: str, drop: bool = False) -> Op:
        text = tree.read_text("checkpoint") if tree.exists("checkpoint") else ""
        state = parse_tf_state(text)
        name = prefix.rsplit("/", 1)[-1]
        kept = [(p, t) for p, t in state["all"] if p.rsplit("/", 1)[-1] != name]
        if not drop:
            kept.append((prefix, time.time()))
            state["model"] = prefix
        state["all"] = kept
        return Op("write", "checkpoint", data=format_tf_state(state).encode(), replace=True,
                  note="state")  # fmt: skip

    def promote_ops(self, tree: Tree, scan: TreeScan, info: SerialInfo) -> list[Op]:
        return [self._state(tree, self._prefix(tree, info))]

    def export_ops(self, tree: Tree, scan: TreeScan, info: SerialInfo) -> list[Op]:
        prefix = self._prefix(tree, info)
        state = {"model": prefix, "all": [(prefix, time.time())], "preserved": None}
        data = format_tf_state(state).encode()
        return [*self.copy_ops(tree, info), Op("write", "checkpoint", data=data, note="state")]

    def delete_ops(self, tree: Tree, scan: TreeScan, info: SerialInfo) -> list[Op]:
        ops = Layout.delete_ops(self, tree, scan, info)
        if tree.exists("checkpoint"):
            ops.insert(0, self._state(tree, self._prefix(tree, info), drop=True))
        return ops


FALLBACKS: dict[str, type] = {
    "paddle-fluid": _PaddleFluid,
    "paddle-incubate": _PaddleIncubate,
    "hf-trainer": _HF,
    "dcp": _DCP,
    "orbax": _Orbax,
    "deepspeed": _DeepSpeed,
    "tf": _TF,
}
_MANAGED: dict[type, type] = {}
HOOKS = ("serial_files", "commit_markers", "marker_data", "relocate", "export_ops",
         "next_serial", "promote_ops", "delete_ops", "staging_suffix")  # fmt: skip


def managed(layout: Layout) -> Layout:
    """The layout with its family's fallback hooks filled in where it has none of its own."""
    mixin = FALLBACKS.get(layout.name)
    if mixin is None:
        return layout
    cls = type(layout)
    if cls not in _MANAGED:
        own = {h: getattr(mixin, h) for h in HOOKS
               if h in vars(mixin) and getattr(cls, h) is getattr(Layout, h)}  # fmt: skip
        if own:  # the fallback's private helpers come along
            own.update({k: v for k, v in vars(mixin).items()
                        if k.startswith("_") and not k.startswith("__")})  # fmt: skip
        _MANAGED[cls] = type(f"Managed{cls.__name__}", (cls,), own) if own else cls
    return layout if _MANAGED[cls] is cls else _MANAGED[cls]()


# -- TF CheckpointState text -----------------------------------------------------------------
_LINE = re.compile(r"^\s*(\w+)\s*:\s*(.*?)\s*$")


def parse_tf_state(text: str) -> dict:
    """``model`` path, ``all`` [(path, timestamp or None)], ``preserved`` timestamp."""
    model, paths, stamps, preserved = None, [], [], None
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        key, value = m.groups()
        if key == "model_checkpoint_path":
            model = _unquote(value)
        elif key == "all_model_checkpoint_paths":
            paths.append(_unquote(value))
        elif key == "all_model_checkpoint_timestamps":
            stamps.append(float(value))
        elif key == "last_preserved_timestamp":
            preserved = float(value)
    if len(stamps) != len(paths):
        stamps = [None] * len(paths)
    return {"model": model, "all": list(zip(paths, stamps)), "preserved": preserved}


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1].encode().decode("unicode_escape")
    return value


def format_tf_state(state: dict) -> str:
    quote = lambda p: '"' + p.replace("\\", "\\\\").replace('"', '\\"') + '"'  # noqa: E731
    lines = [f"model_checkpoint_path: {quote(state['model'])}"] if state.get("model") else []
    lines += [f"all_model_checkpoint_paths: {quote(p)}" for p, _ in state["all"]]
    if state["all"] and all(t is not None for _, t in state["all"]):
        lines += [f"all_model_checkpoint_timestamps: {t!r}" for _, t in state["all"]]
    if state.get("preserved") is not None:
        lines.append(f"last_preserved_timestamp: {state['preserved']!r}")
    return "\n".join(lines) + "\n"


# -- restore -------------------------------------------------------------------------------
def serial_info(cat, serial: int) -> SerialInfo:
    for s in cat.scan.serials:
        if s.serial == serial:
            return s
    raise KeyError(f"no serial {serial}; serials: {sorted(s.serial for s in cat.scan.serials)}")


def restore(cat, serial: int, to: str | os.PathLike | None = None, dry_run: bool = False,
            storage_options: dict | None = None, force: bool = False,
            progress: Callable[[int], None] | None = None) -> RestoreResult:  # fmt: skip
    """Copy ``serial`` to ``to`` as a resumable tree, or promote it in place (never deletes)."""
    if to is not None:
        dest, root = Storage.from_url(os.fspath(to), storage_options)
        return export_to(cat, serial, dest.fs, root, dry_run, force, progress)
    serial = _checked(cat, serial, force)
    if cat.latest == serial:
        return RestoreResult(serial, cat.url, serial, ops_frame([]), dry_run, not dry_run,
                             "already the serial the framework resumes from")  # fmt: skip
    layout = managed(cat._layout)
    ops = layout.promote_ops(cat.tree, cat.scan, serial_info(cat, serial))
    copies = any(o.kind == "copy" for o in ops)
    new_serial = layout.next_serial(cat.tree, cat.scan) if copies else serial
    result = RestoreResult(serial, cat.url, new_serial, ops_frame(ops), dry_run, False)
    if not dry_run:
        run_change(cat, cat.storage.fs, cat.tree.root, ops, result, progress)
        cat.refresh()
    return result


def export_to(cat, serial: int, fs, root: str, dry_run: bool = False, force: bool = False,
              progress: Callable[[int], None] | None = None) -> RestoreResult:  # fmt: skip
    """Copy ``serial`` into the tree at ``root`` of filesystem ``fs``."""
    serial = _checked(cat, serial, force)
    ops = managed(cat._layout).export_ops(cat.tree, cat.scan, serial_info(cat, serial))
    clash = [o.path for o in ops if not o.replace and fs.exists(_join(root, o.path))]
    if clash:
        raise FileExistsError(f"{root} already holds {clash[0]} (restore never overwrites)")
    url = Storage(fs).url(root)
    result = RestoreResult(serial, url, serial, ops_frame(ops), dry_run, False)
    if not dry_run:
        run_change(cat, fs, root, ops, result, progress)
    return result


def _checked(cat, serial: int, force: bool) -> int:
    serial = int(serial)
    serial_info(cat, serial)
    if not bool(cat.serials.loc[serial, "complete"]) and not force:
        raise ValueError(f"serial {serial} is incomplete; restoring it needs force=True")
    return serial


def run_change(cat, fs, root: str, ops: list[Op], result: RestoreResult,
               progress: Callable[[int], None] | None) -> None:  # fmt: skip
    """Run a restore's ops under the target tree's lock, journaled, rolled back on failure."""
    journal = Journal(fs, root)
    with TreeLock(fs, root, f"restore {result.serial}"):
        journal.write("begin", action="restore", serial=result.serial, source=cat.url,
                      target=result.target, steps=len(ops))  # fmt: skip
        runner = OpRunner(fs, root, src_fs=cat.storage.fs, journal=journal, progress=progress)
        runner.run(ops, rollback=True)
        journal.write("end", action="restore", serial=result.serial, new_serial=result.new_serial)
    result.done = True


def _join(root: str, rel: str) -> str:
    return root.rstrip("/") + "/" + rel if root not in ("", "/") else "/" + rel
