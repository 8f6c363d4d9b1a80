"""A real inference engine on a lab host: vLLM's CPU build serving a tiny local model, deployed,
gated, queried, killed the naive way and torn down through the same `invoke` commands a user runs.

One server (lab/roles/vllm-tiny.yml on lab3, deployment ``vllmlab``) is started once for the module and
shared; the startup-failure test uses a second role on another port that never becomes ready.
Processes are checked by the unit's cgroup and by PID (with start time), never by name.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import Lab
from deploytools import REPO, gd, http, status_json, wait_for, write_inventory

from gpudeploy.plan import unit_name
from gpudeploy_lab import engine

pytestmark = [pytest.mark.lab, pytest.mark.vllm]

HOST = "lab3"
DEPLOYMENT = "vllmlab"
ROLE = "vllm-tiny"
BAD_ROLE = "vllm-badkv"
ROUTER_ROLE = "vllm-router"
UNIT = unit_name(DEPLOYMENT, ROLE)
BAD_UNIT = unit_name(DEPLOYMENT, BAD_ROLE)
PORT = 18000
TOO_MUCH_KV = "4T"  # far more than the machine's RAM


@dataclass
class Server:
    lab: Lab
    inventory: Path
    address: str
    deploy_output: str
    deploy_s: float

    @property
    def url(self) -> str:
        return f"http://{self.address}:{PORT}"


def ssh_out(lab: Lab, cmd: str) -> str:
    return lab.ssh(HOST, cmd, check=True).stdout


def cgroup_pids(lab: Lab, unit: str) -> list[int]:
    out = lab.ssh(HOST, f"cat /sys/fs/cgroup/system.slice/{unit}/cgroup.procs 2>/dev/null || true").stdout
    return sorted(int(x) for x in out.split())


def start_times(lab: Lab, pids: list[int]) -> dict[int, str]:
    """PID -> start time (field 22 of /proc/PID/stat) of those alive: a PID reused later does not match."""
    if not pids:
        return {}
    script = ("for p in " + " ".join(map(str, pids)) + "; do "
              "[ -r /proc/$p/stat ] && echo $p $(sed 's/.*) //' /proc/$p/stat | cut -d' ' -f20); done; true")
    return {int(p): t for p, t in (line.split() for line in ssh_out(lab, script).splitlines() if line.strip())}


def still_alive(lab: Lab, procs: dict[int, str]) -> list[int]:
    now = start_times(lab, list(procs))
    return sorted(p for p, t in procs.items() if now.get(p) == t)


def proc_names(lab: Lab, pids: list[int]) -> dict[int, str]:
    out = ssh_out(lab, "for p in " + " ".join(map(str, pids)) + "; do echo $p $(cat /proc/$p/comm 2>/dev/null); done")
    return {int(line.split()[0]): " ".join(line.split()[1:]) for line in out.splitlines() if line.strip()}


def unit_prop(lab: Lab, unit: str, prop: str) -> str:
    return ssh_out(lab, f"systemctl show -p {prop} --value {unit}").strip()


def roles() -> dict[str, dict[str, Any]]:
    good = yaml.safe_load((REPO / "lab" / "roles" / f"{ROLE}.yml").read_text())
    bad = json.loads(json.dumps(good))
    bad["ports"] = {"http": PORT + 10}
    bad["settings"]["kv_cache_memory_bytes"] = TOO_MUCH_KV
    bad["health"]["timeout_s"] = 120
    # The real sglang-router in regular mode in front of the real engine (--worker-urls).
    router = {"engine": "sglang_router", "python": engine.ROUTER_GUEST_PYTHON, "upstreams": {"workers": [ROLE]},
              "ports": {"http": 8100}, "extra_args": ["--disable-circuit-breaker"],
              "health": {"path": "/readiness", "timeout_s": 120}, "stop_timeout_s": 5,
              "smoke": {"endpoint": "/v1/completions", "model": "tiny", "prompt": "the gpu server", "max_tokens": 8}}
    return {ROLE: good, BAD_ROLE: bad, ROUTER_ROLE: router}


@pytest.fixture(scope="module")
def server(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    engine.ensure_engine()  # cached: scripts/test.sh builds it before the lab comes up
    if lab.ssh(HOST, f"test -x {engine.GUEST_PYTHON} && test -f {engine.GUEST_MODEL}/config.json").returncode:
        pytest.fail(f"{HOST} does not see the vLLM engine at {engine.GUEST_PYTHON}: the lab was booted by an "
                    "older gpudeploy; `invoke lab.down && invoke lab.up --hosts 3`")
    root = tmp_path_factory.mktemp("vllm")
    address = lab.address_of(HOST)
    inv = write_inventory(root, deployment=DEPLOYMENT, hosts={HOST: (address, [ROLE, BAD_ROLE, ROUTER_ROLE])},
                          roles=roles())
    gd("teardown", "--inventory", str(inv), "--host", HOST, "--purge")  # what an aborted earlier run left
    started = time.monotonic()
    res = gd("deploy", "--inventory", str(inv), "--host", HOST, "--role", ROLE, timeout=400)
    took = time.monotonic() - started
    print(f"\nvllm: deploy to {HOST} (start + gate) took {took:.1f} s\n{res.stdout}")
    assert res.returncode == 0, res.stdout + res.stderr
    yield Server(lab, inv, address, res.stdout, took)
    gd("teardown", "--inventory", str(inv), "--host", HOST, "--purge")


def test_deploy_gates_and_serves_a_real_completion(server: Server) -> None:
    lab = server.lab
    assert f"{HOST}/{ROLE}: started" in server.deploy_output, server.deploy_output
    # A real generation through the deployed port, from the tiny model's WordLevel vocabulary.
    code, body = http(f"{server.url}/v1/completions",
                      {"model": "tiny", "prompt": "the gpu server", "max_tokens": 8, "temperature": 0}, timeout=60)
    assert code == 200, body
    text = json.loads(body)["choices"][0]["text"]
    assert text.strip(), body
    # status: healthy, with the unit's real MainPID; vLLM's process tree lives in the unit's cgroup.
    doc = status_json(server.inventory, "--host", HOST, "--role", ROLE)
    (unit,) = doc["hosts"][HOST]["units"]
    main_pid = int(unit_prop(lab, UNIT, "MainPID"))
    assert unit["healthy"] and unit["health"] == "200", unit
    assert unit["main_pid"] == main_pid and main_pid > 0, unit
    pids = cgroup_pids(lab, UNIT)
    names = proc_names(lab, pids)
    print(f"vllm: cgroup of {UNIT}: {names}")
    assert main_pid in pids and len(pids) >= 3, names  # API server -> EngineCore -> Worker (+ tracker)
    assert set(unit["pids"]) >= {main_pid}, unit


@pytest.mark.skipif(not engine.ROUTER.is_built(), reason="the lab's sglang-router venv is not built")
def test_the_real_router_in_front_of_the_real_engine_passes_a_real_generation(server: Server) -> None:
    """Real router, real engine, real generation: the smoke gate's text comes from the tiny Llama."""
    res = gd("deploy", "--inventory", str(server.inventory), "--host", HOST, "--role", ROUTER_ROLE, timeout=300)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert re.search(r"smoke /v1/completions through lab3/vllm-router: TTFT \d+\.\d+ s, total \d+\.\d+ s, "
                     r"text '[a-z]", out), out
    print(f"vllm: {next(line for line in out.splitlines() if 'smoke /v1/completions through' in line).strip()}")
    doc = status_json(server.inventory, "--host", HOST)
    router = next(u for u in doc["hosts"][HOST]["units"] if u["role"] == ROUTER_ROLE)
    assert [w["healthy"] for w in router["workers"]] == [True], router


