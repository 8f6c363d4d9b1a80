"""The stand-in checked line by line against the real SGLang 0.5.23 (the lab's CPU build), in one run.

For every phase and fault both can show on a CPU, the real server and the stand-in are started with
the same arguments on loopback, one after the other (2 cores), and the lines gpudeploy reads from a
log are compared after normalizing what differs between any two runs (times, numbers, PIDs, ports,
paths): phase markers, memory lines, progress bars, uvicorn's startup, the ready line, argparse's,
uvicorn's bind, the model loader's and the launcher's death texts (whatever phase_of, fatal_rule,
progress_of or memory.logparse reads) and 0.5.23's init lines, how each run ended (exit code, /health),
/health's generation (>= 1 s) and the load endpoints. One real server serves the startup, endpoint and
killed-scheduler checks. What only a GPU shows (CUDA graphs, NCCL,
VRAM) is the stand-in's alone and not checked here. Differences found: tests/verify/data/
sglang-0.5.23-cpu/DIFFERENCES.md.

Marked ``sglang``; skipped, with the reason, when the real engine is not built
(``python -m gpudeploy_lab engine``). About 4 minutes on a 2-core machine with the lab idle, 10 and more
under the lab's load.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import signal
import socket
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import real_sglang
from real_sglang import MODEL, Server, real_env, server_argv, wait_until
from standin_support import REPO, free_port, http_get

from gpudeploy.memory.logparse import _PATTERNS, _WARMUP
from gpudeploy.progress import progress_of
from gpudeploy.verify.causes import classify, fatal_rule, phase_of

pytestmark = [pytest.mark.sglang,
              pytest.mark.skipif(real_sglang.missing() is not None, reason=str(real_sglang.missing()))]

# the real server: ~20-30 s on an idle 2-core machine; 66 s ready and > 240 s to die (missing-module) at a
# load average of 40-68 (the lab's tests on the same two cores)
READY_S = 480.0


# -- what gpudeploy reads, normalized ----------------------------------------------------------------

_STAMP = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?( [A-Z_0-9 ]+)?\] ")
_SITE = re.compile(r"/\S*?/(?:site|dist)-packages/")
# a number, not the digits of a name ("torch.float16", "scheduler_0", "TP1" stay as they are)
_NUMBER = re.compile(r"(?<![A-Za-z_])-?\d+(?:\.\d+)*")


def normalize(record: str) -> str:
    """One log record without what differs between any two runs: the time (the rank tag stays),
    numbers (sizes, rates, PIDs, ports, counts), install paths, runs of spaces; tqdm's updates in a
    record ("\\r"-joined) each normalized, one of each run of equal ones (a slower load prints one more)."""
    parts = []
    for part in record.split("\r"):
        m = _STAMP.match(part)
        head = f"[T{m.group(1) or ''}] " if m else ""
        body = part[m.end():] if m else part
        body = _NUMBER.sub("N", _SITE.sub("SITE/", body))
        text = re.sub(r"\s+", " ", head + body).strip()
        if text and (not parts or parts[-1] != text):
            parts.append(text)
    return "\r".join(parts)


def read(record: str) -> bool:
    """A record gpudeploy reads: a phase, a fatal text, progress, a memory figure, uvicorn's startup."""
    line = record.split("\r")[-1]
    return bool(phase_of(record) or fatal_rule(record) or progress_of(record) or _WARMUP.search(line)
                or any(p.search(line) for _, p in _PATTERNS))


def lines_read(srv: Server, until: str | None = None) -> list[str]:
    out = []
    for record in srv.lines:
        if read(record):
            out.append(normalize(record))
        if until is not None and until in record:
            break
    return out


def same(real: list[str], standin: list[str], what: str) -> None:
    diff = difflib.unified_diff(real, standin, "real SGLang 0.5.23", "stand-in", lineterm="", n=1)
    assert standin == real, f"{what}: the stand-in's lines differ from the real server's\n" + "\n".join(diff)


# -- starting both ---------------------------------------------------------------------------------


