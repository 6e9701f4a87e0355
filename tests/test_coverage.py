"""Exact coverage of a logical tensor by its pieces (DESIGN.md §3b): DCP chunks and DCP-written
safetensors rank shards that overlap and leave a hole while their element counts add up are an
error at catalog time (which two pieces, where), a plain gap names the hole, and an assembled
tensor never shows uninitialised memory. Every tree is built by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from test_columns import write_safetensors
from test_deepspeed import Glob, Obj, _Emitter, torch_zip
from test_llm import _megatron_rank

import ckptview as cv
from ckptview.model import FileRef, Piece, VarInfo
from ckptview.scan import logical
from ckptview.scan.listing import FileResult
from ckptview.scan.logical import Placed, iter_assembled, read_assembled

DCP = "torch.distributed.checkpoint.metadata"
FS = "torch.distributed.checkpoint.filesystem"

#: (offsets, sizes) of pieces: 1-D, [0:4] and [2:4] overlap on [2:4], [4:6] is a hole
OVERLAP_1D = [((0,), (4,)), ((2,), (2,)), ((6,), (2,))]
#: 2-D (4, 4): rows 0:2 whole, rows 1:3 x cols 0:2 (overlap [1:2, 0:2]), rows 2:4 x cols 2:4
#: (hole [3:4, 0:2]): 8 + 4 + 4 = 16 elements
OVERLAP_2D = [((0, 0), (2, 4)), ((1, 0), (2, 2)), ((2, 2), (2, 2))]
#: a correct uneven 2-D tiling of (5, 7)
TILING_2D = [((0, 0), (3, 4)), ((0, 4), (3, 3)), ((3, 0), (2, 2)), ((3, 2), (2, 5))]


def full(shape: tuple[int, ...]) -> np.ndarray:
    return np.arange(1, math.prod(shape) + 1, dtype=np.float32).reshape(shape)


def box(values: np.ndarray, at: tuple[int, ...], size: tuple[int, ...]) -> np.ndarray:
    return np.ascontiguousarray(values[tuple(slice(o, o + s) for o, s in zip(at, size))])


# -- DCP: a .metadata and one .distcp per chunk -------------------------------------------------
def dcp_tree(root: Path, shape: tuple[int, ...], pieces: list) -> Path:
    """``root/step_1``: tensor ``model.w`` of ``shape`` (float32) stored as ``pieces``
    (``(offsets, sizes)``, values from :func:`full`), chunk ``r`` in ``__r_0.distcp``."""
    d = root / "step_1"
    d.mkdir(parents=True)
    values = full(shape)
    props = Obj(DCP, "TensorProperties", (Glob("torch", "float32"), "torch.strided", False, 0,
                                          False))  # fmt: skip
    chunks, storage = [], {}
    for r, (at, size) in enumerate(pieces):
        data = torch_zip(box(values, at, size))
        (d / f"__{r}_0.distcp").write_bytes(data)
        chunks.append(Obj(DCP, "ChunkStorageMetadata", {"offsets": at, "sizes": size}))
        key = Obj(DCP, "MetadataIndex", {"fqn": "model.w", "offset": at, "index": r})
        where = {"relative_path": f"__{r}_0.distcp", "offset": 0, "length": len(data)}
        storage[key] = Obj(FS, "_StorageInfo", where)
    entry = {"properties": props, "size": shape, "chunks": chunks}
    state = {"state_dict_metadata": {"model.w": Obj(DCP, "TensorStorageMetadata", entry)},
             "planner_data": {"model.w": ("model", "w")}, "storage_data": storage,
             "storage_meta": None, "version": "1.0.0"}  # fmt: skip
    (d / ".metadata").write_bytes(_Emitter().dump(Obj(DCP, "Metadata", state)))
    return root


# -- DCP-HF: DCP's HuggingFaceStorageWriter rank shards (sharded/) ------------------------------
def hf_tree(root: Path, shape: tuple[int, ...], pieces: list, copies: int = 0) -> Path:
    """``root/step-5/sharded``: tensor ``w`` stored as ``pieces`` (values from :func:`full`),
    piece ``r`` in rank ``r + 1``'s file; the first ``copies`` pieces written twice."""
    d = root / "step-5" / "sharded"
    d.mkdir(parents=True)
    values = full(shape)
    for r, (at, size) in enumerate([*pieces, *pieces[:copies]]):
        meta = {"format": "pt", "DCP_SHARDING_INFO": json.dumps({"w": {"saved_offsets": at}})}
        path = d / f"shard-{r + 1:05d}-model-00001-of-00001.safetensors"
        write_safetensors(path, {"w": box(values, at, size)}, meta)
    return root