def test_startup_failure_fails_fast_with_vllms_own_cause(server: Server) -> None:
    started = time.monotonic()
    res = gd("deploy", "--inventory", str(server.inventory), "--host", HOST, "--role", BAD_ROLE, timeout=300)
    took = time.monotonic() - started
    out = res.stdout + res.stderr
    print(f"vllm: failing deploy ({TOO_MUCH_KV} of KV cache) took {took:.1f} s\n{out}")
    assert res.returncode == 1, out
    assert "KV cache" in out and "does not fit" in out, out
    assert f"lower --kv-cache-memory-bytes (now {TOO_MUCH_KV})" in out, out
    assert took < 100, f"the gate took {took:.0f} s: it must stop when vLLM dies, not wait for the timeout"
    # The gate stops at vLLM's fatal line; vLLM itself would take 5-10 s more to wind its tree down,
    # so deploy stops the unit, and status reads the same cause from the run record and journal.
    wait_for(lambda: unit_prop(server.lab, BAD_UNIT, "ActiveState") in ("failed", "inactive"), 60,
             f"{BAD_UNIT} to stop")
    assert cgroup_pids(server.lab, BAD_UNIT) == []
    doc = status_json(server.inventory, "--host", HOST, "--role", BAD_ROLE)
    (unit,) = doc["hosts"][HOST]["units"]
    assert not unit["healthy"] and "does not fit" in (unit["last_failure"] or ""), unit
    assert "--kv-cache-memory-bytes" in (unit["next_step"] or ""), unit
    # The healthy server next to it is untouched.
    assert http(f"{server.url}/health")[0] == 200


