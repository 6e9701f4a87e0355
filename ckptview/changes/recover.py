"""Crash recovery: roll back or finish what an interrupted change left.

An operation with a ``begin`` and no ``end`` in the journal was cut short (a crash, a kill, a
failure whose own clean-up did not finish). Each ``begin`` carries the whole plan, so recovery
knows every path the operation meant to touch: an interrupted restore is rolled back (the
files its plan wrote are removed - a renamed directory file by file, never wholesale -, then
the directories left empty; restore never overwrites, so nothing that existed before is
touched, and never a file of a complete serial other than the one being restored) unless its
last step (the commit: final marker, rename into place, pointer) took effect, in which case
it is finished and kept; a killed export's staging dir (``<target>.ckptview-partial-*``, beside
the path recovered or below it) is removed unless its process still runs; an interrupted
retention finishes deleting the serial it had started on (already
incomplete, its markers went first) and leaves a serial it had not touched yet.
Leftovers in ``.ckptview/tmp/`` are removed. What recovery does is journaled like any change
(CLI ``ckptview journal URL --recover --yes``). The tree as it is now is read with
:mod:`ckptview.scan` (never the catalog: this package sits below it).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..io import Storage
from ..model import META_DIR, Op
from ..scan.core import Scan
from ..scan.detect import detect, list_tree
from .journal import Journal, join_path, journal_path, open_root, read_journal
from .lock import TreeLock, is_stale
from .lockstore import TEMP_SUFFIX
from .ops import OpRunner, describe, ops_frame
from .result import ChangeResult
from .status import needs_recovery, operations

#: what an export names its staging dir: ``<target>.ckptview-partial-<id>``
PARTIAL = ".ckptview-partial-"


class _Fixer:
    """Works out the Ops that undo or finish the interrupted operations of one tree."""

    def __init__(self, fs: Any, root: str, url: str):
        self.fs, self.root, self.url = fs, root, url
        self.doomed: dict[str, None] = {}  # absolute file paths to delete, in order
        self.dirs: set[str] = set()  # absolute dirs to remove once emptied
        self.replay: list[Op] = []  # retention ops to finish
        self.outcomes: list[tuple[str, str]] = []  # (op_id, outcome)
        self._scan: Scan | None = None
        self._scan_done = False
        self.foreign: list[tuple[Any, str]] = []  # (fs, path): export staging dirs elsewhere

    def abs(self, rel: str) -> str:
        return join_path(self.root, rel)

    def rel(self, path: str) -> str:
        return path[len(self.root.rstrip("/")) + 1 :]

    def exists(self, rel: str) -> bool:
        return self.fs.exists(self.abs(rel))

    def scan(self) -> Scan | None:
        """The tree as it is now, or None when no layout recognizes it (an emptied target)."""
        if not self._scan_done:
            self._scan_done = True
            try:
                tree = list_tree(self.url, cache=False)
                self._scan = Scan(tree, detect(tree, label=self.url), cache=tree.cache)
                self._scan.serials  # noqa: B018 - scan now: unreadable trees count as None
            except Exception:  # noqa: BLE001 - recovery works on the files alone then
                self._scan = None
        return self._scan

    def complete_serials(self, exclude: int | None) -> list[tuple[int, str, set[str]]]:
        """(serial, dir or main path, absolute file paths) of every complete serial."""
        scan = self.scan()
        if scan is None:
            return []
        out = []
        tree = scan.tree
        for info in scan.tree_scan.serials:
            if info.serial == exclude or not bool(scan.serials.loc[info.serial, "complete"]):
                continue
            files = {tree.abs(f) for f in scan.layout.serial_files(tree, info)}
            out.append((info.serial, tree.abs(tree.rel(info.path)), files))
        return out

    def doom(self, path: str) -> None:
        """A file or a whole directory (absolute) to delete; its parent dirs too once empty
        (a step may have made them before it failed)."""
        parent = path.rstrip("/").rsplit("/", 1)[0]
        while len(parent) > len(self.root.rstrip("/")) and parent.startswith(self.root):
            self.dirs.add(parent)
            parent = parent.rsplit("/", 1)[0]
        if not self.fs.exists(path):
            return
        if self.fs.isdir(path):
            for f, inf in sorted(self.fs.find(path, withdirs=True, detail=True).items()):
                if inf["type"] == "directory":
                    self.dirs.add(f.rstrip("/"))
                else:
                    self.doomed[f] = None
            self.dirs.add(path.rstrip("/"))
        else:
            self.doomed[path] = None

    # -- restore
    def restore(self, op: dict) -> None:
        begin, recs = op["begin"], op["records"]
        plan = begin.get("plan")
        if plan is None:
            self.outcomes.append((op["op_id"], "no plan journaled: only leftovers removed"))
            return
        reached = sorted({r["step"] for r in recs if r.get("event") == "intent"})
        refused = {r["step"] for r in recs if r.get("event") == "failed"
                   and "FileExistsError" in str(r.get("error"))}  # fmt: skip
        if plan and reached and reached[-1] == len(plan) - 1 and self._took_effect(plan[-1]):
            self.outcomes.append((op["op_id"], f"finished (its last step, {plan[-1]['kind']} "
                                  f"{plan[-1]['path']}, had taken effect)"))  # fmt: skip
            return
        kept = []
        for i in reversed(reached):  # newest first: commit markers go before the data
            step = plan[i]
            if i in refused or step.get("replace"):
                if step.get("replace") and i != len(plan) - 1:
                    kept.append(step["path"])
                continue
            if step["kind"] in ("copy", "write"):
                self.doom(self.abs(step["path"]))
            elif step["kind"] == "rename":  # only the files the plan wrote, on either side
                for staged, moved in _renamed_files(plan, i):
                    self.doom(self.abs(moved))
                    self.doom(self.abs(staged))
        for i, step in enumerate(plan):  # a staging dir made by a step never reached
            src = step.get("src") or ""
            if i not in reached and step["kind"] == "rename" and src:  # noqa: SIM102
                if not src.startswith(META_DIR + "/") and self.exists(src):
                    self.dirs.add(self.abs(src))  # removed once emptied
        spared = self._spare(begin.get("new_serial"))
        what = f"rolled back ({len(reached)} of {len(plan)} steps had started)"
        if spared:
            what += f"; left {len(spared)} file(s) of complete serials"
        if kept:
            what += f"; state files left as written: {', '.join(kept)}"
        self.outcomes.append((op["op_id"], what))

    def _took_effect(self, step: dict) -> bool:
        path = self.abs(step["path"])
        if step["kind"] == "rename":
            return self.fs.exists(path) and not (step.get("src") and self.exists(step["src"]))
        if step["kind"] == "copy":
            return self.fs.exists(path) and self.fs.size(path) == step.get("nbytes", 0)
        if step["kind"] == "write":
            if not self.fs.exists(path):
                return False
            digest = hashlib.sha256(self.fs.cat_file(path)).hexdigest()
            return step.get("sha256") in (None, digest)
        return True

    def _spare(self, own: int | None) -> list[str]:
        """Never touch a complete serial (other than the one the restore was creating)."""
        if not self.doomed and not self.dirs:
            return []
        spared = []
        for _serial, base, files in self.complete_serials(own):
            for f in list(self.doomed):
                if f in files or f.startswith(base.rstrip("/") + "/"):
                    del self.doomed[f]
                    spared.append(f)
            self.dirs -= {d for d in self.dirs if d == base or d.startswith(base + "/")
                          or any(f.startswith(d + "/") for f in files)}  # fmt: skip
        return spared

    # -- retention
    def retention(self, op: dict) -> None:
        begin, recs = op["begin"], op["records"]
        started = [r for r in recs if r.get("event") == "serial"]
        todo = [int(s) for s in begin.get("delete") or []]
        if not started:
            self.outcomes.append((op["op_id"], "nothing deleted yet; plan again"))
            return
        cur = started[-1]
        serial, plan = int(cur["serial"]), cur.get("plan")
        rest = todo[todo.index(serial) + 1 :] if serial in todo else []
        note = f"; not started: {rest} (plan again)" if rest else ""
        if any(s == serial for s, _, _ in self.complete_serials(None)):
            self.outcomes.append((op["op_id"], f"serial {serial} untouched (still complete)"
                                  + note))  # fmt: skip
            return
        if plan is None:
            self.outcomes.append((op["op_id"], "no plan journaled: only leftovers removed"))
            return
        for step in plan:
            if step["kind"] == "rename":
                if self.exists(step["src"]) and not self.exists(step["path"]):
                    self.replay.append(Op("rename", step["path"], src=step["src"],
                                          note=step.get("note", "")))  # fmt: skip
            elif step["kind"] in ("delete", "rmdir"):
                self.replay.append(Op(step["kind"], step["path"], note=step.get("note", "")))
        self.outcomes.append((op["op_id"], f"finished deleting serial {serial}" + note))

    # -- export
    def exports(self) -> None:
        """Staging dirs of exports that were killed (``<target>.ckptview-partial-*`` beside
        this path, or below it, whose own journal begun by a process now gone has no end):
        removed whole. An export writes nothing into the tree it reads, so its leftovers are
        found where its target was to be."""
        parent, name = self.root.rstrip("/").rsplit("/", 1) if "/" in self.root.rstrip("/") \
            else ("", self.root)  # fmt: skip
        places = [(self.root, None), (parent, name + PARTIAL)] if parent else [(self.root, None)]
        for where, prefix in places:
            try:
                entries = self.fs.ls(where, detail=True)
            except (OSError, ValueError):
                continue
            for e in entries:
                path = str(e.get("name", "")).rstrip("/")
                base = path.rsplit("/", 1)[-1]
                if e.get("type") != "directory" or PARTIAL not in base:
                    continue
                if prefix is not None and not base.startswith(prefix):
                    continue
                begun = [r for r in read_journal(self.fs, journal_path(path))
                         if r.get("action") == "export"]  # fmt: skip
                start = next((r for r in begun if r.get("event") == "begin"), None)
                ended = any(r.get("event") == "end" for r in begun)
                if start is None or ended or not is_stale(
                        {"pid": start.get("pid"), "host": start.get("host")}):  # fmt: skip
                    continue  # not an export's, finished, or still running
                self.foreign.append((self.fs, path))
                self.outcomes.append((start.get("op_id", base), f"killed export rolled back: "
                                      f"removed {Storage(self.fs).url(path)}"))  # fmt: skip

    def remove_foreign(self, journal: Journal | None) -> None:
        """Staging dirs of exports outside the tree: removed whole (each is a dir the export
        made, named by it)."""
        for fs, path in self.foreign:
            if fs.exists(path):
                if journal is not None:
                    journal.write("intent", step=-1, op={"kind": "rmtree", "path": path,
                                                         "note": "recover export"})  # fmt: skip
                fs.rm(path, recursive=True)
                if journal is not None:
                    journal.write("done", step=-1)

    # -- leftovers
    def tmp(self) -> None:
        tmp = self.abs(f"{META_DIR}/tmp")
        if self.fs.exists(tmp) and self.fs.ls(tmp):  # an empty tmp dir is no leftover
            self.doom(tmp)
            self.dirs.discard(self.abs(META_DIR))
        for temp in self.fs.glob(self.abs(f"{META_DIR}/lock.*{TEMP_SUFFIX}")):
            self.doomed[temp] = None  # a lock's temp file, left by a kill before its link

    def ops(self) -> list[Op]:
        out = [Op("delete", self.rel(f), nbytes=self._size(f), note="recover")
               for f in self.doomed]  # fmt: skip
        emptied = self._emptied()
        out += [Op("rmdir", self.rel(d), note="recover")
                for d in sorted(emptied, key=lambda d: (-d.count("/"), d))]  # fmt: skip
        replay = [o for o in self.replay if self.abs(o.path) not in self.doomed]
        return replay + out

    def _size(self, path: str) -> int:
        try:
            return int(self.fs.size(path) or 0)
        except (FileNotFoundError, OSError):
            return 0

    def _emptied(self) -> set[str]:
        """The dirs in ``self.dirs`` left empty once the doomed files are gone."""
        out: set[str] = set()
        for d in sorted(self.dirs, key=lambda d: -d.count("/")):
            if not self.fs.exists(d) or d.rstrip("/") == self.root.rstrip("/"):
                continue
            if d == self.abs(META_DIR):
                continue
            entries = self.fs.find(d, withdirs=True, detail=True)
            if all(p.rstrip("/") in out or p in self.doomed or p.rstrip("/") == d.rstrip("/")
                   for p in entries):  # fmt: skip
                out.add(d.rstrip("/"))
        return out


def _recover_target(url: str | os.PathLike, dry_run: bool,
                    storage_options: dict | None) -> RecoverResult:  # fmt: skip
    """Recovery of a path that does not exist: the staging dirs of killed exports to it
    (``<url>.ckptview-partial-*`` beside it) are removed; FileNotFoundError when none."""
    storage, path = Storage.from_url(os.fspath(url), storage_options)
    parent = path.rstrip("/").rsplit("/", 1)[0] or "/"
    if not storage.fs.exists(parent):
        raise FileNotFoundError(f"no such checkpoint tree: {url}")
    fixer = _Fixer(storage.fs, path.rstrip("/"), storage.url(path))
    fixer.exports()
    if not fixer.foreign:
        raise FileNotFoundError(f"no such checkpoint tree, nor an export to it to recover: {url}")
    if not dry_run:
        fixer.remove_foreign(None)
    return RecoverResult(target=storage.url(path), outcomes=fixer.outcomes, dry_run=dry_run,
                         done=not dry_run)  # fmt: skip


def recover(url: str | os.PathLike, dry_run: bool = False,
            storage_options: dict | None = None) -> RecoverResult:  # fmt: skip
    """Roll back or finish the interrupted operations of the tree at ``url`` and remove the
    leftovers in ``.ckptview/tmp/`` (see the module docstring). Takes the tree's lock (a stale
    one, left by a dead process, is broken and journaled; a live one refuses). Returns a
    ``RecoverResult``; with ``dry_run`` nothing is changed."""
    try:
        fs, root = open_root(url, storage_options)
    except FileNotFoundError:  # an export's target that a kill left unmade: its leftovers
        return _recover_target(url, dry_run, storage_options)
    url = Storage(fs).url(root)

    def work() -> tuple[_Fixer, list[dict]]:
        pending = [op for op in operations(read_journal(fs, journal_path(root)))
                   if needs_recovery(op)]  # fmt: skip
        fixer = _Fixer(fs, root, url)
        for op in pending:
            action = op["begin"].get("action")
            if action == "restore":
                fixer.restore(op)
            elif action == "retention":
                fixer.retention(op)
            else:
                fixer.outcomes.append((op["op_id"], "superseded by this recovery"))
        fixer.tmp()
        fixer.exports()
        return fixer, pending

    if dry_run:
        fixer, _ = work()
        return RecoverResult(target=url, ops=ops_frame(fixer.ops()), outcomes=fixer.outcomes,
                             dry_run=True, done=False, lock=TreeLock(fs, root).holder())  # fmt: skip
    journal = Journal(fs, root)
    with TreeLock(fs, root, "recover", journal) as lock:  # a broken stale lock: journaled
        fixer, _ = work()
        ops = fixer.ops()
        if not ops and not fixer.outcomes and not fixer.foreign and not lock.broken:
            return RecoverResult(target=url, dry_run=False, done=True)
        journal.write("begin", action="recover", recovers=[o for o, _ in fixer.outcomes],
                      steps=len(ops), plan=[describe(o) for o in ops])  # fmt: skip
        OpRunner(fs, root, journal=journal).run(ops)
        fixer.remove_foreign(journal)
        for op_id, outcome in fixer.outcomes:
            journal.write("recovered", of=op_id, outcome=outcome)
        journal.write("end", action="recover")
    return RecoverResult(target=url, ops=ops_frame(ops), outcomes=fixer.outcomes, dry_run=False,
                         done=True, lock=lock.broken)  # fmt: skip


def _renamed_files(plan: list[dict], i: int) -> list[tuple[str, str]]:
    """(where written, where renamed to) of the files plan step ``i`` (a rename) moved that
    earlier steps of the plan wrote: never anything else in a renamed directory."""
    src, dest = plan[i].get("src") or "", plan[i]["path"]
    out = []
    for step in plan[:i]:
        path = step["path"]
        if step["kind"] in ("copy", "write") and (path == src or path.startswith(src + "/")):
            out.append((path, dest + path[len(src) :]))
    return out


@dataclass(kw_only=True)
class RecoverResult(ChangeResult):
    """What :func:`recover` did (or, with ``dry_run``, would do): a :class:`ChangeResult` with
    the ``outcomes`` per recovered operation (``(op_id, outcome)`` pairs) and the ``lock``
    found (or broken) on the tree, if any."""

    action: ClassVar[str] = "recover"
    outcomes: list[tuple[str, str]] = field(default_factory=list)
    lock: dict | None = None

    def headline(self) -> str:
        verb = "would run" if self.dry_run else "ran"
        return f"recover {self.target}: {verb} {len(self.ops)} steps"

    def notes(self) -> list[str]:
        lines = []
        if self.lock:
            held = f"pid {self.lock.get('pid')} on {self.lock.get('host')}"
            if not self.dry_run:
                lines.append(f"broke a stale lock of {held}")
            else:
                stale = is_stale(self.lock)
                lines.append(("stale lock of " if stale else "lock held by ") + held
                             + (" (will be broken)" if stale else ""))  # fmt: skip
        lines += [f"{op_id}: {outcome}" for op_id, outcome in self.outcomes]
        if not self.outcomes and not len(self.ops):
            lines.append("nothing to recover")
        return lines

    def __str__(self) -> str:  # the steps are in .ops; the outcomes say what they are for
        return "\n".join([self.headline(), *(f"  {n}" for n in self.notes())])

    def to_dict(self) -> dict:
        out = super().to_dict()
        out["outcomes"] = [{"op_id": o, "outcome": w} for o, w in self.outcomes]
        return out
