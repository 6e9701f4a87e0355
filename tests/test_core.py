"""The core on local paths, ``file://`` and ``memory://``: detection, registry, dtypes,
protobuf bounds, blob bounds, and the catalog's public columns (DESIGN.md §3)."""

from __future__ import annotations

import struct
import uuid
from types import SimpleNamespace

import fsspec
import ml_dtypes
import numpy as np
import pandas as pd
import pytest

import ckptview as cv
from ckptview import registry
from ckptview.codecs.base import Codec
from ckptview.demo import write_demo
from ckptview.dtypes import dtype_name, is_numeric, itemsize, np_dtype
from ckptview.formats import protobuf
from ckptview.io import Storage, TruncatedError
from ckptview.layouts.base import Layout
from ckptview.model import FileRef, SerialInfo, Span, TreeScan, VarInfo

SCHEMES = ["local", "file", "memory"]


def put_files(scheme: str, tmp_path, files: dict[str, bytes]) -> str:
    """Write ``files`` (relative path -> bytes) under a fresh root; return the root's URL."""
    if scheme == "memory":
        root = f"memory://ckptview-test-{uuid.uuid4().hex}"
        fs = fsspec.filesystem("memory")
        fs.mkdir(root)
    else:
        root = str(tmp_path / "tree")
        fs = fsspec.filesystem("file")
        fs.mkdir(root)
    for rel, data in files.items():
        fs.makedirs(f"{root}/{rel}".rsplit("/", 1)[0], exist_ok=True)
        fs.pipe_file(f"{root}/{rel}", data)
    return f"file://{root}" if scheme == "file" else root


# -- a third-party plugin: the "toy" format -----------------------------------------------
TOY_MAGIC = b"TOY1"


def toy_bytes(arr: np.ndarray) -> bytes:
    """TOY1, u32 count, float32 values."""
    arr = np.asarray(arr, dtype="<f4").reshape(-1)
    return TOY_MAGIC + struct.pack("<I", arr.size) + arr.tobytes()


class ToyCodec(Codec):
    name = "toy-codec"
    magic = (TOY_MAGIC,)

    def list_variables(self, blob, hints):
        (n,) = struct.unpack("<I", blob.read(4, 4))
        span = Span(blob.path, 8, 4 * n, disk_dtype="<f4")
        return [VarInfo("", "float32", (n,), nbytes=4 * n, span=span)]


class ToyLayout(Layout):
    name = "toy"
    priority = 1

    def guess_can_open(self, tree):
        return tree.exists("TOY_RUN")

    def scan(self, tree):
        serials = []
        for d in tree.dirs():
            n = int(d.split("-")[1])
            files = [FileRef(tree.abs(f), prefix=f.rsplit("/", 1)[1][:-4], kind="model")
                     for f in tree.files(d)]  # fmt: skip
            serials.append(SerialInfo(n, tree.abs(d), files, epoch=n, step=10 * n))
        return TreeScan(serials)


@pytest.fixture
def toy_plugins(monkeypatch):
    """Register ToyCodec/ToyLayout the way an installed package would: entry points."""

    def fake_entry_points(group=None):
        found = {"ckptview.codecs": ("toy-codec", ToyCodec),
                 "ckptview.layouts": ("toy", ToyLayout)}  # fmt: skip
        if group not in found:
            return []
        name, cls = found[group]
        return [SimpleNamespace(name=name, group=group, load=lambda: cls)]

    monkeypatch.setattr(registry, "entry_points", fake_entry_points)
    registry.codecs.cache_clear()
    registry.layouts.cache_clear()
    yield
    monkeypatch.undo()
    registry.codecs.cache_clear()
    registry.layouts.cache_clear()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_entry_point_plugin_opens_a_tree(scheme, tmp_path, toy_plugins):
    assert "toy" in registry.layouts() and "toy-codec" in registry.codecs()
    assert list(registry.layouts())[0] == "toy"  # priority 1 goes first
    files = {"TOY_RUN": b""}
    for n in range(3):
        files[f"step-{n}/w.toy"] = toy_bytes(np.arange(4) * (n + 1))
        files[f"step-{n}/b.toy"] = toy_bytes(np.full(2, n))
    url = put_files(scheme, tmp_path, files)
    cat = cv.open(url)
    assert cat.layout == "toy"
    assert list(cat.serials.index) == [0, 1, 2]
    assert cat.latest == 2 and cat.serials["latest"].sum() == 1
    assert sorted(cat.variables.query("serial == 1")["name"]) == ["b", "w"]
    np.testing.assert_array_equal(cat.read("w", serial=1), np.arange(4, dtype="f4") * 2)
    np.testing.assert_array_equal(cat.read("b"), np.full(2, 2, dtype="f4"))
    assert cv.open(url, layout="toy").layout == "toy"


