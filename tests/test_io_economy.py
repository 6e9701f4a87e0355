"""I/O economy: a catalog reads headers, not tensors; reading one variable reads that variable.

Measured with the Storage counters on a demo tree of big tensors (> 50 MB), on a local path,
a ``file://`` URL and fsspec's ``memory://`` filesystem.
"""

from __future__ import annotations

import uuid

import fsspec
import pytest

import ckptview as cv
from ckptview.demo import write_demo

SCALE = 64  # fc_0.w_0 is 16384 x 64 float32 (4 MiB), twice more for its Adam moments
SERIALS = 5


@pytest.fixture(scope="module")
def big_tree(tmp_path_factory):
    demo = write_demo(tmp_path_factory.mktemp("big") / "tree", serials=SERIALS, scale=SCALE)
    sizes = {
        str(p.relative_to(demo.root)): p.stat().st_size for p in demo.root.rglob("*") if p.is_file()
    }
    return demo, sizes


@pytest.fixture(scope="module", params=["local", "file", "memory"])
def url(request, big_tree):
    demo, _ = big_tree
    if request.param == "local":
        yield str(demo.root)
    elif request.param == "file":
        yield f"file://{demo.root}"
    else:
        root = f"/ckptview-economy-{uuid.uuid4().hex}"
        mem = fsspec.filesystem("memory")
        for p in demo.root.rglob("*"):
            if p.is_file():
                mem.pipe_file(f"{root}/{p.relative_to(demo.root)}", p.read_bytes())
        yield f"memory://{root}"
        mem.rm(root, recursive=True)


def test_catalog_reads_under_two_percent(url, big_tree):
    _, sizes = big_tree
    total = sum(sizes.values())
    assert total > 50e6, f"the tree should be big: {total / 1e6:.1f} MB"
    cat = cv.open(url)
    variables, serials = cat.variables, cat.serials
    assert len(serials) == SERIALS and variables["error"].notna().sum() == 1  # the crash
    assert variables["nbytes"].sum() > 0.9 * total  # the catalog accounts for the bytes ...
    read = cat.storage.counters.bytes_read
    print(f"{url}: read {read} of {total} bytes ({100 * read / total:.3f}%), "
          f"{cat.storage.counters.requests} requests, {len(sizes)} files")  # fmt: skip
    assert read < 0.02 * total  # ... without reading them
    assert cat.storage.counters.requests <= 2 * len(sizes)


@pytest.mark.parametrize("name", ["fc_0.w_0", "fc_0.w_0_moment2_0", "fc_1.w_0"])
def test_read_one_variable_reads_its_bytes_only(url, big_tree, name):
    _, sizes = big_tree
    cat = cv.open(url)
    assert len(cat.variables)  # headers read and cached
    counters = cat.storage.counters
    before, requests = counters.bytes_read, counters.requests
    arr = cat.read(name, serial=2)
    read = counters.bytes_read - before
    header = sizes[f"checkpoint_2/__model__/{name}"] - arr.nbytes  # version, lod, desc
    assert arr.nbytes <= read <= arr.nbytes + header, (read, arr.nbytes, header)
    assert counters.requests - requests <= 2


def test_lookup_table_read_is_ranged(url, big_tree):
    _, sizes = big_tree
    cat = cv.open(url)
    assert len(cat.variables)
    before = cat.storage.counters.bytes_read
    arr = cat.read("share_w", serial=3, node="pserver_1")
    read = cat.storage.counters.bytes_read - before
    assert arr.ndim == 2 and arr.nbytes > 100_000
    assert arr.nbytes <= read <= sizes["checkpoint_3/__lookup_table__/share_w_1"]


def test_local_reads_into_arrays_equal_bytes(tmp_path):
    """``read_many(arrays=True)`` on local disk: large ranges come as fresh ``uint8`` arrays,
    small ones as bytes, every one equal to the file's bytes and counted once."""
    import numpy as np
    from fsspec.implementations.local import LocalFileSystem

    from ckptview.io import ARRAY_READ, Storage

    data = np.random.default_rng(0).integers(0, 256, size=3 * ARRAY_READ + 11, dtype=np.uint8)
    path = tmp_path / "blob.bin"
    path.write_bytes(data.tobytes())
    other = tmp_path / "other.bin"
    other.write_bytes(b"0123456789")
    storage = Storage(LocalFileSystem())
    requests = [(str(path), 5, 5 + ARRAY_READ), (str(other), 2, 7), (str(path), 0, 100),
                (str(path), 2 * ARRAY_READ, data.size + 50), (str(path), 9, 9)]  # fmt: skip
    got = list(storage.read_many(requests, arrays=True))
    raw = data.tobytes()
    assert [bytes(g) for g in got] == [raw[5 : 5 + ARRAY_READ], b"23456", raw[:100],
                                       raw[2 * ARRAY_READ :], b""]  # fmt: skip
    assert isinstance(got[0], np.ndarray) and got[0].flags.writeable
    assert isinstance(got[1], bytes) and isinstance(got[2], bytes)
    assert storage.counters.bytes_read == sum(len(g) for g in got)
    plain = list(Storage(LocalFileSystem()).read_many(requests))
    assert [bytes(g) for g in got] == [bytes(p) for p in plain]
