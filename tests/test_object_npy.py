"""Object-dtype ``.npy`` / ``.npz`` (``np.save`` of arrays of different shapes; needs
``allow_pickle=True``) against what numpy reads back (tests/data/object_npy, see its README):
the elements listed and read bit-exactly through the restricted VM, every row marked
``needs_pickle``; hostile or non-numeric contents an error naming them; listing reads the
pickle's structure, not the element arrays."""

from __future__ import annotations

import io
import os
import pickle
import posix
import subprocess
import zipfile
from argparse import Namespace
from contextlib import contextmanager
from pathlib import Path

import fsspec
import numpy as np
import pytest

import ckptview as cv
from ckptview.formats.npy_objects import NEEDS_PICKLE, InflatedArray
from ckptview.io import Storage
from ckptview.model import FileRef
from ckptview.scan.listing import list_file
from ckptview.testing import CodecSuite

DATA = Path(__file__).parent / "data" / "object_npy"
TRUTH = np.load(DATA / "truth.npz")
RAGGED = [TRUTH[f"ragged/{i}"] for i in range(3)]


def listing(path: Path, codec: str):
    storage = Storage(fsspec.filesystem("file"))
    return list_file(storage, 0, FileRef(str(path), codec=codec)), storage


def same(got: np.ndarray, want: np.ndarray) -> bool:
    """Bit-exact in native byte order, same logical dtype and shape."""
    native = want.dtype.newbyteorder("=")
    return (got.shape == want.shape and got.dtype == native
            and got.tobytes() == want.astype(native).tobytes())  # fmt: skip


