"""Adding a format is one class and one registration, and the shared kits run on it unchanged
(docs/architecture.md, "Adding a format"). A toy file format and a toy tree layout are
defined here, registered, and put through :class:`ckptview.testing.CodecSuite` and
:class:`ckptview.testing.LayoutSuite`, as are some built-in codecs and layouts on real files.
"""

from __future__ import annotations

import json
import posixpath
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from conftest import corpus_path, wild_path
from test_deepspeed import torch_zip

import ckptview as cv
from ckptview import registry
from ckptview.codecs.base import Codec
from ckptview.io import Blob, TruncatedError
from ckptview.layouts.base import Layout
from ckptview.model import FileRef, SerialInfo, Span, TreeScan, VarInfo
from ckptview.registry import CodecTier, LayoutTier
from ckptview.testing import CodecSuite, LayoutSuite
from ckptview.tree import Tree


# -- the toy format: b"TOY1", u32 header length, JSON {name: [dtype, shape, offset]}, data -----
class ToyCodec(Codec):
    """A made-up format: one module's worth of code is all a codec needs."""

    name = "toy"
    suffixes = (".toy",)
    magic = (b"TOY1",)
    save_suffixes = (".toy",)  # numbered runs (step_3.toy) pick it up from the registry
    priority = CodecTier.FORMAT

    def list_variables(self, blob: Blob, hints) -> list[VarInfo]:
        head = blob.read(0, 8)
        if head[:4] != b"TOY1":
            raise ValueError("not a toy file")
        (n,) = struct.unpack("<I", head[4:])
        if 8 + n > blob.size:
            raise TruncatedError(f"header of {n} bytes, the file has {blob.size - 8}")
        out = []
        for name, (dtype, shape, offset) in json.loads(blob.read(8, n)).items():
            var = VarInfo(name, dtype, tuple(shape))
            var.nbytes = var.numel * np.dtype(dtype).itemsize
            var.span = Span(blob.path, 8 + n + offset, var.nbytes)
            out.append(var)
        return out  # values: the base class reads spans


class ToyRunLayout(Layout):
    """``run-N/`` directories of ``.toy`` files, complete once ``DONE`` is written."""

    name = "toy-run"
    priority = LayoutTier.FRAMEWORK

    def guess_can_open(self, tree: Tree) -> bool:
        return any(_serial(d) is not None for d in tree.dirs())

    def scan(self, tree: Tree) -> TreeScan:
        serials = []
        for d in tree.dirs():
            if (n := _serial(d)) is None:
                continue
            files = tree.files(under=d)
            refs = [FileRef(tree.abs(f), size=tree.size(f)) for f in files if f.endswith(".toy")]
            others = [tree.abs(f) for f in files if not f.endswith(".toy")]
            serials.append(SerialInfo(n, tree.abs(d), refs, others,
                                      complete=tree.exists(f"{d}/DONE")))  # fmt: skip
        return TreeScan(serials)

    def commit_markers(self, tree: Tree, info: SerialInfo) -> list[str]:
        return [f for f in self.serial_files(tree, info) if f.endswith("/DONE")]


def _serial(rel: str) -> int | None:
    name = posixpath.basename(rel)
    return int(name[4:]) if name.startswith("run-") and name[4:].isdigit() else None


def write_toy(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    header, data = {}, b""
    for name, arr in arrays.items():
        header[name] = [arr.dtype.str, list(arr.shape), len(data)]
        data += np.ascontiguousarray(arr).tobytes()
    raw = json.dumps(header).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"TOY1" + struct.pack("<I", len(raw)) + raw + data)
    return path


def toy_arrays(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"fc/w": rng.standard_normal((64, 32)).astype("<f4"), "fc/b": np.arange(32, dtype="<i8")}


@pytest.fixture(autouse=True, scope="module")
def toy_registered():
    """The one registration (a plugin package would use the ``ckptview.codecs`` /
    ``ckptview.layouts`` entry points instead)."""
    registry.register(ToyCodec)
    registry.register(ToyRunLayout)
    yield
    registry.unregister("toy")
    registry.unregister("toy-run")


# -- the kits on the toy ------------------------------------------------------------------------
class TestToyCodec(CodecSuite):
    codec = "toy"

    def make_samples(self, directory: Path) -> list[Path]:
        big = {"emb": np.ones((256, 128), "<f4"), **toy_arrays(1)}  # > 64 KiB: header-only
        return [
            write_toy(directory / "a.toy", toy_arrays(0)),
            write_toy(directory / "big.toy", big),
        ]


