"""The stand-in router: PD forwarding, bootstrap fields, readiness, its own endpoints."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from standin_support import PYTHON, REPO, Lab, free_port, http_get, http_post, wait_for


def test_unknown_router_flag_exits_2(lab: Lab) -> None:
    r = subprocess.run([PYTHON, "-m", "sglang_router.launch_router", "--pd-disaggregation", "--bogus"],
                       env=lab.env(), cwd=REPO, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert r.stderr.startswith("usage: launch_router.py")
    assert "error: unrecognized arguments: --bogus" in r.stderr


def test_pd_router_waits_for_workers_then_returns_decode_text(lab: Lab) -> None:
    boot = free_port()
    _, pport = lab.engine("--disaggregation-mode", "prefill",
                          "--disaggregation-bootstrap-port", str(boot))
    _, dport = lab.engine("--disaggregation-mode", "decode")
    router, rport = lab.router("--pd-disaggregation", "--prefill", f"http://127.0.0.1:{pport}", str(boot),
                               "--decode", f"http://127.0.0.1:{dport}")
    wait_for(lambda: http_get(rport, "/liveness"), timeout=10)
    assert http_get(rport, "/health") == (200, b"OK")
    status, body = http_get(rport, "/readiness")  # type: ignore[misc]
    assert (status, json.loads(body)["status"]) == (503, "not ready")

    wait_for(lambda: (http_get(rport, "/readiness") or (0,))[0] == 200, timeout=15)
    status, body = http_get(rport, "/readiness")  # type: ignore[misc]
    assert json.loads(body) == {"status": "ready", "healthy_workers": 2, "total_workers": 2}
    assert http_get(dport, "/health") == (200, b"")  # engines were ready before the router said so
    router.wait_line("All 2 workers are healthy")

    status, body = http_get(rport, "/workers")  # type: ignore[misc]
    workers = {w["worker_type"]: w for w in json.loads(body)["workers"]}
    assert workers["prefill"]["bootstrap_port"] == boot and workers["prefill"]["is_healthy"]
    assert workers["decode"]["url"] == f"http://127.0.0.1:{dport}"

    req = {"text": "hello router", "sampling_params": {"max_new_tokens": 6}}
    status, body = http_post(rport, "/generate", req)
    via_router = json.loads(body)
    direct_decode = json.loads(http_post(dport, "/generate", req)[1])
    direct_prefill = json.loads(http_post(pport, "/generate", req)[1])
    assert status == 200
    assert via_router["text"] == direct_decode["text"] and len(via_router["text"].split()) == 6
    assert direct_prefill["text"] != direct_decode["text"]  # prefill makes only the first token

    status, body = http_post(rport, "/v1/chat/completions", {
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
    assert status == 200 and len(json.loads(body)["choices"][0]["message"]["content"].split()) == 3
    status, body = http_post(rport, "/v1/completions", {"prompt": "no model"})
    assert status == 422
    assert json.loads(http_get(rport, "/v1/models")[1])["data"][0]["id"] == "/models/test-model"  # type: ignore[index]

    router.popen.send_signal(signal.SIGTERM)
    assert router.wait_exit(3) == 0


class Recorder(BaseHTTPRequestHandler):
    """A fake worker that records what it is sent and answers with its name."""

    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, str, dict[str, Any]]]
    name: str
    status: int = 200

    def log_message(self, *args: Any) -> None:
        pass

    def reply(self, status: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self.reply(200 if self.path == "/health" else 404, {})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append((self.name, self.path, body))
        self.reply(self.status, {"text": f"from {self.name}", "meta_info": {}})


@pytest.fixture
def recorders() -> Iterator[tuple[list[tuple[str, str, dict[str, Any]]], dict[str, Any]]]:
    seen: list[tuple[str, str, dict[str, Any]]] = []
    servers = {}
    for name in ("prefill", "decode"):
        handler = type(f"{name}Handler", (Recorder,), {"seen": seen, "name": name})
        srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers[name] = srv
    yield seen, servers
    for srv in servers.values():
        srv.shutdown()
        srv.server_close()


def test_router_sends_both_sides_with_bootstrap_fields(
        lab: Lab, recorders: tuple[list[tuple[str, str, dict[str, Any]]], dict[str, Any]]) -> None:
    seen, servers = recorders
    pport, dport = servers["prefill"].server_address[1], servers["decode"].server_address[1]
    _, rport = lab.router("--pd-disaggregation", "--prefill", f"http://127.0.0.1:{pport}", "8998",
                          "--decode", f"http://127.0.0.1:{dport}", "--health-check-interval-secs", "1")
    wait_for(lambda: (http_get(rport, "/readiness") or (0,))[0] == 200, timeout=10)

    status, body = http_post(rport, "/generate", {"text": "x"})
    assert status == 200 and json.loads(body)["text"] == "from decode"
    assert sorted(s[0] for s in seen) == ["decode", "prefill"]
    bodies = {name: b for name, path, b in seen if path == "/generate"}
    for b in bodies.values():
        assert b["bootstrap_host"] == "127.0.0.1" and b["bootstrap_port"] == 8998 and b["text"] == "x"
    assert bodies["prefill"]["bootstrap_room"] == bodies["decode"]["bootstrap_room"]
    assert 0 <= bodies["decode"]["bootstrap_room"] < 2**63

    seen.clear()
    http_post(rport, "/v1/chat/completions", {"model": "m", "messages": [], "max_tokens": 7})
    assert all(b["max_completion_tokens"] == 7 and "max_tokens" not in b for _, _, b in seen)

    servers["decode"].RequestHandlerClass.status = 500
    status, body = http_post(rport, "/generate", {"text": "x"})
    assert status == 500 and json.loads(body)["error"]["code"] == "decode_internal_error"


def test_router_help_and_startup_timeout_drops_a_dead_worker(
        lab: Lab, recorders: tuple[list[tuple[str, str, dict[str, Any]]], dict[str, Any]]) -> None:
    r = subprocess.run([PYTHON, "-m", "sglang_router.launch_router", "--help"], env=lab.env(), cwd=REPO,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "--pd-disaggregation" in r.stdout and "SGLang Router" in r.stdout

    _, servers = recorders
    pport, dead = servers["prefill"].server_address[1], free_port()
    router, rport = lab.router("--pd-disaggregation", "--prefill", f"http://127.0.0.1:{pport}",
                               "--decode", f"http://127.0.0.1:{dead}", "--worker-startup-timeout-secs", "1")
    router.wait_line(f"removing: decode http://127.0.0.1:{dead}", timeout=5)
    _, body = http_get(rport, "/workers")  # type: ignore[misc]
    assert [w["worker_type"] for w in json.loads(body)["workers"]] == ["prefill"]
    assert http_get(rport, "/readiness")[0] == 503  # type: ignore[index]
    assert http_get(rport, "/liveness") == (200, b"OK")
