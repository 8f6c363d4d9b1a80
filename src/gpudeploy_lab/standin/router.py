"""The stand-in ``python3 -m sglang_router.launch_router`` (sgl-model-gateway 0.3.2 as seen from outside).

PD mode (``--pd-disaggregation --prefill URL [BOOTSTRAP_PORT] ... --decode URL ...``) sends each
request to one prefill and one decode worker at once, with ``bootstrap_host``/``bootstrap_port``/
``bootstrap_room`` added, and answers with the decode's status and body. Regular mode
(``--worker-urls``) forwards to one healthy worker, round robin. Endpoints and error shapes follow
/work/shared/reference/sglang-router.md.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from gpudeploy_lab.standin import api
from gpudeploy_lab.standin.common import as_float, as_int, build_parser, emit, print_captured_help

VERSION = "0.3.2"
FORWARDED_HEADERS = ("Content-Type", "X-Request-ID", "Authorization")
FORWARD_PATHS = ("/generate", "/v1/completions", "/v1/chat/completions")


@dataclass
class Worker:
    url: str
    worker_type: str  # "prefill" | "decode" | "regular"
    bootstrap_port: int | None = None
    is_healthy: bool = False
    fails: int = 0
    successes: int = 0

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or ""

    def info(self) -> dict[str, Any]:
        return {"id": self.url, "url": self.url, "worker_type": self.worker_type,
                "is_healthy": self.is_healthy, "bootstrap_port": self.bootstrap_port,
                "model_id": "unknown", "load": 0, "connection_mode": "Http"}


@dataclass(frozen=True)
class Reply:
    status: int
    headers: list[tuple[str, str]]
    body: bytes


def request(url: str, method: str, path: str, body: bytes | None = None,
            headers: dict[str, str] | None = None, timeout: float = 5.0) -> Reply:
    """One HTTP request with the stdlib; raises OSError when the worker cannot be reached."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        return Reply(resp.status, resp.getheaders(), data)
    except http.client.HTTPException as e:
        raise OSError(str(e)) from e
    finally:
        conn.close()


def error_reply(status: int, code: str, message: str) -> Reply:
    body = json.dumps({"error": {"type": http.client.responses.get(status, "Error"), "code": code,
                                 "message": message}}).encode()
    return Reply(status, [("Content-Type", "application/json"), ("x-smg-error-code", code)], body)


