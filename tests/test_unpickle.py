"""The restricted unpickler: round trips, lazy payloads, refusals, bounded memory."""

from __future__ import annotations

import builtins
import collections
import os
import pickle
import struct
import subprocess

import numpy as np
import pytest

from ckptview.formats.pickle import (
    ArrayRef,
    LazyBytes,
    Record,
    RestrictedUnpicklingError,
    flatten,
    load_pickle,
)
from ckptview.formats.torch_pickle import torch_persistent_load
from ckptview.io import Storage, TruncatedError


class _Evil:
    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


SAMPLE = {
    "i": 7, "neg": -300, "big": 2**80, "f": 0.25, "s": "ünï", "b": b"\x00\xff", "n": None,
    "t": (1, "a"), "l": [1, [2, 3]], "set": {1, 2}, "fs": frozenset({4}), "c": 1 + 2j,
    "od": collections.OrderedDict(z=1, a=2), "ba": bytearray(b"xy"), "true": True,
}  # fmt: skip
ARRAYS = {
    "f4": np.arange(12, dtype="<f4").reshape(3, 4),
    "be": np.arange(5, dtype=">i4"),
    "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
    "u16": np.array([1, 65535], dtype=np.uint16),
    "scalar0d": np.array(3.5),
    "empty": np.zeros((0, 3), dtype=np.int8),
    "objects": np.array(["a", None], dtype=object),
}


@pytest.mark.parametrize("protocol", range(6))
def test_round_trip_every_protocol(protocol):
    data = pickle.dumps({**SAMPLE, **ARRAYS, "np_scalar": np.float32(1.5)}, protocol=protocol)
    got = load_pickle(data, encoding="latin1")
    for key, want in SAMPLE.items():
        assert got[key] == want, key
    assert list(got["od"]) == ["z", "a"]
    for key, want in ARRAYS.items():
        ref = got[key]
        assert isinstance(ref, ArrayRef)
        arr = ref.read()
        assert arr.dtype == want.dtype and arr.shape == want.shape, key
        assert np.array_equal(arr, want), key
    assert got["np_scalar"] == np.float32(1.5)


def test_flatten_joins_keys_and_walks_records():
    rec = Record("pkg.Cls")
    rec.state = {"lr": 0.1, "inner": {"x": 1}}
    leaves = dict(flatten({"a": {"b": [10, (20, 30)]}, "r": rec, "e": {}}))
    assert leaves == {"a/b/0": 10, "a/b/1/0": 20, "a/b/1/1": 30, "r/lr": 0.1, "r/inner/x": 1,
                      "e": {}}  # fmt: skip
    assert flatten(5) == [("", 5)]


def test_flatten_refuses_cycles():
    cyc: list = []
    cyc.append(cyc)
    with pytest.raises(ValueError):
        flatten(load_pickle(pickle.dumps(cyc)))


