"""A bundled demo: a Paddle 2018 fluid checkpoint tree written by ckptview itself.

The tree follows ``specs/paddle.md`` §4 (the v0.14/v0.15 ``trainer.py`` layout) byte for byte:

```
checkpoint_<N>/__model__/<var>          one LoDTensor stream per variable (§1)
checkpoint_<N>/__model__/_SUCCESS       time.ctime() text, no newline, written last
checkpoint_<N>/trainer_<id>/epoch_id    str(int), no newline
checkpoint_<N>/trainer_<id>/step_id     str(int), no newline
checkpoint_<N>/trainer_<id>/_SUCCESS    time.ctime()
checkpoint_<N>/__lookup_table__/share_w_<i>   SelectedRows stream (§3) from pserver i
```

Serials follow the default schedule (a save every 10 steps of a 20-step epoch), weights evolve
like an Adam run (some variables move a lot, a frozen one never moves, moments build up, the
learning rate decays), and the last serial crashed mid-save (no ``__model__/_SUCCESS``, the
variable being written cut short, later ones missing). Everything is seeded: the same
arguments give the same bytes and the same mtimes. :func:`model_arrays` and
:func:`lookup_shards` return the values a serial holds, for tests.
"""

from __future__ import annotations

import os
import struct
import time
import zlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np

from .formats.protobuf import encode_varint

#: Paddle ``VarType.Type`` codes for the dtypes the demo writes (spec §1.1).
PADDLE_DTYPES = {
    "bool": 0, "int16": 1, "int32": 2, "int64": 3, "float16": 4, "float32": 5, "float64": 6,
    "uint8": 20, "int8": 21,
}  # fmt: skip

SEED = 2018
START = datetime(2018, 7, 20, 9, 0, 0, tzinfo=timezone.utc)
STEPS_PER_EPOCH = 20
STEP_INTERVAL = 10  # CheckpointConfig default: a save at steps 0, 10 of every epoch
TRAINERS = 2
PSERVERS = 2
TABLE = "share_w"
EMB_DIM = 16
HIDDEN = 64
CLASSES = 10
BASE_LR = 0.01
TRAINABLE = ["fc_0.w_0", "fc_0.b_0", "batch_norm_0.w_0", "batch_norm_0.b_0", "fc_1.w_0", "fc_1.b_0"]
ADAM_SLOTS = ["moment1_0", "moment2_0", "beta1_pow_acc_0", "beta2_pow_acc_0"]


# -- byte streams (spec §1 and §3) -----------------------------------------------------------
def tensor_desc(dtype: str, shape: tuple[int, ...]) -> bytes:
    """``VarType.TensorDesc``: ``08 <data_type>`` then one unpacked ``10 <dim>`` per dim."""
    out = b"\x08" + encode_varint(PADDLE_DTYPES[dtype])
    for d in shape:
        out += b"\x10" + encode_varint(int(d))
    return out


def _tensor_body(arr: np.ndarray) -> bytes:
    """``TensorToStream``: u32 version 0, i32 desc_len, TensorDesc, C-order data."""
    desc = tensor_desc(arr.dtype.name, arr.shape)
    data = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
    return struct.pack("<Ii", 0, len(desc)) + desc + data


def lod_tensor_bytes(arr: np.ndarray, lod: list[list[int]] | None = None) -> bytes:
    """A LoDTensor stream as the ``save`` op writes it (spec §1)."""
    lod = lod or []
    head = struct.pack("<IQ", 0, len(lod))
    for level in lod:
        head += struct.pack("<Q", 8 * len(level)) + struct.pack(f"<{len(level)}Q", *level)
    return head + _tensor_body(arr)


def selected_rows_bytes(rows: np.ndarray, height: int, values: np.ndarray) -> bytes:
    """A SelectedRows stream (spec §3): version, N, rows, height, then a tensor body."""
    rows = np.asarray(rows, dtype="<i8")
    if values.shape[0] != len(rows):
        raise ValueError("values must have one row per index")
    head = struct.pack("<IQ", 0, len(rows)) + rows.tobytes() + struct.pack("<q", height)
    return head + _tensor_body(values)


def ctime(t: datetime) -> str:
    """``time.ctime()`` as the 2018 code wrote it (the demo machine ran in UTC)."""
    return time.asctime(t.astimezone(timezone.utc).timetuple())


