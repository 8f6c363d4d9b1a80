"""The stand-in engine as seen from outside: flags, log lines, HTTP phases, processes, faults."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from standin_support import (
    GPU_BYTES,
    PYTHON,
    REPO,
    Lab,
    alive,
    children_of,
    free_port,
    http_get,
    http_post,
    session_of,
    wait_for,
)

GIB = 1 << 30
STAMP = r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d TP0\] "
NUM = r"\d+\.\d\d"
# 0.5.23's (distributed/bootstrap.py; model_runner_components/cuda_graph_setup.py capture_decode_graph)
STARTUP_TP0 = [
    r"Init parallel begin\.$",
    rf"Init parallel ends\. elapsed={NUM} s$",
    r"Memory baseline taken\. mem usage=0\.00 GB$",
    rf"Load weight begin\. avail mem={NUM} GB$",
    rf"Load weight end\. elapsed={NUM} s, type=LlamaForCausalLM, avail mem={NUM} GB, mem usage={NUM} GB\.$",
    rf"KV Cache is allocated\. dtype: torch\.\w+, #tokens: \d+, K size: {NUM} GB, V size: {NUM} GB$",
    rf"Memory pool end\. avail mem={NUM} GB$",
    rf"Capture target decode CUDA graph begin\. backend=full, num_tokens_per_req=1, avail mem={NUM} GB$",
    rf"Capture target decode CUDA graph end\. bs=\[1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64\], "
    rf"elapsed={NUM} s, mem usage={NUM} GB, avail mem={NUM} GB\.$",
    rf"max_total_num_tokens=\d+, chunked_prefill_size=\d+, max_prefill_tokens=\d+, "
    rf"max_running_requests=\d+, context_len=\d+, available_gpu_mem={NUM} GB$",
]


def run_cli(lab: Lab, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "sglang.launch_server", *args], env=lab.env(), cwd=REPO,
                          capture_output=True, text=True, timeout=30)


def test_unknown_flag_bad_choice_and_missing_model_exit_2_like_argparse(lab: Lab) -> None:
    r = run_cli(lab, "--model-path", "m", "--foo")
    assert r.returncode == 2
    assert r.stderr.startswith("usage: sglang serve")  # 0.5.23's own prog (invalid-value.log)
    assert r.stderr.rstrip().endswith("sglang serve: error: unrecognized arguments: --foo")
    # the types 0.5.23 gives the flags the stand-in reads, with their words
    r = run_cli(lab, "--model-path", "m", "--max-total-tokens", "abc")
    assert r.returncode == 2
    assert r.stderr.rstrip().endswith("sglang serve: error: argument --max-total-tokens: Invalid integer value: "
                                      "'abc'. Use a plain integer, SI suffixes (1k, 1M), or IEC suffixes (1Ki, 1Mi). "
                                      "Suffixes are case-sensitive.")
    r = run_cli(lab, "--model-path", "m", "--port", "x")
    assert r.returncode == 2 and "argument --port: invalid int value: 'x'" in r.stderr
    r = run_cli(lab, "--model-path", "m", "--disaggregation-mode", "both")
    assert r.returncode == 2
    assert "argument --disaggregation-mode: invalid choice: 'both'" in r.stderr
    r = run_cli(lab, "--tp-size", "2")
    assert r.returncode == 2
    assert "the following arguments are required: --model-path" in r.stderr
    # flags renamed after 0.5.10 fail on 0.5.23, as argparse (abbreviations allowed) makes them
    r = run_cli(lab, "--model-path", "m", "--mamba-scheduler-strategy", "auto")
    assert r.returncode == 2 and "unrecognized arguments: --mamba-scheduler-strategy auto" in r.stderr
    r = run_cli(lab, "--model-path", "m", "--cuda-graph-max-bs", "16")
    assert r.returncode == 2
    assert "ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode" in r.stderr


def test_startup_log_lines_in_order_with_sglang_formats_and_consistent_numbers(lab: Lab) -> None:
    p, _ = lab.engine("--tensor-parallel-size", "2", "--mem-fraction-static", "0.8",
                      "--cuda-graph-max-bs-decode", "64")
    p.wait_line("The server is fired up and ready to roll!")
    tp0 = [ln for ln in p.lines if re.match(STAMP, ln)]
    assert len(tp0) == len(STARTUP_TP0), p.text
    for line, pattern in zip(tp0, STARTUP_TP0, strict=True):
        assert re.match(STAMP + pattern, line), (line, pattern)
    # rank 1 logs its own lines too; the ready line is the launcher's, without a rank
    assert any(re.search(r" TP1\] Capture target decode CUDA graph end\.", ln) for ln in p.lines)
    assert any(re.fullmatch(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] The server is fired up and ready to roll!", ln)
               for ln in p.lines)

    # numbers follow the memory model: rest = f * P - W, tokens = rest / bytes per token
    load = tp0[3:]  # from "Load weight begin" on
    avail = float(re.search(r"Load weight begin\. avail mem=([\d.]+)", load[0])[1])  # type: ignore[index]
    expect_p = (GPU_BYTES - 644_939_776 - 512 * (1 << 20)) / GIB
    assert avail == pytest.approx(expect_p, abs=0.01)
    assert "mem usage=8.00 GB." in load[1]  # 16 GiB over TP2
    tokens = int(re.search(r"#tokens: (\d+)", load[2])[1])  # type: ignore[index]
    assert tokens == int((0.8 * expect_p - 8) * GIB) // 65536 or abs(tokens - int((0.8 * expect_p - 8)
                                                                                   * GIB / 65536)) <= 1
    summary = load[6]
    assert f"max_total_num_tokens={tokens}," in summary
    assert "chunked_prefill_size=8192" in summary and "max_prefill_tokens=16384" in summary


def test_http_phases_port_closed_then_503_then_ready(lab: Lab) -> None:
    p, port = lab.engine(SGLANG_STANDIN_SPEED="0.4")
    seen: list[tuple[str, int | None, int | None]] = []

    def observe() -> bool:
        health = http_get(port, "/health")
        models = http_get(port, "/v1/models") if health else None
        loaded = any("Load weight end" in ln for ln in p.lines)
        seen.append(("loaded" if loaded else "loading", health and health[0], models and models[0]))
        return bool(health) and health[0] == 200

    wait_for(observe, timeout=15, interval=0.01)
    states = [(h, m) for _, h, m in seen]
    assert states[0] == (None, None)  # nothing listens while loading
    assert all(h is None for phase, h, _ in seen if phase == "loading")
    first_up = next(i for i, (h, _) in enumerate(states) if h is not None)
    after = states[first_up:]
    # once up: some 503s (warmup) with /v1/models already 200, then 200 for good
    assert all(h in (503, 200) for h, _ in after)
    assert after[-1][0] == 200
    assert [h for h, _ in after] == sorted([h for h, _ in after], reverse=True)
    warm = [m for h, m in after if h == 503]
    assert warm and all(m == 200 for m in warm)


def test_warmup_hang_keeps_health_503_while_info_endpoints_answer(lab: Lab) -> None:
    p, port = lab.engine("--served-model-name", "llama-test",
                         SGLANG_STANDIN_FAULT="hang-warmup")
    p.wait_line("Uvicorn running on")
    assert http_get(port, "/health") == (503, b"")
    assert http_get(port, "/health_generate") == (503, b"")
    status, body = http_get(port, "/v1/models")  # type: ignore[misc]
    assert status == 200 and json.loads(body)["data"][0]["id"] == "llama-test"
    for path in ("/model_info", "/get_model_info", "/server_info", "/get_server_info"):
        status, body = http_get(port, path)  # type: ignore[misc]
        info = json.loads(body)
        assert status == 200
        assert "model_path" not in info and "tokenizer_path" not in info, path
    assert not any("ready to roll" in ln for ln in p.lines)
    p.popen.send_signal(signal.SIGTERM)
    assert p.wait_exit(3) == 0


@pytest.fixture
def ready_engine(lab: Lab) -> tuple[Lab, int]:
    p, port = lab.engine("--tp-size", "2")
    p.wait_line("ready to roll")
    return lab, port


def test_a_stopped_scheduler_answers_neither_server_info_nor_health(ready_engine: tuple[Lab, int]) -> None:
    """As the real 0.5.23 (checked in test_real_vs_standin.py): /server_info and /health both wait on
    every scheduler, so status's fast health (verify/liveness.py) sees a hung one as down."""
    lab, port = ready_engine
    [proc] = lab.started
    ranks = [c for c in children_of(proc.popen.pid)
             if Path(f"/proc/{c}/comm").read_text().startswith("sglang::schedul")]
    assert len(ranks) == 2 and http_get(port, "/server_info")[0] == 200  # type: ignore[index]
    os.kill(ranks[1], signal.SIGSTOP)
    try:
        # A rank waiting for a CPU stops only once it runs (under two busy loops, after the request was
        # answered: a loaded run's one failure); the test is about a rank that has stopped.
        deadline = time.monotonic() + 30
        while Path(f"/proc/{ranks[1]}/stat").read_text().rsplit(")", 1)[-1].split()[0] not in ("T", "t"):
            assert time.monotonic() < deadline, "the rank did not stop within 30 s"
            time.sleep(0.01)
        with pytest.raises(TimeoutError):
            http_get(port, "/server_info", timeout=1.0)
    finally:
        os.kill(ranks[1], signal.SIGCONT)
    assert http_get(port, "/server_info", timeout=30.0)[0] == 200  # type: ignore[index]
    assert http_get(port, "/health", timeout=30.0) == (200, b"")


