"""TorchScript archives (``torch.jit.save``) against what torch itself reads back from them
(tests/data/torchscript, written by torch 2.13: see its README): parameters, buffers and
tensor constants listed and read bit-exactly, detection before the torch codec, hostile
globals refused by name, listing from headers only."""

from __future__ import annotations

import io
import json
import os
import subprocess
import zipfile
from pathlib import Path

import fsspec
import numpy as np
import pytest
from conftest import corpus_path

import ckptview as cv
from ckptview import registry
from ckptview.dtypes import np_dtype
from ckptview.io import Storage
from ckptview.model import FileRef
from ckptview.scan.listing import list_file
from ckptview.testing import CodecSuite

DATA = Path(__file__).parent / "data" / "torchscript"
TRUTH = json.loads((DATA / "truth.json").read_text())
VALUES = np.load(DATA / "truth.npz")
ARCHIVES = ["net_script.pt", "net_trace.pt", "attrs_script.pt"]
TORCH_DTYPES = {"torch.float32": "float32", "torch.float64": "float64", "torch.int64": "int64",
                "torch.int32": "int32"}  # fmt: skip


def expected(archive: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (dtype, shape) as torch.jit.load reports them."""
    t = TRUTH[archive]
    out = {k: (TORCH_DTYPES[d], tuple(s)) for k, (d, s) in t["state_dict"].items()}
    out.update(
        {f"CONSTANTS.{k}": (TORCH_DTYPES[d], tuple(s)) for k, (d, s) in t["constants"].items()}
    )
    out.update({k: (TORCH_DTYPES[d], tuple(s)) for k, (d, s) in t.get("attributes", {}).items()})
    return out


def listing(path: Path):
    storage = Storage(fsspec.filesystem("file"))
    res = list_file(storage, 0, FileRef(str(path), codec="torchscript"))
    return res, storage


def rewrite(src: Path, dest: Path, change=None, order=None) -> Path:
    """A copy of an archive, members stored, ``change(name, data)`` applied to each and in
    ``order(names)`` (Python's zipfile: no PyTorchStreamWriter alignment)."""
    with zipfile.ZipFile(src) as z:
        members = {i.filename: z.read(i.filename) for i in z.infolist()}
    names = order(list(members)) if order else list(members)
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_STORED) as out:
        for name in names:
            data = members[name]
            out.writestr(name, change(name, data) if change else data)
    return dest


@pytest.fixture
def no_exec(monkeypatch):
    """Fails the test if anything tries to run a command while ckptview reads a file."""
    calls = []

    def refuse(*args, **kwargs):
        calls.append(args)
        raise AssertionError(f"executed {args!r}")

    monkeypatch.setattr(os, "system", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)
    yield calls
    assert not calls


# -- listing and values against torch ------------------------------------------------------------
@pytest.mark.parametrize("archive", ARCHIVES)
def test_listing_matches_torch(archive):
    cat = cv.open(DATA / archive, cache=False)
    assert cat.files["codec"].tolist() == ["torchscript"]
    v = cat.variables.set_index("name")
    assert v["error"].isna().all(), v["error"]
    want = expected(archive)
    assert set(v.index) == set(want)
    for name, (dtype, shape) in want.items():
        assert (v.loc[name, "dtype"], v.loc[name, "shape"]) == (dtype, shape), name
        assert v.loc[name, "nbytes"] == np.prod(shape, dtype=int) * np_dtype(dtype).itemsize


def test_trace_lists_its_tensor_constant():
    """The traced module's ``torch.tensor([...])`` is constant ``c0`` of constants.pkl."""
    assert expected("net_trace.pt").keys() - expected("net_script.pt").keys() == {"CONSTANTS.c0"}
    res, _ = listing(DATA / "net_trace.pt")
    (const,) = [v for v in res.variables if v.name == "CONSTANTS.c0"]
    assert const.attrs["constant"] is True and "module_class" not in const.attrs
    (w,) = [v for v in res.variables if v.name == "head.0.weight"]
    assert w.attrs["module_class"].startswith("__torch__.torch.nn.modules.linear.")


@pytest.mark.parametrize("archive", ARCHIVES)
def test_values_bit_exact(archive):
    cat = cv.open(DATA / archive, cache=False)
    for name in expected(archive):
        want = VALUES[f"{archive}/{name}"]
        got = cat.read(name)
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert got.tobytes() == want.tobytes(), name


# -- detection -----------------------------------------------------------------------------------
@pytest.mark.parametrize("filename", ["net.pt", "model.torchscript", "model.zip"])
def test_claimed_before_torch_from_the_head(filename):
    """torch.jit.save writes the storages first: the first local header settles it."""
    head = (DATA / "net_script.pt").read_bytes()[:4096]
    assert registry.detect_codec(filename, head).name == "torchscript"


def test_claimed_by_its_directory_when_the_head_does_not_tell(tmp_path):
    """An archive whose first member is neither a storage nor TorchScript-only, with the
    code and constants past the first block: claimed by the second look at the directory."""
    padded = rewrite(DATA / "net_trace.pt", tmp_path / "model.jit",
                     change=lambda n, d: d + bytes(8192) if n.endswith("/data/0") else d,
                     order=lambda names: sorted(names, key=lambda n: not n.endswith("version")))  # fmt: skip
    storage = Storage(fsspec.filesystem("file"))
    blob = storage.blob(str(padded))
    assert registry.detect_codec(padded.name, blob.head()) is None
    assert registry.detect_codec(padded.name, blob.head(), blob).name == "torchscript"
    v = cv.open(padded, cache=False).variables
    assert set(v["name"]) == set(expected("net_trace.pt")) and v["error"].isna().all()


def test_torch_save_files_stay_torchs():
    for rel in ["modern/torch/run_A/step_100.pt", "modern/hf/checkpoint-100/scheduler.pt"]:
        path = corpus_path(rel)
        head = path.read_bytes()[:4096]
        assert registry.detect_codec(path.name, head).name == "torch", rel
        assert not registry.get_codec("torchscript").guess_can_open(path.name, head), rel


def test_a_torch_save_zip_forced_on_the_codec_is_an_error():
    res, _ = listing(corpus_path("modern/torch/run_A/step_100.pt"))
    assert "not a TorchScript archive" in (res.error or ""), res


# -- hostile pickles -----------------------------------------------------------------------------
def test_forbidden_global_in_data_pkl_is_named_never_run(tmp_path, no_exec):
    """data.pkl's module class replaced by ``os.system``: refused by name."""
    evil = rewrite(DATA / "net_script.pt", tmp_path / "evil.pt",
                   change=lambda n, d: d.replace(b"c__torch__\nNet\n", b"cos\nsystem\n")
                   if n.endswith("/data.pkl") else d)  # fmt: skip
    assert b"cos\nsystem\n" in evil.read_bytes()
    cat = cv.open(evil, cache=False)
    errors = " ".join(str(e) for e in cat.variables["error"].dropna())
    assert "os.system" in errors, cat.variables


def test_class_like_global_in_constants_is_refused(tmp_path, no_exec):
    """``subprocess.Popen`` looks like a class: torch.save's inert-class policy would keep it
    as a record; a TorchScript archive only admits ``__torch__.*`` classes."""
    swap = (b"ctorch._utils\n_rebuild_tensor_v2\n", b"csubprocess\nPopen\n")
    evil = rewrite(DATA / "net_trace.pt", tmp_path / "evil.pt",
                   change=lambda n, d: d.replace(*swap) if n.endswith("/constants.pkl") else d)  # fmt: skip
    assert swap[1] in evil.read_bytes()
    res, _ = listing(evil)
    assert "subprocess.Popen" in (res.error or ""), res


def test_scripted_classes_are_inert_records_only_here(tmp_path):
    """``__torch__.*`` is admitted as inert records by this codec, not by the VM's defaults."""
    from ckptview.formats.pickle import RestrictedUnpicklingError, load_pickle

    with zipfile.ZipFile(DATA / "net_script.pt") as z:
        pkl = z.read("net_script/data.pkl")
    with pytest.raises(RestrictedUnpicklingError, match="__torch__"):
        load_pickle(pkl, persistent_load=lambda pid: None)


# -- bytes read ----------------------------------------------------------------------------------
def test_listing_reads_headers_not_storages(tmp_path):
    """8 MiB of storage bytes stay unread by the listing; a read fetches its tensor's bytes."""
    big = rewrite(DATA / "net_script.pt", tmp_path / "big.pt",
                  change=lambda n, d: d + bytes(8 << 20) if n.endswith("/data/0") else d)  # fmt: skip
    size = big.stat().st_size
    cat = cv.open(big, cache=False)
    assert set(cat.variables["name"]) == set(expected("net_script.pt"))
    listed = cat.storage.counters.bytes_read
    assert listed < 64 << 10, (listed, size)
    got = cat.read("running")  # data/0: the first 48 bytes of the padded storage
    assert got.tobytes() == VALUES["net_script.pt/running"].tobytes()
    assert cat.storage.counters.bytes_read - listed <= 4096


# -- the codec kit -------------------------------------------------------------------------------
class TestTorchScriptSuite(CodecSuite):
    """Listing vs reading, truncation at every header offset and flipped bytes on the real
    archives (the fuzzing of this codec)."""

    codec = "torchscript"

    def make_samples(self, directory: Path) -> list[Path]:
        directory.mkdir(parents=True)
        big = rewrite(DATA / "net_trace.pt", directory / "big.pt",
                      change=lambda n, d: d + bytes(1 << 20) if n.endswith("/data/0") else d)  # fmt: skip
        return [DATA / "net_script.pt", DATA / "net_trace.pt", big]


def test_typed_attributes_through_the_jit_list_helpers():
    """``List[int]``, ``Dict[str, Tensor]``, ``List[Tensor]`` attributes: data.pkl names
    ``torch.jit._pickle``'s helpers; the tensors inside are listed as ``attr.key`` /
    ``attr.i`` (torch's own ``table["a"]``, ``tl[0]``)."""
    with zipfile.ZipFile(DATA / "attrs_script.pt") as z:
        pkl = z.read("attrs_script/data.pkl")
    for helper in (b"build_intlist", b"restore_type_tag", b"build_tensorlist", b"build_doublelist"):
        assert b"ctorch.jit._pickle\n" + helper + b"\n" in pkl, helper
    v = cv.open(DATA / "attrs_script.pt", cache=False).variables
    assert set(v["name"]) == {"table.a", "tl.0"} and v["error"].isna().all()


def test_big_endian_byteorder_record(tmp_path):
    """A ``byteorder`` record saying ``big``: values are swapped to native on reading."""

    def swap(name: str, data: bytes) -> bytes:
        if name.endswith("/byteorder"):
            return b"big"
        if name.endswith("/data/0"):  # running: float64
            return np.frombuffer(data, "<f8").astype(">f8").tobytes()
        return data

    path = rewrite(DATA / "net_script.pt", tmp_path / "be.pt", change=swap)
    got = cv.open(path, cache=False).read("running")
    assert got.dtype == np.float64 and got.tobytes() == VALUES["net_script.pt/running"].tobytes()


def test_reading_through_bytes_io_matches(tmp_path):
    """The archive also opens from memory:// (no local path assumptions)."""
    mem = fsspec.filesystem("memory")
    mem.pipe_file("/ts-test/net_trace.pt", (DATA / "net_trace.pt").read_bytes())
    try:
        cat = cv.open("memory:///ts-test/net_trace.pt", cache=False)
        buf = io.BytesIO(cat.read("CONSTANTS.c0").tobytes())
        assert buf.getvalue() == VALUES["net_trace.pt/CONSTANTS.c0"].tobytes()
    finally:
        mem.rm("/ts-test", recursive=True)


def test_fuzz_mutated_archives_never_crash(tmp_path):
    """Random bytes overwritten in the pickles, the directory and the local headers: every
    listing is a result (rows or an error), every row it lists reads or raises cleanly."""
    import random

    from ckptview.scan.listing import FileResult

    rng = random.Random(24)
    data = (DATA / "net_trace.pt").read_bytes()
    with zipfile.ZipFile(DATA / "net_trace.pt") as z:
        hot = [(i.header_offset, i.header_offset + 30 + len(i.filename) + i.file_size)
               for i in z.infolist() if i.filename.endswith((".pkl", "/0", "version"))]  # fmt: skip
    hot.append((len(data) - 1024, len(data)))  # central directory and its end record
    path = tmp_path / "fuzz.pt"
    storage = Storage(fsspec.filesystem("file"))
    for _ in range(300):
        buf = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            a, b = rng.choice(hot)
            buf[rng.randrange(a, b)] = rng.randrange(256)
        path.write_bytes(bytes(buf))
        res = list_file(storage, 0, FileRef(str(path), codec="torchscript"))
        assert isinstance(res, FileResult)
        codec = registry.get_codec("torchscript")
        for var in res.variables:
            if var.error is None:
                try:
                    codec.read(storage.blob(str(path)), var)
                except (ValueError, OSError):
                    pass
