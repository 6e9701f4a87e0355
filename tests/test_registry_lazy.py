"""The lazy registry (issue 13, fixed first-call cost): built-in codecs and layouts are known
from a static table (``registry.BUILTIN``) and their modules imported only when detection
reaches them; entry points are scanned once. These tests hold the table to the classes and
the laziness to what a local tree needs."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import CORPUS

import ckptview as cv
from ckptview import registry
from ckptview.codecs.base import Codec
from ckptview.layouts.base import Layout

ROOT = Path(__file__).resolve().parents[1]
BASES = {"ckptview.codecs": Codec, "ckptview.layouts": Layout}


def _classes(package: str) -> dict[str, type]:
    """name -> class of every named class defined in the package's modules (the old
    discovery by import)."""
    pkg = importlib.import_module(package)
    found = {}
    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name.startswith("_") or info.name == "base":
            continue
        module = importlib.import_module(f"{package}.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BASES[package]) and cls.__module__ == module.__name__ and cls.name:
                found[cls.name] = cls
    return found


@pytest.mark.parametrize("package", list(BASES))
def test_the_static_table_lists_every_class_as_it_is(package):
    rows = {row.name: row for row in registry.BUILTIN[package]}
    classes = _classes(package)
    assert set(rows) == set(classes)
    for name, cls in classes.items():
        row = rows[name]
        assert (row.module, row.cls) == (cls.__module__.rsplit(".", 1)[1], cls.__name__)
        assert row.priority == cls.priority, name
        if package == "ckptview.codecs":
            assert row.suffixes == tuple(cls.suffixes), name
            assert row.save_suffixes == tuple(cls.save_suffixes), name
            has_blob = cls.guess_can_open_blob is not Codec.guess_can_open_blob
            assert row.claim.blob == has_blob, name


def _corpus_files() -> list[Path]:
    if not CORPUS.exists():
        pytest.fail(f"corpus missing: {CORPUS}")
    return [p for p in sorted(CORPUS.rglob("*")) if p.is_file() and ".ckptview" not in p.parts]


def test_a_claim_covers_whatever_its_codec_accepts():
    """A file ruled out by a codec's Claim is never accepted by its guess_can_open (the
    Claim is checked instead of importing the module): over the whole corpus."""
    files = _corpus_files()
    codecs = {row.name: (row, registry.get_codec(row.name))
              for row in registry.BUILTIN["ckptview.codecs"]}  # fmt: skip
    missed = []
    for path in files:
        with open(path, "rb") as fh:
            head = fh.read(4096)
        name = path.name
        for row, codec in codecs.values():
            if codec.guess_can_open(name, head) and not row.claim.may(name, name.lower(), head):
                missed.append((row.name, str(path.relative_to(CORPUS))))
    assert len(files) > 500
    assert not missed, missed[:5]


def test_detection_order_and_suffixes_match_the_imported_classes():
    codecs = registry.codecs()  # imports every module
    assert registry.names("ckptview.codecs") == list(codecs)
    assert registry.names("ckptview.layouts") == list(registry.layouts())
    known = {x.lower() for c in codecs.values() for x in (*c.suffixes, *c.save_suffixes)}
    assert registry.known_suffixes() == tuple(sorted(known))
    saves = {s.lower() for c in codecs.values() for s in c.save_suffixes}
    assert set(registry.save_suffixes()) == saves


def test_detect_codec_agrees_with_trying_every_codec_in_order():
    """The lazy detection picks what the eager loop over every codec picked."""
    codecs = list(registry.codecs().values())
    for path in _corpus_files()[::7]:
        with open(path, "rb") as fh:
            head = fh.read(4096)
        eager = next((c for c in codecs if c.guess_can_open(path.name, head)), None)
        assert registry.detect_codec(path.name, head) is eager, path


LOCAL_OPEN = r"""
import json, sys
import ckptview as cv
after_import = set(sys.modules)
cat = cv.open(sys.argv[1], cache=False)
n = len(cat.variables)
print(json.dumps({"import": sorted(after_import), "open": sorted(set(sys.modules)), "rows": n}))
"""

HEAVY = ("panel", "bokeh", "holoviews", "torch", "tensorflow", "safetensors",
         "fsspec.implementations.http", "aiohttp", "s3fs", "ckptview.widgets", "ckptview.cli")  # fmt: skip


def test_opening_a_local_safetensors_tree_imports_only_what_it_needs(tmp_path):
    from hostile_names import safetensors

    for step in (100, 200):
        (tmp_path / f"step_{step}.safetensors").write_bytes(safetensors({"w": np.ones(4, "f4")}))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", LOCAL_OPEN, str(tmp_path)], env=env,
                         capture_output=True, text=True, check=True)  # fmt: skip
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["rows"] == 2
    imported, opened = set(got["import"]), set(got["open"])
    for name in HEAVY:
        assert name not in opened, name
    # import ckptview: no codec, no layout beyond the bases, no management engine
    for name in imported:
        if name.startswith(("ckptview.codecs.", "ckptview.layouts.")):
            assert name.rsplit(".", 1)[1] == "base", name
    assert not {n for n in imported if n.startswith(("ckptview.engine.", "ckptview.changes"))
                and n not in ("ckptview.engine.stats", "ckptview.engine.sums")}  # fmt: skip
    # open: the safetensors codec alone, and no pickle / protobuf machinery
    codecs = {n.rsplit(".", 1)[1] for n in opened if n.startswith("ckptview.codecs.")}
    assert codecs == {"base", "safetensors"}
    assert not {n for n in opened if n.startswith(("ckptview.formats.pickle",
                                                   "ckptview.formats.torch_pickle"))}  # fmt: skip
    assert "importlib.metadata" in opened  # plugins were looked for


def test_entry_points_are_scanned_once(monkeypatch):
    calls = []

    def counting(**select):
        calls.append(select)
        return SimpleNamespace(select=lambda group: [])  # as importlib.metadata's

    monkeypatch.setattr(registry, "entry_points", counting)
    try:
        for _ in range(3):
            registry.detect_codec("x.safetensors", b"")
            registry.get_layout("numbered")
            registry.known_suffixes()
        assert calls == [{}]  # one scan for both groups
    finally:
        monkeypatch.undo()
        registry._clear()


class LazyToyCodec(Codec):
    name = "lazy-toy"
    suffixes = (".lazytoy",)
    save_suffixes = (".lazytoy",)
    priority = 1


def test_runtime_registration_with_the_lazy_registry(tmp_path):
    registry.register(LazyToyCodec)
    try:
        assert registry.detect_codec("a.lazytoy", b"") is registry.get_codec("lazy-toy")
        assert ".lazytoy" in registry.known_suffixes()
        assert ".lazytoy" in registry.save_suffixes()
        assert registry.names("ckptview.codecs")[0] == "lazy-toy"  # priority 1 goes first
    finally:
        registry.unregister(LazyToyCodec)
    assert ".lazytoy" not in registry.known_suffixes()
    assert registry.detect_codec("a.lazytoy", b"") is None


def test_a_plugin_replaces_a_builtin_of_its_name(monkeypatch):
    class Mine(LazyToyCodec):
        name = "safetensors"
        priority = 5

    def fake(group=None):
        if group is None:
            return []
        return [SimpleNamespace(name="safetensors", group=group, load=lambda: Mine)] if (
            group == "ckptview.codecs") else []  # fmt: skip

    monkeypatch.setattr(registry, "entry_points", fake)
    try:
        assert isinstance(registry.get_codec("safetensors"), Mine)
        assert registry.detect_codec("a.lazytoy", b"").name == "safetensors"
        assert registry.names("ckptview.codecs")[0] == "safetensors"
    finally:
        monkeypatch.undo()
        registry._clear()
    assert type(registry.get_codec("safetensors")).__name__ == "SafetensorsCodec"


def test_catalog_export_default_is_the_engine_constant():
    from ckptview.engine.export import DEFAULT_MAX_SHARD

    default = inspect.signature(cv.Catalog.export).parameters["max_shard_bytes"].default
    assert default == DEFAULT_MAX_SHARD


def test_unknown_names_list_the_known_without_importing(monkeypatch):
    with pytest.raises(ValueError, match="known: .*numbered"):
        registry.get_layout("no-such-layout")
    with pytest.raises(ValueError, match="known: .*safetensors"):
        registry.get_codec("no-such-codec")
