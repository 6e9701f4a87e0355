"""Fuzzing every codec with truncated and mutated copies of small real corpus files.

Each case must list without raising (a bad file is an error row), within a time limit, under
a memory cap, and every ``read`` of a listed row either returns an array of the catalogued
dtype and shape or raises an ordinary exception. Every case goes through the codec as the
catalog calls it (``catalog.list_file``); a sample also through ``ckptview.open``.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import random
import shutil
import signal
import struct
import subprocess
import sys
import time
import tracemalloc
import zipfile
import zlib
from pathlib import Path

import fsspec
import numpy as np
import pytest
from conftest import CORPUS, corpus_path

import ckptview as cv
from ckptview import registry
from ckptview.dtypes import np_dtype
from ckptview.io import Storage
from ckptview.scan.listing import list_file

SEED = 20240611
#: $CKPTVIEW_FUZZ_SCALE multiplies the case counts (default: ~25 s of CPU in all; 4 gives
#: every offset of the first 512 bytes and 240 mutations per file)
SCALE = max(1.0, float(os.environ.get("CKPTVIEW_FUZZ_SCALE", "1")))
N_FLIPS = int(60 * SCALE)
EVERY_OFFSET = int(64 * SCALE)  # every truncation offset below this
HEAD_OFFSETS = 512  # then every STEP-th offset below this
STEP = max(1, int(8 / SCALE))
N_STRIDE = int(16 * SCALE)  # then this many truncation offsets spread over the rest
CATALOG_EVERY = 25  # every n-th case also goes through ckptview.open
CASE_SECONDS = 5
PEAK_BYTES = 64 << 20
MAX_READS = 4  # rows read per case
#: exceptions a bad file may raise from ``read`` (MemoryError, SystemError, RecursionError,
#: AttributeError, TypeError … are bugs)
OK_ERRORS = (ValueError, KeyError, IndexError, OSError, EOFError, NotImplementedError,
             OverflowError, zipfile.BadZipFile, struct.error, zlib.error,
             pickle.UnpicklingError)  # fmt: skip

#: one or two small files per codec: (tree to copy or None for the file alone, file)
TARGETS = [
    (None, "modern/hf/checkpoint-100/scheduler.pt"),  # torch zip
    (None, "modern/torch/run_legacy/step_100.pt"),  # torch legacy
    (None, "modern/npz/step_300_compressed.npz"),
    (None, "paddle/static_vars/seq_lod_var"),  # LoDTensor stream with LoD
    (None, "paddle/selected_rows/emb_sparse_table.bin"),  # SelectedRows
    (None, "paddle/dygraph/lowp.pdparams"),
    (None, "modern/safetensors/sharded/model-00001-of-00002.safetensors"),
    (None, "caffe2/extra/edge_cases.minidb"),
    ("modern/tf/run_ckpt", "modern/tf/run_ckpt/ckpt-300.index"),
    ("paddle/dist_ckpt", "paddle/dist_ckpt/0_0.distcp"),
    ("modern/dcp", "modern/dcp/step_1/.metadata"),  # DCP metadata (torch_dcp codec)
    (None, "llm/gguf/tiny-qwen-mixed.gguf"),  # GGUF header and block types
]
#: files a layout parses itself (state, metadata): fuzzed through ckptview.open only
TREE_TARGETS = [
    ("paddle/dist_ckpt", "paddle/dist_ckpt/0.metadata"),
    ("tf_orbax/orbax/run3_noocdbt", "tf_orbax/orbax/run3_noocdbt/2/state/_METADATA"),
    ("tf_orbax/orbax/run3_noocdbt", "tf_orbax/orbax/run3_noocdbt/2/state/opt.mu/.zarray"),
]


def _detected(rel: str) -> str | None:
    path = CORPUS / rel
    with open(path, "rb") as f:
        head = f.read(4096)
    codec = registry.detect_codec(path.name, head)
    return codec.name if codec else None


#: codecs fuzzed by their own tests below (npy, keras) or through their layout's files
FUZZED_ELSEWHERE = {"npy": "test_fuzz_npy", "keras": "test_fuzz_keras",
                    "orbax": "TREE_TARGETS", "orbax-json": "TREE_TARGETS",
                    "tf-v1": "test_plugin_kit.TestTfV1 (truncations and flips of wild V1 tables)",
                    "t5x": "test_plugin_kit.TestT5x (never detected: the t5x layout assigns it)",
                    "paddle-text-int": "never detected: layouts assign it to 2018 trainer files",
                    "torchscript": "test_torchscript (TestTorchScriptSuite flips and truncations, "
                                   "test_fuzz_mutated_archives_never_crash)"}  # fmt: skip


def _auto_targets() -> list[tuple[None, str]]:
    """The smallest corpus file of every registered codec the hand-picked TARGETS miss: a
    codec added to the registry is fuzzed on the corpus without editing this module."""
    if not CORPUS.exists():
        return []
    covered = {_detected(rel) for _, rel in TARGETS} | set(FUZZED_ELSEWHERE)
    files = sorted(
        (p.stat().st_size, p.relative_to(CORPUS).as_posix())
        for p in CORPUS.rglob("*")
        if p.is_file() and "generators" not in p.parts and p.suffix != ".json"
    )
    out = []
    for _, rel in files:
        name = _detected(rel)
        if name is not None and name not in covered:
            covered.add(name)
            out.append((None, rel))
    return out


AUTO_TARGETS = _auto_targets()


class CaseTimeout(BaseException):
    """Raised by the alarm: a BaseException, so no ``except Exception`` can swallow it."""


def _alarm(signum, frame):
    raise CaseTimeout


def mutations(data: bytes, rng: random.Random, n_flips: int = N_FLIPS,
              head: int = HEAD_OFFSETS, n_stride: int = N_STRIDE):  # fmt: skip
    """(label, bytes): truncations at every offset below ``EVERY_OFFSET``, every ``STEP``-th
    below ``head`` and a stride beyond, then seeded mutations (random bytes, huge 32/64-bit
    lengths, zeroed runs)."""
    size = len(data)
    cuts = list(range(min(EVERY_OFFSET, head, size)))
    cuts += list(range(EVERY_OFFSET, min(head, size), STEP))
    if size > head:
        cuts += sorted({head + (size - head) * i // n_stride for i in range(n_stride)})
    for n in cuts:
        yield f"cut@{n}", data[:n]
    for i in range(n_flips):
        buf = bytearray(data)
        how = i % 4
        pos = rng.randrange(size) if rng.random() < 0.5 else rng.randrange(min(size, 64))
        if how == 0:
            for _ in range(rng.randint(1, 4)):
                buf[rng.randrange(size)] = rng.randrange(256)
        elif how == 1:
            buf[pos : pos + 4] = rng.choice([b"\xff\xff\xff\x7f", b"\xff\xff\xff\xff",
                                             b"\x00\x00\x00\x80"])  # fmt: skip
        elif how == 2:
            buf[pos : pos + 8] = rng.choice([b"\xff" * 8, b"\xff\xff\xff\xff\xff\x00\x00\x00"])
        else:
            buf[pos : pos + rng.randint(1, 16)] = bytes(16)[: rng.randint(1, 16)]
        yield f"mut{i}@{pos}", bytes(buf[:size]) if how else bytes(buf)


def _check_reads(reader, variables, label: str) -> None:
    """Read a few listed rows: an ndarray of the catalogued dtype/shape, or a normal error."""
    rows = [v for v in variables if v.error is None and v.dtype != "object"][:MAX_READS]
    for var in rows:
        try:
            arr = reader(var)
        except OK_ERRORS:
            continue
        assert isinstance(arr, np.ndarray), (label, var.name, type(arr))
        assert arr.dtype == np_dtype(var.dtype), (label, var.name, arr.dtype, var.dtype)
        assert tuple(arr.shape) == tuple(var.shape), (label, var.name, arr.shape, var.shape)


def run_case(label: str, fn) -> None:
    """Run one case under the alarm and the memory cap; any exception fails the test."""
    tracemalloc.reset_peak()
    signal.setitimer(signal.ITIMER_REAL, CASE_SECONDS)
    start = time.monotonic()
    try:
        fn()
    except CaseTimeout:
        pytest.fail(f"{label}: no result after {CASE_SECONDS} s")
    except Exception as e:  # noqa: BLE001 - report which case broke, with the cause
        raise AssertionError(f"{label}: {type(e).__name__}: {e}") from e
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    peak = tracemalloc.get_traced_memory()[1]
    assert peak < PEAK_BYTES, f"{label}: peak allocation {peak >> 20} MiB"
    assert time.monotonic() - start < CASE_SECONDS, label


@pytest.fixture()
def harness():
    """tracemalloc and the alarm handler around a test."""
    old = signal.signal(signal.SIGALRM, _alarm)
    tracemalloc.start()
    try:
        yield
    finally:
        tracemalloc.stop()
        signal.signal(signal.SIGALRM, old)


def _copy(tmp_path: Path, tree: str | None, rel: str) -> tuple[Path, Path]:
    """A private copy of the target (its whole tree when given): (root to open, target)."""
    if tree is None:
        target = tmp_path / Path(rel).name
        shutil.copyfile(corpus_path(rel), target)
        return target, target
    root = tmp_path / Path(tree).name
    shutil.copytree(corpus_path(tree), root)
    return root, root / Path(rel).relative_to(tree)


def _catalog_case(root: Path, label: str) -> None:
    cat = cv.open(str(root), cache=False)
    df = cat.variables
    cat.serials  # noqa: B018
    ok = df[df["error"].isna() & (df["dtype"] != "object")].head(MAX_READS)
    for row in ok.itertuples():
        try:
            arr = cat.read(row.name, serial=row.serial, node=row.node)
        except OK_ERRORS:
            continue
        assert arr.dtype == np_dtype(row.dtype) and arr.shape == row.shape, (label, row.name)


def _fuzz_file(root: Path, target: Path, rng: random.Random, **kw) -> int:
    """All cases for one file; returns how many listings parsed at least one variable."""
    data = target.read_bytes()
    cat = cv.open(str(root), cache=False)
    refs = [(s.serial, r) for s in cat.scan.serials for r in s.files if r.path == str(target)]
    assert refs, f"{target} is not a data file of {root}"
    serial, ref = refs[0]
    fs = fsspec.filesystem("file")
    listed = 0
    errors: list[str] = []
    for i, (label, buf) in enumerate(mutations(data, rng, **kw)):
        target.write_bytes(buf)
        label = f"{target.name}:{label}"

        def case(buf=buf, label=label, i=i):
            nonlocal listed
            storage = Storage(fs)
            res = list_file(storage, serial, dataclasses.replace(ref, size=len(buf)))
            assert res.error is None or isinstance(res.error, str)
            listed += bool(res.variables)
            errors.append(res.error or "")
            for var in res.variables:
                assert all(isinstance(d, int) and d >= 0 for d in var.shape), (label, var)
            if res.codec:
                from ckptview import registry

                codec = registry.get_codec(res.codec)
                blob = storage.blob(ref.path, len(buf))
                _check_reads(lambda v: codec.read(blob, v), res.variables, label)
            if i % CATALOG_EVERY == 0:
                _catalog_case(root, label)

        run_case(label, case)
    target.write_bytes(data)
    if listed == 0:  # a checksummed format refuses every mutation: it must say so
        assert sum("crc" in e for e in errors) > len(errors) // 4
        return -1
    return listed


@pytest.mark.parametrize("name", sorted(registry.codecs()))
def test_every_registered_codec_is_fuzzed(name):
    """The registry decides what is fuzzed: every codec has a target (hand-picked, picked
    from the corpus by detection, or its own test)."""
    fuzzed = {_detected(rel) for _, rel in TARGETS + AUTO_TARGETS} | set(FUZZED_ELSEWHERE)
    assert name in fuzzed, f"codec {name!r} has no fuzz target and no corpus file it detects"


ALL_TARGETS = TARGETS + AUTO_TARGETS


@pytest.mark.parametrize("tree,rel", ALL_TARGETS, ids=[Path(r).name for _, r in ALL_TARGETS])
def test_fuzz_codec(tree, rel, tmp_path, harness):
    root, target = _copy(tmp_path, tree, rel)
    listed = _fuzz_file(root, target, random.Random(f"{SEED}:{rel}"))
    assert listed > 0 or (listed == -1 and rel.endswith(".index"))  # not vacuous


def test_fuzz_npy(tmp_path, harness):
    """``.npy`` (no corpus file of its own): one written by numpy."""
    target = tmp_path / "w.npy"
    np.save(target, np.arange(24, dtype=">f4").reshape(2, 3, 4))
    assert _fuzz_file(target, target, random.Random(SEED)) > 0


@pytest.mark.parametrize("tree,rel", TREE_TARGETS, ids=[Path(r).name for _, r in TREE_TARGETS])
def test_fuzz_layout_files(tree, rel, tmp_path, harness):
    """Metadata a layout or tree codec parses: the whole tree through ckptview.open."""
    root, target = _copy(tmp_path, tree, rel)
    data = target.read_bytes()
    rng = random.Random(f"{SEED}:{rel}")
    for label, buf in mutations(data, rng, n_flips=N_FLIPS // 6, head=16, n_stride=N_STRIDE // 2):
        target.write_bytes(buf)
        run_case(f"{rel}:{label}", lambda label=label: _catalog_case(root, label))


KERAS_SCRIPT = """
import random, sys
sys.path.insert(0, {tests!r})
import test_fuzz as t
from pathlib import Path
root = Path({root!r})
t.tracemalloc.start()
t.signal.signal(t.signal.SIGALRM, t._alarm)
n = t._fuzz_file(root, root, random.Random({seed!r}))
print("listed", n)
# a mutation that crashed libhdf5 2.0.0 (h5py 3.16) in H5Aread of a corrupt attribute
if root.name == "w.weights.h5":
    buf = bytearray(root.read_bytes())
    for pos, value in ((10603, 87), (2762, 116), (201, 102), (8841, 118)):
        buf[pos] = value
    root.write_bytes(bytes(buf))
    from ckptview.model import FileRef
    t.list_file(t.Storage(t.fsspec.filesystem("file")), 0, FileRef(str(root), size=len(buf)))
