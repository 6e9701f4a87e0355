"""PyTorch Lightning ``ModelCheckpoint`` trees (specs/modern.md §7).

Every ``*.ckpt`` is one serial, numbered by its global step: from the file name
(``epoch=1-step=200.ckpt``, ``…-v1.ckpt``) or, for names without ``step=``, from the
``global_step`` stored in the file. ``last.ckpt`` / ``last-vN.ckpt`` are aliases of the serial
whose step they hold (a serial of their own only when no other file has that step); Lightning
resumes (``ckpt_path="last"``) from the newest ``last*.ckpt``, else we take the largest step.
Files are written atomically, so a file that parses is complete. Metrics: the
ModelCheckpoint callback state (``best_k_models`` scores under the monitor's name) and
CSVLogger ``metrics.csv`` rows (logged at global step - 1); ``hparams.yaml`` goes to attrs.
"""

from __future__ import annotations

import csv
import io
import math
import posixpath
import re
from typing import TYPE_CHECKING, Any

import numpy as np

from ..dtypes import np_dtype
from ..io import Blob
from ..model import FileRef, Op, SerialInfo, TreeScan
from ..tree import Tree
from .base import Layout, LayoutTier

if TYPE_CHECKING:
    from ..formats.torch_pickle import ZipRecord

LAST = re.compile(r"^last(?:-v(\d+))?\.ckpt$")
STEP = re.compile(r"(?<![A-Za-z0-9_])step=(\d+)")
GLOBAL_STEP = re.compile(r"global_step=(\d+)")
EPOCH = re.compile(r"(?<![A-Za-z0-9_])epoch=(\d+)")
VERSION = re.compile(r"-v(\d+)\.ckpt$")


