"""HTTP side of the stand-in: a quiet, robust stdlib server and the engine's endpoints."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import socketserver
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gpudeploy_lab.standin.common import at_least, emit

# ------------------------------------------------------------------------------------ the server


class QuietServer(ThreadingHTTPServer):
    """ThreadingHTTPServer that binds IPv4 or IPv6, never resolves names (getfqdn hangs on hosts
    without DNS) and does not print tracebacks for clients that hang up."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, host: str, port: int, handler: type[BaseHTTPRequestHandler]) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, port), handler)

    def server_bind(self) -> None:
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass


class BaseHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    timeout = 60

    def version_string(self) -> str:
        return self.server_version

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # A request line that is not HTTP/1.x (garbage, TLS) gets a proper "HTTP/1.1 400" like uvicorn,
    # not argparse-era HTTP/0.9 bare HTML.
    default_request_version = "HTTP/1.0"

    def parse_request(self) -> bool:
        # gRPC probes send the HTTP/2 preface ("PRI * HTTP/2.0"): answer 400 and hang up.
        line = getattr(self, "raw_requestline", b"")
        if line.startswith(b"PRI * HTTP/2"):
            self.command = None  # type: ignore[assignment]
            self.request_version = "HTTP/1.1"
            self.requestline = line.decode("latin-1").rstrip("\r\n")
            self.close_connection = True
            self.send_error(400, "Invalid HTTP request received.")
            return False
        return super().parse_request()

    def read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        return self.rfile.read(length) if length > 0 else b""

    def send_bytes(self, status: int, body: bytes, ctype: str = "application/json",
                   headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        self.send_bytes(status, json.dumps(obj).encode(), headers=headers)

    def start_stream(self, status: int = 200, ctype: str = "text/event-stream") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def write_chunk(self, data: bytes) -> None:
        if data:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

    def end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


# ------------------------------------------------------------------------------ text generation

_WORD_TEXT = (
    "the of and to in is that for it as with was on be by at this from or an are not have which "
    "one all were when there can more an will if about into has some would other out also time "
    "these two may then do first any my now such like our over man me even most made after well "
    "new way could great where through much before back good just through years used each very"
)
WORDS = tuple(_WORD_TEXT.split())


def fake_tokens(prompt: str, n: int) -> list[str]:
    """``n`` deterministic "tokens" (words with a leading space) for a prompt."""
    out: list[str] = []
    block = 0
    while len(out) < n:
        digest = hashlib.sha256(f"{block}:{prompt}".encode()).digest()
        for i in range(0, len(digest), 2):
            out.append(" " + WORDS[(digest[i] << 8 | digest[i + 1]) % len(WORDS)])
        block += 1
    return out[:n]


def count_prompt_tokens(prompt: str) -> int:
    return max(1, len(prompt.encode()) // 4)


# -------------------------------------------------------------------------------- engine state


@dataclass
class EngineState:
    """What the HTTP handlers need to know about the running engine."""

    served_model_name: str
    mode: str  # "null" | "prefill" | "decode"
    version: str
    context_len: int
    max_total_num_tokens: int
    server_args: dict[str, Any]
    model_type: str = "llama"
    architectures: list[str] = field(default_factory=list)
    phase: str = "warmup"  # warmup | ready | shutting_down
    created: int = field(default_factory=lambda: int(time.time()))
    requests: int = 0
    in_flight: int = 0  # generation requests being answered now (/v1/loads)
    lock: threading.Lock = field(default_factory=threading.Lock)
    fault: str = ""  # SGLANG_STANDIN_FAULT; the handlers act on "generate-500"
    tp: int = 1
    scheduler_pids: list[int] = field(default_factory=list)  # this node's ranks (the workers)


# How long 0.5.23's health_generate waits for a scheduler's answer before its 503
# (SGLANG_HEALTH_CHECK_TIMEOUT, http_server.py), and how long the stand-in lets a /server_info wait
# for one (the real one has no deadline: get_internal_state waits on its communicator).
HEALTH_CHECK_TIMEOUT_S = float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20"))
SERVER_INFO_WAIT_S = 600.0


def _stopped(pid: int) -> bool:
    """A scheduler that cannot answer now: stopped (SIGSTOP, a debugger), as /proc/PID/stat says."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] in ("T", "t")
    except OSError:
        return False  # gone: the launcher's watchdog says that, not the request


def schedulers_answer(state: EngineState, within_s: float) -> bool:
    """Whether every scheduler answers a request within ``within_s``: the real server's /health and
    /server_info both wait on each scheduler's event loop (0.5.23 http_server.py health_generate,
    server_info -> tokenizer_manager.get_internal_state), so a stopped one answers neither."""
    deadline = time.monotonic() + within_s
    while any(_stopped(pid) for pid in state.scheduler_pids):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


SECRET_KEYS = ("model_path", "tokenizer_path")  # reported, the real router downloads a tokenizer


class DummyHealthHandler(BaseHandler):
    """What a multi-node group's non-zero node serves once its schedulers are ready (SGLang's
    ``launch_dummy_health_check_server``): /health and /health_generate 200, nothing else."""

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in ("/health", "/health_generate", "/ping"):
            self.send_bytes(200, b"", "text/plain")
        else:
            self.send_json(404, {"detail": "Not Found"})


def make_engine_handler(state: EngineState) -> type[BaseHandler]:
    api_key = state.server_args.get("api_key")

    class EngineHandler(BaseHandler):
        def authorized(self, path: str) -> bool:
            """SGLang's --api-key middleware: everything but /health* and /metrics needs the key."""
            if not api_key or path.startswith("/health") or path == "/metrics":
                return True
            if self.headers.get("Authorization") == f"Bearer {api_key}":
                return True
            self.send_json(401, {"error": "Unauthorized"})
            return False

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if not self.authorized(path):
                return
            if path in ("/health", "/health_generate"):
                ok = state.phase == "ready"
                # As SGLang 0.5.23 (http_server.py health_generate): while starting 503 at once; once up,
                # a one-token generation and `await asyncio.sleep(1)` before its first look, so a 200
                # never comes sooner than a second after the request (unless generation is turned off).
                generation = os.environ.get("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "1").lower() \
                    not in ("0", "false", "no", "off")
                if ok and (generation or path == "/health_generate"):
                    time.sleep(1.0)
                    # its first look after that second; no answer from a scheduler until the timeout: 503
                    ok = schedulers_answer(state, max(0.0, HEALTH_CHECK_TIMEOUT_S - 1.0))
                self.send_bytes(200 if ok else 503, b"", "text/plain")
            elif path == "/v1/models":
                self.send_json(200, {"object": "list", "data": [{
                    "id": state.served_model_name, "object": "model", "created": state.created,
                    "owned_by": "sglang", "root": state.served_model_name,
                    "max_model_len": state.context_len}]})
            elif path in ("/model_info", "/get_model_info"):
                self.send_json(200, {
                    "is_generation": True, "preferred_sampling_params": None,
                    "weight_version": "default", "has_image_understanding": False,
                    "has_audio_understanding": False, "model_type": state.model_type,
                    "architectures": state.architectures})
            elif path in ("/server_info", "/get_server_info"):
                if not schedulers_answer(state, SERVER_INFO_WAIT_S):
                    self.close_connection = True  # the real one would still be waiting
                    return
                info = {k: v for k, v in state.server_args.items() if k not in SECRET_KEYS}
                info.update({
                    "version": state.version, "status": state.phase,
                    "max_total_num_tokens": state.max_total_num_tokens,
                    "internal_states": [{"max_total_num_tokens": state.max_total_num_tokens,
                                         "last_gen_throughput": 0.0}]})
                self.send_json(200, info)
            elif path == "/v1/loads":  # as 0.5.23 reports the load per DP rank (the fields gpudeploy reads)
                self.send_json(200, {"version": state.version, "loads": [{
                    "dp_rank": 0, "num_running_reqs": state.in_flight, "num_waiting_reqs": 0,
                    "max_total_num_tokens": state.max_total_num_tokens}]})
            elif path == "/get_load" and not at_least(state.version, (0, 5, 23)):
                # gone by 0.5.23 (its http_server.py has no such route; PR #23010 had made it a deprecated
                # shim of /v1/loads): a 404 there, as from the real server
                self.send_json(200, [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0,
                                      "num_tokens": 0}])
            elif path == "/metrics" and state.server_args.get("enable_metrics"):
                self.send_bytes(200, b"# stand-in\nsglang:num_running_reqs 0\n", "text/plain")
            else:
                self.send_json(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            path = self.path.split("?", 1)[0]
            body = self.read_body()
            if not self.authorized(path):
                return
            if path not in ("/generate", "/v1/completions", "/v1/chat/completions"):
                self.send_json(404, {"detail": "Not Found"})
                return
            if state.phase == "shutting_down":
                self.send_json(503, {"error": {"message": "The server is shutting down"}})
                return
            try:
                req = json.loads(body or b"{}")
                if not isinstance(req, dict):
                    raise ValueError("body must be a JSON object")
            except ValueError as e:
                self.send_json(400, {"error": {"message": f"Invalid request: {e}", "type": "BadRequest",
                                               "code": 400}})
                return
            state.requests += 1
            if state.fault == "generate-500":
                self.generation_500(path, req)
                return
            with state.lock:
                state.in_flight += 1
            try:
                if path == "/generate":
                    self.generate(req)
                elif path == "/v1/completions":
                    self.completions(req)
                else:
                    self.chat(req)
            finally:
                with state.lock:
                    state.in_flight -= 1

        # ------------------------------------------------------------------------ generation

        def generation_500(self, path: str, req: dict[str, Any]) -> None:
            """The ``generate-500`` fault, as SGLang fails a request whose KV transfer failed.

            SGLang (python/sglang/srt/disaggregation/decode.py, ``pop_transferred``) logs on every
            rank ``Decode transfer failed for request rank=N decode_req.req.rid='...'
            decode_req.req.bootstrap_room=N with exception KVTransferError(bootstrap_room=N): Failed
            to get kvcache from prefill instance, it might be dead`` and aborts the request with
            status 500; the tokenizer manager raises ``fastapi.HTTPException(500, message)``, which
            http_server.py's handler answers with an ``ErrorResponse``: ``{"object": "error",
            "message", "type": "500", "param": null, "code": 500}``. The OpenAI endpoints catch it in
            serving_base.py's ``handle_request`` and answer ``{"object": "error", "message":
            "Internal server error: 500: ...", "type": "InternalServerError", "param": null, "code":
            500}``. Streamed requests get the same 500 (the real server would send an error chunk).
            """
            rid = str(req.get("rid") or uuid.uuid4().hex)
            room = req.get("bootstrap_room")
            if state.mode == "prefill":
                message = (f"Prefill transfer failed for request rank={{rank}} req.rid='{rid}' with exception "
                           f"KVTransferError(bootstrap_room={room}): Decode instance could be dead, remote "
                           "mooncake session is not alive")
            elif state.mode == "decode":
                message = (f"Decode transfer failed for request rank={{rank}} decode_req.req.rid='{rid}' "
                           f"decode_req.req.bootstrap_room={room} with exception "
                           f"KVTransferError(bootstrap_room={room}): Failed to get kvcache from prefill "
                           "instance, it might be dead")
            else:
                message = f"Scheduler aborted request rid='{rid}' (stand-in fault generate-500)"
            for rank in range(max(1, state.tp)):
                emit(message.format(rank=rank), f"TP{rank}")
            detail = message.format(rank=0)
            if path == "/generate":
                body = {"object": "error", "message": detail, "type": "500", "param": None, "code": 500}
            else:
                body = {"object": "error", "message": f"Internal server error: 500: {detail}",
                        "type": "InternalServerError", "param": None, "code": 500}
            self.send_json(500, body)

        def limit(self, requested: Any, default: int) -> int:
            n = requested if isinstance(requested, int) and requested >= 0 else default
            if state.mode == "prefill":
                n = min(n, 1)  # a prefill server produces the first token only
            return min(n, 1024)

        def generate(self, req: dict[str, Any]) -> None:
            text = req.get("text")
            if text is None and req.get("input_ids") is not None:
                text = json.dumps(req["input_ids"])
            sp = req.get("sampling_params") or {}
            n = self.limit(sp.get("max_new_tokens") if isinstance(sp, dict) else None, 128)
            prompts = text if isinstance(text, list) else [str(text or "")]
            rid = str(req.get("rid") or uuid.uuid4().hex)
            t0 = time.monotonic()

            def result(prompt: str, toks: list[str], done: bool) -> dict[str, Any]:
                return {"text": "".join(toks), "meta_info": {
                    "id": rid, "finish_reason": {"type": "length", "length": n} if done else None,
                    "prompt_tokens": count_prompt_tokens(prompt), "completion_tokens": len(toks),
                    "cached_tokens": 0, "e2e_latency": round(time.monotonic() - t0, 4)}}

            if req.get("stream"):
                self.start_stream()
                toks = fake_tokens(prompts[0], n)
                for i in _stream_points(n):
                    self.sse(result(prompts[0], toks[:i], i == n))
                self.write_chunk(b"data: [DONE]\n\n")
                self.end_stream()
                return
            outs = [result(p, fake_tokens(p, n), True) for p in prompts]
            self.send_json(200, outs if isinstance(text, list) else outs[0])

        def completions(self, req: dict[str, Any]) -> None:
            prompt = req.get("prompt", "")
            prompt = prompt[0] if isinstance(prompt, list) and prompt else prompt
            prompt = str(prompt)
            n = self.limit(req.get("max_tokens"), 16)
            toks = fake_tokens(prompt, n)
            base = {"id": "cmpl-" + uuid.uuid4().hex, "object": "text_completion",
                    "created": int(time.time()), "model": req.get("model") or state.served_model_name}
            usage = {"prompt_tokens": count_prompt_tokens(prompt), "completion_tokens": n,
                     "total_tokens": count_prompt_tokens(prompt) + n}
            if req.get("stream"):
                self.start_stream()
                prev = 0
                for i in _stream_points(n):
                    self.sse({**base, "choices": [{"index": 0, "text": "".join(toks[prev:i]),
                                                   "logprobs": None,
                                                   "finish_reason": "length" if i == n else None}]})
                    prev = i
                self.write_chunk(b"data: [DONE]\n\n")
                self.end_stream()
                return
            self.send_json(200, {**base, "choices": [{"index": 0, "text": "".join(toks), "logprobs": None,
                                                      "finish_reason": "length"}], "usage": usage})

        def chat(self, req: dict[str, Any]) -> None:
            msgs = req.get("messages") or []
            prompt = "\n".join(f"{m.get('role')}: {m.get('content')}" for m in msgs if isinstance(m, dict))
            n = self.limit(req.get("max_completion_tokens", req.get("max_tokens")), 64)
            toks = fake_tokens(prompt, n)
            base = {"id": "chatcmpl-" + uuid.uuid4().hex, "created": int(time.time()),
                    "model": req.get("model") or state.served_model_name}
            if req.get("stream"):
                self.start_stream()
                self.sse({**base, "object": "chat.completion.chunk", "choices": [
                    {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
                prev = 0
                for i in _stream_points(n):
                    self.sse({**base, "object": "chat.completion.chunk", "choices": [{
                        "index": 0, "delta": {"content": "".join(toks[prev:i])},
                        "finish_reason": "length" if i == n else None}]})
                    prev = i
                self.write_chunk(b"data: [DONE]\n\n")
                self.end_stream()
                return
            pt = count_prompt_tokens(prompt)
            self.send_json(200, {**base, "object": "chat.completion", "choices": [{
                "index": 0, "message": {"role": "assistant", "content": "".join(toks)},
                "finish_reason": "length"}],
                "usage": {"prompt_tokens": pt, "completion_tokens": n, "total_tokens": pt + n}})

        def sse(self, obj: Any) -> None:
            self.write_chunk(b"data: " + json.dumps(obj).encode() + b"\n\n")

    return EngineHandler


def _stream_points(n: int) -> Iterator[int]:
    """Token counts after which a stream sends a chunk: about 4 chunks, the last one at ``n``."""
    step = max(1, n // 4)
    yield from range(step, n, step)
    yield n