def test_sigkill_of_main_pid_then_status_and_teardown(server: Server) -> None:
    """What a naive script's `kill -9 $PID` does to a vLLM unit, and that teardown cleans up after it."""
    lab = server.lab
    main_pid = int(unit_prop(lab, UNIT, "MainPID"))
    procs = start_times(lab, cgroup_pids(lab, UNIT))
    names = proc_names(lab, list(procs))
    children = sorted(set(procs) - {main_pid})
    assert main_pid in procs and children, names
    killed_at = time.monotonic()
    lab.ssh(HOST, f"kill -KILL {main_pid}", check=True)
    wait_for(lambda: unit_prop(lab, UNIT, "ActiveState") in ("failed", "inactive"), 60, f"{UNIT} to stop")
    stopped_s = time.monotonic() - killed_at
    survivors = still_alive(lab, procs)
    print(f"vllm: killed MainPID {main_pid}; unit {unit_prop(lab, UNIT, 'ActiveState')} after {stopped_s:.1f} s "
          f"(result {unit_prop(lab, UNIT, 'Result')}); of {names} alive now: {survivors}")
    print(ssh_out(lab, f"journalctl --no-pager -o cat -u {UNIT} -n 12 | grep -v '^(' || true"))

    doc = status_json(server.inventory, "--host", HOST, "--role", ROLE)
    (unit,) = doc["hosts"][HOST]["units"]
    assert unit["state"].startswith("failed"), unit
    assert not unit["healthy"] and unit["health"] != "200", unit
    reported = sorted(o["pid"] for o in unit["orphans"])
    # Every process that is still alive is named (a process may end between the two looks, never the other way).
    assert set(still_alive(lab, procs)) <= set(reported) <= set(procs), (reported, names)
    res = gd("status", "--inventory", str(server.inventory), "--host", HOST, "--role", ROLE)
    assert res.returncode == 1 and "failed" in res.stdout, res.stdout

    started = time.monotonic()
    res = gd("teardown", "--inventory", str(server.inventory), "--host", HOST, "--role", ROLE)
    print(f"vllm: teardown after the kill took {time.monotonic() - started:.1f} s\n{res.stdout}")
    assert res.returncode == 0, res.stdout + res.stderr
    assert still_alive(lab, procs) == [], proc_names(lab, still_alive(lab, procs))
    assert cgroup_pids(lab, UNIT) == []
    assert http(f"{server.url}/health")[0] == 0


def test_redeploy_then_teardown_of_a_running_server_leaves_nothing(server: Server) -> None:
    """After the failure above, deploy converges again; teardown of a live vLLM (SIGTERM path) leaves no
    API server, EngineCore, Worker or resource tracker: checked by the unit's cgroup and by PID."""
    lab = server.lab
    res = gd("deploy", "--inventory", str(server.inventory), "--host", HOST, "--role", ROLE, timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    assert http(f"{server.url}/health")[0] == 200
    procs = start_times(lab, cgroup_pids(lab, UNIT))
    assert len(procs) >= 3, proc_names(lab, list(procs))
    started = time.monotonic()
    res = gd("teardown", "--inventory", str(server.inventory), "--host", HOST, "--role", ROLE)
    print(f"vllm: teardown of a running server took {time.monotonic() - started:.1f} s\n{res.stdout}")
    assert res.returncode == 0 and "clean" in res.stdout, res.stdout + res.stderr
    assert still_alive(lab, procs) == [], proc_names(lab, still_alive(lab, procs))
    assert cgroup_pids(lab, UNIT) == []
    assert unit_prop(lab, UNIT, "ActiveState") in ("inactive", "failed")
