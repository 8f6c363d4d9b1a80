"""The gate's and status's HTTP reads, against real local servers (loopback only)."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator

import pytest

from gpudeploy.verify.http import status_of


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 503)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_an_operators_proxy_is_not_used(server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # urllib's default opener sent the gate's polls to http_proxy, where they never reached the GPU node.
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.delenv("no_proxy", raising=False)
    assert status_of(f"{server}/health", timeout=2) == 200
    assert status_of(f"{server}/other", timeout=2) == 503


def test_a_port_that_does_not_speak_http_is_not_ready_not_an_error() -> None:
    # http.client.BadStatusLine is no OSError: it escaped the gate's retry as a traceback.
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()

    def garbage() -> None:
        conn, _ = sock.accept()
        conn.recv(1024)
        conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")
        conn.close()

    t = threading.Thread(target=garbage, daemon=True)
    t.start()
    try:
        assert status_of(f"http://127.0.0.1:{sock.getsockname()[1]}/health", timeout=2) is None
    finally:
        t.join(5)
        sock.close()
    assert status_of("http://127.0.0.1:9/health", timeout=2) is None  # nothing listens
