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