class Router:
    def __init__(self, ns: argparse.Namespace) -> None:
        self.ns = ns
        self.pd = bool(ns.pd_disaggregation)
        self.workers: list[Worker] = []
        for entry in ns.prefill or []:
            port: int | None = None
            if len(entry) > 1 and entry[1].lower() not in ("none", "null", ""):
                port = as_int(entry[1], 0) or None
            self.workers.append(Worker(entry[0].rstrip("/"), "prefill", port))
        for url in ns.decode or []:
            self.workers.append(Worker(url.rstrip("/"), "decode"))
        for url in ns.worker_urls or []:
            self.workers.append(Worker(url.rstrip("/"), "regular"))
        self.interval = as_float(ns.health_check_interval_secs, 60.0)
        self.timeout = as_float(ns.health_check_timeout_secs, 5.0)
        self.fail_threshold = as_int(ns.health_failure_threshold, 3)
        self.success_threshold = as_int(ns.health_success_threshold, 2)
        self.endpoint = str(ns.health_check_endpoint or "/health")
        self.request_timeout = as_float(ns.request_timeout_secs, 1800.0)
        self.retries = 0 if ns.disable_retries else max(0, as_int(ns.retry_max_retries, 5) - 1)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.rr = itertools.count()
        self.started = False
        self.startup_timeout = as_float(ns.worker_startup_timeout_secs, 1800.0)
        self.t0 = time.monotonic()

    # --------------------------------------------------------------------------------- health

    def of(self, kind: str) -> list[Worker]:
        return [w for w in self.workers if w.worker_type == kind]

    def ready(self) -> bool:
        with self.lock:
            if not self.workers or not all(w.is_healthy for w in self.workers):
                return False
            if self.pd:
                return bool(self.of("prefill")) and bool(self.of("decode"))
            return True

    def check(self, w: Worker) -> None:
        try:
            ok = 200 <= request(w.url, "GET", self.endpoint, timeout=self.timeout).status < 300
        except OSError:
            ok = False
        with self.lock:
            was = w.is_healthy
            if ok:
                w.fails, w.successes = 0, w.successes + 1
                # At startup one 2xx is enough; later it takes success_threshold in a row.
                if not was and (not self.started or w.successes >= self.success_threshold):
                    w.is_healthy = True
            else:
                w.successes, w.fails = 0, w.fails + 1
                if was and w.fails >= self.fail_threshold:
                    w.is_healthy = False
            now = w.is_healthy
        if now and not was:
            emit(f"INFO sgl_model_gateway::core::worker: Worker is healthy: {w.worker_type} {w.url}")
        elif was and not now:
            emit(f"WARN sgl_model_gateway::core::worker: Worker is unhealthy: {w.worker_type} {w.url}")

    def health_loop(self) -> None:
        while not self.stop.is_set():
            threads = [threading.Thread(target=self.check, args=(w,), daemon=True) for w in self.workers]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if not self.started and self.ready():
                self.started = True
                emit(f"INFO sgl_model_gateway::server: All {len(self.workers)} workers are healthy")
            elif not self.started and time.monotonic() - self.t0 > self.startup_timeout:
                self.drop_unhealthy()
            if self.ns.disable_health_check and self.started:
                return
            self.stop.wait(self.interval if self.started else 0.5)

    def drop_unhealthy(self) -> None:
        """After --worker-startup-timeout-secs the real router gives up on a worker (and runs on)."""
        with self.lock:
            gone = [w for w in self.workers if not w.is_healthy]
            self.workers = [w for w in self.workers if w.is_healthy]
        for w in gone:
            emit(f"ERROR sgl_model_gateway::core::worker: Worker failed to become healthy within "
                 f"{self.startup_timeout:g}s, removing: {w.worker_type} {w.url}")
        self.started = True

    # ------------------------------------------------------------------------------ forwarding

    def pick(self, kind: str) -> Worker | None:
        with self.lock:
            pool = [w for w in self.of(kind) if w.is_healthy] or self.of(kind)
            if not pool:
                return None
            return pool[next(self.rr) % len(pool)]

    def forward(self, path: str, body: bytes, headers: dict[str, str]) -> Reply:
        try:
            req = json.loads(body or b"{}")
        except ValueError:
            return error_reply(400, "invalid_request", "request body is not valid JSON")
        if not isinstance(req, dict):
            return error_reply(400, "invalid_request", "request body must be a JSON object")
        if path == "/v1/completions" and "model" not in req:
            return error_reply(422, "invalid_request", "missing field `model`")
        if path == "/v1/chat/completions" and "max_tokens" in req:
            req.setdefault("max_completion_tokens", req.pop("max_tokens"))
        if not self.pd:
            w = self.pick("regular")
            if w is None:
                return error_reply(503, "no_available_workers", "No available workers")
            try:
                return request(w.url, "POST", path, json.dumps(req).encode(), headers, self.request_timeout)
            except OSError as e:
                return error_reply(502, "server_error", f"worker unreachable: {e}")
        reply = error_reply(503, "server_selection_failed", "No available prefill/decode workers")
        for _attempt in range(self.retries + 1):
            reply = self.forward_pd(path, req, headers)
            if reply.status < 500:
                return reply
            time.sleep(0.05)
        return reply

    def forward_pd(self, path: str, req: dict[str, Any], headers: dict[str, str]) -> Reply:
        prefill, decode = self.pick("prefill"), self.pick("decode")
        if prefill is None or decode is None:
            return error_reply(503, "server_selection_failed", "No available prefill/decode workers")
        body = json.dumps({**req, "bootstrap_host": prefill.host,
                           "bootstrap_port": prefill.bootstrap_port,
                           "bootstrap_room": random.getrandbits(63)}).encode()
        results: dict[str, Reply | OSError] = {}

        def call(kind: str, w: Worker) -> None:
            try:
                results[kind] = request(w.url, "POST", path, body, headers, self.request_timeout)
            except OSError as e:
                results[kind] = e

        threads = [threading.Thread(target=call, args=(k, w), daemon=True)
                   for k, w in (("prefill", prefill), ("decode", decode))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        p, d = results["prefill"], results["decode"]
        if isinstance(d, OSError):
            return error_reply(502, "decode_server_error", f"decode server error: {d}")
        if isinstance(p, OSError) or p.status >= 500:
            return error_reply(500, "prefill_internal_error", "prefill server error")
        if d.status == 503:
            return error_reply(503, "decode_unavailable", "decode server unavailable")
        if d.status >= 500:
            return error_reply(500, "decode_internal_error", "decode server error")
        return d

    def models(self) -> Reply:
        for kind in ("decode", "regular", "prefill"):
            w = self.pick(kind)
            if w is not None:
                try:
                    return request(w.url, "GET", "/v1/models", timeout=self.timeout)
                except OSError:
                    continue
        return error_reply(503, "no_available_workers", "No available workers")


def make_handler(router: Router) -> type[api.BaseHandler]:
    class RouterHandler(api.BaseHandler):
        def reply(self, r: Reply) -> None:
            keep = {"content-type", "x-smg-error-code"}
            extra = {k: v for k, v in r.headers if k.lower() in keep and k.lower() != "content-type"}
            ctype = next((v for k, v in r.headers if k.lower() == "content-type"), "application/json")
            self.send_bytes(r.status, r.body, ctype, extra)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path in ("/health", "/liveness"):
                self.send_bytes(200, b"OK", "text/plain")
            elif path == "/readiness":
                with router.lock:
                    healthy = sum(w.is_healthy for w in router.workers)
                    total = len(router.workers)
                if router.ready():
                    self.send_json(200, {"status": "ready", "healthy_workers": healthy,
                                         "total_workers": total})
                else:
                    self.send_json(503, {"status": "not ready",
                                         "reason": "insufficient healthy workers",
                                         "healthy_workers": healthy, "total_workers": total})
            elif path == "/workers":
                with router.lock:
                    infos = [w.info() for w in router.workers]
                self.send_json(200, {"workers": infos, "total": len(infos), "stats": {
                    "prefill_count": sum(i["worker_type"] == "prefill" for i in infos),
                    "decode_count": sum(i["worker_type"] == "decode" for i in infos),
                    "regular_count": sum(i["worker_type"] == "regular" for i in infos)}})
            elif path == "/v1/models":
                self.reply(router.models())
            else:
                self.send_json(404, {"error": {"type": "Not Found", "code": "not_found",
                                               "message": f"no route for {path}"}})

        def do_POST(self) -> None:
            path = self.path.split("?", 1)[0]
            body = self.read_body()
            if path == "/workers":
                self.add_worker(body)
                return
            if path not in FORWARD_PATHS:
                self.send_json(404, {"error": {"type": "Not Found", "code": "not_found",
                                               "message": f"no route for {path}"}})
                return
            headers = {h: v for h in FORWARDED_HEADERS if (v := self.headers.get(h)) is not None}
            headers.setdefault("Content-Type", "application/json")
            self.reply(router.forward(path, body, headers))

        def add_worker(self, body: bytes) -> None:
            try:
                req = json.loads(body)
                w = Worker(str(req["url"]).rstrip("/"), str(req.get("worker_type") or "regular"),
                           req.get("bootstrap_port"))
            except (ValueError, KeyError, TypeError):
                self.send_json(400, {"error": {"type": "Bad Request", "code": "invalid_request",
                                               "message": "expected {\"url\": ...}"}})
                return
            with router.lock:
                router.workers.append(w)
            threading.Thread(target=router.check, args=(w,), daemon=True).start()
            self.send_json(202, {"status": "accepted", "url": w.url})

    return RouterHandler


def main(argv: list[str] | None = None) -> int:
    parser = build_parser("sglang_router", VERSION, prog="launch_router.py",
                          append=["--prefill", "--decode"])
    args = sys.argv[1:] if argv is None else argv
    if print_captured_help("sglang_router", VERSION, args):
        return 0
    ns = parser.parse_args(args)
    if ns.pd_disaggregation and (not ns.prefill or not ns.decode):
        parser.error("PD disaggregation mode requires --prefill and --decode")
    for entry in ns.prefill or []:
        if len(entry) > 2:
            parser.error(f"--prefill takes a URL and an optional bootstrap port, got {entry}")
    router = Router(ns)
    host = str(ns.host or "0.0.0.0")  # noqa: S104  (the real router's default)
    port = as_int(ns.port, 30000)
    try:
        srv = api.QuietServer(host, port, make_handler(router))
    except OSError as e:
        emit(f"ERROR sgl_model_gateway::server: Failed to bind {host}:{port}: {e}")
        return 1

    def on_term(signum: int, frame: object) -> None:
        router.stop.set()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    mode = "PD disaggregated" if router.pd else "regular"
    emit(f"INFO sgl_model_gateway::server: Starting router on {host}:{port} | mode: {mode} | "
         f"prefill: {[w.url for w in router.of('prefill')]} | decode: {[w.url for w in router.of('decode')]}"
         f" | workers: {[w.url for w in router.of('regular')]}")
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    threading.Thread(target=router.health_loop, daemon=True).start()
    router.stop.wait()
    emit("INFO sgl_model_gateway::server: Shutting down")
    srv.shutdown()
    srv.server_close()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
