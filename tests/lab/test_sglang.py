"""The real SGLang 0.5.23 (CPU build of torch, a tiny model) in the lab, marked ``sglang``.

One PD pair with real KV transfer (mooncake over TCP) behind the real sglang-router serves the
module's tests (lab/inventory/lab-sglang.yml: prefill lab1, decode lab2, router lab3); the faults run on
lab4, a host of their own, each with the real engine's own lines and gpudeploy's cause for them.
Every wait is a condition polled against a deadline. The engines are built by
``python -m gpudeploy_lab engine`` (scripts/test.sh does, before the lab comes up).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Lab
from deploytools import REPO, Deployments, gd, http, status_json, unit_pids, wait_for

import gpudeploy_lab as labctl
from gpudeploy.plan import unit_name
from gpudeploy_lab import engine
from gpudeploy_lab.config import NET_PREFIX

pytestmark = [pytest.mark.lab, pytest.mark.sglang]

PAIR = REPO / "lab" / "inventory" / "lab-sglang.yml"
HOST = "lab4"  # the faults' host: the pair's hosts keep serving meanwhile
PROMPTS = ["the gpu server is", "hello world the model", "one two three four"]
INVOKE = [sys.executable, "-m", "invoke", "--search-root", str(REPO)]


def real_role(*, settings: dict[str, Any] | None = None, env: dict[str, str] | None = None,
              timeout_s: float = 300, **extra: Any) -> dict[str, Any]:
    """One real SGLang server on CPU (no PD), as lab/roles/sglang-cpu-prefill.yml without the PD part."""
    role: dict[str, Any] = {
        "engine": "sglang", "tp_size": 1, "gpus": 0, "python": engine.SGLANG_GUEST_PYTHON,
        "model": {"path": engine.GUEST_MODEL},
        "settings": {"served_model_name": "tiny", "device": "cpu", "max_total_tokens": 4096,
                     "sleep_on_idle": True, **(settings or {})},
        "env": {"HF_HUB_OFFLINE": "1", **(env or {})}, "health": {"timeout_s": timeout_s}, "stop_timeout_s": 30}
    role.update(extra)
    return role


@pytest.fixture(scope="module")
def pair(lab: Lab) -> Iterator[subprocess.CompletedProcess[str]]:
    engine.ensure_sglang()  # cached: scripts/test.sh builds both before the lab comes up
    engine.ensure_router()  # the pair is served through the real router
    res = gd("deploy", "--inventory", str(PAIR), timeout=900)
    yield res
    down = gd("teardown", "--inventory", str(PAIR), "--purge", timeout=300)
    assert down.returncode == 0, down.stdout + down.stderr


@pytest.fixture(scope="module")
def fault_host(lab: Lab) -> Iterator[str]:
    labctl.up(0, extra=[HOST])
    lab.refresh()
    yield HOST
    labctl.down([HOST])
    lab.refresh()


def generate(url: str, prompt: str, tokens: int = 16) -> str:
    code, body = http(f"{url}/generate", {"text": prompt, "sampling_params": {"max_new_tokens": tokens,
                                                                              "temperature": 0}}, timeout=60)
    assert code == 200, body
    return str(json.loads(body)["text"])


def test_the_real_pd_pair_serves_through_the_real_router(pair: subprocess.CompletedProcess[str]) -> None:
    out = pair.stdout + pair.stderr
    assert pair.returncode == 0, out
    assert re.search(r"deployment lab-sglang: READY\n    smoke /generate through lab3/sglang-cpu-router: "
                     r"TTFT \d+\.\d+ s, total \d+\.\d+ s, text '\w", out), out
    print(next(line for line in out.splitlines() if "smoke /generate" in line))
    st = status_json(PAIR)
    units = {u["role"]: u for u in st["hosts"]["lab3"]["units"] + st["hosts"]["lab1"]["units"]
             + st["hosts"]["lab2"]["units"]}
    assert st["healthy"], st
    assert units["sglang-cpu-router"]["health"] == "200"
    assert all(units[r]["health"] == "200" for r in ("sglang-cpu-prefill", "sglang-cpu-decode"))
    text = gd("status", "--inventory", str(PAIR)).stdout
    assert "2/2 workers healthy" in text and "healthy in lab3/sglang-cpu-router" in text, text


def test_greedy_output_through_the_pair_is_a_single_servers(pair: subprocess.CompletedProcess[str], fault_host: str,
                                                            deployments: Deployments, lab: Lab) -> None:
    # The KV cache really crosses: decode continues from prefill's KV; wrong KV changes the tokens.
    assert pair.returncode == 0
    inv = deployments.inventory("single", {"srv": real_role()}, host=fault_host)
    res = gd("deploy", "--inventory", str(inv), timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    single = f"http://{lab.address_of(fault_host)}:30000"
    router = "http://10.231.0.13:8000"
    for prompt in PROMPTS:
        assert generate(router, prompt) == generate(single, prompt), prompt


def test_a_decode_that_cannot_reach_its_prefill_is_refused_before_anything_changes(
        pair: subprocess.CompletedProcess[str], lab: Lab) -> None:
    # The KV handshake starts at prefill's bootstrap port; on lab2 (decode) lab1 gets no route.
    assert pair.returncode == 0
    pids = {h: unit_pids(lab, h, unit_name("lab-sglang", r)) for h, r in
            (("lab1", "sglang-cpu-prefill"), ("lab2", "sglang-cpu-decode"))}
    # from outside: the hosts have no CAP_NET_ADMIN in their own netns (a firewall they cannot change)
    route = ["ip", "-n", NET_PREFIX + "lab2", "route"]
    subprocess.run([*route, "add", "unreachable", "10.231.0.11/32"], check=True)
    try:
        res = gd("deploy", "--inventory", str(PAIR))
    finally:
        subprocess.run([*route, "del", "unreachable", "10.231.0.11/32"], check=True)
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert re.search(r"lab2/sglang-cpu-decode cannot reach 10\.231\.0\.11:\d+ \(prefill lab1/sglang-cpu-prefill "
                     r"bootstrap\) from lab2: unreachable", out), out
    assert "preflight failed, nothing was changed" in out, out
    assert {h: unit_pids(lab, h, unit_name("lab-sglang", r)) for h, r in
            (("lab1", "sglang-cpu-prefill"), ("lab2", "sglang-cpu-decode"))} == pids


def test_a_setting_the_real_argparse_refuses_is_named_with_its_value(fault_host: str,
                                                                      deployments: Deployments) -> None:
    # gpudeploy knows the flag (so the plan passes it) but not its type: the real argparse says.
    inv = deployments.inventory("rval", {"srv": real_role(settings={"max_total_tokens": "abc"})}, host=fault_host)
    res = gd("deploy", "--inventory", str(inv), timeout=600)
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "--max-total-tokens" in out and "Invalid integer value: 'abc'" in out, out
    assert "role's settings" in out, out  # the fix: where the value comes from
    assert "not ready after" not in out


def test_a_model_path_that_does_not_exist_is_named(fault_host: str, deployments: Deployments) -> None:
    role = real_role()
    role["model"] = {"path": "/models/no-such-model"}
    inv = deployments.inventory("rmodel", {"srv": role}, host=fault_host)
    res = gd("deploy", "--inventory", str(inv), timeout=600)
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "/models/no-such-model" in out and "not ready after" not in out, out


def test_a_kv_budget_of_nothing_is_the_pools_cause_with_the_setting_to_raise(fault_host: str,
                                                                             deployments: Deployments) -> None:
    inv = deployments.inventory("rkv", {"srv": real_role(settings={"max_total_tokens": 0})}, host=fault_host)
    res = gd("deploy", "--inventory", str(inv), timeout=600)
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "KV cache pool came out empty" in out and "--max-total-tokens (now 0)" in out, out
    assert "Not enough memory" in out, out  # the real engine's own line, in the excerpt


def _interrupt_when(proc: subprocess.Popen[str], marker: str, act: Any) -> str:
    """Read the deploy's output until ``marker``, call ``act()``, read the rest."""
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if marker in line:
            act()
            break
    rest, _ = proc.communicate(timeout=600)
    return "".join(seen) + rest


