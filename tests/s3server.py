"""A real S3 endpoint for the tests: moto's server in a subprocess, and a fault proxy in front.

``MotoServer`` runs ``python -m moto.server`` on a free loopback port. ``FaultProxy`` is a tiny
threaded HTTP proxy (loopback only) that forwards every request to moto, logs it (method,
bucket/key, Range) so tests count requests at the server side, tracks how many are in flight
at once, and answers chosen keys with an S3 error (503 SlowDown, 403 AccessDenied …) a given
number of times. Clients are real s3fs filesystems (``storage_options``).
"""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")


class MotoServer:
    """``python -m moto.server`` on 127.0.0.1 (a separate process, stopped by ``stop``)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_port(self.port)
        except TimeoutError:
            self.stop()
            raise

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@dataclass
class Rule:
    """Answer ``times`` requests (None: all) of ``method`` on ``key`` with an
    S3 error ``status``/``code`` (``key``: "bucket/key", exact)."""

    method: str
    key: str
    status: int
    code: str
    times: int | None = None
    hits: int = 0


@dataclass
class Entry:
    method: str
    key: str  # "bucket/key" (query string dropped)
    range: str | None
    status: int


@dataclass
class ProxyState:
    log: list[Entry] = field(default_factory=list)
    rules: list[Rule] = field(default_factory=list)
    inflight: int = 0
    max_inflight: int = 0
    delay: float = 0.0  # seconds added to every GET (to see overlap)
    delay_methods: tuple[str, ...] = ("GET",)  # the methods ``delay`` holds
    held: list[tuple[float, float]] = field(default_factory=list)  # (start, end) of each hold
    lock: threading.Lock = field(default_factory=threading.Lock)


class FaultProxy:
    """A logging, fault-injecting HTTP proxy in front of ``upstream_port`` (loopback only)."""

    def __init__(self, upstream_port: int) -> None:
        self.state = ProxyState()
        handler = type("Handler", (_Handler,), {"upstream": upstream_port, "state": self.state})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fail(self, method: str, key: str, status: int, code: str, times: int | None = None):
        rule = Rule(method.upper(), key, status, code, times)
        with self.state.lock:
            self.state.rules.append(rule)
        return rule

    def reset(self) -> None:
        with self.state.lock:
            self.state.log.clear()
            self.state.rules.clear()
            self.state.max_inflight = 0
            self.state.delay = 0.0
            self.state.held.clear()

    def requests(self, method: str | None = None, under: str = "") -> list[Entry]:
        with self.state.lock:
            return [
                e
                for e in self.state.log
                if (method is None or e.method == method) and e.key.startswith(under)
            ]

    def held_seconds(self) -> float:
        """How long at least one request was held by ``delay`` (the union of the holds): the
        latency a client added to its own time, whatever its CPU was doing meanwhile."""
        with self.state.lock:
            spans = sorted(self.state.held)
        total, end = 0.0, float("-inf")
        for a, b in spans:
            total += max(0.0, b - max(a, end))
            end = max(end, b)
        return total

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    upstream: int
    state: ProxyState
    _local = threading.local()

    def log_message(self, *args) -> None:  # quiet
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                n = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if n == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                out += self.rfile.read(n)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _rule(self, method: str, key: str) -> Rule | None:
        with self.state.lock:
            for rule in self.state.rules:
                live = rule.times is None or rule.hits < rule.times
                if rule.method == method and rule.key == key and live:
                    rule.hits += 1
                    return rule
        return None

    def _handle(self) -> None:
        method = self.command
        body = self._body()
        parsed = urllib.parse.urlsplit(self.path)
        key = urllib.parse.unquote(parsed.path.lstrip("/"))
        rule = self._rule(method, key)
        if rule is not None:
            self._log(method, key, rule.status)
            payload = (
                '<?xml version="1.0" encoding="UTF-8"?>\n'
                f"<Error><Code>{rule.code}</Code><Message>injected by the test proxy</Message>"
                f"<Key>{key}</Key><RequestId>{uuid.uuid4().hex}</RequestId></Error>"
            ).encode()
            self.send_response(rule.status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if method != "HEAD":
                self.wfile.write(payload)
            return
        with self.state.lock:
            self.state.inflight += 1
            self.state.max_inflight = max(self.state.max_inflight, self.state.inflight)
            delay = self.state.delay if method in self.state.delay_methods else 0.0
        try:
            if delay:
                start = time.monotonic()
                time.sleep(delay)
                with self.state.lock:
                    self.state.held.append((start, time.monotonic()))
            status, headers, data = self._forward(method, body)
        finally:
            with self.state.lock:
                self.state.inflight -= 1
        self._log(method, key, status)
        self.send_response(status)
        for k, v in headers:
            if k.lower() not in HOP and k.lower() != "content-length":
                self.send_header(k, v)
        length = next((v for k, v in headers if k.lower() == "content-length"), None)
        self.send_header(
            "Content-Length", length if method == "HEAD" and length else str(len(data))
        )
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(data)

    def _forward(self, method: str, body: bytes) -> tuple[int, list, bytes]:
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
        if body or method in ("PUT", "POST"):
            headers["Content-Length"] = str(len(body))
        for attempt in range(2):
            conn = getattr(self._local, "conn", None)
            if conn is None:
                conn = self._local.conn = http.client.HTTPConnection("127.0.0.1", self.upstream)
            try:
                conn.request(method, self.path, body=body or None, headers=headers)
                resp = conn.getresponse()
                return resp.status, resp.getheaders(), resp.read()
            except (http.client.HTTPException, OSError):
                conn.close()
                self._local.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def _log(self, method: str, key: str, status: int) -> None:
        with self.state.lock:
            self.state.log.append(Entry(method, key, self.headers.get("Range"), status))

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle


def storage_options(endpoint: str) -> dict:
    """s3fs options for a loopback endpoint (dummy credentials, no caching of listings)."""
    return {
        "key": "testing",
        "secret": "testing",
        "anon": False,
        "endpoint_url": endpoint,
        "client_kwargs": {"region_name": "us-east-1"},
        "use_listings_cache": False,
        "skip_instance_cache": True,
    }


def s3fs_client(endpoint: str):
    import s3fs

    return s3fs.S3FileSystem(**storage_options(endpoint))


def upload(fs, local: Path, bucket: str, prefix: str) -> str:
    """Copy a local tree to ``s3://bucket/prefix`` (s3fs ``put``, recursive); its URL."""
    if not fs.exists(bucket):
        fs.call_s3("create_bucket", Bucket=bucket)
        fs.invalidate_cache()
    fs.put(str(local).rstrip("/") + "/", f"{bucket}/{prefix}", recursive=True)
    fs.invalidate_cache()
    return f"s3://{bucket}/{prefix}"