class TestToyRunLayout(LayoutSuite):
    layout = "toy-run"

    def make_trees(self, directory: Path) -> list[Path]:
        root = directory / "run"
        for n in (1, 2, 3):
            write_toy(root / f"run-{n}" / "model.toy", toy_arrays(n))
            (root / f"run-{n}" / "DONE").write_text("ok")
        write_toy(root / "run-4" / "model.toy", toy_arrays(4))  # in flight: no DONE yet
        return [root]


class TestToyFilesInANumberedRun(LayoutSuite):
    """The built-in ``numbered`` layout takes ``step_N.toy`` files: it asks the registry which
    suffixes codecs save under, and the toy codec declared ``.toy``."""

    layout = "numbered"

    def make_trees(self, directory: Path) -> list[Path]:
        for n in (10, 20, 30):
            write_toy(directory / "numbered" / f"step_{n}.toy", toy_arrays(n))
        return [directory / "numbered"]


def test_toy_tree_through_the_public_api(tmp_path):
    root = TestToyRunLayout().make_trees(tmp_path)[0]
    cat = cv.open(root)
    assert cat.layout == "toy-run" and cat.latest == 3
    assert cat.serials["complete"].tolist() == [True, True, True, False]
    np.testing.assert_array_equal(cat.read("fc/w"), toy_arrays(3)["fc/w"])
    assert set(cat.variables["name"]) == {"fc/w", "fc/b"}
    assert cat.files.set_index("role").loc["marker", "path"].size == 3


def test_unregistered_toy_is_unknown(tmp_path):
    path = write_toy(tmp_path / "x.toy", toy_arrays(0))
    registry.unregister("toy")
    try:
        v = cv.open(path, cache=False).variables
        assert v["error"].tolist() == ["no codec recognizes this file"]
    finally:
        registry.register(ToyCodec)


# -- the same kits on built-in codecs and layouts, on real files --------------------------------
class TestSafetensors(CodecSuite):
    codec = "safetensors"
    samples = tuple(
        str(p)
        for p in sorted(Path(corpus_path("modern/safetensors/sharded")).glob("*.safetensors"))
    )


class TestNpy(CodecSuite):
    codec = "npy"

    def make_samples(self, directory: Path) -> list[Path]:
        directory.mkdir(parents=True)
        np.save(directory / "c.npy", np.arange(40000, dtype=">f8").reshape(200, 200))
        np.save(directory / "f.npy", np.asfortranarray(np.ones((30, 7), "<i2")))
        return [directory / "c.npy", directory / "f.npy"]


class TestTorch(CodecSuite):
    codec = "torch"

    def make_samples(self, directory: Path) -> list[Path]:
        directory.mkdir(parents=True)
        (directory / "sd.pt").write_bytes(torch_zip({"w": np.ones((300, 100), np.float32)}))
        return [directory / "sd.pt", Path(corpus_path("modern/torch/run_A/step_100.pt"))]


class TestHfTrainer(LayoutSuite):
    layout = "hf-trainer"
    trees = (str(corpus_path("modern/hf")),)


class TestDeepSpeed(LayoutSuite):
    layout = "deepspeed"
    trees = (str(corpus_path("llm/deepspeed_zero")),)


class TestTfV1(CodecSuite):
    """TF V1 TensorSlice tables from TF Serving's test data (../shared/wild)."""

    codec = "tf-v1"
    truncate_every_below = 256

    def make_samples(self, directory: Path) -> list[Path]:
        return [
            wild_path("files/tf-serving/bad_half_plus_two/00000123/export"),
            wild_path(
                "files/tf-serving/session_bundle_half_plus_two/00000123/export-00000-of-00001"
            ),
        ]


class TestTfServing(LayoutSuite):
    """A TF Serving base path of two SavedModel versions (../shared/wild test data)."""

    layout = "tf-serving"

    def make_trees(self, directory: Path) -> list[Path]:
        src = wild_path("files/tf-serving/saved_model_half_plus_two_cpu/00000123")
        for version in ("00000123", "00000124"):
            shutil.copytree(src, directory / "base" / version)
        return [directory / "base"]


class TestT5x(CodecSuite):
    """The msgpack ``checkpoint`` of t5x's own test data (../shared/wild)."""

    codec = "t5x"
    detected = False
    truncate_every_below = 512

    def make_samples(self, directory: Path) -> list[Path]:
        return [wild_path("files/t5x/tiny_t5/checkpoint_1/checkpoint")]