# -- the training run ----------------------------------------------------------------------
@dataclass
class DemoSerial:
    """One serial of the demo tree, as written."""

    serial: int
    epoch: int
    step: int
    global_step: int  # optimizer steps taken before the save
    complete: bool
    timestamp: datetime  # the __model__/_SUCCESS time (the crash time when incomplete)
    variables: list[str] = field(default_factory=list)  # complete __model__ files written
    truncated: str | None = None  # the variable cut short by the crash


@dataclass
class DemoTree:
    """What :func:`write_demo` wrote."""

    root: Path
    scale: int
    seed: int
    serials: list[DemoSerial]

    @property
    def latest(self) -> int | None:
        done = [s.serial for s in self.serials if s.complete]
        return max(done) if done else None

    @property
    def nbytes(self) -> int:
        return sum(p.stat().st_size for p in self.root.rglob("*") if p.is_file())


def shapes(scale: int = 1) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every ``__model__`` variable in program order: name -> (shape, dtype)."""
    d_in = 256 * scale
    params = {
        "pos_emb.w_0": ((32, HIDDEN), "float32"),  # frozen (stop_gradient): never changes
        "fc_0.w_0": ((d_in, HIDDEN), "float32"),
        "fc_0.b_0": ((HIDDEN,), "float32"),
        "batch_norm_0.w_0": ((HIDDEN,), "float32"),
        "batch_norm_0.b_0": ((HIDDEN,), "float32"),
        "batch_norm_0.w_1": ((HIDDEN,), "float32"),  # moving mean
        "batch_norm_0.w_2": ((HIDDEN,), "float32"),  # moving variance
        "fc_1.w_0": ((HIDDEN, CLASSES), "float32"),
        "fc_1.b_0": ((CLASSES,), "float32"),
    }
    out = dict(params)
    for p in TRAINABLE:
        shape = params[p][0]
        for slot in ADAM_SLOTS:
            out[f"{p}_{slot}"] = ((1,) if "pow" in slot else shape, "float32")
    out["learning_rate_0"] = ((1,), "float32")  # 2018 had no 0-d tensors: dims [1]
    out["@LR_DECAY_COUNTER@"] = ((1,), "int64")
    return out


def _rng(seed: int, *keys: object) -> np.random.Generator:
    return np.random.default_rng([seed, *(zlib.crc32(str(k).encode()) for k in keys)])


# how far each trainable variable travels over the run (init std, travel)
_MOTION = {
    "fc_0.w_0": (0.05, 0.03),
    "fc_0.b_0": (0.0, 0.02),
    "batch_norm_0.w_0": (0.0, 0.05),
    "batch_norm_0.b_0": (0.0, 0.05),
    "fc_1.w_0": (0.1, 0.5),  # the head moves most
    "fc_1.b_0": (0.0, 0.3),
}
_BASE = {"batch_norm_0.w_0": 1.0, "batch_norm_0.w_2": 1.0}
_TAU = 25.0  # steps: how fast training progress saturates


def schedule(serial: int) -> tuple[int, int, int]:
    """(epoch, step within the epoch, optimizer steps taken) of a serial."""
    per_epoch = STEPS_PER_EPOCH // STEP_INTERVAL
    epoch, k = divmod(serial, per_epoch)
    step = k * STEP_INTERVAL
    return epoch, step, epoch * STEPS_PER_EPOCH + step + 1


def model_arrays(serial: int, scale: int = 1, seed: int = SEED) -> dict[str, np.ndarray]:
    """The values every ``__model__`` variable holds at a serial (program order)."""
    t = schedule(serial)[2]
    progress = 1.0 - np.exp(-t / _TAU)
    out: dict[str, np.ndarray] = {}
    for name, (shape, _dtype) in shapes(scale).items():
        if name in _MOTION or name == "pos_emb.w_0" or name.startswith("batch_norm_0.w_"):
            out[name] = _param(name, shape, t, progress, seed)
    for p in TRAINABLE:
        shape = out[p].shape
        std, travel = _MOTION[p]
        direction = _rng(seed, p, "dir").standard_normal(shape)
        grad = -direction * travel / _TAU * np.exp(-t / _TAU)
        grad = grad + 0.01 * travel * _rng(seed, p, "grad", t).standard_normal(shape)
        out[f"{p}_moment1_0"] = ((1 - 0.9**t) * grad).astype("float32")
        out[f"{p}_moment2_0"] = ((1 - 0.999**t) * (grad**2 + 1e-8)).astype("float32")
        out[f"{p}_beta1_pow_acc_0"] = np.array([0.9**t], dtype="float32")
        out[f"{p}_beta2_pow_acc_0"] = np.array([0.999**t], dtype="float32")
    out["learning_rate_0"] = np.array([BASE_LR * 0.9 ** (t // 10)], dtype="float32")
    out["@LR_DECAY_COUNTER@"] = np.array([t], dtype="int64")
    return {name: out[name] for name in shapes(scale)}


def _param(name: str, shape: tuple[int, ...], t: int, progress: float, seed: int) -> np.ndarray:
    base = _BASE.get(name, 0.0)
    if name == "pos_emb.w_0":
        return (0.02 * _rng(seed, name, "init").standard_normal(shape)).astype("float32")
    if name.startswith("batch_norm_0.w_") and name not in _MOTION:  # moving statistics
        target = 0.5 * _rng(seed, name, "target").standard_normal(shape)
        value = base + target * progress if name.endswith("w_1") else base + abs(target) * progress
        return np.asarray(value, dtype="float32")
    std, travel = _MOTION[name]
    init = base + std * _rng(seed, name, "init").standard_normal(shape)
    direction = _rng(seed, name, "dir").standard_normal(shape)
    noise = 0.002 * travel * _rng(seed, name, "noise", t).standard_normal(shape)
    return (init + travel * progress * direction + noise).astype("float32")


def lookup_shards(
    serial: int, scale: int = 1, seed: int = SEED
) -> dict[int, tuple[np.ndarray, int, np.ndarray]]:
    """pserver id -> (rows, height, values) of the ``share_w`` table at a serial.

    Pserver ``i`` holds the ids ``id % PSERVERS == i`` seen so far, in the order first seen;
    more ids are seen as training goes on, so the shards grow from serial to serial.
    """
    t = schedule(serial)[2]
    height = 1000 * scale
    order = _rng(seed, TABLE, "order").permutation(height)
    seen = order[: max(PSERVERS, int(height * 0.6 * (1 - np.exp(-t / 15.0))))]
    init = _rng(seed, TABLE, "init").standard_normal((height, EMB_DIM)) * 0.1
    direction = _rng(seed, TABLE, "dir").standard_normal((height, EMB_DIM))
    table = init + 0.05 * (1 - np.exp(-t / _TAU)) * direction
    out = {}
    for i in range(PSERVERS):
        rows = seen[seen % PSERVERS == i].astype("int64")
        out[i] = (rows, height, table[rows].astype("float32"))
    return out


# -- writing -------------------------------------------------------------------------------
def write_demo(
    root: str | os.PathLike,
    serials: int = 8,
    scale: int = 1,
    seed: int = SEED,
    incomplete: bool = True,
) -> DemoTree:
    """Write the demo tree into ``root`` (created; must be empty or absent).

    ``serials`` counts every serial, the crashed last one included when ``incomplete``.
    ``scale`` multiplies the big tensors (``fc_0.w_0`` and its moments, the lookup table).
    """
    if serials < 1 or scale < 1:
        raise ValueError("serials and scale must be >= 1")
    root = Path(root)
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(f"{root} exists and is not empty")
    root.mkdir(parents=True, exist_ok=True)
    clock = _rng(seed, "clock")
    now = START
    written = []
    for n in range(serials):
        crashed = incomplete and n == serials - 1
        now += timedelta(minutes=9, seconds=int(clock.integers(0, 240)))
        written.append(_write_serial(root, n, scale, seed, now, crashed))
    os.utime(root, (now.timestamp(), now.timestamp()))
    return DemoTree(root, scale, seed, written)


def _write_serial(root: Path, n: int, scale: int, seed: int, t0: datetime, crashed: bool):
    epoch, step, global_step = schedule(n)
    serial_dir = root / f"checkpoint_{n}"
    clock = t0
    for trainer in range(TRAINERS):  # _save_trainer_args first, each trainer its own dir
        tdir = serial_dir / f"trainer_{trainer}"
        clock += timedelta(milliseconds=350 * (trainer + 1))
        _put(tdir / "epoch_id", str(epoch).encode(), clock)
        _put(tdir / "step_id", str(step).encode(), clock)
        _put(tdir / "_SUCCESS", ctime(clock).encode(), clock)
        _touch(tdir, clock)
    model_dir = serial_dir / "__model__"
    arrays = model_arrays(n, scale, seed)
    names = list(arrays)
    stop = len(names) * 2 // 3 if crashed else len(names)
    for name in names[:stop]:
        data = lod_tensor_bytes(arrays[name])
        clock += timedelta(seconds=len(data) / 40e6)  # a 2018 disk: about 40 MB/s
        _put(model_dir / name, data, clock)
    info = DemoSerial(n, epoch, step, global_step, not crashed, clock, names[:stop])
    if crashed:  # the crash: the next variable is cut short, nothing after it is written
        data = lod_tensor_bytes(arrays[names[stop]])
        _put(model_dir / names[stop], data[: max(21, len(data) // 2)], clock)
        info.truncated = names[stop]
    else:
        clock += timedelta(milliseconds=20)
        _put(model_dir / "_SUCCESS", ctime(clock).encode(), clock)
        info.timestamp = clock
        table_dir = serial_dir / "__lookup_table__"
        for i, (rows, height, values) in lookup_shards(n, scale, seed).items():
            clock += timedelta(milliseconds=200)
            _put(table_dir / f"{TABLE}_{i}", selected_rows_bytes(rows, height, values), clock)
        _touch(table_dir, clock)
    _touch(model_dir, info.timestamp)
    _touch(serial_dir, clock)
    return info


def _put(path: Path, data: bytes, when: datetime) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    _touch(path, when)


def _touch(path: Path, when: datetime) -> None:
    os.utime(path, (when.timestamp(), when.timestamp()))


# -- a demo experiment: a small sweep of runs in several formats ---------------------------------
#: (run directory, format, serials, learning rate, diverges) of the demo sweep
SWEEP = (
    ("lr_3e-4", "npz", 5, 3e-4, False),
    ("lr_1e-3", "safetensors", 8, 1e-3, False),
    ("lr_1e-2_diverged", "npz", 6, 1e-2, True),
)
SWEEP_STEP = 100  # a save every 100 steps


def _sweep_arrays(rng: np.random.Generator, t: int, lr: float, nan: bool) -> dict[str, np.ndarray]:
    """A tiny MLP's weights after ``t`` saves at learning rate ``lr`` (NaNs once diverged)."""
    out = {}
    for name, shape in (("model.fc1.weight", (32, 16)), ("model.fc1.bias", (32,)),
                        ("model.fc2.weight", (4, 32)), ("model.fc2.bias", (4,))):  # fmt: skip
        w = rng.standard_normal(shape).astype(np.float32) * (1 + 50 * lr * t)
        if nan and "weight" in name:
            w.reshape(-1)[:: 7] = np.nan
        out[name] = w
    return out


