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


class _Endless(http.server.BaseHTTPRequestHandler):
    """A 'generation' that never ends: an event every millisecond, never [DONE]."""

    protocol_version = "HTTP/1.0"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        try:
            for i in range(10**6):
                self.wfile.write(b'data: {"text": "' + b"x" * (i % 50) + b'"}\n\n')
        except OSError:
            pass  # the client stopped reading: what the bound is for

    def log_message(self, *args: object) -> None:
        pass


def test_a_stream_that_never_ends_is_cut_not_kept_whole() -> None:
    # The smoke kept every event of the stream: a server that streams on (or a port that is not an
    # engine's) grew gpudeploy's memory without bound until the socket timeout, which never came.
    from gpudeploy.verify.http import stream_events

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Endless)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        got = stream_events(f"http://127.0.0.1:{srv.server_address[1]}/generate", {"text": "hi"}, timeout=30,
                            max_events=500)
    finally:
        srv.shutdown()
        srv.server_close()
    assert got.status == 200 and len(got.events) == 500
    assert "past 500 events" in got.cut


def test_the_host_asks_its_own_servers_at_the_address_they_listen_on() -> None:
    # A NAT'd container often cannot reach the address we reach it by (no hairpin): the gate's HTTP
    # on the host itself goes to the server's listening address instead.
    from dataclasses import replace
    from pathlib import Path

    from gpudeploy.inventory import load_inventory
    from gpudeploy.verify.liveness import local_url

    inv = load_inventory(str(Path(__file__).resolve().parents[2] / "lab" / "inventory" / "lab.yml"))
    host = next(iter(inv.hosts.values()))
    url = f"http://{host.address}:30000/health"
    assert local_url(url, replace(host, bind_address="0.0.0.0")) == "http://127.0.0.1:30000/health"
    assert local_url(url, replace(host, bind_address="10.9.8.7")) == "http://10.9.8.7:30000/health"
    assert local_url(url, replace(host, bind_address="::")) == "http://[::1]:30000/health"
    assert local_url("http://192.0.2.99:30000/health", host) == "http://192.0.2.99:30000/health"  # another host's