# -- peeking into torch files (the pickle only; tensors stay unread) ---------------------------
class TorchPeek:
    """The unpickled object of a torch file and a reader for its small scalar tensors (the
    torch codec opens the file: :func:`ckptview.codecs.torch.open_torch`)."""

    def __init__(self, blob: Blob):
        from ..formats.torch_pickle import open_torch  # the pickle machine: when a file is read

        self.blob = blob
        opened = open_torch(blob, views_ok=True)
        self.records: dict[str, ZipRecord] = opened.records  # storage key -> its bytes
        self.big_endian = opened.big_endian
        self.obj = opened.obj

    def scalar(self, value: Any) -> float | None:
        """A number, or the value of a one-element tensor (one small ranged read)."""
        if isinstance(value, bool):
            return float(value)
        if isinstance(value, (int, float)):
            return float(value)
        from ..formats.pickle import StorageRef, TensorRef

        if not isinstance(value, TensorRef) or value.numel != 1:
            return None
        storage = value.storage
        if not isinstance(storage, StorageRef) or storage.key not in self.records:
            return None
        dt = np_dtype(value.dtype)
        if self.big_endian and dt.itemsize > 1:
            dt = dt.newbyteorder(">")
        record = self.records[storage.key]
        at = value.storage_offset * dt.itemsize
        if at + dt.itemsize > record.size:
            return None
        raw = record.fetch(self.blob, at, dt.itemsize)[1]
        return float(np.frombuffer(raw, dtype=dt)[0])


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# -- the layout -------------------------------------------------------------------------------
class LightningLayout(Layout):
    """``ModelCheckpoint`` output (``…/checkpoints/*.ckpt``), anywhere below the root."""

    name = "lightning"
    resume_reads = "the one ``.ckpt`` file (``Trainer.fit(ckpt_path=...)``)"
    priority = LayoutTier.CONVENTION

    def guess_can_open(self, tree: Tree) -> bool:
        for rel in self._ckpts(tree):
            name = posixpath.basename(rel)
            parent = posixpath.basename(posixpath.dirname(rel))
            if LAST.match(name) or "=" in name or parent == "checkpoints":
                return True
        return False

    def _ckpts(self, tree: Tree) -> list[str]:
        return [f for f in tree.files() if f.endswith(".ckpt")]

    def scan(self, tree: Tree) -> TreeScan:
        files = self._ckpts(tree)
        lasts = [f for f in files if LAST.match(posixpath.basename(f))]
        peeks: dict[str, TorchPeek | None] = {}
        by_serial: dict[int, list[tuple[str, int | None]]] = {}
        unresolved = []
        for rel in files:
            if rel in lasts:
                continue
            name = posixpath.basename(rel)
            step, epoch = _name_step(name), _name_epoch(name)
            if step is None:
                peek = peeks[rel] = _peek(tree, rel)
                if peek is not None and isinstance(peek.obj, dict):
                    step = _int(peek.obj.get("global_step"))
                    epoch = epoch if epoch is not None else _int(peek.obj.get("epoch"))
            if step is None:
                unresolved.append(rel)
                continue
            by_serial.setdefault(step, []).append((rel, epoch))
        serials: dict[int, SerialInfo] = {}
        for step, entries in sorted(by_serial.items()):
            entries.sort(key=lambda e: (_version(e[0]), tree.info(e[0]).get("mtime") or 0))
            rel, epoch = entries[-1]
            info = SerialInfo(step, tree.abs(rel), files=[_ref(tree, rel)], epoch=epoch, step=step)
            if len(entries) > 1:
                info.other_files = [tree.abs(r) for r, _ in entries[:-1]]
                info.attrs["duplicates"] = [r for r, _ in entries[:-1]]
            serials[step] = info
        last_serial = None
        newest_last = max(lasts, key=lambda r: (tree.info(r).get("mtime") or 0, _version(r)),
                          default=None)  # fmt: skip
        for rel in sorted(lasts):
            peek = peeks[rel] = _peek(tree, rel)
            obj = peek.obj if peek is not None and isinstance(peek.obj, dict) else {}
            step = _int(obj.get("global_step"))
            if step is None:
                unresolved.append(rel)
                continue
            if step in serials:
                serials[step].aliases += (tree.abs(rel),)
            else:
                epoch = _int(obj.get("epoch"))
                serials[step] = SerialInfo(step, tree.abs(rel), files=[_ref(tree, rel)],
                                           epoch=epoch, step=step)  # fmt: skip
            if rel == newest_last:
                last_serial = step
        scan = TreeScan(sorted(serials.values(), key=lambda s: s.serial))
        if last_serial is not None:
            scan.latest, scan.latest_rule = last_serial, True
        if unresolved:
            scan.attrs["unresolved_files"] = unresolved
            scan.file_errors = {rel: _why_unplaced(tree, rel, peeks.get(rel)) for rel in unresolved}
        self._callback_metrics(tree, scan, serials, peeks, newest_last or _newest(tree, serials))
        self._logger_records(tree, scan)
        return scan

    def _callback_metrics(self, tree: Tree, scan: TreeScan, serials: dict[int, SerialInfo],
                          peeks: dict, rel: str | None) -> None:  # fmt: skip
        """Scores from the ModelCheckpoint state stored in the newest checkpoint."""
        if rel is None:
            return
        peek = peeks.get(rel) or _peek(tree, rel)
        if peek is None or not isinstance(peek.obj, dict):
            return
        by_name = {}
        for s in serials.values():
            for p in (s.path, *s.other_files, *s.aliases):
                by_name[posixpath.basename(p)] = s.serial
        callbacks = peek.obj.get("callbacks")
        if not isinstance(callbacks, dict):
            return
        for key, state in callbacks.items():
            if not (isinstance(key, str) and key.startswith("ModelCheckpoint")):
                continue
            if not isinstance(state, dict):
                continue
            monitor = state.get("monitor")
            best_path = state.get("best_model_path")
            if isinstance(best_path, str) and best_path:
                scan.attrs.setdefault("best_model_path", best_path)
                best = by_name.get(posixpath.basename(best_path))
                if best is not None:
                    scan.attrs.setdefault("best_serial", best)
            score = peek.scalar(state.get("best_model_score"))
            if score is not None:
                scan.attrs.setdefault("best_model_score", score)
            if isinstance(monitor, str):
                scan.attrs.setdefault("monitor", monitor)
                kmodels = state.get("best_k_models")
                for path, value in kmodels.items() if isinstance(kmodels, dict) else []:
                    serial = by_name.get(posixpath.basename(str(path)))
                    v = peek.scalar(value)
                    if serial is not None and v is not None and math.isfinite(v):
                        scan.metrics.append((serial, monitor, v))
            if isinstance(state.get("last_model_path"), str) and state["last_model_path"]:
                scan.attrs.setdefault("last_model_path", state["last_model_path"])

    def _logger_records(self, tree: Tree, scan: TreeScan) -> None:
        """CSVLogger ``metrics.csv`` rows (serial = logged step + 1) and ``hparams.yaml``."""
        rows = []
        for rel in tree.files():
            name = posixpath.basename(rel)
            if name == "metrics.csv":
                rows += _csv_metrics(tree.read_text(rel, limit=64 << 20))
            elif name == "hparams.yaml" and "hparams" not in scan.attrs:
                hp = _yaml(tree.read_text(rel))
                if hp:
                    scan.attrs["hparams"] = hp
        csv_keys = {(s, n) for s, n, _ in rows}
        scan.metrics = [m for m in scan.metrics if (m[0], m[1]) not in csv_keys] + rows

    # -- management: files are atomic; ``last*.ckpt`` (newest mtime) is Lightning's resume point
    def serial_files(self, tree: Tree, info: SerialInfo) -> list[str]:
        """The serial's file and its duplicates (``-vN`` re-saves); aliases are not copied."""
        return [tree.rel(p) for p in (info.path, *info.other_files)]

    def _lasts(self, tree: Tree) -> list[str]:
        return [f for f in self._ckpts(tree) if LAST.match(posixpath.basename(f))]

    def promoted_serial(self, tree: Tree, scan: TreeScan, info: SerialInfo) -> int:
        return info.serial if self._lasts(tree) else self.next_serial(tree, scan)

    def promote_ops(self, tree: Tree, scan: TreeScan, info: SerialInfo) -> list[Op]:
        """Without ``last*.ckpt``: copy the file as the next serial's (``step=`` renumbered).
        With one: ``ckpt_path="last"`` resumes from the newest ``last*`` by mtime, so the file
        is copied to a new ``last-vK.ckpt`` beside it (``last.ckpt`` itself is never touched)."""
        rel = tree.rel(info.path)
        lasts = self._lasts(tree)
        if lasts:
            folder = posixpath.dirname(max(lasts, key=lambda r: tree.info(r).get("mtime") or 0))
            k = 1 + max((int(m[1] or 0) for r in lasts if (m := LAST.match(posixpath.basename(r)))
                         and posixpath.dirname(r) == folder), default=0)  # fmt: skip
            dest = posixpath.join(folder, f"last-v{k}.ckpt")
        else:
            new = self.next_serial(tree, scan)
            folder, name = posixpath.split(rel)
            if STEP.search(name):
                name = STEP.sub(f"step={new}", name)
            else:
                epoch = f"epoch={info.epoch}-" if info.epoch is not None else ""
                name = f"{epoch}step={new}.ckpt"
            dest = posixpath.join(folder, name)
        return [Op("copy", dest, src=tree.abs(rel), nbytes=tree.size(rel))]

    def delete_ops(self, tree: Tree, scan: TreeScan, info: SerialInfo) -> list[Op]:
        """The serial's files and any older ``last-vN`` alias of it."""
        aliases = [tree.rel(p) for p in info.aliases]
        return super().delete_ops(tree, scan, info) + [
            Op("delete", a, nbytes=tree.size(a)) for a in aliases
        ]


