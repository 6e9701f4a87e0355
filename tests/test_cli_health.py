"""``ckptview health URL [--spectral] [--json]``: exit 0 healthy, 1 with findings, 2 on usage."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_health import write_run

from ckptview.cli import main


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_healthy_exits_zero(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    write_run(tmp_path / "run", n=5)
    code, out, err = run(capsys, "health", tmp_path / "run", "-q")
    assert code == 0, err
    assert "healthy" in out and "rollback point: 500 (latest)" in out
    assert max(map(len, out.splitlines())) <= 80


def test_findings_exit_one_with_table(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    write_run(tmp_path / "run", n=8, spike=6, nan_at=7, frozen_from=3)
    code, out, _ = run(capsys, "health", tmp_path / "run", "--spectral", "-q")
    assert code == 1
    assert "first divergence: serial 600" in out and "rollback point: 500" in out
    assert "top variables by update spike" in out and "fc1.weight" in out
    assert "spectra at serial 800" in out
    assert max(map(len, out.splitlines())) <= 80


def test_json(tmp_path, capsys):
    write_run(tmp_path / "run", n=6, nan_at=4)
    code, out, _ = run(capsys, "health", tmp_path / "run", "--json", "--spectral")
    doc = json.loads(out)
    assert code == 1 and doc["healthy"] is False
    assert doc["rollback_point"] == 300 and doc["divergence"] == 400
    assert doc["first"]["nonfinite"] == 400
    by_serial = {r["serial"]: r["status"] for r in doc["serials"]}
    assert by_serial == {100: "ok", 200: "ok", 300: "ok", 400: "nonfinite", 500: "nonfinite",
                         600: "nonfinite"}  # fmt: skip
    spectral = [r for r in doc["spectral"] if r["name"] == "fc1.weight" and r["serial"] == 100]
    assert len(spectral) == 1 and spectral[0]["sigma_max"] > 0
    w = np.load(tmp_path / "run" / "step_100.npz")["fc1.weight"].astype(np.float64)
    assert spectral[0]["sigma_max"] == pytest.approx(np.linalg.svd(w, compute_uv=False)[0])


def test_healthy_json_exits_zero(tmp_path, capsys):
    write_run(tmp_path / "run", n=3)
    code, out, _ = run(capsys, "health", tmp_path / "run", "--json")
    assert code == 0 and json.loads(out)["rollback_point"] == 300


def test_usage_errors_exit_two(tmp_path, capsys):
    write_run(tmp_path / "run", n=2)
    code, out, err = run(capsys, "health", tmp_path / "run", "--spike-factor", "0.5")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit) as e:
        main(["health"])  # no URL
    assert e.value.code == 2 and "url" in capsys.readouterr().err.lower()
    code, _, err = run(capsys, "health", tmp_path / "nowhere")
    assert code == 1 and len(err.strip().splitlines()) == 1