def test_generate_is_deterministic_and_streams(ready_engine: tuple[Lab, int]) -> None:
    _, port = ready_engine
    req = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 12}}
    s1, b1 = http_post(port, "/generate", req)
    s2, b2 = http_post(port, "/generate", req)
    assert s1 == s2 == 200
    r1, r2 = json.loads(b1), json.loads(b2)
    assert r1["text"] == r2["text"] and len(r1["text"].split()) == 12
    assert r1["meta_info"]["completion_tokens"] == 12
    other = json.loads(http_post(port, "/generate", {**req, "text": "Something else"})[1])
    assert other["text"] != r1["text"]

    status, body = http_post(port, "/generate", {**req, "stream": True})
    events = [ln[6:] for ln in body.decode().splitlines() if ln.startswith("data: ")]
    assert status == 200 and events[-1] == "[DONE]"
    assert json.loads(events[-2])["text"] == r1["text"]

    status, body = http_post(port, "/v1/completions", {"model": "x", "prompt": "hi", "max_tokens": 5})
    comp = json.loads(body)
    assert status == 200 and comp["object"] == "text_completion"
    assert len(comp["choices"][0]["text"].split()) == 5
    status, body = http_post(port, "/v1/chat/completions", {
        "model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    chat = json.loads(body)
    assert status == 200 and chat["choices"][0]["message"]["role"] == "assistant"
    assert http_post(port, "/generate", "not an object")[0] == 400


def test_survives_http2_preface_and_garbage(ready_engine: tuple[Lab, int]) -> None:
    _, port = ready_engine
    for junk in (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x12\x04\x00\x00\x00\x00\x00",
                 b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
            s.sendall(junk)
            reply = s.recv(4096)
        assert reply.startswith(b"HTTP/1.1 400"), reply
    assert http_get(port, "/health") == (200, b"")


def test_one_worker_per_rank_on_the_visible_gpus_and_clean_sigterm(lab: Lab) -> None:
    p, port = lab.engine("--tp-size", "2", "--base-gpu-id", "1", CUDA_VISIBLE_DEVICES="3,2,1,0")
    p.wait_line("ready to roll")
    kids = p.children()
    assert len(kids) == 2
    records = lab.records()
    assert sorted(r["pid"] for r in records) == kids
    assert sorted(r["gpu"] for r in records) == [1, 2]  # local devices 1, 2 -> physical 2, 1
    assert all(r["used_bytes"] > 8 * GIB for r in records)

    p.popen.send_signal(signal.SIGTERM)
    assert p.wait_exit(2) == 0
    wait_for(lambda: not any(alive(k) for k in kids), timeout=2)
    assert lab.records() == []
    assert http_get(port, "/health") is None


def test_prefill_opens_bootstrap_port_before_its_schedulers_start(lab: Lab) -> None:
    """0.5.23 starts the KV bootstrap server in the launcher, first (missing-module.log)."""
    boot = free_port()
    p, _ = lab.engine("--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(boot),
                      "--disaggregation-transfer-backend", "mooncake")
    p.wait_line("Load weight begin")
    assert http_get(boot, "/health") == (200, b"OK")
    text = p.text
    assert text.index(f"CommonKVBootstrapServer started successfully on 127.0.0.1:{boot}") < text.index(
        "Load weight begin")
    p.wait_line("ready to roll")
    assert http_get(boot, "/health") == (200, b"OK")


def test_a_single_rank_tags_no_line(lab: Lab) -> None:
    """0.5.23 adds " TPn" to a scheduler's log prefix only when tp_size > 1 (normal.log)."""
    p, _ = lab.engine()
    p.wait_line("ready to roll")
    assert re.search(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] Load weight begin", p.text, re.M)
    assert " TP0]" not in p.text


# ------------------------------------------------------------------------------------ faults

FAULT_TEXTS = {
    "oom-graph": [
        "Scheduler hit an exception: Traceback (most recent call last):",
        "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 7.50 GiB. "
        "GPU 0 has a total capacity of 139.80 GiB of which",
        "Possible solutions:",
        "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)",
        "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)",
        "Received sigquit from a child process. It usually means the child failed.",
    ],
    # a capture OOM whose figures read as a real one's (less free than asked), for reports without figures
    "oom-graph-spent": [
        "Scheduler hit an exception: Traceback (most recent call last):",
        "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 2.00 GiB. "
        "GPU 0 has a total capacity of 139.80 GiB of which 0.50 GiB is free.",
        "Possible solutions:",
        "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)",
        "Received sigquit from a child process. It usually means the child failed.",
    ],
    # the field report's own line, from rank 1, as torch raised it inside the capture
    "oom-graph-field": [
        "TP1] Scheduler hit an exception: Traceback (most recent call last):",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7.50 GiB. GPU 1 has a total capacity of "
        "94.97 GiB of which 2.30 GiB is free.",
        "Received sigquit from a child process. It usually means the child failed.",
    ],
    "kv-not-enough": ["RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."],
    "weights-oom": ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
                    "GPU 0 has a total capacity of 139.80 GiB"],
    "mamba-oom": ["Not enough GPU memory for hybrid (mamba/linear-attention) state cache."],
    "nccl-error": ["torch.distributed.DistBackendError: NCCL error in: ", "unhandled system error"],
    # 0.5.23's launcher when a scheduler died without a word before it was ready
    # (scheduler-killed-while-starting.log): its exception, exit 1
    "worker-dies": ["RuntimeError: Rank 1 scheduler died during initialization (exit code: -9). If exit code is -9 "
                    "(SIGKILL), a common cause is the OS OOM killer. Run `dmesg -T | grep -i oom` to check."],
    "missing-module": ["ModuleNotFoundError: No module named 'mooncake'",
                       "ImportError: Please install mooncake by following the instructions at "
                       "https://kvcache-ai.github.io/Mooncake/getting_started/build.html to run SGLang with "
                       "MooncakeTransferEngine.",
                       "Received sigquit from a child process. It usually means the child failed."],
}


@pytest.mark.parametrize("fault", sorted(FAULT_TEXTS))
def test_fault_prints_sglang_text_and_dies_as_0523_without_leftovers(lab: Lab, fault: str) -> None:
    """A scheduler's exception: the launcher's SIGQUIT words, then its SIGKILL to itself (exit -9, as
    kv-too-small.log); a scheduler's silent death: the launcher's exception (exit 1)."""
    p, port = lab.engine("--tp-size", "2", SGLANG_STANDIN_FAULT=fault)
    wait_for(lambda: p.children() or p.popen.poll() is not None, timeout=5)
    assert p.wait_exit(10) == (1 if fault == "worker-dies" else -9)
    for text in FAULT_TEXTS[fault]:
        assert text in p.text, f"{text!r} missing in:\n{p.text}"
    if fault != "worker-dies":
        assert "kill_process_tree called: parent_pid=" in p.text and "include_parent=True" in p.text
    assert "ready to roll" not in p.text
    wait_for(lambda: not any(alive(k) for k in p.known_children), timeout=3)
    assert http_get(port, "/health") is None


def test_port_in_use_fault_hangs_after_saying_so_deaf_to_sigterm(lab: Lab) -> None:
    """0.5.23 when uvicorn cannot bind (port-in-use.log): the error, "Waiting for application
    shutdown.", and then neither an exit nor an answer to SIGTERM; its schedulers live on."""
    p, port = lab.engine("--tp-size", "2", SGLANG_STANDIN_FAULT="port-in-use")
    line = p.wait_line("Waiting for application shutdown.")
    assert re.search(r"\] ERROR:    \[Errno 98\] error while attempting to bind on address \('127\.0\.0\.1', "
                     rf"{port}\): address already in use\n\[.*\] INFO:     Waiting for application shutdown\.",
                     p.text), p.text
    assert line.endswith("] INFO:     Waiting for application shutdown.")
    kids = p.children()
    p.popen.send_signal(signal.SIGTERM)
    with pytest.raises(AssertionError):
        p.wait_exit(1)
    assert len(kids) == 2 and all(alive(k) for k in kids)
    assert "Traceback" not in p.text and "ready to roll" not in p.text
    # lab.close() SIGKILLs it; its workers follow their launcher


def test_the_fields_oom_comes_without_sglangs_wrapper_after_capture_began(lab: Lab) -> None:
    """The case the field hit: torch's text alone (no "Capture cuda graph failed" line), after the
    weights loaded and the capture began: gpudeploy must name the phase from the lines before it."""
    p, _ = lab.engine("--tp-size", "2", SGLANG_STANDIN_FAULT="oom-graph-field")
    assert p.wait_exit(10) == -9  # a scheduler's exception: the launcher's SIGKILL to itself, as 0.5.23
    assert "Capture cuda graph failed" not in p.text
    assert p.text.index("Capture target decode CUDA graph begin") < p.text.index("Tried to allocate 7.50 GiB")
    assert p.text.index("Load weight end") < p.text.index("Tried to allocate 7.50 GiB")
    from gpudeploy.verify.causes import classify

    cause = classify(p.text.splitlines(), {"mem_fraction_static": 0.7})
    assert cause is not None and cause.kind == "oom-in-graph-capture", cause
    assert "5.20 GiB short" in cause.summary and "use more GPUs" not in cause.next_step


def test_silent_exit_says_nothing(lab: Lab) -> None:
    p, _ = lab.engine(SGLANG_STANDIN_FAULT="silent-exit")
    assert p.wait_exit(10) == 1
    assert "Load weight begin" in p.text
    assert not re.search(r"Error|Traceback|exception|dead", p.text)


def test_port_really_in_use_is_said_after_loading(lab: Lab) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p, _ = lab.engine(port=port)
        p.wait_line("Waiting for application shutdown.")
        assert p.popen.poll() is None  # and it stays, as 0.5.23 does
    assert "Capture target decode CUDA graph end" in p.text
    assert f"[Errno 98] error while attempting to bind on address ('127.0.0.1', {port})" in p.text


def test_fraction_too_low_fails_naturally_with_not_enough_memory(lab: Lab) -> None:
    p, _ = lab.engine("--mem-fraction-static", "0.05")
    assert p.wait_exit(10) == -9
    assert "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static." in p.text


def test_max_total_tokens_0_leaves_the_pool_empty(lab: Lab) -> None:
    """0.5.23 caps the pool at --max-total-tokens, 0 included, before it checks it (kv-too-small.log)."""
    p, _ = lab.engine("--max-total-tokens", "0")
    assert p.wait_exit(10) == -9
    assert "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static." in p.text
    assert "Load weight end" in p.text and "KV Cache is allocated" not in p.text


def test_a_missing_model_path_fails_first_without_the_hub(lab: Lab) -> None:
    """With HF_HUB_OFFLINE=1 (the lab's real roles set it), as 0.5.23's missing-model.log: no folder and
    no valid repo id fails before anything starts, exit 1; without it the stand-in pretends to download."""
    p, _ = lab.engine(HF_HUB_OFFLINE="1")  # /models/test-model does not exist
    assert p.wait_exit(10) == 1
    assert ("OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': '/models/test-model'. "
            "Use `repo_type` argument if needed.") in p.text
    assert "server_args=" not in p.text and p.known_children == set()
    p, _ = lab.engine()
    p.wait_line("ready to roll")


def test_weights_too_big_fail_naturally_while_loading(lab: Lab) -> None:
    p, _ = lab.engine(SGLANG_STANDIN_WEIGHTS_GIB="400")
    assert p.wait_exit(10) == -9
    assert "torch.OutOfMemoryError: CUDA out of memory." in p.text
    assert "Load weight end" not in p.text


def test_hang_never_opens_the_port_and_still_stops_on_sigterm(lab: Lab) -> None:
    p, port = lab.engine(SGLANG_STANDIN_FAULT="hang")
    p.wait_line("Capture target decode CUDA graph begin")
    with pytest.raises(AssertionError):
        p.wait_line("Capture target decode CUDA graph end", timeout=0.5)
    assert http_get(port, "/health") is None
    p.popen.send_signal(signal.SIGTERM)
    assert p.wait_exit(2) == 0


def test_crash_after_ready(lab: Lab) -> None:
    # 2 s after ready: /health answers after a second, as SGLang's does
    p, port = lab.engine(SGLANG_STANDIN_FAULT="crash-after-ready", SGLANG_STANDIN_FAULT_AFTER="2")
    p.wait_line("ready to roll")
    assert http_get(port, "/health") == (200, b"")
    assert p.wait_exit(10) == -9
    assert "CUDA error: an illegal memory access was encountered" in p.text
    # once serving, 0.5.23's running-phase SIGQUIT handler (scheduler-killed-after-ready.log)
    assert "SIGQUIT received. signum=None, frame=None. It usually means one child failed." in p.text
    assert "Received sigquit from a child process" not in p.text


def test_ignore_sigterm_needs_sigkill(lab: Lab) -> None:
    p, _ = lab.engine("--tp-size", "2", SGLANG_STANDIN_FAULT="ignore-sigterm")
    p.wait_line("ready to roll")
    kids = p.children()
    p.popen.send_signal(signal.SIGTERM)
    for k in kids:
        import os
        os.kill(k, signal.SIGTERM)
    with pytest.raises(AssertionError):
        p.wait_exit(0.6)
    assert all(alive(k) for k in kids)
    # lab.close() SIGKILLs the engine and the workers by PID


def test_leak_worker_outlives_the_engine_in_its_own_session(lab: Lab) -> None:
    import importlib.util
    p, _ = lab.engine("--tp-size", "2", SGLANG_STANDIN_FAULT="leak-worker")
    p.wait_line("ready to roll")
    kids = p.children()
    records = lab.records()
    assert len(records) == 2
    leaked = [r["pid"] for r in records if r["pid"] not in kids]
    assert len(leaked) == 1
    lab.extra_pids.extend(leaked)  # cleanup kills it by its exact PID
    assert session_of(leaked[0]) != session_of(p.pid)  # setsid + double fork: detached
    assert leaked[0] not in children_of(p.pid)

    p.popen.send_signal(signal.SIGTERM)
    assert p.wait_exit(2) == 0
    assert alive(leaked[0])
    assert [r["pid"] for r in lab.records()] == leaked

    spec = importlib.util.spec_from_file_location("fake_pynvml_leak", REPO / "lab/shims/pynvml.py")
    assert spec and spec.loader
    nvml = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nvml)
    import os
    os.environ["GPUDEPLOY_LAB_GPUS"] = str(lab.gpus_json)
    os.environ["SGLANG_STANDIN_GPU_PROCS_DIR"] = str(lab.procs_dir)
    try:
        nvml.nvmlInit()
        h = nvml.nvmlDeviceGetHandleByIndex(1)
        procs = nvml.nvmlDeviceGetComputeRunningProcesses(h)
        assert [x.pid for x in procs] == leaked
        assert nvml.nvmlDeviceGetMemoryInfo(h).used > 8 * GIB
    finally:
        del os.environ["GPUDEPLOY_LAB_GPUS"], os.environ["SGLANG_STANDIN_GPU_PROCS_DIR"]


def test_help_is_the_captured_help_of_the_release(lab: Lab) -> None:
    r = run_cli(lab, "--help")
    assert r.returncode == 0
    assert r.stdout == (REPO / "src/gpudeploy/data/sglang-0.5.23-launch_server-help.txt").read_text()


def test_older_release_accepts_its_own_flags(lab: Lab) -> None:
    from gpudeploy.flagspec import supported_versions
    if "0.5.10" not in supported_versions("sglang"):
        pytest.skip("no 0.5.10 capture")
    env = lab.env(SGLANG_STANDIN_VERSION="0.5.10")
    argv = [PYTHON, "-m", "sglang.launch_server", "--model-path", "m", "--cuda-graph-max-bs-decode", "8"]
    r = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "unrecognized arguments: --cuda-graph-max-bs-decode 8" in r.stderr
    p, _ = lab.engine("--cuda-graph-max-bs", "16", SGLANG_STANDIN_VERSION="0.5.10")
    line = p.wait_line("Capturing batches")
    assert "(bs=16 " in line


def test_api_key_guards_everything_but_health(lab: Lab) -> None:
    import http.client
    p, port = lab.engine("--api-key", "sekrit")
    p.wait_line("ready to roll")
    assert http_get(port, "/health") == (200, b"")
    assert http_get(port, "/v1/models")[0] == 401  # type: ignore[index]
    assert http_post(port, "/generate", {"text": "x"})[0] == 401
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3)
    conn.request("POST", "/generate", body=json.dumps({"text": "x"}),
                 headers={"Authorization": "Bearer sekrit"})
    assert conn.getresponse().status == 200
    conn.close()


