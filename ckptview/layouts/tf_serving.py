"""TensorFlow Serving model base paths: ``<base>/<version>/`` directories, each a SavedModel
(``saved_model.pb`` + ``variables/variables.{index,data-*}``) or a TF1 SessionBundle
(``export.meta`` + ``export-*``). A version is a serial; TF Serving serves the highest
complete one. Version directories are written whole and renamed into place, so one without
its ``saved_model.pb`` / ``export.meta`` is incomplete.
"""

from __future__ import annotations

import posixpath
import re

from ..model import FileRef, SerialInfo, TreeScan
from ..tree import Tree
from .base import Layout, LayoutTier

VERSION = re.compile(r"^\d+$")
MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt", "export.meta")
#: files beside the variables that hold none (graphs, fingerprints, assets)
NOT_DATA = re.compile(r"\.(pb|pbtxt|meta)$|\.data-\d+-of-\d+$|(^|/)assets(\.extra)?/")


class TFServingLayout(Layout):
    """Numbered version directories of SavedModels or SessionBundles."""

    name = "tf-serving"
    resume_reads = (
        "``saved_model.pb`` and ``variables/variables.{index,data-*}`` (or ``export.meta`` + "
        "``export-*``) of the version"
    )
    priority = LayoutTier.FRAMEWORK

    def guess_can_open(self, tree: Tree) -> bool:
        return any(self._model(tree, d) for d in self._versions(tree))

    @staticmethod
    def _versions(tree: Tree) -> list[str]:
        return [d for d in tree.dirs() if VERSION.match(posixpath.basename(d))]

    @staticmethod
    def _model(tree: Tree, rel: str) -> bool:
        return any(tree.exists(f"{rel}/{m}") for m in MODEL_FILES)

    def scan(self, tree: Tree) -> TreeScan:
        serials = []
        for d in self._versions(tree):
            files = tree.files(under=d)
            data = [f for f in files if not NOT_DATA.search(f[len(d) + 1 :])
                    and posixpath.basename(f) != "checkpoint"]  # fmt: skip
            many = len(data) > 1
            refs = [FileRef(tree.abs(f), prefix=f[len(d) + 1 :] if many else "",
                            size=tree.size(f)) for f in data]  # fmt: skip
            others = [tree.abs(f) for f in files if f not in data]
            serials.append(SerialInfo(int(posixpath.basename(d)), tree.abs(d), refs, others,
                                      complete=self._model(tree, d)))  # fmt: skip
        return TreeScan(serials)

    def commit_markers(self, tree: Tree, info: SerialInfo) -> list[str]:
        rel = tree.rel(info.path)
        return [f"{rel}/{m}" for m in MODEL_FILES if tree.exists(f"{rel}/{m}")]
