"""What makes a serial not loadable, as the framework's own loader decides (DESIGN.md §3c):
each rule on a tree built or mutated here, failing before the rule existed."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import corpus_copy, corpus_path
from test_dcp import W, metadata
from test_deepspeed import Glob, Obj, _Emitter, torch_zip

import ckptview as cv
from ckptview.formats.pickle import InertClasses, RestrictedUnpicklingError, load_pickle
from ckptview.scan import checks


def copy(rel: str, dest: Path) -> Path:
    return corpus_copy(rel, dest)


# -- DCP: the data files the metadata names --------------------------------------------------
def dcp_tree(root: Path, paths: dict[int, str] | None = None) -> Path:
    d = root / "run" / "step_7"
    d.mkdir(parents=True)
    w0, w1, step = torch_zip(W[:2].copy()), torch_zip(W[2:].copy()), torch_zip(7)
    (d / "__0_0.distcp").write_bytes(w0 + step)
    (d / "__1_0.distcp").write_bytes(w1)
    meta = metadata({"w0": len(w0), "w1": len(w1), "step": len(step)})
    for r, path in (paths or {}).items():
        old, new = f"__{r}_0.distcp".encode(), path.encode()  # BINUNICODE: 4-byte length
        meta = meta.replace(b"X" + len(old).to_bytes(4, "little") + old,
                            b"X" + len(new).to_bytes(4, "little") + new)  # fmt: skip
        assert new in meta
    (d / ".metadata").write_bytes(meta)
    return root / "run"


@pytest.mark.parametrize("where", ["../../secret.bin", "ABSOLUTE"])
def test_a_metadata_path_outside_the_checkpoint_is_an_error_never_read(tmp_path, where):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(torch_zip(np.full((2, 3), 42, np.float32)))  # a valid record
    path = str(secret) if where == "ABSOLUTE" else where
    run = dcp_tree(tmp_path, {1: path})
    cat = cv.open(run, cache=False)
    row = cat.serials.loc[7]
    assert not row["loadable"] and "leaves the checkpoint directory" in row["error"]
    assert cat.latest is None
    with pytest.raises(ValueError, match="leaves the checkpoint directory"):
        cat.read("model/w", serial=7)
    deep = cat.verify(deep=True)
    assert (deep["severity"] == "error").any()


@pytest.mark.parametrize("fault", ["truncate", "flip_pickle", "swap_files", "delete"])
def test_a_dcp_data_file_that_dcp_load_refuses_makes_the_serial_not_loadable(tmp_path, fault):
    run = dcp_tree(tmp_path)
    d = run / "step_7"
    assert cv.open(run, cache=False).serials.loc[7, "loadable"]
    f0, f1 = d / "__0_0.distcp", d / "__1_0.distcp"
    data = f0.read_bytes()
    if fault == "truncate":
        f0.write_bytes(data[:-1])
    elif fault == "flip_pickle":  # inside the first record's data.pkl (its name and pickle)
        at = data.index(b"data.pkl") + 40
        f0.write_bytes(data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :])
    elif fault == "swap_files":
        f0.write_bytes(f1.read_bytes())
    else:
        f1.unlink()
    row = cv.open(run, cache=False).serials.loc[7]
    assert row["complete"] and not row["loadable"], row["error"]
    assert ".distcp" in row["error"]


# -- HF Trainer: index, shards, state, pickles -------------------------------------------------
def hf(tmp_path: Path) -> Path:
    run = copy("modern/hf", tmp_path / "hf")
    cat = cv.open(run, cache=False)
    assert cat.serials["loadable"].all() and cat.latest == 300
    return run


def test_a_trainer_state_with_a_key_trainerstate_rejects_does_not_load(tmp_path):
    run = hf(tmp_path)
    state = run / "checkpoint-300" / "trainer_state.json"
    doc = json.loads(state.read_text())
    doc["learning_rate_schedule"] = 1
    state.write_text(json.dumps(doc))
    cat = cv.open(run, cache=False)
    assert not cat.serials.loc[300, "loadable"]
    assert "rejects keys ['learning_rate_schedule']" in cat.serials.loc[300, "error"]
    assert cat.latest == 200


def test_a_file_every_other_checkpoint_has_is_missing(tmp_path):
    run = hf(tmp_path)
    (run / "checkpoint-300" / "optimizer.pt").unlink()
    cat = cv.open(run, cache=False)
    assert "no optimizer.pt, which every other checkpoint has" in cat.serials.loc[300, "error"]
    assert cat.latest == 200


def safetensors(tensors: dict[str, np.ndarray]) -> bytes:
    header, data = {}, b""
    for name, arr in tensors.items():
        raw = np.ascontiguousarray(arr, "<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape),
                        "data_offsets": [len(data), len(data) + len(raw)]}  # fmt: skip
        data += raw
    text = json.dumps(header).encode()
    return len(text).to_bytes(8, "little") + text + data


def sharded_hf(run: Path) -> None:
    """Every checkpoint's model as two safetensors shards and their index."""
    for ck in sorted(run.glob("checkpoint-*")):
        (ck / "model.safetensors").unlink()
        parts = {"model-00001-of-00002.safetensors": {"a.weight": np.ones((2, 2))},
                 "model-00002-of-00002.safetensors": {"b.weight": np.zeros(3)}}  # fmt: skip
        for name, tensors in parts.items():
            (ck / name).write_bytes(safetensors(tensors))
        index = {"metadata": {"total_size": 28},
                 "weight_map": {"a.weight": "model-00001-of-00002.safetensors",
                                "b.weight": "model-00002-of-00002.safetensors"}}  # fmt: skip
        (ck / "model.safetensors.index.json").write_text(json.dumps(index))