def test_killed_worker_takes_the_server_down(lab: Lab) -> None:
    import os
    p, _ = lab.engine("--tp-size", "2")
    p.wait_line("ready to roll")
    kids = p.children()
    os.kill(kids[1], signal.SIGKILL)
    assert p.wait_exit(5) == -9
    # 0.5.23's watchdog and running-phase SIGQUIT handler (scheduler-killed-after-ready.log)
    assert (f"Subprocess scheduler_1 (pid={kids[1]}) crashed with exit code -9. Triggering SIGQUIT for "
            "cleanup...") in p.text
    assert "SIGQUIT received. signum=None, frame=None. It usually means one child failed." in p.text
    wait_for(lambda: not any(alive(k) for k in kids), timeout=3)


def test_workers_follow_a_sigkilled_engine_and_free_their_memory(lab: Lab) -> None:
    p, _ = lab.engine("--tp-size", "2")
    p.wait_line("ready to roll")
    kids = p.children()
    assert len(lab.records()) == 2
    p.popen.kill()
    p.popen.wait()
    wait_for(lambda: not any(alive(k) for k in kids), timeout=3)
    assert lab.records() == []


def test_generate_500_is_healthy_but_every_generation_fails_like_sglang(lab: Lab) -> None:
    p, port = lab.engine("--tp-size", "2", "--disaggregation-mode", "decode",
                         SGLANG_STANDIN_FAULT="generate-500")
    p.wait_line("ready to roll")
    assert http_get(port, "/health") == (200, b"")
    assert http_get(port, "/v1/models")[0] == 200  # type: ignore[index]
    status, body = http_post(port, "/generate", {"text": "x", "bootstrap_room": 42})
    err = json.loads(body)
    assert status == 500
    assert set(err) == {"object", "message", "type", "param", "code"}
    assert (err["object"], err["type"], err["code"]) == ("error", "500", 500)
    assert err["message"].startswith("Decode transfer failed for request rank=0 decode_req.req.rid='")
    assert err["message"].endswith("decode_req.req.bootstrap_room=42 with exception KVTransferError("
                                   "bootstrap_room=42): Failed to get kvcache from prefill instance, it might be dead")
    for path, req in (("/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 2}),
                      ("/v1/completions", {"model": "m", "prompt": "x", "stream": True}),
                      ("/v1/chat/completions", {"model": "m", "messages": [], "max_tokens": 2}),
                      ("/generate", {"text": "x", "stream": True})):
        status, body = http_post(port, path, req)
        err = json.loads(body)
        assert status == 500 and err["code"] == 500 and err["object"] == "error", (path, body)
        if path != "/generate":
            assert err["type"] == "InternalServerError"
            assert err["message"].startswith("Internal server error: 500: Decode transfer failed")
    assert re.search(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d TP1\] Decode transfer failed for request rank=1 ", p.text)
    assert http_get(port, "/health") == (200, b"")  # stays healthy
    assert p.popen.poll() is None


SHARD = re.compile(r"\rMulti-thread loading shards: +(\d+)% Completed \| (\d+)/(\d+) "
                   r"\[\d\d:\d\d<(?:\d\d:\d\d|\?), +(?:[\d.]+(?:it/s|s/it)|\?it/s)\]")
CAPTURE = re.compile(r"Capturing batches \(bs=(\d+) avail_mem=(\d+\.\d\d) GB\): +(\d+)%\|(.{10})\| (\d+)/(\d+) "
                     r"\[\d\d:\d\d<(?:\d\d:\d\d|\?), +(?:[\d.]+(?:it/s|s/it)|\?it/s)\]")


def run_to_ready(lab: Lab, tmp: Path, *args: str, **env: str) -> tuple[str, str]:
    """(stdout, stderr) of an engine that got ready and was then stopped, kept apart."""
    out, err = tmp / "stdout", tmp / "stderr"
    port = free_port()
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen([PYTHON, "-m", "sglang.launch_server", "--model-path", "/models/m", "--host",
                                 "127.0.0.1", "--port", str(port), *args], env=lab.env(**env), cwd=REPO,
                                stdout=o, stderr=e, stdin=subprocess.DEVNULL)
        try:
            wait_for(lambda: b"ready to roll" in out.read_bytes(), timeout=15)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=5)
    return out.read_bytes().decode(), err.read_bytes().decode()  # read_text() would turn \r into \n