def set_delay(proxy: FaultProxy, seconds: float, methods: tuple[str, ...] = ("GET",)) -> None:
    """Hold every request of ``methods`` ``seconds`` at ``proxy`` (a store's latency); the
    high-water mark of requests in flight is reset."""
    with proxy.state.lock:
        proxy.state.delay = seconds
        proxy.state.delay_methods = methods
        proxy.state.max_inflight = 0


def write_sharded_run(root: Path, serials: int = 25, shards: int = 8, tensors: int = 4,
                      first: int = 100, step: int = 100, rows: int = 8) -> list[Path]:  # fmt: skip
    """A ``transformers.Trainer``-shaped tree: ``checkpoint-N/`` with ``shards`` safetensors
    shards, their ``model.safetensors.index.json`` and ``trainer_state.json`` (``serials``
    of them, N = first, first + step, …); ``rows`` × 4 float32 tensors. The serial dirs
    written."""
    import json
    import struct

    import numpy as np

    made = []
    for k in range(serials):
        n = first + k * step
        d = root / f"checkpoint-{n}"
        d.mkdir(parents=True, exist_ok=True)
        weight_map, total = {}, 0
        for s in range(shards):
            fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            header, blobs, off = {}, [], 0
            for t in range(tensors):
                name = f"layers.{s * tensors + t}.weight"
                arr = np.full((8, 4), n + s + t / 10, dtype=np.float32).tobytes()
                header[name] = {
                    "dtype": "F32",
                    "shape": [8, 4],
                    "data_offsets": [off, off + len(arr)],
                }
                blobs.append(arr)
                off += len(arr)
                weight_map[name] = fname
            raw = json.dumps(header, separators=(",", ":")).encode()
            raw += b" " * (-len(raw) % 8)
            (d / fname).write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))
            total += off
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (d / "model.safetensors.index.json").write_text(json.dumps(index))
        state = {"global_step": n, "epoch": float(k + 1), "max_steps": first + serials * step,
                 "log_history": [{"step": n, "loss": 1.0 / (k + 1), "epoch": float(k + 1)}]}  # fmt: skip
        (d / "trainer_state.json").write_text(json.dumps(state))
        made.append(d)
    return made
