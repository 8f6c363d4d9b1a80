"""Record the real SGLang 0.5.23 (CPU) server's output for each case, as test data.

    .venv/bin/python tests/standin/record_real_sglang.py [CASE ...]

writes tests/verify/data/sglang-0.5.23-cpu/<case>.log (the server's combined stdout and stderr, byte
for byte) and updates recorded.json there (each case's command, exit code, timings, memory). Runs one
server at a time on loopback (this machine has 2 cores); takes about 5 minutes for all cases. Only the
processes started here are signalled, each by PID. See that folder's README.md.
"""

from __future__ import annotations

import json
import signal
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_sglang
from real_sglang import MODEL, Server, real_env, server_argv

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "tests" / "verify" / "data" / "sglang-0.5.23-cpu"
HOME = Path(tempfile.gettempdir()) / "gpudeploy-real-sglang-home"


def free_port() -> int:
    with closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def health(port: int, timeout: float = 25.0) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=timeout) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except (OSError, ValueError):
        return None


def base_args(port: int, *extra: str) -> list[str]:
    """The lab role's single-server command; ``extra`` adds flags or replaces the KV budget."""
    budget = [] if "--max-total-tokens" in extra else ["--max-total-tokens", "4096"]
    return ["--model-path", str(MODEL), "--device", "cpu", "--host", "127.0.0.1", "--port", str(port),
            "--nccl-port", str(free_port()), *budget, *extra]


def shown(argv: list[str], port: int) -> list[str]:
    """The command as the README shows it: the engine's python and the model by name, ports as P/N."""
    out = []
    for i, a in enumerate(argv):
        prev = argv[i - 1] if i else ""
        if a == str(real_sglang.PYTHON):
            a = "python3"
        elif a == str(MODEL):
            a = "MODEL"
        elif prev == "--port":
            a = "PORT"
        elif prev in ("--nccl-port", "--disaggregation-bootstrap-port"):
            a = "PORT2"
        out.append(a)
    return out


class Case:
    def __init__(self, name: str) -> None:
        self.name = name
        self.port = free_port()
        self.meta: dict[str, Any] = {}

    def start(self, args: list[str], env: dict[str, str] | None = None) -> Server:
        argv = server_argv(*args)
        self.meta["command"] = " ".join(shown(argv, self.port))
        return Server(argv, env or real_env(HOME), OUT / f"{self.name}.log")

    def wait_ready(self, srv: Server, timeout: float = 120.0) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if srv.popen.poll() is not None:
                raise RuntimeError(f"{self.name}: exited {srv.popen.returncode} before ready")
            if health(self.port) == 200:
                return srv.elapsed()
            time.sleep(0.25)
        raise TimeoutError(f"{self.name}: not ready in {timeout} s")

    def finish(self, srv: Server, code: int | None) -> None:
        self.meta["exit_code"] = code
        self.meta["log_lines"] = len(srv.lines)
        srv.kill()


def ready_then_stop(*extra: str) -> Callable[[Case], None]:
    return lambda c: normal(c, *extra)