@pytest.mark.parametrize("fault", ["no_index", "shard_missing", "renamed_in_shard",
                                   "index_names_another"])  # fmt: skip
def test_an_index_and_its_shards_must_agree_both_ways(tmp_path, fault):
    run = hf(tmp_path)
    sharded_hf(run)
    assert cv.open(run, cache=False).serials["loadable"].all()
    ck = run / "checkpoint-300"
    index = ck / "model.safetensors.index.json"
    if fault == "no_index":
        index.unlink()
        want = "a shard without its model.safetensors.index.json"
    elif fault == "shard_missing":
        (ck / "model-00002-of-00002.safetensors").unlink()
        want = "names model-00002-of-00002.safetensors, which is missing"
    elif fault == "renamed_in_shard":
        (ck / "model-00002-of-00002.safetensors").write_bytes(
            safetensors({"b.weihgt": np.zeros(3)}))
        want = "lacks 'b.weight', which the index puts there"
    else:
        index.write_text(index.read_text().replace('"b.weight"', '"c.weight"'))
        want = "holds 'b.weight', which the index does not name"
    cat = cv.open(run, cache=False)
    assert want in cat.serials.loc[300, "error"]
    assert cat.latest == 200


def test_an_optimizer_pickling_numpy_is_refused_where_rng_state_may(tmp_path):
    run = hf(tmp_path)
    ck = run / "checkpoint-300"
    rng = ck / "rng_state.pth"
    if not rng.exists():
        pytest.fail("the corpus checkpoint has no rng_state.pth")
    shutil.copy(rng, ck / "optimizer.pt")  # rng states pickle numpy arrays
    cat = cv.open(run, cache=False)
    err = cat.serials.loc[300, "error"]
    assert "weights_only=True) refuses global numpy" in err and "optimizer.pt" in err
    assert "rng_state.pth" not in err  # transformers allows numpy there
    assert cat.latest == 200
    assert cat.read("optimizer/state/0/exp_avg", serial=200) is not None


@pytest.mark.parametrize("glob", [("subprocess", "Popen"), ("os", "system"),
                                  ("commands", "Popen"), ("builtins", "exec")])  # fmt: skip
