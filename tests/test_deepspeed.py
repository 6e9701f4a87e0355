"""DeepSpeed ``save_checkpoint`` trees (specs/modern.md §8), built by hand: ``latest`` +
``global_stepN/`` with ``mp_rank_00_model_states.pt`` and per-rank ZeRO optimizer files.

The torch files are written as real ``torch.save`` zip archives (``<stem>/data.pkl`` pickled
with protocol 2 by the small opcode emitter below, ``<stem>/data/<key>`` raw storages), the
form DeepSpeed writes through ``torch.save``. The emitter is shared by the Lightning and DCP
tests.
"""

from __future__ import annotations

import io
import struct
import zipfile
from dataclasses import dataclass, field

import numpy as np
import pytest

import ckptview as cv

# -- a minimal torch.save writer (no torch) ----------------------------------------------------
STORAGE = {"float32": "FloatStorage", "float64": "DoubleStorage", "float16": "HalfStorage",
           "bfloat16": "BFloat16Storage", "int64": "LongStorage", "int32": "IntStorage",
           "uint8": "ByteStorage", "bool": "BoolStorage"}  # fmt: skip


@dataclass(eq=False)  # hashable by identity: usable as a dict key (DCP MetadataIndex)
class Obj:
    """A class instance: ``GLOBAL mod.name``, NEWOBJ with no args, then BUILD ``state``."""

    module: str
    name: str
    state: object = None


@dataclass
class Glob:
    """A bare global reference (``torch float32``)."""

    module: str
    name: str