def test_a_port_taken_while_the_server_starts_is_its_cause(fault_host: str, deployments: Deployments,
                                                           lab: Lab) -> None:
    # Free at preflight, taken before the server binds it (its HTTP port comes last, ~20 s in).
    inv = deployments.inventory("rport", {"srv": real_role()}, host=fault_host)
    # SO_REUSEADDR as SGLang's own socket has: the previous test's server left connections in TIME_WAIT
    holder = ("import socket, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
              "s.bind(('0.0.0.0', 30000)); s.listen(); time.sleep(600)")
    proc = subprocess.Popen([*INVOKE, "deploy", "--inventory", str(inv)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    pid: list[str] = []

    def take() -> None:
        pid.append(lab.ssh(fault_host, f"setsid python3 -c {json.dumps(holder)} > /dev/null 2>&1 < /dev/null & "
                                       "echo $!", check=True).stdout.strip())
        wait_for(lambda: f"pid={pid[0]}," in lab.ssh(fault_host, "ss -ltnp 'sport = :30000'").stdout, 10,
                 "the holder to listen on port 30000")

    try:
        out = _interrupt_when(proc, "started gpudeploy-rport.srv", take)
    finally:
        if pid:
            lab.ssh(fault_host, f"kill {pid[0]}")
    assert proc.returncode == 1, out
    assert "cause: a port the server needs is already taken" in out, out
    assert "Address already in use" in out or "error while attempting to bind" in out, out


def _scheduler(lab: Lab, host: str, unit: str) -> int:
    """The unit's scheduler process (SGLang names it sglang::scheduler): one of the unit's own PIDs."""
    for pid in unit_pids(lab, host, unit):
        comm = lab.ssh(host, f"cat /proc/{pid}/comm 2>/dev/null").stdout.strip()
        if comm.startswith("sglang::schedul"):
            return pid
    raise AssertionError(f"no scheduler among {unit}'s processes on {host}")


def test_a_killed_scheduler_after_ready_shows_in_status_with_its_cause(fault_host: str, deployments: Deployments,
                                                                        lab: Lab) -> None:
    inv = deployments.inventory("rkill", {"srv": real_role()}, host=fault_host)
    res = gd("deploy", "--inventory", str(inv), timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    unit = unit_name("rkill", "srv")
    lab.ssh(fault_host, f"kill -9 {_scheduler(lab, fault_host, unit)}", check=True)
    failed = wait_for(lambda: next((u for u in status_json(inv)["hosts"][fault_host]["units"]
                                    if u["state"].startswith("failed")), None), 90, "the death to show")
    assert (failed["last_failure"] or "").startswith("a TP worker (scheduler) process died"), failed
    down = gd("teardown", "--inventory", str(inv))
    assert down.returncode == 0 and "clean: no process left" in down.stdout, down.stdout


def test_a_scheduler_killed_while_starting_fails_the_gate_with_its_cause(fault_host: str,
                                                                         deployments: Deployments, lab: Lab) -> None:
    inv = deployments.inventory("rkils", {"srv": real_role()}, host=fault_host)
    unit = unit_name("rkils", "srv")
    proc = subprocess.Popen([*INVOKE, "deploy", "--inventory", str(inv)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)

    def kill() -> None:
        pid = wait_for(lambda: next((p for p in unit_pids(lab, fault_host, unit)
                                     if lab.ssh(fault_host, f"cat /proc/{p}/comm").stdout.startswith(
                                         "sglang::schedul")), None), 120, "the scheduler")
        lab.ssh(fault_host, f"kill -9 {pid}", check=True)

    out = _interrupt_when(proc, "started gpudeploy-rkils.srv", kill)
    assert proc.returncode == 1, out
    assert "cause: a TP worker (scheduler) process died" in out, out
    assert "not ready after" not in out  # the death, not the timeout, ends the gate


def test_a_server_that_hangs_is_reported_with_its_last_phase(fault_host: str, deployments: Deployments,
                                                             lab: Lab) -> None:
    # SIGSTOP of every process of the unit once it is loading: nothing moves, nothing dies.
    inv = deployments.inventory("rhang", {"srv": real_role(timeout_s=45)}, host=fault_host)
    unit = unit_name("rhang", "srv")
    proc = subprocess.Popen([*INVOKE, "deploy", "--inventory", str(inv)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    stopped: list[int] = []

    def stop() -> None:
        stopped.extend(unit_pids(lab, fault_host, unit))
        lab.ssh(fault_host, "kill -STOP " + " ".join(map(str, stopped)), check=True)

    try:
        out = _interrupt_when(proc, "loading weights", stop)
    finally:
        lab.ssh(fault_host, "kill -CONT " + " ".join(map(str, stopped)))
    assert proc.returncode == 1, out
    phases = re.findall(r"\[lab4/srv\]\s+[\d.]+s  ([A-Za-z ]+?)(?:  |$)", out, re.M)
    assert phases, out
    assert f"cause: not ready after 45 s; last phase reached: {phases[-1]}" in out, out
    assert "the unit was stopped so its GPUs are free again" in out, out
    assert unit_pids(lab, fault_host, unit) == []


def test_teardown_of_the_real_engine_leaves_nothing(fault_host: str, deployments: Deployments, lab: Lab) -> None:
    inv = deployments.inventory("rdown", {"srv": real_role()}, host=fault_host)
    assert gd("deploy", "--inventory", str(inv), timeout=600).returncode == 0
    unit = unit_name("rdown", "srv")
    pids = unit_pids(lab, fault_host, unit)
    assert len(pids) >= 3  # main, scheduler, detokenizer (and the resource tracker)
    down = gd("teardown", "--inventory", str(inv))
    assert down.returncode == 0 and "clean: no process left" in down.stdout, down.stdout
    assert [p for p in pids if lab.ssh(fault_host, f"test -e /proc/{p}").returncode == 0] == []
    listening = lab.ssh(fault_host, "ss -ltn", check=True).stdout
    assert ":30000 " not in listening and ":30005 " not in listening, listening


def test_flags_learned_from_the_real_help_are_the_captured_ones(fault_host: str, deployments: Deployments,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Any) -> None:
    # The learn path against a real host (not the capture shipped in the package): deploy's learn()
    # reads the real 0.5.23 --help there; it lists the captured options with the same arity and
    # choices, which is all rendering and checking read, so the plan's command is the same from either.
    from gpudeploy import flagcache
    from gpudeploy.apply.learn import learn
    from gpudeploy.flagspec import load_flags
    from gpudeploy.inventory import load_inventory
    from gpudeploy.plan.flags import FlagsNotKnown

    monkeypatch.setattr(flagcache, "ROOT", tmp_path / "flags")
    inv = load_inventory(deployments.inventory("rlearn", {"srv": real_role()}, host=fault_host))
    need = FlagsNotKnown("sglang 0.5.23 on the host", program="sglang", version="0.5.23",
                         python=engine.SGLANG_GUEST_PYTHON, host=fault_host)
    assert learn(inv, [need]) == ["sglang 0.5.23"]
    [kept] = flagcache.of_release("sglang", "0.5.23")
    learned = flagcache.flags_of(kept.path, kept.digest)
    captured = load_flags("sglang", "0.5.23")
    # Every option the real help shows is the captured one (arity, choices as a set: SGLang builds
    # some lists from sets); a help cannot show argparse's hidden options or choices a metavar
    # replaces (tests/plan/test_parse_help.py names them).
    assert set(learned) <= set(captured) and len(learned) >= len(captured) - 2, set(captured) - set(learned)
    differ = {k for k, v in learned.items()
              if (v.takes_value, v.nargs, frozenset(v.choices or ())) !=
              (captured[k].takes_value, captured[k].nargs, frozenset(captured[k].choices or ()))}
    assert differ == {"--lora-target-modules"}, differ
