"""The real sglang-router (0.3.2, the lab's cached venv) in front of stand-in engines, on loopback only.

The real router fetches a tokenizer from a model hub when a worker reports ``model_path`` or
``tokenizer_path`` (/work/shared/reference/sglang-router.md). The stand-in reports neither, and on
top of that every test here runs in a network namespace of its own that has nothing but ``lo``: no
route and no resolver, as inside a lab host. Skipped (with the reason) when the router venv is not
built (``python -m gpudeploy_lab router``) or no network namespace can be made (not root).
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from standin_support import Lab, NoNetns, Proc, free_port, http_get, http_post, own_netns, wait_for

from gpudeploy_lab import engine

pytestmark = pytest.mark.router

ROUTER_READY_S = 20.0  # stand-ins ready in ~0.5 s; the router retries a worker ~1 s apart


@pytest.fixture
def loopback_only() -> Iterator[None]:
    """This test and every process it starts in a network namespace of its own with only ``lo``."""
    if not engine.ROUTER.is_built():
        pytest.skip(f"the real router venv is not built ({engine.ROUTER.base_dir} has no .complete): "
                    "run `python -m gpudeploy_lab router`")
    try:
        with own_netns():
            links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=10)
            routes = subprocess.run(["ip", "-4", "route", "show"], capture_output=True, text=True, timeout=10)
            assert [ln.split(":")[1].strip() for ln in links.stdout.splitlines()] == ["lo"], links.stdout
            assert routes.stdout.strip() == "", routes.stdout  # no route anywhere but lo's own table
            yield
    except NoNetns as exc:
        pytest.skip(f"cannot make a network namespace ({exc}): the real router may only run where nothing "
                    "outside is reachable")


def router_env() -> dict[str, str]:
    # No PYTHONPATH: lab/shims has a stand-in ``sglang_router`` that would shadow the real one.
    # Belt and braces on top of the namespace: no hub, and any proxy-aware client goes nowhere.
    nowhere = "http://127.0.0.1:9"
    return {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": nowhere,
            "HTTP_PROXY": nowhere, "HTTPS_PROXY": nowhere, "ALL_PROXY": nowhere,
            "NO_PROXY": "127.0.0.1,localhost", "NO_COLOR": "1"}


class RealRouter:
    def __init__(self, lab: Lab, *args: str) -> None:
        self.port = free_port()
        argv = [str(engine.ROUTER.python), "-m", "sglang_router.launch_router", *args,
                "--host", "127.0.0.1", "--port", str(self.port), "--disable-circuit-breaker"]
        self.started = time.monotonic()
        self.proc = Proc(argv, router_env())
        lab.started.append(self.proc)

    def wait_ready(self) -> float:
        """Seconds from launch until /readiness answered 200."""
        def ready() -> bool:
            if self.proc.popen.poll() is not None:
                raise AssertionError(f"router exited {self.proc.popen.returncode}:\n{self.proc.text}")
            return (http_get(self.port, "/readiness") or (0,))[0] == 200
        try:
            wait_for(ready, timeout=ROUTER_READY_S, interval=0.05)
        except AssertionError:
            raise AssertionError(f"router not ready in {ROUTER_READY_S} s:\n{self.proc.text[-4000:]}") from None
        return time.monotonic() - self.started

    def stop(self) -> int:
        self.proc.popen.send_signal(signal.SIGTERM)
        return self.proc.wait_exit(10)


def sse_events(body: bytes) -> list[str]:
    return [ln[6:] for ln in body.decode().splitlines() if ln.startswith("data: ")]


@pytest.fixture
def pd_pair(loopback_only: None, lab: Lab) -> tuple[Lab, int, int, int]:
    """(lab, prefill port, bootstrap port, decode port), both stand-ins ready."""
    boot = free_port()
    pre, pport = lab.engine("--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(boot),
                            "--served-model-name", "tiny")
    dec, dport = lab.engine("--disaggregation-mode", "decode", "--served-model-name", "tiny")
    pre.wait_line("ready to roll")
    dec.wait_line("ready to roll")
    return lab, pport, boot, dport


def test_real_router_in_pd_mode_returns_the_decode_text(pd_pair: tuple[Lab, int, int, int]) -> None:
    lab, pport, boot, dport = pd_pair
    router = RealRouter(lab, "--pd-disaggregation", "--prefill", f"http://127.0.0.1:{pport}", str(boot),
                        "--decode", f"http://127.0.0.1:{dport}")
    took = router.wait_ready()
    print(f"real router ready {took:.2f} s after launch")
    status, body = http_get(router.port, "/readiness")  # type: ignore[misc]
    assert json.loads(body) == {"status": "ready", "healthy_workers": 2, "total_workers": 2}

    status, body = http_get(router.port, "/workers")  # type: ignore[misc]
    workers = {w["worker_type"]: w for w in json.loads(body)["workers"]}
    assert status == 200 and sorted(workers) == ["decode", "prefill"]
    assert workers["prefill"]["url"] == f"http://127.0.0.1:{pport}"
    assert workers["prefill"]["bootstrap_port"] == boot
    assert workers["decode"]["url"] == f"http://127.0.0.1:{dport}"
    assert all(w["is_healthy"] for w in workers.values())
    # It asked the workers for a tokenizer source and found none: nothing to download.
    assert "No tokenizer_path or model_path found for model tiny" in router.proc.text

    req: dict[str, Any] = {"text": "hello real router", "sampling_params": {"max_new_tokens": 6}}
    t0 = time.monotonic()
    status, body = http_post(router.port, "/generate", req)
    print(f"/generate through the real router: {1000 * (time.monotonic() - t0):.1f} ms")
    decode_text = json.loads(http_post(dport, "/generate", req)[1])["text"]
    prefill_text = json.loads(http_post(pport, "/generate", req)[1])["text"]
    assert status == 200 and json.loads(body)["text"] == decode_text
    assert len(decode_text.split()) == 6 and prefill_text != decode_text

    status, body = http_post(router.port, "/generate", {**req, "stream": True})
    events = sse_events(body)
    assert status == 200 and events[-1] == "[DONE]" and json.loads(events[-2])["text"] == decode_text

    comp: dict[str, Any] = {"model": "tiny", "prompt": "hello real router", "max_tokens": 5}
    direct = json.loads(http_post(dport, "/v1/completions", comp)[1])["choices"][0]["text"]
    status, body = http_post(router.port, "/v1/completions", comp)
    assert status == 200 and json.loads(body)["choices"][0]["text"] == direct
    status, body = http_post(router.port, "/v1/completions", {**comp, "stream": True})
    events = sse_events(body)
    assert status == 200 and events[-1] == "[DONE]"
    assert "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]) == direct

    chat: dict[str, Any] = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    status, body = http_post(router.port, "/v1/chat/completions", chat)
    assert status == 200 and len(json.loads(body)["choices"][0]["message"]["content"].split()) == 3

    assert router.stop() in (0, -signal.SIGTERM)


def test_real_router_passes_on_the_decode_generation_500(loopback_only: None, lab: Lab) -> None:
    """The ``generate-500`` fault: healthy workers, a ready router, and every generation fails."""
    boot = free_port()
    pre, pport = lab.engine("--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(boot))
    dec, dport = lab.engine("--disaggregation-mode", "decode", SGLANG_STANDIN_FAULT="generate-500")
    pre.wait_line("ready to roll")
    dec.wait_line("ready to roll")
    router = RealRouter(lab, "--pd-disaggregation", "--prefill", f"http://127.0.0.1:{pport}", str(boot),
                        "--decode", f"http://127.0.0.1:{dport}", "--disable-retries")
    router.wait_ready()
    assert http_get(dport, "/health") == (200, b"")
    status, body = http_post(router.port, "/generate", {"text": "x", "sampling_params": {"max_new_tokens": 2}})
    assert status == 500, body
    assert json.loads(body)["error"]["code"] == "decode_internal_error"
    status, body = http_post(router.port, "/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 2})
    assert status == 500, body
    assert http_get(router.port, "/readiness")[0] == 200  # type: ignore[index]


def test_real_router_in_regular_mode(loopback_only: None, lab: Lab) -> None:
    eng, port = lab.engine("--served-model-name", "tiny")
    eng.wait_line("ready to roll")
    router = RealRouter(lab, "--worker-urls", f"http://127.0.0.1:{port}")
    router.wait_ready()
    req = {"text": "regular", "sampling_params": {"max_new_tokens": 4}}
    status, body = http_post(router.port, "/generate", req)
    assert status == 200 and json.loads(body)["text"] == json.loads(http_post(port, "/generate", req)[1])["text"]
    status, body = http_get(router.port, "/v1/models")  # type: ignore[misc]
    assert status == 200 and [m["id"] for m in json.loads(body)["data"]] == ["tiny"]
