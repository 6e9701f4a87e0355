"""Listings in worker processes (``ckptview.scan.isolated``): a parser that dies by a signal
or exhausts its memory limit costs one error row, never the process that asked.

The crashing parsers are a real codec plugin, installed the way a third-party one would be
(an entry point in a ``.dist-info`` on ``sys.path``), so the workers load it themselves.
"""

from __future__ import annotations

import shutil
import textwrap

import pytest
from conftest import corpus_path

import ckptview as cv
from ckptview.scan.isolated import IsolatedExecutor
from ckptview.scan.listing import WORKER_DIED

PLUGIN = '''
import os, signal
from ckptview.codecs.base import Codec
from ckptview.registry import CodecTier


class Crashy(Codec):
    """.crash: the parser dies by SIGSEGV; .hog: it asks for 16 GiB."""

    name = "crashy"
    suffixes = (".crash", ".hog")
    priority = CodecTier.FORMAT

    def guess_can_open(self, filename, head):
        return filename.endswith(self.suffixes)

    def list_variables(self, blob, hints):
        if blob.path.endswith(".crash"):
            os.kill(os.getpid(), signal.SIGSEGV)
        bytearray(16 << 30)
        return []
'''


def install_plugin(site):
    """The crashy codec as an installed distribution in ``site`` (a ``sys.path`` entry)."""
    (site / "crashy-1.0.dist-info").mkdir(parents=True)
    (site / "crashy_codec.py").write_text(PLUGIN)
    (site / "crashy-1.0.dist-info" / "METADATA").write_text("Name: crashy\nVersion: 1.0\n")
    (site / "crashy-1.0.dist-info" / "entry_points.txt").write_text(
        textwrap.dedent("[ckptview.codecs]\ncrashy = crashy_codec:Crashy\n")
    )
    return site


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    site = install_plugin(tmp_path / "site")
    monkeypatch.syspath_prepend(str(site))  # spawn workers start with the parent's sys.path
    return site


@pytest.fixture
def executor():
    ex = IsolatedExecutor(max_workers=2, memory=2 << 30, context="spawn")
    yield ex
    ex.shutdown()


def test_a_crashing_parser_is_one_error_row(tmp_path, plugin, executor):
    root = tmp_path / "files"
    root.mkdir()
    shutil.copyfile(corpus_path("modern/safetensors/single/model.safetensors"),
                    root / "model.safetensors")  # fmt: skip
    (root / "boom.crash").write_bytes(b"x")
    (root / "big.hog").write_bytes(b"x")
    cat = cv.open(str(root), executor=executor, cache=False)
    files = cat.files.set_index(cat.files["path"].str.rsplit("/", n=1).str[-1])
    assert WORKER_DIED in files.loc["boom.crash", "error"]
    assert "SIGSEGV" in files.loc["boom.crash", "error"]
    assert "MemoryError" in files.loc["big.hog", "error"]  # the limit, not the host, said no
    assert files.loc["model.safetensors", "error"] is None
    good = cat.variables[cat.variables["error"].isna()]
    assert len(good) == 11  # model.safetensors' tensors, listed by a healthy worker
    # the pool was replaced: the next scan works
    again = cv.open(str(corpus_path("modern/torch/run_A")), executor=executor, cache=False)
    plain = cv.open(str(corpus_path("modern/torch/run_A")), cache=False)
    assert len(again.variables) == len(plain.variables) and executor.restarts >= 1


def test_single_file_runs_isolated_too(tmp_path, plugin, executor):
    path = tmp_path / "only.crash"
    path.write_bytes(b"x")
    cat = cv.open(str(path), executor=executor, cache=False)
    assert WORKER_DIED in cat.files["error"].iloc[0]


def test_value_reads_stay_in_threads(tmp_path):
    """Stats and trajectories of an isolated catalog read values in the caller's threads: a
    job sent to a worker would carry the whole scan across the process boundary."""

    class Counting(IsolatedExecutor):
        submitted = 0

        def submit(self, fn, /, *args, **kwargs):
            Counting.submitted += 1
            return super().submit(fn, *args, **kwargs)

    ex = Counting(max_workers=1, context="spawn")
    try:
        cat = cv.open(str(corpus_path("modern/torch/run_A")), executor=ex, cache=False)
        n_files = len(cat.files)
        listed = Counting.submitted
        assert listed == n_files  # every file listed by a worker
        name = cat.variables["name"].iloc[0]
        plain = cv.open(str(corpus_path("modern/torch/run_A")), cache=False)
        assert cat.stats(names=[name]).equals(plain.stats(names=[name]))
        assert list(cat.trajectory(name)) == list(plain.trajectory(name))
        assert Counting.submitted == listed  # no value read went to a worker
    finally:
        ex.shutdown()


def test_the_workers_last_words_name_the_signal_when_its_status_is_lost(tmp_path):
    """Under forkserver the pool's manager thread and the caller both join a dead worker; the
    loser reads exit code 255. The signal faulthandler wrote before the worker died wins."""
    import multiprocessing
    import os
    import subprocess
    import sys

    from ckptview.scan.isolated import _cause

    log = tmp_path / "fault.log"
    crash = ("import faulthandler, os, signal, sys; faulthandler.enable(open(sys.argv[1], 'a'));"
             " os.kill(os.getpid(), signal.SIGSEGV)")  # fmt: skip
    assert subprocess.run([sys.executable, "-c", crash, str(log)]).returncode == -11
    worker = multiprocessing.get_context("spawn").Process(target=os._exit, args=(255,))
    worker.start()
    worker.join()
    assert worker.exitcode == 255  # what the race leaves behind
    assert _cause([worker], str(log)) == "the worker process listing it was killed by SIGSEGV"
    assert _cause([worker], None).endswith("exited with code 255")  # no last words: the code