@dataclass
class _Emitter:
    storages: list[np.ndarray] = field(default_factory=list)

    def dump(self, obj: object) -> bytes:
        return b"\x80\x02" + self.emit(obj) + b"."

    def emit(self, o: object) -> bytes:
        if o is None:
            return b"N"
        if isinstance(o, bool):
            return b"\x88" if o else b"\x89"
        if isinstance(o, int):
            if -(2**31) <= o < 2**31:
                return b"J" + struct.pack("<i", o)
            raw = o.to_bytes((o.bit_length() + 8) // 8, "little", signed=True)
            return b"\x8a" + bytes([len(raw)]) + raw
        if isinstance(o, float):
            return b"G" + struct.pack(">d", o)
        if isinstance(o, str):
            raw = o.encode()
            return b"X" + struct.pack("<I", len(raw)) + raw
        if isinstance(o, tuple):
            return b"(" + b"".join(self.emit(v) for v in o) + b"t"
        if isinstance(o, list):
            return b"](" + b"".join(self.emit(v) for v in o) + b"e"
        if isinstance(o, dict):
            inner = b"".join(self.emit(k) + self.emit(v) for k, v in o.items())
            return b"}(" + inner + b"u"
        if isinstance(o, Glob):
            return f"c{o.module}\n{o.name}\n".encode()
        if isinstance(o, Obj):
            return f"c{o.module}\n{o.name}\n".encode() + b")\x81" + self.emit(o.state) + b"b"
        if isinstance(o, np.ndarray):
            return self.tensor(o)
        raise TypeError(type(o))

    def tensor(self, arr: np.ndarray) -> bytes:
        key = len(self.storages)
        self.storages.append(np.ascontiguousarray(arr))
        dtype = arr.dtype.name
        pid = self.emit(("storage", Glob("torch", STORAGE[dtype]), str(key), "cpu", arr.size))
        stride, acc = [], 1
        for n in reversed(arr.shape):
            stride.insert(0, acc)
            acc *= n
        return (
            b"ctorch._utils\n_rebuild_tensor_v2\n("
            + pid
            + b"Q"
            + self.emit(0)
            + self.emit(tuple(arr.shape))
            + self.emit(tuple(stride))
            + b"\x89"
            + b"ccollections\nOrderedDict\n)R"
            + b"tR"
        )


def torch_zip(obj: object, prefix: str = "archive") -> bytes:
    """Bytes of a torch.save zip holding ``obj`` (numpy arrays become tensors)."""
    em = _Emitter()
    pkl = em.dump(obj)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr(f"{prefix}/data.pkl", pkl)
        z.writestr(f"{prefix}/byteorder", b"little")
        for i, arr in enumerate(em.storages):
            z.writestr(f"{prefix}/data/{i}", arr.tobytes())
        z.writestr(f"{prefix}/version", b"3\n")
    return buf.getvalue()


# -- a DeepSpeed tree --------------------------------------------------------------------------
def weights(step: int) -> dict[str, np.ndarray]:
    return {
        "fc.weight": np.arange(12, dtype=np.float32).reshape(3, 4) * step,
        "fc.bias": np.full(3, step, dtype=np.float32),
    }


def model_states(step: int) -> dict:
    return {
        "module": weights(step),
        "buffer_names": [],
        "optimizer": None,
        "lr_scheduler": {"last_epoch": step},
        "global_steps": step,
        "global_samples": step * 8,
        "skipped_steps": 0,
        "dp_world_size": 2,
        "mp_world_size": 1,
        "ds_config": {"train_batch_size": 8, "zero_optimization": {"stage": 2}},
        "ds_version": "0.19.8",
    }


def optim_states(step: int, rank: int) -> dict:
    part = np.full(8, step + rank, dtype=np.float32)
    return {
        "optimizer_state_dict": {
            "loss_scaler": None,
            "base_optimizer_state": {"state": {0: {"exp_avg": part, "exp_avg_sq": part * 2}}},
            "single_partition_of_fp32_groups": [part],
            "zero_stage": 2,
            "partition_count": 2,
        },
        "ds_config": {"train_batch_size": 8},
        "ds_version": "0.19.8",
    }


def write_tag(root, step: int, ranks=(0, 1), model=True) -> None:
    tag = root / f"global_step{step}"
    tag.mkdir(parents=True)
    if model:
        (tag / "mp_rank_00_model_states.pt").write_bytes(
            torch_zip(model_states(step), "mp_rank_00_model_states")
        )
    for r in ranks:
        name = f"zero_pp_rank_{r}_mp_rank_00_optim_states"
        (tag / f"{name}.pt").write_bytes(torch_zip(optim_states(step, r), name))


@pytest.fixture
def ds_tree(tmp_path):
    root = tmp_path / "run"
    write_tag(root, 10)
    write_tag(root, 20)
    write_tag(
        root, 30, ranks=(0,), model=False
    )  # interrupted: rank 1 and the model states never landed
    (root / "latest").write_text("global_step20")  # no newline, as DeepSpeed writes it
    (root / "zero_to_fp32.py").write_text("# recovery script\n")
    return root


def test_serials_latest_and_nodes(ds_tree):
    cat = cv.open(ds_tree)
    assert cat.layout == "deepspeed"
    s = cat.serials
    assert list(s.index) == [10, 20, 30]
    assert s["complete"].tolist() == [True, True, False]
    assert cat.latest == 20 and s["latest"].tolist() == [False, True, False]
    assert s.loc[20, "nodes"] == ("rank0", "rank1")
    assert s.loc[30, "nodes"] == ("rank0",)
    assert s["step"].tolist() == [10, 20, 30]
    assert "interrupted" in s.loc[30, "error"]
    assert cat.attrs["latest_tag"] == "global_step20"


def test_values_per_rank(ds_tree):
    cat = cv.open(ds_tree)
    w = cat.read("module/fc.weight")  # default serial: latest (20)
    np.testing.assert_array_equal(w, weights(20)["fc.weight"])
    assert cat.read("global_steps", serial=10) == 10
    name = "optimizer_state_dict/base_optimizer_state/state/0/exp_avg"
    for rank in (0, 1):
        got = cat.read(name, serial=20, node=f"rank{rank}")
        np.testing.assert_array_equal(got, np.full(8, 20 + rank, dtype=np.float32))
    with pytest.raises(KeyError, match="several nodes"):
        cat.read(name, serial=20)
    v = cat.variables
    kinds = v[v["node"] == "rank0"]["kind"].unique().tolist()
    assert kinds == ["optimizer"]


def test_latest_naming_a_missing_tag(ds_tree):
    (ds_tree / "latest").write_text("global_step40")
    cat = cv.open(ds_tree)
    assert cat.latest == 20  # the newest loadable tag older than the missing one
    assert cat.attrs["latest_tag_missing"] is True
    # every tag older than the named one has committed
    assert cat.serials["complete"].tolist() == [True, True, False]


def test_without_latest_file(ds_tree):
    (ds_tree / "latest").unlink()
    cat = cv.open(ds_tree)
    assert cat.latest == 20  # tag 30 has no model states: not complete
    assert cat.serials["complete"].tolist() == [True, True, False]


def test_corrupt_rank_file_is_an_error_row(ds_tree):
    bad = ds_tree / "global_step20" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    bad.write_bytes(bad.read_bytes()[:100])
    cat = cv.open(ds_tree)
    v = cat.variables
    rows = v[(v["serial"] == 20) & (v["node"] == "rank1")]
    assert len(rows) == 1 and rows["error"].iloc[0]
    assert cat.serials.loc[20, "complete"]  # committed, by the framework's rule
    assert cat.latest == 10  # but not loadable: the catalog falls back to the newest loadable
    assert cat.attrs["framework_latest"] == 20
    assert cat.read("module/fc.bias", serial=20).tolist() == [20.0] * 3


# -- complete vs. resume point: tags newer than ``latest`` -------------------------------------
def test_promote_back_keeps_newer_tags_complete(ds_tree):
    """After ``latest`` is moved back to an older tag, the newer tag is still a complete save
    (every rank's files), just not the resume point; the half-written tag stays incomplete."""
    cat = cv.open(ds_tree)
    cat.restore(10)
    assert (ds_tree / "latest").read_text() == "global_step10"
    s = cv.open(ds_tree).serials
    assert s["complete"].tolist() == [True, True, False]
    assert s["latest"].tolist() == [True, False, False]
    assert s.loc[20, "error"] is None  # not an "interrupted save"
    assert "interrupted" in s.loc[30, "error"]


def test_newer_tag_complete_by_files(ds_tree):
    """Newer than ``latest``: complete with model states and every ZeRO rank 0..D-1 (D from
    the resume tag); a tag missing a rank or the model states is an interrupted save."""
    write_tag(ds_tree, 40)  # both ranks + model states
    write_tag(ds_tree, 50, ranks=(0,))  # rank 1 never landed
    write_tag(ds_tree, 60, ranks=(1,))  # rank 0 missing: a hole
    cat = cv.open(ds_tree)
    s = cat.serials
    assert s["complete"].to_dict() == {10: True, 20: True, 30: False, 40: True, 50: False,
                                       60: False}  # fmt: skip
    assert cat.latest == 20
    assert s.loc[40, "error"] is None
    assert all("interrupted" in s.loc[n, "error"] for n in (30, 50, 60))
    assert s.loc[40, "nodes"] == ("rank0", "rank1")


def test_retention_with_tags_newer_than_latest(ds_tree):
    """DESIGN.md invariants as they stand: the resume tag (10) and the newest complete tag (20)
    are protected; an incomplete tag newer than the newest complete one (30) is in flight."""
    write_tag(ds_tree, 5)
    cat = cv.open(ds_tree)
    cat.restore(10)
    plan = cv.open(ds_tree).plan_retention(keep_last=1)
    assert plan["action"].to_dict() == {5: "delete", 10: "keep", 20: "keep", 30: "keep"}
    assert "resume point" in plan.loc[10, "reason"]
    assert "latest complete" in plan.loc[20, "reason"]
    assert "in flight" in plan.loc[30, "reason"]
    write_tag(ds_tree, 40)  # now 20 is an ordinary complete tag newer than the resume point
    cat = cv.open(ds_tree)
    plan = cat.plan_retention(keep_last=1)
    assert plan["action"].to_dict() == {5: "delete", 10: "keep", 20: "delete", 30: "delete",
                                        40: "keep"}  # fmt: skip
    deleted = cat.apply_retention(plan).deleted
    assert list(deleted.index) == [5, 20, 30]
    after = cv.open(ds_tree)
    assert list(after.serials.index) == [10, 40] and after.latest == 10
    assert (ds_tree / "latest").read_text() == "global_step10"