print("survived")
"""


@pytest.mark.parametrize("rel", ["tf_orbax/tf/keras/w.weights.h5", "tf_orbax/tf/keras/m.keras"])
def test_fuzz_keras(rel, tmp_path):
    """HDF5 goes through libhdf5: run in a child process so a crash fails this test only."""
    root, _ = _copy(tmp_path, None, rel)
    script = KERAS_SCRIPT.format(tests=str(Path(__file__).parent), root=str(root),
                                 seed=f"{SEED}:{rel}")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=str(Path(__file__).parents[1]))  # fmt: skip
    assert proc.returncode == 0, f"child died ({proc.returncode}): {proc.stderr[-1500:]}"
    assert "survived" in proc.stdout


def test_corpus_present():
    assert (CORPUS / "INDEX.json").exists()


def test_fuzz_generated_extreme_headers(tmp_path, harness):
    """The GGUF and DCP metadata parsers on the generated extremes of issue 25 item 5, scaled
    down (tests/extremes.py): many tensor infos, and a DCP ``.metadata`` of many chunks."""
    from extremes import dcp_many_chunks, gguf_many_tensors

    target = tmp_path / "many.gguf"
    target.write_bytes(gguf_many_tensors(64))
    assert _fuzz_file(target, target, random.Random(f"{SEED}:gguf-many"), n_flips=N_FLIPS // 2,
                      n_stride=N_STRIDE // 2) > 0  # fmt: skip
    meta, item = dcp_many_chunks(40)
    d = tmp_path / "run" / "step_1"
    d.mkdir(parents=True)
    (d / "__0_0.distcp").write_bytes(item)
    (d / ".metadata").write_bytes(meta)
    root, target = tmp_path / "run", d / ".metadata"
    assert cv.open(root, cache=False).variables["error"].isna().all()
    rng = random.Random(f"{SEED}:dcp-many")
    for label, buf in mutations(meta, rng, n_flips=N_FLIPS // 4, head=16, n_stride=N_STRIDE // 2):
        target.write_bytes(buf)
        run_case(f"dcp-many:{label}", lambda label=label: _catalog_case(root, label))