def test_broken_plugin_is_skipped_with_a_warning(monkeypatch):
    def boom():
        raise ImportError("missing dependency")

    monkeypatch.setattr(
        registry, "entry_points",
        lambda group=None: [SimpleNamespace(name="broken", group=group, load=boom)],
    )  # fmt: skip
    registry.layouts.cache_clear()
    try:
        with pytest.warns(UserWarning, match="broken"):
            names = list(registry.layouts())
        assert "broken" not in names and "files" in names
    finally:
        monkeypatch.undo()
        registry.layouts.cache_clear()


def test_unknown_layout_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="known: .*files"):
        registry.get_layout("no-such-layout")


# -- unknown trees -------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", SCHEMES)
def test_unknown_tree_lists_the_layouts_tried(scheme, tmp_path):
    url = put_files(scheme, tmp_path, {"README.md": b"# notes", "sub/notes.txt": b"hello"})
    with pytest.raises(cv.UnknownTreeError) as err:
        cv.open(url)
    message = str(err.value)
    assert "tried:" in message
    for name in registry.layouts():
        assert name in message


@pytest.mark.parametrize("scheme", SCHEMES)
def test_missing_tree_is_a_clear_error(scheme, tmp_path):
    url = put_files(scheme, tmp_path, {"x.md": b""}) + "/does-not-exist"
    with pytest.raises(FileNotFoundError, match="no such checkpoint tree"):
        cv.open(url)


# -- dtypes --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, expected",
    [("bfloat16", ml_dtypes.bfloat16), ("float8_e4m3fn", ml_dtypes.float8_e4m3fn),
     ("float8_e5m2", ml_dtypes.float8_e5m2), ("bf16", ml_dtypes.bfloat16),
     ("half", np.float16), ("float32", np.float32), ("long", np.int64), ("bool", np.bool_),
     ("cfloat", np.complex64)],
)  # fmt: skip
def test_np_dtype(name, expected):
    assert np_dtype(name) == np.dtype(expected)


def test_dtype_names_round_trip():
    for name in ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float16", "float32", "float64",
                 "int8", "int16", "int32", "int64", "uint8", "bool", "complex64", "complex128"]:  # fmt: skip
        assert dtype_name(np_dtype(name)) == name
    assert dtype_name(np.dtype(object)) == dtype_name(np.dtype("V4")) == "object"
    assert dtype_name(np.dtype("<U5")) == "str160" and dtype_name(np.dtype("S3")) == "bytes24"
    assert np_dtype("str160") == np.dtype("<U5") and np_dtype("bytes24") == np.dtype("S3")
    assert itemsize("str160") == 20 and not is_numeric("str160") and is_numeric("bfloat16")
    assert dtype_name("bf16") == "bfloat16"
    assert itemsize("bfloat16") == 2 and itemsize("float8_e5m2") == 1 and itemsize("object") == 0
    bits = np.array([0x3F80, 0xC000], dtype="<u2")  # bfloat16 1.0, -2.0
    assert bits.view(np_dtype("bfloat16")).astype("f4").tolist() == [1.0, -2.0]


# -- protobuf decoder bounds --------------------------------------------------------------
def test_protobuf_decodes_a_tensor_desc():
    fields = protobuf.decode(bytes.fromhex("0805 1004 1008"))
    assert fields[1] == [5] and protobuf.varints(fields[2]) == [4, 8]
    packed = protobuf.decode(bytes.fromhex("0805 1202 0408"))
    assert protobuf.varints(packed[2]) == [4, 8]
    minus_one = protobuf.decode(b"\x10" + b"\xff" * 9 + b"\x01")
    assert protobuf.varints(minus_one[2]) == [-1]


@pytest.mark.parametrize(
    "hostile",
    [b"\x0a\xff\xff\xff\xff\x0f",  # a length of 4 GiB in a 6-byte buffer
     b"\x0a\x05abc",  # a length beyond the buffer
     b"\x08",  # a key with no value
     b"\x08" + b"\xff" * 11,  # a varint longer than 64 bits
     b"\x00\x01",  # field number 0
     b"\x0b",  # wire type 3 (groups)
     b"\x09\x01\x02",  # a truncated fixed64
     b"\x0d\x01",  # a truncated fixed32
     b"\x12\x02\xff\xff"],  # a packed field whose varint never ends
)  # fmt: skip
def test_protobuf_rejects_hostile_input(hostile):
    with pytest.raises(protobuf.DecodeError):
        fields = protobuf.decode(hostile)
        protobuf.varints(fields.get(2, []))