def npy_with_pickle(payload: bytes, shape: tuple[int, ...]) -> bytes:
    buf = io.BytesIO()
    header = {"descr": "|O", "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(buf, header)
    return buf.getvalue() + payload


@contextmanager
def no_exec():
    """Commands run inside raise AssertionError("… was run") (set up after the hostile
    pickles are written: Python's pickle looks the real functions up by name)."""

    def run(*args, **kwargs):
        raise AssertionError(f"the pickle was run: {args!r}")

    with pytest.MonkeyPatch.context() as mp:
        for module in (os, posix, subprocess):
            for name in ("system", "Popen"):
                if hasattr(module, name):
                    mp.setattr(module, name, run)
        yield


# -- listing and values against numpy ------------------------------------------------------------
def test_npy_list_of_arrays():
    cat = cv.open(DATA / "ragged.npy", cache=False)
    v = cat.variables.set_index("name")
    assert v["error"].isna().all(), v["error"]
    assert list(v.index) == ["ragged.npy", "0", "1", "2"]
    assert (v.loc["ragged.npy", "dtype"], v.loc["ragged.npy", "shape"]) == ("object", (3,))
    for i, want in enumerate(RAGGED):
        row = v.loc[str(i)]
        assert (row["dtype"], row["shape"], row["nbytes"]) == (
            want.dtype.newbyteorder("=").name, want.shape, want.nbytes)  # fmt: skip
        assert same(cat.read(str(i)), want), i


@pytest.mark.parametrize("name", ["mixed.npz", "mixed_deflated.npz"])
def test_npz_object_member_beside_a_plain_one(name):
    cat = cv.open(DATA / name, cache=False)
    v = cat.variables.set_index("name")
    assert list(v.index) == ["ragged", "ragged/0", "ragged/1", "ragged/2", "plain"]
    assert v["error"].isna().all(), v["error"]
    for i, want in enumerate(RAGGED):
        assert v.loc[f"ragged/{i}", "shape"] == want.shape
        assert same(cat.read(f"ragged/{i}"), want), i
    assert same(cat.read("plain"), TRUTH["plain"])


def test_zero_d_dict():
    """``np.save(path, {...})``: a 0-d object array; its dict's keys name the rows."""
    cat = cv.open(DATA / "dict.npy", cache=False)
    v = cat.variables.set_index("name")
    assert list(v.index) == ["dict.npy", "w", "steps/0", "steps/1"]
    assert v.loc["dict.npy", "shape"] == ()
    for key in ("w", "steps/0", "steps/1"):
        assert same(np.asarray(cat.read(key)), TRUTH[f"dict/{key}"]), key


def test_the_object_array_reads_as_numpy_loads_it():
    cat = cv.open(DATA / "ragged.npy", cache=False)
    got = cat.read("ragged.npy")
    want = np.load(DATA / "ragged.npy", allow_pickle=True)  # the reference reader
    assert got.dtype == object and got.shape == want.shape
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape and g.tobytes() == w.tobytes()


@pytest.mark.parametrize(("name", "codec"), [("ragged.npy", "npy"), ("dict.npy", "npy"),
                                             ("mixed.npz", "npz"), ("mixed_deflated.npz", "npz")])  # fmt: skip
def test_every_object_row_needs_pickle(name, codec):
    res, _ = listing(DATA / name, codec)
    for var in res.variables:
        if var.name == "plain":
            assert NEEDS_PICKLE not in var.attrs
        else:
            assert var.attrs[NEEDS_PICKLE] is True, var.name


def test_numpy_refuses_these_without_allow_pickle():
    """What the ``needs_pickle`` mark stands for."""
    with pytest.raises(ValueError, match="allow_pickle"):
        np.load(DATA / "ragged.npy")


# -- refused contents ----------------------------------------------------------------------------
class Evil:
    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


@pytest.mark.parametrize(("fn", "named"), [(os.system, "system"),
                                           (subprocess.Popen, "subprocess.Popen")])  # fmt: skip
def test_refused_global_is_named_never_run(tmp_path, fn, named):
    arr = np.empty(2, dtype=object)
    arr[:] = [RAGGED[0], Evil(fn, "echo pwned")]
    path = tmp_path / "evil.npy"
    path.write_bytes(npy_with_pickle(pickle.dumps(arr, protocol=3), (2,)))

    with no_exec():  # checks the test: Python's pickle would run it
        with pytest.raises(AssertionError, match="was run"):
            np.load(path, allow_pickle=True)
        v = cv.open(path, cache=False).variables
        assert len(v) == 1 and v["dtype"].iloc[0] == "object" and v["shape"].iloc[0] == (2,)
        assert named in v["error"].iloc[0] and "pickle" in v["error"].iloc[0]


def test_pickled_instance_of_an_allowlisted_class_is_refused(tmp_path):
    """``argparse.Namespace`` is a record the VM may build, but it is not a numeric value."""
    arr = np.empty(2, dtype=object)
    arr[:] = [RAGGED[0], Namespace(lr=0.1)]
    path = tmp_path / "ns.npy"
    np.save(path, arr, allow_pickle=True)
    with no_exec():
        v = cv.open(path, cache=False).variables
    assert len(v) == 1 and "argparse.Namespace" in v["error"].iloc[0]


@pytest.mark.parametrize("compressed", [False, True])
def test_refused_member_leaves_the_others_readable(tmp_path, compressed):
    bad = np.empty(1, dtype=object)
    bad[0] = Evil(subprocess.Popen, ["true"])
    path = tmp_path / "m.npz"
    save = np.savez_compressed if compressed else np.savez
    buf = io.BytesIO()
    save(buf, plain=TRUTH["plain"], good=np.array(RAGGED + [None], dtype=object)[:3])
    with np.load(io.BytesIO(buf.getvalue()), allow_pickle=True) as z:
        assert len(z["good"]) == 3
    with zipfile.ZipFile(buf, "a", zipfile.ZIP_DEFLATED if compressed else zipfile.ZIP_STORED) as z:
        z.writestr("bad.npy", npy_with_pickle(pickle.dumps(bad, protocol=3), (1,)))
    path.write_bytes(buf.getvalue())
    with no_exec():
        cat = cv.open(path, cache=False)
        v = cat.variables.set_index("name")
    assert "subprocess.Popen" in v.loc["bad", "error"]
    assert v.drop(index="bad")["error"].isna().all()
    assert same(cat.read("good/2"), RAGGED[2]) and same(cat.read("plain"), TRUTH["plain"])


def test_a_string_element_is_an_error_row(tmp_path):
    np.save(tmp_path / "s.npy", np.array([RAGGED[1], "lr=0.1"], dtype=object), allow_pickle=True)
    v = cv.open(tmp_path / "s.npy", cache=False).variables
    assert len(v) == 1 and "'1'" in v["error"].iloc[0] and "str" in v["error"].iloc[0]


# -- bytes read ----------------------------------------------------------------------------------
def test_listing_reads_the_structure_not_the_elements(tmp_path):
    parts = [np.full((256, 1024), i, dtype="<f4") for i in range(3)]  # 1 MiB each
    arr = np.empty(3, dtype=object)
    arr[:] = parts
    path = tmp_path / "big.npy"
    np.save(path, arr, allow_pickle=True)
    size = path.stat().st_size
    res, storage = listing(path, "npy")
    listed = storage.counters.bytes_read
    assert len(res.variables) == 4 and listed < 256 << 10, (listed, size)
    spans = [v.span for v in res.variables[1:]]
    assert all(s is not None and s.offset + s.length <= size for s in spans)
    cat = cv.open(path, cache=False)
    assert len(cat.variables) == 4
    before = cat.storage.counters.bytes_read
    assert same(cat.read("1"), parts[1])
    assert cat.storage.counters.bytes_read - before <= parts[1].nbytes + 4096


def test_deflated_member_elements_are_read_by_inflating_up_to_them(tmp_path):
    """Elements past the VM's in-memory size stay ranges of the inflated stream."""
    parts = [np.arange(i * 5000, (i + 1) * 5000, dtype="<i8") for i in range(3)]  # 40 KB each
    arr = np.empty(3, dtype=object)
    arr[:] = parts
    np.savez_compressed(tmp_path / "z.npz", objs=arr)
    res, _ = listing(tmp_path / "z.npz", "npz")
    assert [type(v.locator) for v in res.variables[1:]] == [InflatedArray] * 3
    cat = cv.open(tmp_path / "z.npz", cache=False)
    for i, want in enumerate(parts):
        assert same(cat.read(f"objs/{i}"), want), i


# -- the codec kit -------------------------------------------------------------------------------
class TestObjectNpy(CodecSuite):
    codec = "npy"
    samples = (str(DATA / "ragged.npy"), str(DATA / "dict.npy"))
    truncate_every_below = 600


class TestObjectNpz(CodecSuite):
    codec = "npz"
    samples = (str(DATA / "mixed.npz"), str(DATA / "mixed_deflated.npz"))
