"""Checkpoint trees whose names are HTML: every name a tree can put on the dashboard (run label,
serial paths, file names, tensor names, metric names, node names) carries a payload that sets
``window.__xss_<field>`` if the browser ever runs it.

A page that escapes names shows them as text (the literal ``<img`` is visible) and runs none.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np


def payload(field: str) -> str:
    """An ``<img>`` whose error handler marks ``field`` (no slash: fits in a file name; the
    quoted attribute makes it raw HTML to Markdown too)."""
    return f'<img src=x onerror="window.__xss_{field}=1">'


def breakout(field: str) -> str:
    """A payload that first closes an attribute and a tag, then runs a script."""
    return f'"><script>window.__xss_{field}=1</script><svg onload=window.__xss_{field}_svg=1>'


ROOT_NAME = "hf" + payload("root")
TENSOR = "h." + payload("tensor")
TENSOR_BREAKOUT = "h." + breakout("tensor")
METRIC = "a_loss" + payload("metric")  # sorts first: a default column
METRIC_BREAKOUT = "eval_loss" + breakout("metric")
#: Panel compiles a Tabulator configuration string of this form as JavaScript
METRIC_CODE = "--x_x--0_0--window.__xss_jscode=1--x_x--0_0--"
WEIGHTS_FILE = "extra" + payload("file") + ".safetensors"
BROKEN_FILE = "broken" + payload("errfile") + ".safetensors"
NODE = "node" + payload("node")
SERIALS = (100, 200, 300)


def safetensors(tensors: dict[str, np.ndarray]) -> bytes:
    """A safetensors file holding ``tensors`` (float32), written by hand."""
    header, blobs, offset = {}, [], 0
    for name, value in tensors.items():
        data = np.ascontiguousarray(value, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(value.shape),
                        "data_offsets": [offset, offset + len(data)]}  # fmt: skip
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + b"".join(blobs)


def hf_tree(base: Path) -> Path:
    """A Trainer output dir (three ``checkpoint-N``) whose every name is a payload."""
    root = base / ROOT_NAME
    rng = np.random.default_rng(11)
    for i, step in enumerate(SERIALS):
        ckpt = root / f"checkpoint-{step}"
        ckpt.mkdir(parents=True)
        tensors = {
            TENSOR: rng.standard_normal((16, 8)) * (1 + i),  # the biggest: followed by default
            TENSOR_BREAKOUT: rng.standard_normal((8, 8)),
            "h.bias": rng.standard_normal(8),
        }
        (ckpt / "model.safetensors").write_bytes(safetensors(tensors))
        (ckpt / WEIGHTS_FILE).write_bytes(safetensors({"scale": np.full(4, 1.0 + i)}))
        if step == SERIALS[-1]:
            (ckpt / BROKEN_FILE).write_bytes(safetensors({"cut": np.ones(64)})[:40])
        (ckpt / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
        state = {
            "global_step": step, "epoch": float(i + 1), "best_metric": None,
            "log_history": [{"step": step, "epoch": float(i + 1), "loss": 3.0 - i / 2,
                             METRIC: 2.0 - i / 4, METRIC_BREAKOUT: 1.5 + i, METRIC_CODE: i}],
        }  # fmt: skip
        (ckpt / "trainer_state.json").write_text(json.dumps(state))
    return root


def caffe2_tree(base: Path, source: Path) -> Path:
    """A copy of a Caffe2 tree (``<node>.<epoch>`` files) whose second node is a payload."""
    root = base / "caffe2_nodes"
    shutil.copytree(source, root)
    nodes = sorted({p.name.rsplit(".", 1)[0] for p in root.iterdir()})
    for p in list(root.iterdir()):
        if p.name.rsplit(".", 1)[0] == nodes[-1]:
            p.rename(root / f"{NODE}.{p.name.rsplit('.', 1)[1]}")
    return root