class Pair:
    """Starts the real server and the stand-in with the same arguments; kills all it started."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.started: list[Server] = []

    def args(self, port: int, *extra: str) -> list[str]:
        budget = [] if "--max-total-tokens" in extra else ["--max-total-tokens", "4096"]
        return ["--model-path", str(MODEL), "--device", "cpu", "--host", "127.0.0.1", "--port", str(port),
                "--nccl-port", str(free_port()), *budget, *extra]

    def real(self, args: list[str], **env: str) -> Server:
        srv = Server(server_argv(*args), real_env(self.tmp / "home", env.items()))
        self.started.append(srv)
        return srv

    def standin(self, args: list[str], speed: float = 0.3, **env: str) -> Server:
        base = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{REPO / 'src'}:{REPO / 'lab' / 'shims'}",
                "HF_HUB_OFFLINE": "1", "SGLANG_STANDIN_SPEED": str(speed),
                "SGLANG_STANDIN_GPU_PROCS_DIR": str(self.tmp / "gpu-procs"),
                "GPUDEPLOY_LAB_GPUS": str(self.tmp / "no-gpus.json"),
                "GPUDEPLOY_LAB_SGLANG": str(self.tmp / "no-sglang.json")}
        srv = Server(["/usr/bin/python3", "-m", "sglang.launch_server", *args], {**base, **env}, cwd=REPO)
        self.started.append(srv)
        return srv

    def close(self) -> None:
        for srv in self.started:
            srv.kill()


def health(port: int) -> int | None:
    got = http_get(port, "/health", timeout=25.0)
    return got[0] if got else None


def wait_ready(srv: Server, port: int) -> float:
    def ready() -> bool:
        if srv.popen.poll() is not None:
            raise AssertionError(f"exited {srv.popen.returncode} before ready:\n" + "\n".join(srv.lines[-40:]))
        return health(port) == 200
    wait_until(ready, READY_S, "ready", interval=0.25)
    return srv.elapsed()


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    p = Pair(tmp_path_factory.mktemp("real-vs-standin"))
    try:
        yield p
    finally:
        p.close()


@pytest.fixture(scope="module")
def ready_pair(pair: Pair) -> tuple[Server, Server, dict[str, float]]:
    """One real server and one stand-in, both started the lab role's way and ready."""
    port = free_port()
    real = pair.real(pair.args(port))
    took = wait_ready(real, port)
    rss = real.rss_kib() / (1 << 20)
    sport = free_port()
    standin = pair.standin(pair.args(sport))
    wait_ready(standin, sport)
    return real, standin, {"ready_s": took, "rss_gib": rss, "port": port, "standin_port": sport}


# -- the checks ------------------------------------------------------------------------------------


def test_startup_to_ready_prints_the_same_lines(ready_pair: tuple[Server, Server, dict[str, float]]) -> None:
    real, standin, seen = ready_pair
    print(f"real SGLang 0.5.23 (CPU): ready in {seen['ready_s']:.1f} s, {seen['rss_gib']:.2f} GiB RSS")
    ready = "The server is fired up and ready to roll"
    same(lines_read(real, until=ready), lines_read(standin, until=ready), "startup to ready")
    # 0.5.23's init lines, which gpudeploy does not read (yet): the same too
    inits = [[normalize(ln) for ln in srv.lines if re.search(r"Init parallel|Memory baseline", ln)]
             for srv in (real, standin)]
    assert len(inits[0]) == 3
    same(inits[0], inits[1], "0.5.23's init lines")
    phases = [p for p in map(phase_of, real.lines) if p]
    assert phases[0] == "loading weights" and phases[-1] == "ready"


def cpu_share(pid: int, seconds: float = 2.0) -> float:
    """The share of one core process ``pid`` used over ``seconds`` (utime + stime of /proc/PID/stat)."""
    def ticks() -> int:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
        return int(fields[11]) + int(fields[12])
    t0, c0 = time.monotonic(), ticks()
    time.sleep(seconds)  # a measurement over a span, not a wait for a condition
    return (ticks() - c0) / os.sysconf("SC_CLK_TCK") / (time.monotonic() - t0)


def test_health_takes_a_generation_and_the_load_endpoints_are_the_same(
        ready_pair: tuple[Server, Server, dict[str, float]]) -> None:
    """Once up, /health runs a one-token generation and looks after 1 s, so a 200 takes >= 1 s (the gate's
    poll must outwait it); the load is at /v1/loads with the fields gpudeploy reads, /get_load is gone."""
    real, standin, seen = ready_pair
    took = []
    for port in (int(seen["port"]), int(seen["standin_port"])):
        t0 = time.monotonic()
        assert health(port) == 200
        took.append(time.monotonic() - t0)
    print(f"/health once ready: real {took[0]:.2f} s, stand-in {took[1]:.2f} s")
    assert min(took) >= 1.0
    codes = []
    for port in (int(seen["port"]), int(seen["standin_port"])):
        loads = http_get(port, "/v1/loads", timeout=10.0)
        assert loads is not None and loads[0] == 200
        [rank] = json.loads(loads[1])["loads"]
        assert {"dp_rank", "num_running_reqs", "num_waiting_reqs"} <= set(rank), rank
        codes.append(http_get(port, "/get_load", timeout=10.0))
    assert [c[0] if c else None for c in codes] == [404, 404]
    # What only the real one does, idle: its scheduler polls without --sleep-on-idle (printed, not compared)
    shares = [cpu_share(srv.child_named("sglang::schedul")) for srv in (real, standin)]
    print(f"idle scheduler: real {shares[0]:.0%} of a core, stand-in {shares[1]:.0%}")