def test_progress_bars_are_tqdm_on_stderr_of_rank_0_only(lab: Lab, tmp_path: Path) -> None:
    out, err = run_to_ready(lab, tmp_path, "--tp-size", "2", "--cuda-graph-max-bs-decode", "32",
                            SGLANG_STANDIN_WEIGHTS_GIB="16")
    assert "\r" not in out and "loading shards" not in out and "Capturing batches" not in out
    # 0.5.23's shard bar (no newline in its bar_format): one line of "\r" updates, closed by one newline
    shards_part, capture_part = err.split("\n", 1)
    shards = [m.groups() for m in SHARD.finditer(shards_part)]
    # the last step prints only if 0.1 s passed since the one before; close() always prints 100%
    assert shards[0] == ("0", "0", "4") and shards[-1] == ("100", "4", "4")
    assert [int(n) for _, n, _ in shards] == sorted(int(n) for _, n, _ in shards)
    assert shards_part.count("\r") == len(shards)
    # the capture: one line, updates separated by \r, closed by one newline
    capture_line, rest = capture_part.split("\n", 1)
    assert rest == ""
    parts = capture_line.split("\r")
    assert parts[0] == "" and re.fullmatch(r" {2}0%\| {10}\| 0/(\d+) \[00:00<\?, \?it/s\]", parts[1])
    total = int(parts[1].split("/")[1].split()[0])
    updates = [CAPTURE.fullmatch(p.rstrip(" ")) for p in parts[2:]]
    assert all(updates), parts
    sizes = [int(m[1]) for m in updates if m]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] == 32 and sizes[-1] == 1
    assert len(set(sizes)) == total  # each batch size was described once at least
    last = updates[-1]
    assert last and (last[3], last[4], last[5], last[6]) == ("100", "█" * 10, str(total), str(total))
    avail = [float(m[2]) for m in updates if m]
    assert avail == sorted(avail, reverse=True)  # free memory shrinks as graphs are captured