def assert_refused(cat: cv.Catalog, name: str, serial: int, *patterns: str, tmp: Path) -> None:
    """``name`` carries an error matching every pattern, the serial does not load, and read,
    iter_chunks and export refuse it."""
    row = cat.variables.set_index("name").loc[name]
    assert isinstance(row["error"], str), row
    for pattern in patterns:
        assert pattern in row["error"], row["error"]
    assert not cat.serials.loc[serial, "loadable"]
    assert patterns[0] in cat.serials.loc[serial, "error"]
    with pytest.raises(ValueError, match=patterns[0]):
        cat.read(name, serial=serial)
    with pytest.raises(ValueError, match=patterns[0]):
        list(cat.iter_chunks(name, serial=serial))
    with pytest.raises(ValueError, match="does not load"):
        cat.export(serial, to=tmp / "out")
    with pytest.raises(ValueError, match="no tensor to export"):  # forced: it is left out
        cat.export(serial, to=tmp / "forced", force=True)


def test_dcp_chunks_overlapping_with_a_hole_1d(tmp_path):
    cat = cv.open(dcp_tree(tmp_path / "run", (8,), OVERLAP_1D))
    where = "chunk (4,) at (0,) in __0_0.distcp and chunk (2,) at (2,) in __1_0.distcp"
    row = cat.variables.set_index("name").loc["model/w"]
    assert f"chunks overlap: {where} both hold [2:4]" in row["error"]
    assert_refused(cat, "model/w", 1, "chunks overlap", "[2:4]", tmp=tmp_path)


def test_dcp_chunks_overlapping_with_a_hole_2d(tmp_path):
    cat = cv.open(dcp_tree(tmp_path / "run", (4, 4), OVERLAP_2D))
    assert_refused(cat, "model/w", 1, "chunks overlap", "__0_0.distcp", "__1_0.distcp",
                   "both hold [1:2, 0:2]", tmp=tmp_path)  # fmt: skip


def test_dcp_hf_rank_shards_overlapping_with_a_hole_1d(tmp_path):
    cat = cv.open(hf_tree(tmp_path / "run", (8,), OVERLAP_1D))
    assert cat.variables.set_index("name").loc["model/w", "shape"] == (8,)
    assert_refused(cat, "model/w", 5, "pieces overlap", "(rank1) piece (4,) at (0,)",
                   "(rank2) piece (2,) at (2,)", "both hold [2:4]", tmp=tmp_path)  # fmt: skip


def test_dcp_hf_rank_shards_overlapping_with_a_hole_2d(tmp_path):
    cat = cv.open(hf_tree(tmp_path / "run", (4, 4), OVERLAP_2D))
    assert_refused(cat, "model/w", 5, "pieces overlap", "(rank1) piece (2, 4) at (0, 0)",
                   "(rank2) piece (2, 2) at (1, 0)", "both hold [1:2, 0:2]", tmp=tmp_path)  # fmt: skip