def server_info(port: int, timeout: float) -> tuple[int, Any] | None:
    """/server_info's (status, JSON), None when no answer comes within ``timeout``."""
    try:
        got = http_get(port, "/server_info", timeout=timeout)
    except TimeoutError:
        return None
    return (got[0], json.loads(got[1]) if got[0] == 200 else None) if got else None


def test_server_info_asks_every_scheduler_and_a_stopped_one_never_answers(
        ready_pair: tuple[Server, Server, dict[str, float]]) -> None:
    """What status asks instead of /health (verify/liveness.py): /server_info answers with each
    scheduler's internal state, without /health's second, and not while a scheduler is stopped."""
    real, standin, seen = ready_pair
    took = []
    for srv, port in ((real, int(seen["port"])), (standin, int(seen["standin_port"]))):
        t0 = time.monotonic()
        got = server_info(port, timeout=10.0)
        took.append(time.monotonic() - t0)
        assert got is not None and got[0] == 200
        assert len(got[1]["internal_states"]) == 1  # one DP rank, one scheduler's answer
        sched = srv.child_named("sglang::schedul")
        os.kill(sched, signal.SIGSTOP)
        try:
            assert server_info(port, timeout=3.0) is None, "answered while its scheduler was stopped"
        finally:
            os.kill(sched, signal.SIGCONT)
        assert (server_info(port, timeout=30.0) or (None,))[0] == 200  # and again once it runs
    print(f"/server_info once ready: real {took[0]:.3f} s, stand-in {took[1]:.3f} s")


def test_a_killed_scheduler_after_ready_dies_the_same_way(
        ready_pair: tuple[Server, Server, dict[str, float]]) -> None:
    real, standin, seen = ready_pair
    ended = []
    for srv in (real, standin):
        n = len(srv.lines)
        srv.children()  # note every descendant before one goes
        os.kill(srv.child_named("sglang::schedul"), signal.SIGKILL)
        ended.append(srv.wait_exit(60))
        assert srv.lines[n:], "nothing said about the death"
    assert ended == [-9, -9]  # both end by SGLang's SIGKILL to itself
    after = [lines_read(srv)[len(lines_read(srv, until="ready to roll")):] for srv in (real, standin)]
    same(after[0], after[1], "a killed scheduler after ready")
    causes = [classify(srv.lines, exited=True) for srv in (real, standin)]
    assert [c.kind if c else None for c in causes] == ["worker-died", "worker-died"]
    assert health(int(seen["port"])) is None and health(int(seen["standin_port"])) is None


@pytest.mark.parametrize(("extra", "code"), [(("--no-such-flag", "1"), 2), (("--max-total-tokens", "abc"), 2)],
                         ids=["unknown-flag", "invalid-value"])
def test_argparse_refuses_the_same_way(pair: Pair, extra: tuple[str, ...], code: int) -> None:
    args = pair.args(free_port(), *extra)
    runs = [pair.real(args), pair.standin(args)]
    assert [srv.wait_exit(120) for srv in runs] == [code, code]
    errors = [[ln for ln in srv.lines if ": error: " in ln] for srv in runs]
    assert errors[0] == errors[1] and len(errors[0]) == 1, errors
    same(lines_read(runs[0]), lines_read(runs[1]), " ".join(extra))


def test_a_missing_model_fails_the_same_way(pair: Pair) -> None:
    args = pair.args(free_port())
    args[args.index("--model-path") + 1] = "/nonexistent/tiny-model"
    runs = [pair.real(args), pair.standin(args)]
    assert [srv.wait_exit(120) for srv in runs] == [1, 1]
    same(lines_read(runs[0]), lines_read(runs[1]), "missing model")
    assert [c.kind if (c := classify(srv.lines)) else None for srv in runs] == ["model-not-found"] * 2


