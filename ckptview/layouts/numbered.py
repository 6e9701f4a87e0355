"""Numbered checkpoint files or dirs: ``step_100.pt``, ``ckpt_000050.pt``, ``epoch10.pth``,
``model_3.safetensors``, ``step_1.npz`` … or ``checkpoint_3/`` dirs of such files.

No manager: a serial is the number in the name; its files are complete when they parse (a
truncated zip or safetensors fails), and the latest is the largest complete serial. The
number is the one after a step-like keyword (``step``, ``iter``, ``global_step`` …), else a
separate run of digits (``model_3``; ``resnet50`` does not count), else an epoch number.
Where a serial has several files of different naming templates, the main template keeps
plain names and the others are prefixed by their name with the number removed.

No commit marker, so completeness comes from the files: with several templates, a serial
missing a template that every other serial has is incomplete (a save, copy or deletion cut
short between its files; a template only some serials have, ``step_300_compressed.npz``,
makes no other serial incomplete).
ckptview's own changes never leave such a serial under its final name: copies are staged
under ``.ckptview/tmp/`` and renamed into place last (a numbered dir in one rename), and a
deleted numbered dir is first renamed there (``Layout.stage_in_meta``).
Which files are checkpoints: the endings codecs declare as ``save_suffixes``
(:func:`ckptview.registry.save_suffixes`); names parse with :func:`.base.parse_name`.
"""

from __future__ import annotations

import posixpath
from collections import Counter

from .. import registry
from ..formats.hf_files import weight_refs
from ..model import FileRef, SerialInfo, TreeScan
from ..tree import Tree
from .base import Layout, LayoutTier, Parsed, parse_name


def _stem(name: str, suffixes: tuple[str, ...]) -> str:
    for suffix in suffixes:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name


class NumberedLayout(Layout):
    """A directory of numbered checkpoint files (or numbered dirs of checkpoint files)."""

    name = "numbered"
    resume_reads = "every checkpoint file of the serial (the script's own ``load``: all of them)"
    priority = LayoutTier.GENERIC
    stage_in_meta = True

    def guess_can_open(self, tree: Tree) -> bool:
        return bool(self._files(tree) or self._dirs(tree))

    def _files(self, tree: Tree) -> dict[str, Parsed]:
        """The numbered checkpoint files at the top of the tree (parsed once per listing:
        detection asks, then the scan; the dict is only read)."""
        suffixes = registry.save_suffixes()
        return tree.per_listing(("numbered", suffixes), lambda: self._parse_files(tree, suffixes))

    @staticmethod
    def _parse_files(tree: Tree, suffixes: tuple[str, ...]) -> dict[str, Parsed]:
        out = {}
        for rel in tree.files(depth=1):
            name = posixpath.basename(rel)
            if name.lower().endswith(suffixes) and (p := parse_name(_stem(name, suffixes))):
                out[rel] = p
        return out

    def _dirs(self, tree: Tree) -> dict[str, Parsed]:
        suffixes = registry.save_suffixes()
        out = {}
        for rel in tree.dirs():
            p = parse_name(posixpath.basename(rel))
            if p and any(f.lower().endswith(suffixes) for f in tree.files(under=rel, depth=2)):
                out[rel] = p
        return out

    def scan(self, tree: Tree) -> TreeScan:
        files = self._files(tree)
        if files:
            return self._scan_files(tree, files)
        return self._scan_dirs(tree, self._dirs(tree))

    def _scan_files(self, tree: Tree, files: dict[str, Parsed]) -> TreeScan:
        suffixes = registry.save_suffixes()
        by_serial: dict[int, list[str]] = {}
        for rel, p in files.items():
            by_serial.setdefault(p.serial, []).append(rel)
        labels = Counter(p.label for p in files.values())
        many = any(len(v) > 1 for v in by_serial.values())
        main = _main_label(labels) if many else None
        serials = []
        for serial, rels in sorted(by_serial.items()):
            refs = []
            for rel in sorted(rels):
                p = files[rel]
                prefix = (
                    ""
                    if not many or p.label == main
                    else p.label or _stem(posixpath.basename(rel), suffixes)
                )
                kind = _kind(p.label)
                refs.append(FileRef(tree.abs(rel), prefix=prefix, kind=kind, size=tree.size(rel)))
            steps = {files[r].step for r in rels} - {None}
            epochs = {files[r].epoch for r in rels} - {None}
            path = next((r.path for r in refs if not r.prefix), refs[0].path)
            serials.append(
                SerialInfo(serial, path, files=refs, step=_one(steps), epoch=_one(epochs))
            )
        if many:
            _mark_missing_templates(serials, [{files[r].label for r in by_serial[s.serial]}
                                              for s in serials])  # fmt: skip
        numbered = set(files)
        loose = [
            f for f in tree.files(depth=1) if f not in numbered and f.lower().endswith(suffixes)
        ]
        scan = TreeScan(serials)
        if loose:
            scan.attrs["unnumbered_files"] = loose  # last.pt, best.pt …: which serial is unknown
        return scan

    def _scan_dirs(self, tree: Tree, dirs: dict[str, Parsed]) -> TreeScan:
        suffixes = registry.save_suffixes()
        serials = []
        seen: dict[int, str] = {}
        for rel, p in sorted(dirs.items(), key=lambda kv: kv[1].serial):
            if p.serial in seen:
                continue
            seen[p.serial] = rel
            problems: list[str] = []
            refs, used = weight_refs(tree, rel, problems=problems)
            taken = {tree.rel(r.path) for r in refs} | set(used)
            data = [f for f in tree.files(under=rel, depth=2) if f.lower().endswith(suffixes)]
            for f in data:
                if f in taken:
                    continue
                stem = _stem(f[len(rel) + 1 :], suffixes)
                refs.append(FileRef(tree.abs(f), prefix=stem, kind=_kind(stem), size=tree.size(f)))
            if len(refs) == 1 and not refs[0].prefix.startswith("model"):
                refs[0].prefix = ""
            paths = {tree.rel(r.path) for r in refs}
            others = [tree.abs(f) for f in tree.files(under=rel) if f not in paths]
            serials.append(SerialInfo(p.serial, tree.abs(rel), files=refs, other_files=others,
                                      step=p.step, epoch=p.epoch,
                                      error="; ".join(problems) or None))  # fmt: skip
        return TreeScan(serials)


def _mark_missing_templates(serials: list[SerialInfo], labels: list[set[str]]) -> None:
    """Mark incomplete a serial lacking a file template every other serial has."""
    for i, info in enumerate(serials):
        others = labels[:i] + labels[i + 1 :]
        if not others:
            continue
        missing = set.intersection(*others) - labels[i]
        if missing:
            info.complete = False
            names = ", ".join(repr(m or "(plain)") for m in sorted(missing))
            info.error = f"no {names} file, which every other serial has: cut short"


def _main_label(labels: Counter) -> str | None:
    """The naming template that keeps plain variable names (None: every file is prefixed)."""
    top = labels.most_common(2)
    if len(top) == 1 or top[0][1] > top[1][1]:
        return top[0][0]
    return None


def _one(values: set[int | None]) -> int | None:
    return next(iter(values)) if len(values) == 1 else None


def _kind(label: str) -> str | None:
    low = label.lower()
    if "optim" in low:
        return "optimizer"
    if "sched" in low:
        return "scheduler"
    if "rng" in low or "random" in low:
        return "rng"
    return None
