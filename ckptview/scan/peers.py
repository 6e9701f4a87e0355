"""Serials whose variables do not fit the run's model: for formats whose framework loads a
save into a model built at the run's shapes (Keras ``load_weights``: a layer of another
size is refused), a serial whose shapes differ from those most of the run's serials share
does not load. A file opened on its own is held to its two nearest sibling saves of the same
naming template (a directory listing and two header reads); with fewer, or when they
disagree, nothing is said."""

from __future__ import annotations

import posixpath
from collections import Counter

from .. import registry
from ..layouts.base import parse_name
from ..model import FileRef
from ..tree import Tree
from .listing import FileResult, list_file

Signature = frozenset[tuple[str, tuple[int, ...]]]


def loads_into_model(res: FileResult) -> bool:
    """Whether the framework loads this file into a model built at the run's shapes."""
    if res.codec is None:
        return False
    try:
        codec = registry.get_codec(res.codec)
    except ValueError:  # the logical view's assembled and quantized groups
        return False
    return bool(getattr(codec, "loads_into_model", False))


def signature(results: list[FileResult]) -> Signature:
    """Every (name, shape) of a serial's model-loaded files (variables without error)."""
    return frozenset((v.name, tuple(v.shape)) for r in results for v in r.variables
                     if not v.error)  # fmt: skip


def drift(tree: Tree, results: list[FileResult]) -> dict[int, list[str]]:
    """Serial -> why its shapes do not fit the run's (none when all fit or no rule applies)."""
    mine = [r for r in results if loads_into_model(r) and not r.error]
    if not mine:
        return {}
    by_serial: dict[int, list[FileResult]] = {}
    for r in mine:
        by_serial.setdefault(r.serial, []).append(r)
    if tree.single and len(by_serial) == 1:
        serial, files = next(iter(by_serial.items()))
        peers = _peer_signatures(tree, files[0])
        if len(peers) == 2 and peers[0][1] == peers[1][1] != signature(files):
            return {serial: [_why(signature(files), peers[0][1], peers[0][0])]}
        return {}
    sigs = {s: signature(files) for s, files in by_serial.items()}
    counts = Counter(sigs.values()).most_common(2)
    if counts[0][1] < 2 or (len(counts) > 1 and counts[1][1] == counts[0][1]):
        return {}
    common = counts[0][0]
    return {s: [_why(sig, common, "the run's other serials")] for s, sig in sigs.items()
            if sig != common}  # fmt: skip


def _why(have: Signature, want: Signature, whose: str) -> str:
    theirs = dict(want)
    shown = [f"{n} {list(s)} vs {list(theirs[n])}" for n, s in sorted(have) if n in theirs and
             theirs[n] != s][:3]  # fmt: skip
    missing = sorted(set(theirs) - {n for n, _ in have})[:3]
    parts = shown + [f"no {n}" for n in missing]
    return (f"variables do not fit the model of {whose} ({'; '.join(parts) or 'other names'}): "
            "loading into the run's model refuses them")


def _peer_signatures(tree: Tree, res: FileResult) -> list[tuple[str, Signature]]:
    """The two sibling saves nearest in number with this file's naming template, listed."""
    name = posixpath.basename(res.ref.path)
    suffix = next((s for s in registry.save_suffixes() if name.lower().endswith(s)), "")
    me = parse_name(name[: len(name) - len(suffix)]) if suffix else None
    if me is None:
        return []
    try:
        entries = tree.storage.fs.ls(tree.root, detail=True)
    except (OSError, ValueError):
        return []
    near = []
    for e in entries:
        other = posixpath.basename(str(e.get("name", "")).rstrip("/"))
        if e.get("type") != "file" or other == name or not other.lower().endswith(suffix):
            continue
        p = parse_name(other[: len(other) - len(suffix)])
        if p is not None and p.label == me.label and p.serial != me.serial:
            near.append((abs(p.serial - me.serial), p.serial, other, int(e.get("size") or 0)))
    out = []
    for _, serial, other, size in sorted(near)[:2]:
        ref = FileRef(posixpath.join(tree.root, other), size=size, codec=res.codec)
        got = list_file(tree.storage, serial, ref)
        if got.error:
            return []
        out.append((other, signature([got])))
    return out
