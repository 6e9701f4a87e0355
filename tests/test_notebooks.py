"""Every notebook in ``notebooks/`` runs top to bottom (nbclient, this interpreter's kernel).

The notebooks are committed without outputs; they work on scratch copies in temp dirs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
NAMES = ["quickstart", "compare", "manage", "experiments"]
KERNEL = "ckptview-test"


@pytest.fixture(scope="module")
def kernel(tmp_path_factory, monkeypatch_module):
    """A kernelspec running this very interpreter (the venv's python)."""
    root = tmp_path_factory.mktemp("jupyter")
    spec = root / "kernels" / KERNEL
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": KERNEL, "language": "python"})
    )
    monkeypatch_module.setenv("JUPYTER_PATH", str(root))
    return KERNEL


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs(name, kernel):
    path = NOTEBOOKS / f"{name}.ipynb"
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), (
        f"{path.name} is committed with outputs; clear them"
    )
    client = NotebookClient(nb, kernel_name=kernel, timeout=300,
                            resources={"metadata": {"path": str(NOTEBOOKS)}})  # fmt: skip
    client.execute()
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    widgets = [
        o for c in nb.cells for o in c.get("outputs", [])
        if "application/vnd.holoviews_exec.v0+json" in o.get("data", {})
    ]  # fmt: skip
    assert widgets, f"{name}: no Panel widget was displayed inline"