def normal(c: Case, *extra: str) -> None:
    """Startup to ready, a generation, then SIGTERM: SGLang's own shutdown."""
    srv = c.start(base_args(c.port, *extra))
    c.meta["ready_s"] = round(c.wait_ready(srv), 1)
    c.meta["rss_mib_by_process"] = {("main " if p == srv.pid else "") + (real_sglang.comm(p) or "?") + f" {p}":
                                    real_sglang.rss_kib(p) // 1024 for p in [srv.pid, *srv.children()]}
    c.meta["rss_mib"] = srv.rss_kib() // 1024
    req = urllib.request.Request(f"http://127.0.0.1:{c.port}/generate", method="POST",
                                 data=json.dumps({"text": "hello", "sampling_params": {"max_new_tokens": 4,
                                                                                        "temperature": 0}}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        c.meta["generate_status"] = r.status
    t = time.monotonic()
    c.finish(srv, srv.stop(grace=60))
    c.meta["sigterm_to_exit_s"] = round(time.monotonic() - t, 1)


def quick_exit(*extra: str, model: str | None = None) -> Callable[[Case], None]:
    def run(c: Case) -> None:
        args = base_args(c.port, *extra)
        if model is not None:
            args[args.index("--model-path") + 1] = model
        srv = c.start(args)
        code = srv.wait_exit(180)
        c.meta["exit_s"] = round(srv.elapsed(), 1)
        c.finish(srv, code)
    return run


def port_in_use(c: Case) -> None:
    """The HTTP port is held by a listening socket of ours before the server starts."""
    with closing(socket.socket()) as s:
        s.bind(("127.0.0.1", c.port))
        s.listen()
        srv = c.start(base_args(c.port))
        code = srv.wait_exit(180)
        c.meta["exit_s"] = round(srv.elapsed(), 1)
        c.finish(srv, code)


def kill_scheduler(after: str) -> Callable[[Case], None]:
    """SIGKILL the scheduler: once the server is ready, or at ``after`` (a log line regex)."""
    def run(c: Case) -> None:
        srv = c.start(base_args(c.port))
        if after == "ready":
            c.wait_ready(srv)
        else:
            srv.wait_line(after, 120)
        pid = srv.child_named("sglang::schedul")
        srv.signal_all(0)  # note every descendant before one goes
        os_kill(pid, signal.SIGKILL)
        c.meta["killed"] = f"sglang::scheduler (SIGKILL) at {after!r}"
        t = time.monotonic()
        code = srv.wait_exit(60)
        c.meta["kill_to_exit_s"] = None if code is None else round(time.monotonic() - t, 1)
        if code is None:
            c.meta["note"] = "the main process was still running 60 s after the kill (then SIGKILLed by us)"
        c.meta["health_after"] = health(c.port, timeout=5) if code is None else None
        c.finish(srv, code)
    return run


def os_kill(pid: int, sig: int) -> None:
    import os
    os.kill(pid, sig)


def stopped(at: str) -> Callable[[Case], None]:
    """SIGSTOP the main process and every descendant the moment ``at`` is logged; what comes after."""
    def run(c: Case) -> None:
        srv = c.start(base_args(c.port))
        srv.wait_line(at, 120)
        pids = srv.signal_all(signal.SIGSTOP)
        c.meta["stopped"] = f"{len(pids)} processes at {at!r}"
        n = len(srv.lines)
        time.sleep(10)  # nothing can come: every process is stopped (the record shows what did)
        c.meta["lines_after_stop"] = len(srv.lines) - n
        c.meta["health_while_stopped"] = health(c.port, timeout=3)
        c.finish(srv, None)
    return run


def missing_module(c: Case) -> None:
    """A PD prefill whose python has no mooncake: a sitecustomize on PYTHONPATH makes `import mooncake`
    fail as it does where the package is not installed (ModuleNotFoundError), in every process."""
    block = HOME / "no-mooncake"
    real_sglang.block_mooncake(block)
    env = real_env(HOME, [("PYTHONPATH", str(block)), ("SGLANG_HOST_IP", "127.0.0.1"),
                          ("SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER", "1"),
                          ("SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX", "0")])
    srv = c.start(base_args(c.port, "--disaggregation-mode", "prefill", "--disaggregation-transfer-backend",
                            "mooncake_tcp", "--disaggregation-bootstrap-port", str(free_port())), env)
    c.meta["env"] = "PYTHONPATH=<dir with a sitecustomize.py that makes `import mooncake` fail>"
    code = srv.wait_exit(180)
    c.meta["exit_s"] = round(srv.elapsed(), 1)
    c.finish(srv, code)


CASES: dict[str, Callable[[Case], None]] = {
    "normal": normal,
    "invalid-value": quick_exit("--max-total-tokens", "abc"),
    "unknown-flag": quick_exit("--no-such-flag", "1"),
    "port-in-use": port_in_use,
    "missing-model": quick_exit(model="/nonexistent/tiny-model"),
    "scheduler-killed-after-ready": kill_scheduler("ready"),
    "scheduler-killed-while-starting": kill_scheduler(r"Init parallel begin"),
    "kv-too-small": quick_exit("--max-total-tokens", "0"),
    # not an error in 0.5.23: a warning ("KV pool holds 16 tokens, fewer than --context-length 2048. ...")
    "kv-below-context": ready_then_stop("--max-total-tokens", "16"),
    "missing-module": missing_module,
    "sigstop-starting": stopped(r"Load weight begin"),
}


def main(names: list[str]) -> int:
    reason = real_sglang.missing()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    OUT.mkdir(parents=True, exist_ok=True)
    meta_path = OUT / "recorded.json"
    meta: dict[str, Any] = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    for name in names or list(CASES):
        c = Case(name)
        print(f"recording {name} ...", flush=True)
        CASES[name](c)
        c.meta["recorded"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        meta[name] = c.meta
        print(f"  {json.dumps(c.meta)}", flush=True)
        meta_path.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