def _name_step(name: str) -> int | None:
    m = STEP.search(name) or GLOBAL_STEP.search(name)
    return int(m[1]) if m else None


def _name_epoch(name: str) -> int | None:
    m = EPOCH.search(name)
    return int(m[1]) if m else None


def _version(rel: str) -> int:
    m = VERSION.search(rel)
    return int(m[1]) if m else 0


def _ref(tree: Tree, rel: str) -> FileRef:
    return FileRef(tree.abs(rel), codec="torch", size=tree.size(rel))


def _peek(tree: Tree, rel: str) -> TorchPeek | None:
    try:
        return TorchPeek(tree.blob(rel))
    except Exception:  # noqa: BLE001 - an unreadable file shows up as an error row later
        return None


def _why_unplaced(tree: Tree, rel: str, peek: TorchPeek | None) -> str:
    """Why a ``.ckpt`` file belongs to no serial: unreadable, or no step in name or content."""
    if peek is None:
        try:
            TorchPeek(tree.blob(rel))
        except Exception as exc:  # noqa: BLE001 - the reason is the message
            return f"not a readable Lightning checkpoint, so no serial: {exc}"
    return "no step in its name and no global_step inside: belongs to no serial"


def _newest(tree: Tree, serials: dict[int, SerialInfo]) -> str | None:
    return tree.rel(serials[max(serials)].path) if serials else None


def _csv_metrics(text: str) -> list[tuple[int, str, float]]:
    out: dict[tuple[int, str], float] = {}
    for row in csv.DictReader(io.StringIO(text)):
        try:
            step = int(float(row.get("step") or ""))
        except ValueError:
            continue
        for key, value in row.items():
            if key in ("step", "epoch") or key is None or value in (None, ""):
                continue
            try:
                out[(step + 1, key)] = float(value)
            except ValueError:
                continue
    return [(s, k, v) for (s, k), v in sorted(out.items())]


def _yaml(text: str) -> dict | None:
    try:
        import yaml

        data = yaml.safe_load(text)
        return data if isinstance(data, dict) else None
    except Exception:  # noqa: BLE001 - no PyYAML or bad YAML: flat "key: value" lines
        out = {}
        for line in text.splitlines():
            if ":" in line and not line.startswith((" ", "#")):
                k, _, v = line.partition(":")
                out[k.strip()] = v.strip()
        return out or None


__all__ = ["LightningLayout", "TorchPeek"]


def __getattr__(name: str) -> Any:
    if name == "Record":  # re-exported, imported on use (the pickle machine is not cheap)
        from ..formats.pickle import Record

        return Record
    raise AttributeError(name)
