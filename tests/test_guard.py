"""The served roots hold against "Open another tree": what fsspec would open is checked, not
the URL's text (``ckptview.widgets.guard``).

Each escape found by the red team is replayed through the picker: a ``reference`` filesystem
whose ``fo`` is fetched from a loopback HTTP server (SSRF) or maps a served name onto a file
outside the roots, a ``simplecache`` that writes into a directory the visitor names, a
``simplecache::`` chain that leaves a relative root, a relative URL. None may open, fetch or
write anything; URLs inside the roots (and safe options) still open.
"""

from __future__ import annotations

import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import corpus_path

from ckptview.widgets import TreePicker, Workspace
from ckptview.widgets.guard import AccessRefused, Guard

SAFETENSORS = ("modern", "safetensors", "single", "model.safetensors")


@pytest.fixture
def layout(tmp_path):
    """``served/run`` (a root holding a checkpoint) and ``outside/model.safetensors``."""
    served = tmp_path / "served" / "run"
    served.mkdir(parents=True)
    shutil.copyfile(corpus_path(*SAFETENSORS), served / "model.safetensors")
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copyfile(corpus_path(*SAFETENSORS), outside / "secret.safetensors")
    return served, outside


def picker_for(root) -> tuple[TreePicker, Workspace]:
    ws = Workspace(guard=Guard(roots=[str(root)]))
    return TreePicker(ws), ws


def refused(picker: TreePicker, url: str, options: dict | None = None) -> str:
    picker.url, picker.storage_options = url, json.dumps(options) if options else ""
    with pytest.raises(AccessRefused) as err:
        picker.open()
    return str(err.value)


def onto_outside(served, outside) -> dict:
    """A reference set that shows the outside file as a file of the served root."""
    secret = str(outside / "secret.safetensors")
    return {"version": 1, "refs": {f"{served}/secret.safetensors": [secret]}}


class Recorder(BaseHTTPRequestHandler):
    """Answers every GET with a reference set that maps a name onto an outside file."""

    def do_GET(self):  # noqa: N802 - the http.server API
        self.server.paths.append(self.path)
        body = json.dumps(self.server.refs).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def loopback(layout):
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    server.paths = []
    server.refs = onto_outside(*layout)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_reference_fo_from_a_loopback_service_is_never_fetched(layout, loopback):
    served, _ = layout
    picker, ws = picker_for(served)
    fo = f"http://127.0.0.1:{loopback.server_address[1]}/refs.json"
    message = refused(picker, str(served), {"protocol": "reference", "fo": fo})
    assert "'protocol'" in message and loopback.paths == [] and not ws.runs
    refused(picker, f"reference://{served}", {"fo": fo})  # the protocol in the URL instead
    assert loopback.paths == [] and not ws.runs


def test_reference_onto_an_outside_file_is_refused(layout):
    served, outside = layout
    picker, ws = picker_for(served)
    refused(picker, str(served), {"protocol": "reference", "fo": onto_outside(served, outside)})
    refused(picker, str(served), {"target_protocol": "file", "fo": str(outside)})
    assert not ws.runs


def test_simplecache_writes_nowhere(layout, tmp_path):
    served, _ = layout
    picker, ws = picker_for(served)
    cache = tmp_path / "visitor-cache"
    refused(picker, str(served), {"protocol": "simplecache", "target_protocol": "file",
                                  "cache_storage": str(cache)})  # fmt: skip
    refused(picker, f"simplecache::{served}", {"simplecache": {"cache_storage": str(cache)}})
    refused(picker, str(served), {"cache_storage": str(cache)})
    assert not cache.exists() and not ws.runs


def test_a_chain_out_of_a_relative_root_is_refused(layout, monkeypatch):
    served, outside = layout
    monkeypatch.chdir(served)
    picker, ws = picker_for(".")  # `ckptview serve .`
    message = refused(picker, f"simplecache::{outside}")
    assert "chained" in message and not ws.runs
    for url in (f"file::{outside}", f"{served}::x"):
        refused(picker, url)


def test_relative_and_home_urls_are_refused(layout, monkeypatch):
    served, _ = layout
    monkeypatch.chdir(served.parent)
    picker, ws = picker_for(served.parent)
    for url in ("run", "./run", "~/run", "file://run"):
        assert "absolute" in refused(picker, url)
    assert not ws.runs


def test_a_link_out_of_the_roots_is_refused(layout):
    served, outside = layout
    (served / "escape").symlink_to(outside, target_is_directory=True)
    picker, ws = picker_for(served)
    refused(picker, str(served / "escape"))
    refused(picker, str(served / "escape" / "secret.safetensors"))
    assert not ws.runs


def test_urls_inside_the_roots_still_open(layout):
    served, _ = layout
    picker, ws = picker_for(served.parent)
    picker.url = f"file://{served}"
    assert picker.open() == "run"
    picker.url = str(served / "model.safetensors")
    label = picker.open()
    assert ws.runs[label].variables["name"].size > 0


def test_storage_options_are_checked_per_filesystem():
    guard = Guard(roots=["s3://bucket/runs"])
    creds = {"key": "AKIA", "secret": "s", "token": "t", "anon": False}
    assert guard.check_url("s3://bucket/runs/a", creds) == "s3://bucket/runs/a"
    assert guard.check_url("s3://bucket/runs/a", {"anon": True})
    for bad in ({"endpoint_url": "http://127.0.0.1:9"},
                {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9"}},
                {"s3": {"endpoint_url": "http://127.0.0.1:9"}},
                {"protocol": "file"}, {"config_kwargs": {}}, {"anon": ["x"]}):  # fmt: skip
        with pytest.raises(AccessRefused, match="storage option"):
            guard.check_url("s3://bucket/runs/a", bad)
    for outside in ("s3://bucket/other", "s3://bucket/runs/../other", "s3://bucket/runsX",
                    "/bucket/runs", "memory://bucket/runs"):  # fmt: skip
        with pytest.raises(AccessRefused):
            guard.check_url(outside)
    local = Guard(roots=["/srv/runs"])
    with pytest.raises(AccessRefused, match="storage option"):
        local.check_url("/srv/runs/a", {"anon": True})  # local paths take no options


def test_a_notebook_workspace_is_not_restricted(layout):
    served, outside = layout
    ws = Workspace()  # no roots: the notebook's user is the operator
    assert ws.add(str(outside)) == "outside"