# -- blobs ---------------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", SCHEMES)
def test_blob_reads_stop_at_end_of_file(scheme, tmp_path):
    data = bytes(range(256)) * 40  # 10240 bytes: beyond the cached head block
    url = put_files(scheme, tmp_path, {"f.bin": data})
    storage, root = Storage.from_url(url)
    blob = storage.blob(f"{root}/f.bin")
    assert blob.size == len(data)
    assert blob.head(16) == data[:16]
    assert blob.read(5000, 100) == data[5000:5100]
    assert blob.read_upto(10200, 100) == data[10200:]
    for offset, length in [(10200, 41), (0, 10241), (1 << 40, 1), (-1, 4), (0, -1)]:
        with pytest.raises(TruncatedError):
            blob.read(offset, length)
    before = storage.counters.bytes_read
    with pytest.raises(TruncatedError):
        blob.read(0, 1 << 62)  # a hostile header's length: refused before any read
    assert storage.counters.bytes_read == before


# -- the catalog's public columns ----------------------------------------------------------
@pytest.fixture(scope="module")
def demo_catalog(tmp_path_factory):
    root = tmp_path_factory.mktemp("demo") / "tree"
    write_demo(root, serials=4)
    return cv.open(root)


def test_serials_columns_and_dtypes(demo_catalog):
    df = demo_catalog.serials
    assert df.index.name == "serial" and df.index.dtype == np.dtype("int64")
    assert df.index.is_monotonic_increasing and df.index.is_unique
    expected = ["path", "complete", "latest", "timestamp", "nbytes", "n_files", "n_variables",
                "epoch", "step", "nodes", "error"]  # fmt: skip
    assert list(df.columns[: len(expected)]) == expected
    assert pd.api.types.is_string_dtype(df["path"])
    assert df["complete"].dtype == bool and df["latest"].dtype == bool
    assert isinstance(df["timestamp"].dtype, pd.DatetimeTZDtype)
    assert str(df["timestamp"].dtype) == "datetime64[ns, UTC]"
    for col in ["nbytes", "n_files", "n_variables"]:
        assert df[col].dtype == np.dtype("int64"), col
    assert df["epoch"].dtype == pd.Int64Dtype() and df["step"].dtype == pd.Int64Dtype()
    assert all(isinstance(n, tuple) and all(isinstance(x, str) for x in n) for n in df["nodes"])
    assert all(e is None or isinstance(e, str) or pd.isna(e) for e in df["error"])
    assert df["latest"].sum() == 1


def test_variables_columns_and_dtypes(demo_catalog):
    df = demo_catalog.variables
    expected = ["serial", "node", "name", "kind", "dtype", "shape", "numel", "nbytes", "file",
                "error"]  # fmt: skip
    assert list(df.columns[: len(expected)]) == expected
    for col in ["serial", "numel", "nbytes"]:
        assert df[col].dtype == np.dtype("int64"), col
    for col in ["node", "name", "kind", "dtype", "file"]:
        assert pd.api.types.is_string_dtype(df[col]), col
    assert set(df["kind"]) <= {"model", "optimizer", "trainer", "lookup_table", "rng",
                               "scheduler", "other"}  # fmt: skip
    assert all(isinstance(s, tuple) and all(isinstance(d, int) for d in s) for s in df["shape"])
    ok = df[df["error"].isna()]
    assert (ok["numel"] == [int(np.prod(s)) for s in ok["shape"]]).all()
    assert all(e is None or isinstance(e, str) or pd.isna(e) for e in df["error"])
    assert isinstance(demo_catalog.metrics, pd.DataFrame)
    assert list(demo_catalog.metrics.columns) == ["serial", "name", "value"]


def test_protobuf_encoder_matches_the_documented_encoding():
    """protobuf.dev "Encoding": field 1 = 150 is ``08 96 01``; 300 is ``ac 02``; int64 -1 is
    ten bytes ``ff … ff 01``; and the decoder reads the encoder's output back."""
    from ckptview.formats.protobuf import decode, encode_field, encode_varint, signed

    assert encode_field(1, 150) == bytes.fromhex("089601")
    assert encode_varint(300) == bytes.fromhex("ac02")
    assert encode_varint(-1) == bytes.fromhex("ffffffffffffffffff01")
    msg = encode_field(2, b"testing") + encode_field(3, -5)
    fields = decode(msg)
    assert bytes(fields[2][0]) == b"testing" and signed(fields[3][0]) == -5
