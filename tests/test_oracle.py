"""The differential test against the real frameworks (``../shared/oracle``): trees written by
torch, DCP, safetensors, numpy, gguf, TensorFlow, Paddle and Keras, one fault each, and the
frameworks' own verdicts. ``run.sh`` needs only ckptview; this runs it with this Python."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CORPUS

ORACLE = Path(os.environ.get("CKPTVIEW_ORACLE", CORPUS.parent / "oracle")).resolve()
LINE = re.compile(r"^oracle(?: \(deep\))?: (\d+)/(\d+) verdicts agree, (\d+) false-loadable, "
                  r"(\d+) false-alarms, (\d+) value mismatches, (\d+) latest mismatches$")  # fmt: skip


def run_oracle(tmp_path: Path, deep: bool) -> tuple[list[int], dict]:
    if not (ORACLE / "run.sh").exists():
        pytest.fail(f"oracle missing: {ORACLE} (set CKPTVIEW_ORACLE)")
    report = tmp_path / ("report-deep.json" if deep else "report.json")
    env = {**os.environ, "CKPTVIEW_PYTHON": sys.executable, "ORACLE_REPORT": str(report)}
    cmd = ["bash", str(ORACLE / "run.sh"), *(["--deep"] if deep else [])]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    last = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-2000:]
    m = LINE.match(last)
    assert m, f"no summary line: {last}"
    return [int(x) for x in m.groups()], json.loads(report.read_text())


def test_deep_verdicts_agree_with_the_frameworks(tmp_path):
    (agree, total, false_loadable, alarms, values, latest), report = run_oracle(tmp_path, True)
    assert (false_loadable, alarms, values, latest) == (0, 0, 0, 0), report["disagreements"][:3]
    assert agree == total >= 1000


def test_verdicts_agree_with_the_frameworks_without_a_deep_verify(tmp_path):
    """Without ``--deep``: every verdict is the framework's own, ``latest`` too. The faults
    only a checksum shows (a flipped data byte under TF's crc32c or a deflate stream, a TF
    data file or index from another serial or run) are in files small enough that their
    checksums are checked as the tree is read (``scan.checks.SMALL_CHECK``)."""
    (agree, total, false_loadable, alarms, values, latest), report = run_oracle(tmp_path, False)
    assert (false_loadable, alarms, values, latest) == (0, 0, 0, 0), report["disagreements"][:3]
    assert agree == total >= 1000