@pytest.mark.parametrize("tree", [dcp_tree, hf_tree])
def test_the_check_reads_no_tensor_bytes(tmp_path, tree):
    """The overlap is found from the headers: a 4 MiB tensor's pieces are not read."""
    wide = 1 << 18
    pieces = [((r, c * wide), (h, w * wide)) for (r, c), (h, w) in OVERLAP_2D]
    root = tree(tmp_path / "run", (4, 4 * wide), pieces)
    cat = cv.open(root)
    cat.storage.counters.reset()
    assert "overlap" in cat.variables.set_index("name").loc["model/w", "error"]
    assert not cat.serials["loadable"].any()
    stored = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
    assert cat.storage.counters.bytes_read < stored // 16


def test_a_plain_gap_is_reported_with_where(tmp_path):
    """A missing piece (no overlap): the hole is named, for chunks and rank shards."""
    dcp = cv.open(dcp_tree(tmp_path / "dcp", (5, 7), TILING_2D[:2] + TILING_2D[3:]))
    assert_refused(dcp, "model/w", 1, "a piece is missing", "hole at [3:5, 0:2]",
                   tmp=tmp_path / "a")  # fmt: skip
    hf = cv.open(hf_tree(tmp_path / "hf", (8,), [((0,), (4,)), ((6,), (2,))]))
    assert_refused(hf, "model/w", 5, "a piece is missing", "cover 6 of 8", "hole at [4:6]",
                   tmp=tmp_path / "b")  # fmt: skip


def test_a_correct_tiling_reads_bit_exactly(tmp_path):
    want = full((5, 7))
    for cat, serial in ((cv.open(dcp_tree(tmp_path / "dcp", (5, 7), TILING_2D)), 1),
                        (cv.open(hf_tree(tmp_path / "hf", (5, 7), TILING_2D)), 5)):  # fmt: skip
        assert cat.serials.loc[serial, "loadable"], cat.serials.loc[serial, "error"]
        got = cat.read("model/w", serial=serial)
        assert got.tobytes() == want.tobytes()
        chunks = list(cat.iter_chunks("model/w", serial=serial, max_bytes=16))
        assert np.concatenate(chunks).tobytes() == want.tobytes()
    rows = cv.open(hf_tree(tmp_path / "rows", (8, 3), [((0, 0), (5, 3)), ((5, 0), (3, 3))]))
    streamed = np.concatenate(list(rows.iter_chunks("model/w", max_bytes=8)))
    assert streamed.tobytes() == full((8, 3)).tobytes()


def test_replicas_are_not_overlaps(tmp_path):
    """The same piece in two rank files (DCP-HF) and Megatron's replicated layer norms."""
    cat = cv.open(hf_tree(tmp_path / "hf", (5, 7), TILING_2D, copies=2))
    assert cat.serials.loc[5, "loadable"], cat.serials.loc[5, "error"]
    assert cat.read("model/w").tobytes() == full((5, 7)).tobytes()
    assert len(cat.shards.query("name == 'model/w'")) == 6
    rng = np.random.default_rng(0)
    fc1, norm = rng.standard_normal((8, 6), "f4"), rng.standard_normal(6, "f4")
    root = tmp_path / "megatron"
    for tp in range(2):
        model = {"decoder.layers.0.mlp.linear_fc1.weight": fc1[4 * tp : 4 * tp + 4],
                 "decoder.layers.0.input_layernorm.weight": norm}  # fmt: skip
        out = root / "iter_0000007" / f"mp_rank_{tp:02d}_000" / "model_optim_rng.pt"
        out.parent.mkdir(parents=True)
        out.write_bytes(_megatron_rank(model, tp, 0, 2))
    (root / "latest_checkpointed_iteration.txt").write_text("7")
    mega = cv.open(root)
    assert mega.serials.loc[7, "loadable"], mega.serials.loc[7, "error"]
    np.testing.assert_array_equal(mega.read("model/decoder.layers.0.input_layernorm.weight"), norm)
    np.testing.assert_array_equal(mega.read("model/decoder.layers.0.mlp.linear_fc1.weight"), fc1)