def _loss(t: int, lr: float, diverges: bool) -> float:
    if diverges:
        return 2.0 - 0.3 * t if t < 3 else 2.0 + 3.0 * (t - 2)
    return 2.5 / (1 + 1000 * lr * t) + (0.2 * max(0, t - 5) if lr > 5e-4 else 0.0) + 0.05


def _safetensors_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    from .formats.safetensors import header

    entries = [(k, "F32", v.shape, v.nbytes) for k, v in arrays.items()]
    return header(entries) + b"".join(np.ascontiguousarray(v).tobytes() for v in arrays.values())


def _npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    import io

    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def write_sweep(root: str | os.PathLike, seed: int = SEED) -> list[Path]:
    """Write a demo experiment into ``root`` (created; must be empty or absent): runs of
    numbered ``.npz`` and ``.safetensors`` files of different lengths (the loss in each file
    name: ``step_300-loss_0.41.npz``), one that diverges (NaN weights from its fourth save),
    and a Paddle fluid run that crashed mid-save (its last serial incomplete). Returns the
    run directories."""
    root = Path(root)
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(f"{root} exists and is not empty")
    root.mkdir(parents=True, exist_ok=True)
    runs = []
    for i, (name, fmt, n, lr, diverges) in enumerate(SWEEP):
        run = root / name
        run.mkdir()
        rng = _rng(seed, "sweep", name)
        for t in range(1, n + 1):
            arrays = _sweep_arrays(rng, t, lr, diverges and t >= 4)
            data = _npz_bytes(arrays) if fmt == "npz" else _safetensors_bytes(arrays)
            when = START + timedelta(hours=i, minutes=10 * t)
            _put(run / f"step_{t * SWEEP_STEP}-loss_{_loss(t, lr, diverges):.3f}.{fmt}", data, when)
        runs.append(run)
    write_demo(root / "paddle_fluid_crashed", serials=4, seed=seed, incomplete=True)
    runs.append(root / "paddle_fluid_crashed")
    (root / "sweep.yaml").write_text("lr: [3e-4, 1e-3, 1e-2]\n")  # not a run
    return runs