def test_code_running_globals_are_refused_whatever_their_name_looks_like(glob):
    blob = _Emitter().dump(Obj(*glob, ("echo hi",)) if glob[1][0].isupper() else
                           [Glob(*glob)])  # fmt: skip
    with pytest.raises(RestrictedUnpicklingError, match=f"{glob[0]}.{glob[1]}.*runs code"):
        load_pickle(blob, allow=InertClasses())


# -- deep verify: checksums, folded into the verdicts and kept for unchanged files -----------
def flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x20
    path.write_bytes(bytes(data))


def _flipped_tf_entry(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A copy of the modern TF run (latest 400, opened once with a disk cache) with one bit
    flipped in an entry of serial 400: (run, cache directory, the data shard)."""
    run = copy("modern/tf", tmp_path / "tf") / "run_ckpt"
    cache = tmp_path / "cache"
    cat = cv.open(run, cache=str(cache))
    assert cat.latest == 400
    var = next(v for r in cat._scan.file_results() if r.serial == 400 for v in r.variables
               if v.span is not None and v.span.length > 8)  # fmt: skip
    flip(Path(var.span.path), var.span.offset + 3)
    return run, cache, Path(var.span.path)


def test_a_small_tf_shard_failing_its_checksum_is_refused_at_open(tmp_path):
    """TF's reader checks every entry's crc32c: a data shard of at most SMALL_CHECK bytes is
    checked as the tree is read, so the serial is not loadable without a deep verify; what
    was found is remembered (a reopened tree reads no data shard again)."""
    run, cache, shard = _flipped_tf_entry(tmp_path)
    assert shard.stat().st_size <= checks.SMALL_CHECK
    cat = cv.open(run, cache=str(cache))
    assert not cat.serials.loc[400, "loadable"] and cat.latest == 300
    assert "crc32c checksum does not match" in cat.serials.loc[400, "error"]
    again = cv.open(run, cache=str(cache))
    again.variables  # noqa: B018 - headers
    before = again.storage.counters.bytes_read
    assert again.latest == 300 and again.storage.counters.bytes_read == before


def test_a_tf_checksum_failure_found_by_deep_verify_moves_latest_and_is_remembered(
        tmp_path, monkeypatch):  # fmt: skip
    monkeypatch.setattr(checks, "SMALL_CHECK", 0)  # shards too large to check as it is read
    run, cache, _shard = _flipped_tf_entry(tmp_path)
    cat = cv.open(run, cache=str(cache))
    assert cat.latest == 400  # headers alone cannot see it
    found = cat.verify(deep=True)
    bad = found[(found["severity"] == "error") & (found["check"] == "checksum")]
    assert list(bad["serial"]) == [400] and "crc32c checksum does not match" in bad["message"].iloc[0]
    assert not cat.serials.loc[400, "loadable"] and cat.latest == 300
    assert "deep verify" in cat.serials.loc[400, "error"]
    again = cv.open(run, cache=str(cache))  # unchanged files: the finding is kept
    assert again.latest == 300 and not again.serials.loc[400, "loadable"]
    clean = cv.open(run, cache=False)  # another cache never saw it
    assert clean.latest == 400


def test_a_flipped_torch_storage_is_refused_though_torch_would_load_it(tmp_path):
    run = hf(tmp_path)
    path = run / "checkpoint-300" / "optimizer.pt"
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if "/data/" in i.filename and i.file_size > 8)
    flip(path, _payload(path, info) + 4)
    cat = cv.open(run, cache=False)
    assert cat.serials.loc[300, "loadable"]
    cat.verify(300, deep=True)
    err = cat.serials.loc[300, "error"]
    assert "CRC-32" in err and "torch would load it silently" in err and cat.latest == 200


def _payload(path: Path, info: zipfile.ZipInfo) -> int:
    head = path.read_bytes()[info.header_offset : info.header_offset + 30]
    return info.header_offset + 30 + int.from_bytes(head[26:28], "little") + int.from_bytes(
        head[28:30], "little")


@pytest.mark.parametrize("small", [True, False], ids=["small", "large"])
def test_a_deflated_npz_member_failing_its_crc_is_refused(tmp_path, small):
    """np.load checks each member's CRC-32: an archive of at most SMALL_CHECK bytes is
    checked as the tree is read (refused at open); a larger one keeps its header verdict
    until a deep verify reads it."""
    run = tmp_path / "npz"
    run.mkdir()
    rng = np.random.default_rng(0)
    n = 4096 if small else 64 * 1024  # random values: deflate leaves them about as large
    for step in (1, 2):
        np.savez_compressed(run / f"step_{step}.npz", w=rng.normal(size=n).astype(np.float32))
    path = run / "step_2.npz"
    assert (path.stat().st_size <= checks.SMALL_CHECK) == small
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("w.npy")
    flip(path, _payload(path, info) + info.compress_size // 2)
    cat = cv.open(run, cache=False)
    assert cat.serials.loc[2, "loadable"] != small
    with pytest.raises(Exception):  # noqa: B017 - zipfile's own refusal (BadZipFile, zlib.error)
        np.load(path)["w"]
    cat.verify(deep=True)
    assert not cat.serials.loc[2, "loadable"] and cat.latest == 1
    assert "w.npy" in cat.serials.loc[2, "error"]


def test_deep_verify_of_dcp_hf_rank_shards_finds_nothing_and_keeps_them_loadable():
    """Issue 25 item 7: each rank's piece is read as stored, not looked up by its logical
    name (which the assembled tensor holds), so a sound tree has no finding."""
    cat = cv.open(corpus_path("llm/dcp_hf"), cache=False)
    found = cat.verify(deep=True)
    assert (found["severity"] != "error").all(), found["message"].head(3).tolist()
    assert cat.serials["loadable"].all()


def test_a_single_torch_file_pickling_a_class_is_not_loadable_but_reads(tmp_path):
    """``torch.load(weights_only=True)`` refuses a pickled dataclass: the file is listed and
    its tensors read, but it is no resume point."""
    path = tmp_path / "model.pt"
    path.write_bytes(torch_zip({"w": W, "cfg": Obj("mylib.config", "TrainConfig", {"lr": 1})}))
    cat = cv.open(path, cache=False)
    assert "refuses global mylib.config.TrainConfig" in cat.serials["error"].iloc[0]
    assert cat.latest is None
    np.testing.assert_array_equal(cat.read("w", serial=int(cat.serials.index[0])), W)


# -- Keras: a save of another run does not fit the run's model ---------------------------------
def keras_run(root: Path, sizes: dict[int, int]) -> Path:
    """``mlp_step_N.weights.h5`` files whose hidden layer has ``sizes[N]`` units."""
    import h5py

    root.mkdir(parents=True, exist_ok=True)
    for step, hidden in sizes.items():
        with h5py.File(root / f"mlp_step_{step}.weights.h5", "w") as f:
            f.create_dataset("layers/dense/vars/0", data=np.ones((4, hidden), np.float32))
            f.create_dataset("layers/dense/vars/1", data=np.zeros(hidden, np.float32))
    return root


def test_a_keras_save_of_another_run_does_not_load_in_the_run(tmp_path):
    run = keras_run(tmp_path / "run", {100: 8, 200: 8, 300: 8, 400: 16})
    cat = cv.open(run, cache=False)
    assert cat.serials["loadable"].tolist() == [True, True, True, False]
    assert "do not fit the model of the run's other serials" in cat.serials.loc[400, "error"]
    assert "layers/dense/vars/1 [16] vs [8]" in cat.serials.loc[400, "error"]
    assert cat.latest == 300


def test_a_keras_file_opened_alone_is_held_to_its_two_nearest_siblings(tmp_path):
    run = keras_run(tmp_path / "run", {100: 8, 200: 8, 300: 8, 400: 16})
    alone = cv.open(run / "mlp_step_400.weights.h5", cache=False)
    assert not alone.serials["loadable"].any()
    assert "mlp_step_300.weights.h5" in alone.serials["error"].iloc[0]
    # 300's nearest siblings disagree (200 fits, 400 does not): nothing is said
    assert cv.open(run / "mlp_step_300.weights.h5", cache=False).serials["loadable"].all()
    lone = keras_run(tmp_path / "lone", {100: 16})
    assert cv.open(lone / "mlp_step_100.weights.h5", cache=False).serials["loadable"].all()


# -- beside the run: nothing hostile sits unread, nothing empty goes unnamed ----------------
def test_a_pickle_beside_the_run_that_would_run_code_is_named(tmp_path):
    run = hf(tmp_path)
    (run / "model_legacy.pth").write_bytes(_Emitter().dump([Glob("os", "system")]))
    cat = cv.open(run, cache=False)
    warned = [w for w in cat.attrs["warnings"] if "model_legacy.pth" in w]
    assert warned and "os.system" in warned[0] and "runs code" in warned[0]
    row = cat.files[cat.files["path"].str.endswith("model_legacy.pth")].iloc[0]
    assert row["role"] == "unclaimed" and "os.system" in row["error"]
    assert cat.latest == 300  # the run itself is untouched


def test_empty_state_and_program_files_are_named(tmp_path):
    run = hf(tmp_path)
    (run / "checkpoint-300" / "generation_config.json").write_bytes(b"")
    (run / "program.pdmodel").write_bytes(b"")
    cat = cv.open(run, cache=False)
    assert "empty file(s): generation_config.json" in cat.serials.loc[300, "warning"]
    assert any("program.pdmodel: empty file" in w for w in cat.attrs["warnings"])


def test_reading_a_variable_listed_with_a_parse_error_raises_that_error(tmp_path):
    """Issue 29 item 3: not "no variable X": the error the catalog lists for it."""
    run = hf(tmp_path)
    path = run / "checkpoint-300" / "scheduler.pt"
    path.write_bytes(path.read_bytes()[:40])
    cat = cv.open(run, cache=False)
    v = cat.variables
    row = v[(v["serial"] == 300) & v["error"].notna()].iloc[0]
    with pytest.raises(ValueError, match="zip|truncat|archive") as err:
        cat.read(row["name"], serial=300)
    assert row["error"][:40] in str(err.value)


def test_checks_of_small_files_never_walk_a_large_checkpoint(monkeypatch):
    """A TF bundle whose shards are above SMALL_CHECK is left on its header verdict without
    its columnar listing being turned into records or any data shard read for the check."""
    from ckptview.model import as_columns

    monkeypatch.setattr(checks, "SMALL_CHECK", 16)  # every shard of the corpus run is larger
    cat = cv.open(corpus_path("tf_orbax/tf/run1"), cache=False)
    cat.variables  # noqa: B018 - the listing
    before = cat.storage.counters.bytes_read
    assert cat.serials["loadable"].all()
    assert cat.storage.counters.bytes_read == before
    for res in cat._scan.file_results():
        columns = as_columns(res.variables)
        assert columns is not None and columns.materialized is None


def test_tf_spans_name_string_tensors_and_slices():
    """What the checks size: a string tensor's bytes are in a data shard (not unknown)."""
    from ckptview import registry

    cat = cv.open(corpus_path("tf_orbax/tf/run1"), cache=False)
    res = cat._scan.file_results()[0]
    codec = registry.get_codec(res.codec)
    graph = cat.variable("_CHECKPOINTABLE_OBJECT_GRAPH")
    span = graph.locator.span
    got = codec.spans(cat.storage.blob(res.ref.path), graph)
    assert got == [(span.path, span.offset, span.length)] and ".data-" in span.path


def test_a_file_gone_before_its_check_keeps_its_header_verdict(tmp_path):
    """A small npz deleted between the listing and the serials' verdicts (retention on a live
    run): the verdicts are formed, nothing is remembered about the file."""
    run = tmp_path / "npz"
    run.mkdir()
    for step in (1, 2):
        np.savez(run / f"step_{step}.npz", w=np.arange(64, dtype=np.float32) * step)
    cat = cv.open(run, cache=False)
    cat.variables  # noqa: B018 - listed
    (run / "step_2.npz").unlink()
    serials = cat.serials  # no FileNotFoundError
    assert list(serials.index) == [1, 2] and serials.loc[1, "loadable"]
