"""The host probe's GET (status's /health and a router's /workers, deploy's /health before it decides
what changed): a bare socket, not urllib.request, whose imports cost ~30-50 ms of every probe on a
host (issue 26). It must read what urllib read: status, JSON body, chunked bodies, down servers."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpudeploy.facts import remote_probe
from gpudeploy.facts.probe import SOURCE


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path == "/health":
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/workers":
            body = json.dumps({"workers": [{"url": "http://10.0.0.1:30000", "healthy": True}]}).encode()
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (body[:10], body[10:]):
                self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send_response(503)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"no")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def server() -> Iterator[int]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_status_json_chunks_and_a_down_server(server: int) -> None:
    down = _free_port()
    got = remote_probe.http_get({"h": f"http://127.0.0.1:{server}/health", "w": f"http://127.0.0.1:{server}/workers",
                                 "x": f"http://127.0.0.1:{server}/other", "d": f"http://127.0.0.1:{down}/health"},
                                timeout=5)
    assert got["h"] == {"status": 200, "json": None}
    assert got["w"] == {"status": 200, "json": {"workers": [{"url": "http://10.0.0.1:30000", "healthy": True}]}}
    assert got["x"]["status"] == 503
    assert got["d"] == {"status": None}


def test_an_ipv6_address_in_brackets(server: int) -> None:
    with pytest.raises(OSError):  # parsed as host ::1, port <server>: nothing listens there on IPv6
        remote_probe.http_status_body(f"http://[::1]:{_free_port()}/health", 2)


def test_the_probe_asks_without_importing_urllib_request(server: int, tmp_path: Path) -> None:
    script = tmp_path / "probe.py"
    script.write_text(SOURCE.replace('if __name__ == "__main__":', "if False:"))
    code = (f"import runpy, sys, json; ns = runpy.run_path({str(script)!r}); "
            f"out = ns['http_get']({{'h': 'http://127.0.0.1:{server}/health'}}, 5); "
            "print(json.dumps([out['h']['status'], 'urllib.request' in sys.modules, 'hashlib' in sys.modules]))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(res.stdout.strip().splitlines()[-1]) == [200, False, False]


def test_the_probe_reads_its_other_facts_while_the_servers_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang's /health answers after 1 s at the earliest: the probe's GETs start first, so a status or
    a redeploy costs that second once, not that second plus every other fact."""
    import time

    slow_health, slow_facts = 0.6, 0.6

    def answer(url: str, timeout: float) -> tuple[int, bytes]:
        time.sleep(slow_health)
        return 200, b""

    def facts(units: list[str]) -> dict[str, dict[str, str]]:
        time.sleep(slow_facts)
        return {}

    monkeypatch.setattr(remote_probe, "http_status_body", answer)
    monkeypatch.setattr(remote_probe, "systemctl_show", facts)
    t0 = time.monotonic()
    out = remote_probe.main({"units": [], "http": {"u": "http://127.0.0.1:1/health"}, "http_timeout": 5})
    took = time.monotonic() - t0
    assert out["http"] == {"u": {"status": 200, "json": None}}
    assert took < slow_health + slow_facts - 0.2  # overlapped (was their sum)


class _Older(_Handler):
    """A server without the first URL of a chain (404), one that keeps it behind a key (401), and
    one whose first URL hangs."""

    def do_GET(self) -> None:
        if self.path == "/no-route":
            self.send_response(404)
        elif self.path == "/keyed":
            self.send_response(401)
        elif self.path == "/slow":
            threading.Event().wait(3)  # longer than the probe's timeout below
            self.send_response(200)
        else:
            super().do_GET()
            return
        self.send_header("Content-Length", "0")
        self.end_headers()


def test_a_chain_asks_the_next_url_only_where_the_first_has_no_such_route() -> None:
    """status's fast health (/server_info, verify/liveness.py) falls back to the role's /health on an
    older SGLang (404) or one with --api-key (401); a server that does not answer is down, not asked
    again (a hung scheduler answers /health no better)."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Older)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        got = remote_probe.http_get({"old": [f"{base}/no-route", f"{base}/health"],
                                     "key": [f"{base}/keyed", f"{base}/health"],
                                     "hung": [f"{base}/slow", f"{base}/health"],
                                     "sick": [f"{base}/other", f"{base}/health"]}, timeout=1)
    finally:
        srv.shutdown()
        srv.server_close()
    assert got["old"] == {"status": 200, "json": None, "url": f"{base}/health"}
    assert got["key"] == {"status": 200, "json": None, "url": f"{base}/health"}
    assert got["hung"] == {"status": None, "url": f"{base}/slow"}
    assert got["sick"]["status"] == 503 and got["sick"]["url"] == f"{base}/other"  # a real answer counts