def test_a_taken_port_is_said_and_then_the_server_hangs(pair: Pair) -> None:
    """uvicorn cannot bind: both say so, then neither exits nor heeds SIGTERM (real 0.5.23 does that)."""
    with closing(socket.socket()) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        args = pair.args(port)
        runs = []
        for start in (pair.real, pair.standin):
            srv = start(args)
            srv.wait_line(r"Waiting for application shutdown", READY_S)
            srv.popen.send_signal(signal.SIGTERM)
            assert srv.wait_exit(3) is None, "exited"
            runs.append(srv)
            srv.kill()
    same(lines_read(runs[0]), lines_read(runs[1]), "port in use")
    assert [c.kind if (c := classify(srv.lines, exited=False)) else None for srv in runs] == ["port-in-use"] * 2


def test_an_empty_kv_pool_fails_the_same_way(pair: Pair) -> None:
    args = pair.args(free_port(), "--max-total-tokens", "0")
    runs = [pair.real(args), pair.standin(args)]
    assert [srv.wait_exit(READY_S) for srv in runs] == [-9, -9]
    same(lines_read(runs[0]), lines_read(runs[1]), "--max-total-tokens 0")
    assert [c.kind if (c := classify(srv.lines)) else None for srv in runs] == ["kv-pool-empty"] * 2


def test_stopped_then_its_scheduler_killed_while_starting(pair: Pair) -> None:
    """SIGSTOP of every process at "Memory baseline taken." (the real one then imports its model classes
    for seconds; its load itself takes 0.04 s, too short to stop it in under load): nothing more is said
    and /health is silent; SIGKILL of the stopped scheduler and SIGCONT of the rest: the launcher sees it
    died during initialization. (Stopped at "Load weight begin", a timeout's last phase is "loading
    weights": sigstop-starting.log, tests/verify.)"""
    port = free_port()
    runs = []
    for start in (pair.real, lambda a: pair.standin(a, speed=2.0)):
        srv = start(pair.args(port))
        srv.wait_line(r"Memory baseline taken", READY_S)
        pids = srv.signal_all(signal.SIGSTOP)
        scheduler = srv.child_named("sglang::schedul")
        n = len(srv.lines)
        time.sleep(2)  # nothing can come: every process is stopped
        assert len(srv.lines) == n and health(port) is None
        assert "Load weight begin" not in srv.text  # stopped before it
        # gpudeploy reads no phase before "Load weight begin" (DIFFERENCES.md: "Init parallel begin.")
        assert [p for p in map(phase_of, srv.lines) if p] == []
        os.kill(scheduler, signal.SIGKILL)
        for pid in pids:
            if pid != scheduler:
                os.kill(pid, signal.SIGCONT)
        assert srv.wait_exit(60) == 1
        runs.append(srv)
    head = [lines_read(srv, until="Memory baseline taken") for srv in runs]
    inits = [[normalize(ln) for ln in srv.lines if re.search(r"Init parallel|Memory baseline", ln)] for srv in runs]
    same(inits[0], inits[1], "0.5.23's init lines")
    same(head[0], head[1], "up to the stop")
    deaths = [[normalize(ln) for ln in srv.lines if fatal_rule(ln)] for srv in runs]
    same(deaths[0], deaths[1], "a scheduler killed while starting")
    assert [c.kind if (c := classify(srv.lines)) else None for srv in runs] == ["worker-died"] * 2


def test_a_pd_server_without_mooncake_fails_the_same_way(pair: Pair) -> None:
    """The real one's Python cannot import mooncake (a sitecustomize makes `import mooncake` fail as where
    it is not installed); the stand-in's fault missing-module."""
    block = pair.tmp / "no-mooncake"
    real_sglang.block_mooncake(block)
    env = {"SGLANG_HOST_IP": "127.0.0.1", "SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER": "1",
           "SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX": "0"}
    args = pair.args(free_port(), "--disaggregation-mode", "prefill", "--disaggregation-transfer-backend",
                     "mooncake_tcp", "--disaggregation-bootstrap-port", str(free_port()))
    runs = [pair.real(args, PYTHONPATH=str(block), **env),
            pair.standin(args, SGLANG_STANDIN_FAULT="missing-module", **env)]
    assert [srv.wait_exit(READY_S) for srv in runs] == [-9, -9]
    same(lines_read(runs[0]), lines_read(runs[1]), "PD server without mooncake")
    assert [c.kind if (c := classify(srv.lines)) else None for srv in runs] == ["missing-module"] * 2