def _write(tmp_path, name: str, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    storage, p = Storage.from_url(str(path))
    return storage, storage.blob(p)


def test_large_payloads_stay_on_disk(tmp_path):
    big = np.random.default_rng(0).standard_normal((512, 512)).astype("f4")  # 1 MiB
    for protocol in (2, 4):
        storage, blob = _write(tmp_path, f"p{protocol}.pkl", pickle.dumps({"w": big}, protocol))
        got = load_pickle(blob, encoding="latin1")
        assert storage.counters.bytes_read < 70_000
        ref = got["w"]
        assert isinstance(ref.data, LazyBytes)
        assert ref.data.length >= big.nbytes
        assert np.array_equal(ref.read(), big)


def test_hostile_globals_are_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "PWNED"
    evil = [
        _Evil(os.system, f"touch {marker}"),
        _Evil(subprocess.Popen, ["touch", str(marker)]),
        _Evil(builtins.eval, f"open({str(marker)!r}, 'w')"),
        _Evil(builtins.exec, f"open({str(marker)!r}, 'w')"),
        _Evil(builtins.getattr, "text", "upper"),
    ]
    names = ["system", "Popen", "eval", "exec", "getattr"]
    for obj, name in zip(evil, names, strict=True):
        for protocol in (0, 2, 4):
            data = pickle.dumps({"model": {"w": obj}}, protocol=protocol)
            with pytest.raises(RestrictedUnpicklingError, match=name):
                load_pickle(data)
    assert not marker.exists()


def test_paddle_eval_form_returns_the_entry_without_eval():
    arr = np.arange(3, dtype="f4")
    data = pickle.dumps(_Evil(builtins.eval, "data", {"data": arr}), protocol=4)
    got = load_pickle(data)
    assert np.array_equal(got.read(), arr)


def test_bad_input_raises_cleanly(tmp_path):
    good = pickle.dumps({"a": np.arange(10)}, protocol=4)
    for cut in (0, 1, 5, len(good) // 2, len(good) - 1):
        with pytest.raises((pickle.UnpicklingError, TruncatedError, ValueError)):
            load_pickle(good[:cut])
    rng = np.random.default_rng(1)
    for _ in range(50):
        junk = b"\x80\x04" + rng.integers(0, 256, 200, dtype=np.uint8).tobytes()
        try:
            load_pickle(junk)
        except Exception as e:  # noqa: BLE001 - any clean exception is fine
            assert not isinstance(e, (MemoryError, RecursionError))


def test_lengths_claiming_terabytes_are_refused(tmp_path):
    huge = 1 << 40
    cases = [
        b"\x80\x04\x8e" + struct.pack("<Q", huge) + b"xx.",  # BINBYTES8
        b"\x80\x04\x8d" + struct.pack("<Q", huge) + b"xx.",  # BINUNICODE8
        b"\x80\x05\x96" + struct.pack("<Q", huge) + b"xx.",  # BYTEARRAY8
        b"\x80\x02\x8b" + struct.pack("<i", 2**31 - 1) + b"xx.",  # LONG4
        b"\x80\x04\x95" + struct.pack("<Q", huge) + b"N.",  # FRAME
    ]
    for data in cases:
        _, blob = _write(tmp_path, "huge.pkl", data)
        for source in (data, blob):
            with pytest.raises((pickle.UnpicklingError, TruncatedError)):
                load_pickle(source)
    # bytearray(n) through REDUCE would allocate n bytes: refused
    with pytest.raises(RestrictedUnpicklingError):
        load_pickle(pickle.dumps(_Evil(bytearray, huge), protocol=2))


def test_torch_persistent_ids():
    good = (
        b"\x80\x02(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000"
        b"X\x03\x00\x00\x00cpuK\x06tQ."
    )
    ref = load_pickle(good, persistent_load=torch_persistent_load)
    assert (ref.key, ref.dtype, ref.numel, ref.location, ref.nbytes) == (
        "0",
        "float32",
        6,
        "cpu",
        24,
    )
    with pytest.raises(RestrictedUnpicklingError, match="persistent"):
        load_pickle(good)
    bad = pickle.dumps(("storage", "not-a-type", "0", "cpu", 6), protocol=2)[:-1] + b"Q."
    with pytest.raises(RestrictedUnpicklingError, match="storage type"):
        load_pickle(bad, persistent_load=torch_persistent_load)


def test_allow_adds_record_classes():
    data = (
        b"\x80\x02cmylib.conf\nConfig\nq\x00)\x81q\x01}q\x02X\x02\x00\x00\x00lrq\x03G?\xb9"
        b"\x99\x99\x99\x99\x99\x9asb."
    )
    with pytest.raises(RestrictedUnpicklingError, match="mylib.conf.Config"):
        load_pickle(data)
    rec = load_pickle(data, allow=["mylib."])
    assert isinstance(rec, Record) and rec.cls == "mylib.conf.Config" and rec.lr == 0.1


def test_object_count_is_capped():
    """Millions of DUP/MEMOIZE opcodes cannot build an enormous memo or stack."""
    import ckptview.formats.pickle as unpickle

    assert unpickle.MAX_OBJECTS == 10_000_000
    memo_bomb = b"\x80\x04N" + b"\x94" * 50_000 + b"."  # MEMOIZE: one memo entry each
    stack_bomb = b"\x80\x04N" + b"2" * 50_000 + b"."  # DUP: one stack entry each
    for data in (memo_bomb, stack_bomb):
        with pytest.raises(pickle.UnpicklingError, match="more than 10000 objects"):
            unpickle.Unpickler(data, max_objects=10_000).load()
        assert unpickle.Unpickler(data).load() is None  # under the default cap


def test_blob_reader_reads_no_byte_twice(tmp_path):
    """Reads crossing the cached head, text lines and re-reads are served from held bytes."""
    obj = {f"key_{i}": [f"v{i}" * 3, i, float(i)] for i in range(600)}
    data = pickle.dumps(obj, protocol=0)  # text lines: the reader backs up after each one
    assert len(data) > 3 * 4096
    path = tmp_path / "p.pkl"
    path.write_bytes(data)
    storage, _ = Storage.from_url(str(tmp_path))
    blob = storage.blob(str(path))
    assert load_pickle(blob) == obj
    assert storage.counters.bytes_read == len(data)
