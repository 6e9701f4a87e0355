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

A template is a name without its number *and* its ending, so Paddle hapi's ``100.pdparams`` +
``100.pdopt`` (``Model.save``: the number is the epoch) are two templates of serial 100: the
``.pdopt`` file's variables are ``optimizer/…`` of kind optimizer, and a serial whose partner
file is missing is incomplete. ``final.pdparams``, ``best.pt`` … name no serial: they are listed
in ``attrs["unnumbered_files"]``. Decimals in a name are the serial's ``metrics`` (Keras
``ModelCheckpoint``'s ``weights.{epoch:02d}-{val_loss:.2f}.weights.h5`` -> ``weights.07-0.41``:
serial and epoch 7, ``{"filename_metric": 0.41}``; where the template writes the metric's word,
that word: ``loss_0.41`` gives ``loss``).
A tree that is one file of a family that joined later (:data:`DIR_ONLY`) opens as before, with
the ``files`` layout.
"""

from __future__ import annotations

import posixpath
from collections import Counter

from .. import registry
from ..formats.hf_files import weight_refs
from ..model import FileRef, SerialInfo, TreeScan
from ..tree import Tree
from .base import Layout, LayoutTier, Parsed, parse_name, renumber

#: endings numbered in a directory only: a tree that is one such file keeps the ``files``
#: layout (serial 0) it always had (Paddle pickles, Keras HDF5, GGUF)
DIR_ONLY = (".pdparams", ".pdopt", ".weights.h5", ".keras", ".h5", ".hdf5", ".gguf")
#: the kind of a file's variables by its ending (its template's words say nothing)
SUFFIX_KINDS = {".pdopt": "optimizer"}
#: the prefix of a template told apart from another by its ending alone
SUFFIX_PREFIXES = {".pdopt": "optimizer", ".pdparams": "model"}
#: endings whose bare-number files are numbered by epoch (Paddle hapi ``ModelCheckpoint``)
EPOCH_SUFFIXES = (".pdparams", ".pdopt")

Template = tuple[str, str]  # (label, ending)


def _stem(name: str, suffixes: tuple[str, ...]) -> str:
    suffix = _suffix(name, suffixes)
    return name[: -len(suffix)] if suffix else name


def _suffix(name: str, suffixes: tuple[str, ...]) -> str:
    """The (lower-case) save ending ``name`` has, longest first; "" for none."""
    low = name.lower()
    return next((s for s in suffixes if low.endswith(s)), "")


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
            if not name.lower().endswith(suffixes):
                continue
            if tree.single and name.lower().endswith(DIR_ONLY):
                continue
            if p := parse_name(_stem(name, suffixes)):
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
        keys = {rel: (p.label, _suffix(posixpath.basename(rel), suffixes))
                for rel, p in files.items()}  # fmt: skip
        counts = Counter(keys.values())
        shared = {label for label, n in Counter(k[0] for k in counts).items() if n > 1}
        many = any(len(v) > 1 for v in by_serial.values())
        main = _main_template(counts) if many else None
        serials = []
        for serial, rels in sorted(by_serial.items()):
            refs = []
            for rel in sorted(rels):
                label, suffix = keys[rel]
                if not many or keys[rel] == main:
                    prefix = ""
                elif label in shared:  # told apart by the ending: 100.pdparams / 100.pdopt
                    ending = SUFFIX_PREFIXES.get(suffix, suffix.strip(".").replace(".", "_"))
                    prefix = "_".join(filter(None, [label, ending]))
                else:
                    prefix = label or _stem(posixpath.basename(rel), suffixes)
                kind = _kind(label) or SUFFIX_KINDS.get(suffix)
                refs.append(FileRef(tree.abs(rel), prefix=prefix, kind=kind, size=tree.size(rel)))
            steps = {files[r].step for r in rels} - {None}
            epochs = {files[r].epoch for r in rels} - {None}
            if not epochs and all(keys[r][0] == "" and keys[r][1] in EPOCH_SUFFIXES for r in rels):
                epochs = {serial}  # hapi: ``{epoch}.pdparams``
            metrics: dict[str, float] = {}
            for r in rels:
                metrics.update(files[r].metrics)
            path = next((r.path for r in refs if not r.prefix), refs[0].path)
            serials.append(SerialInfo(serial, path, files=refs, step=_one(steps),
                                      epoch=_one(epochs), metrics=metrics))  # fmt: skip
        if many:
            _mark_missing_templates(serials, [{keys[r]: r for r in by_serial[s.serial]}
                                              for s in serials])  # fmt: skip
        numbered = set(files)
        loose = [
            f for f in tree.files(depth=1) if f not in numbered and f.lower().endswith(suffixes)
        ]
        scan = TreeScan(serials)
        if loose:
            scan.attrs["unnumbered_files"] = loose  # last.pt, final.pdparams …: which serial?
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


def _mark_missing_templates(serials: list[SerialInfo], found: list[dict[Template, str]]) -> None:
    """Mark incomplete a serial lacking a file template every other serial has (``found``:
    per serial, template -> one of its files), naming the file it lacks."""
    for i, info in enumerate(serials):
        others = [(s.serial, f) for j, (s, f) in enumerate(zip(serials, found)) if j != i]
        if not others:
            continue
        missing = set.intersection(*(set(f) for _, f in others)) - set(found[i])
        if missing:
            info.complete = False
            serial, example = others[0]
            names = ", ".join(_missing_name(example[key], serial, info.serial)
                              for key in sorted(missing))  # fmt: skip
            info.error = f"no {names} file, which every other serial has: cut short"


def _missing_name(example: str, old: int, new: int) -> str:
    """The file serial ``new`` lacks, named after serial ``old``'s file of that template."""
    name = posixpath.basename(example)
    try:
        return repr(renumber(name, old, new))
    except ValueError:
        return repr(name)


def _main_template(counts: Counter) -> Template | None:
    """The template that keeps plain variable names (None: every file is prefixed). A tie
    between templates differing by their ending only goes to the one not of a kind
    (``100.pdparams`` over ``100.pdopt``)."""
    top = counts.most_common()
    best = [k for k, n in top if n == top[0][1]]
    if len(best) == 1:
        return best[0]
    plain = [k for k in best if _kind(k[0]) is None and k[1] not in SUFFIX_KINDS]
    if len({k[0] for k in best}) == 1 and len(plain) == 1:
        return plain[0]
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