def test_progress_sits_between_its_phase_lines(lab: Lab) -> None:
    p, _ = lab.engine("--cuda-graph-max-bs-decode", "8")
    p.wait_line("ready to roll")
    text = p.text
    # at TP 1 a scheduler's lines carry no rank tag (0.5.23: " TP{rank}" only when tp_size > 1)
    order = [text.index("] Load weight begin"), text.index("\rMulti-thread loading shards:   0%"),
             text.rindex("Multi-thread loading shards: 100%"), text.index("] Load weight end"),
             text.index("] Capture target decode CUDA graph begin"), text.index("\r  0%|          | 0/"),
             text.rindex("Capturing batches (bs=1 "), text.index("] Capture target decode CUDA graph end")]
    assert order == sorted(order), order


def test_tqdm_bar_format_from_the_environment_gives_a_line_per_capture_update(lab: Lab, tmp_path: Path) -> None:
    _, err = run_to_ready(lab, tmp_path, "--cuda-graph-max-bs-decode", "4",
                          TQDM_BAR_FORMAT="{l_bar}{bar}{r_bar}\n")
    lines = [ln for ln in err.split("\n") if "Capturing batches" in ln or "0%|" in ln]
    assert len(lines) > 3 and all(ln.count("\r") == 1 for ln in lines), lines
    # SGLang passes its own bar_format to the shard bar: TQDM_BAR_FORMAT does not change it
    assert "\rMulti-thread loading shards: 100% Completed | 4/4 " in err


def test_oom_in_capture_leaves_the_bar_open_before_the_error(lab: Lab) -> None:
    p, _ = lab.engine(SGLANG_STANDIN_FAULT="oom-graph")
    assert p.wait_exit(10) == -9
    glued = next(ln for ln in p.lines if "Scheduler hit an exception" in ln)
    assert glued.startswith("\r  0%|") and "Capturing batches (bs=" in glued  # no newline before the error
    assert re.search(r"\]\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] Scheduler hit an exception: Traceback", glued)


@pytest.mark.parametrize(("version", "get_load"), [("0.5.23", 404), ("0.5.10", 200)])
def test_load_endpoints_are_the_releases_own(lab: Lab, version: str, get_load: int) -> None:
    """0.5.23 reports load only at /v1/loads (its http_server.py has no /get_load route, measured on
    the real server); older releases had /get_load too, which gpudeploy falls back to (router_api.py)."""
    p, port = lab.engine(SGLANG_STANDIN_VERSION=version)
    p.wait_line("ready to roll")
    got = http_get(port, "/v1/loads")
    assert got is not None and got[0] == 200 and json.loads(got[1])["loads"][0]["num_running_reqs"] == 0
    got = http_get(port, "/get_load")
    assert got is not None and got[0] == get_load