# -- the assembly itself never returns uninitialised memory -------------------------------------
def _assembled(shape: tuple[int, ...], pieces: list, short: int = 0) -> tuple:
    """An assembled variable (no catalog error) over ``pieces`` of :func:`full` values, and
    its read functions; the stored pieces give ``short`` values fewer than they hold."""
    values = full(shape)
    ref = FileRef("/x/w.safetensors", node="", size=0)
    res = FileResult(0, ref, "safetensors", [])
    placed = [Placed(VarInfo("w", "float32", size), res, at, Piece(None, at))
              for at, size in pieces]  # fmt: skip
    var = VarInfo("", "float32", shape)
    var.name, var.locator = "w", placed

    def read_piece(_res: FileResult, v: VarInfo) -> np.ndarray:
        p = next(p for p in placed if p.var is v)
        return box(values, p.offsets, p.shape)

    def chunk_piece(_res: FileResult, v: VarInfo, _max: int):
        flat = read_piece(_res, v).reshape(-1)
        yield flat[: flat.size - short]

    return var, read_piece, chunk_piece


@pytest.mark.parametrize("pieces", [OVERLAP_1D, [((0,), (4,)), ((6,), (2,))]])
def test_a_hole_never_leaks_from_the_assembly(pieces):
    """Even when the catalog's check is bypassed (no error on the variable), reading pieces
    that leave a hole raises instead of returning np.empty's leftovers."""
    var, read_piece, chunk_piece = _assembled((8,), pieces)
    with pytest.raises(ValueError, match="overlap|a piece is missing"):
        read_assembled(var, read_piece, chunk_piece)
    with pytest.raises(ValueError, match="overlap|a piece is missing"):
        list(iter_assembled(var, read_piece, chunk_piece, 1 << 20))


def test_a_streamed_piece_giving_too_few_values_is_an_error():
    """A piece of whole rows streamed into place must fill its rows: short, it raises."""
    var, read_piece, chunk_piece = _assembled((8,), [((0,), (4,)), ((4,), (4,))], short=1)
    with pytest.raises(ValueError, match="gave"):
        read_assembled(var, read_piece, chunk_piece)
    with pytest.raises(ValueError, match="gave"):
        list(iter_assembled(var, read_piece, chunk_piece, 1 << 20))


# -- the check on many pieces -------------------------------------------------------------------
def test_thousands_of_pieces_on_a_huge_tensor():
    """A 64 x 64 grid of boxes over a 2**40-element tensor: checked from the boxes alone
    (per-element marking could not run); then one box shifted makes an overlap and a hole."""
    n, step = 64, 1 << 14
    shape = (n * step, n * step)
    boxes = [((i * step, j * step), (step, step)) for i in range(n) for j in range(n)]
    assert logical.cover_errors(shape, boxes, str) == []
    assert logical.cover_errors(shape, boxes[::-1], str) == []
    moved = list(boxes)
    moved[2 * n + 5] = ((2 * step, 4 * step + 1), (step, step))  # onto its left neighbour
    errors = logical.cover_errors(shape, moved, lambda i: f"box {i}")
    assert errors == [f"pieces overlap: box {2 * n + 4} and box {2 * n + 5} both hold "
                      f"[{2 * step}:{3 * step}, {4 * step + 1}:{5 * step}]"]  # fmt: skip
    del moved[2 * n + 5]
    errors = logical.cover_errors(shape, moved, str)
    assert errors == [f"pieces cover {n * n * step * step - step * step} of {shape[0] * shape[1]}"
                      f" elements: a piece is missing (hole at [{2 * step}:{3 * step}, "
                      f"{5 * step}:{6 * step}])"]  # fmt: skip


def test_boxes_outside_zero_sized_and_scalar():
    assert logical.cover_errors((4,), [((2,), (3,))], lambda i: "b")[0] == "b: outside (4,)"
    assert logical.cover_errors((0, 3), [((0, 0), (0, 3)), ((0, 1), (0, 2))], str) == []
    assert logical.cover_errors((), [((), ())], str) == []
    assert "overlap" in logical.cover_errors((), [((), ()), ((), ())], str)[0]
    assert "hole at []" in logical.cover_errors((), [], str)[0]
