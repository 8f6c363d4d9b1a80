"""A PD deployment is one thing: engines on several hosts, then the router, then a real generation.

Real hosts (systemd + sshd), the SGLang stand-in engines, and the real sglang-router where the lab
has built it. Every wait is a condition polled against a deadline.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import Lab
from deploytools import Deployments, gd, http, standin_role, status_json

from gpudeploy.plan import unit_name
from gpudeploy_lab import control, engine

pytestmark = [pytest.mark.lab, pytest.mark.skipif(not engine.ROUTER.is_built(),
                                                  reason="the lab's sglang-router venv is not built "
                                                         "(python -m gpudeploy_lab engine)")]

MODEL = {"path": "/models/tiny"}


def pd_roles(decode_fault: str | None = None, *, router: dict[str, Any] | None = None,
             prefill_port: int | None = None) -> dict[str, dict[str, Any]]:
    pre = standin_role(None, settings={"disaggregation_mode": "prefill"}, model=MODEL)
    if prefill_port:
        pre["ports"] = {"http": prefill_port, "nccl": prefill_port + 5, "bootstrap": prefill_port + 7}
    dec = standin_role(decode_fault, settings={"disaggregation_mode": "decode"}, model=MODEL)
    # The real sglang-router (built by `python -m gpudeploy_lab engine`); --disable-circuit-breaker
    # so a fault test sees the engines' own answers (shared/reference/sglang-router.md).
    rt = {"engine": "sglang_router", "upstreams": {"prefill": ["pre"], "decode": ["dec"]},
          "python": engine.ROUTER_GUEST_PYTHON, "extra_args": ["--disable-circuit-breaker"],
          "health": {"timeout_s": 60}, "stop_timeout_s": 5, **(router or {})}
    return {"pre": pre, "dec": dec, "rt": rt}


def stopped_at(lab: Lab, host: str, unit: str) -> int:
    """When systemd last logged "Stopped <unit>" (µs since the epoch; 0 if never). Lab hosts share
    the machine's clock, so times of different hosts compare. (systemctl show forgets a stopped
    unit's timestamps as soon as it unloads it.)"""
    out = lab.ssh(host, f"journalctl -u {unit} -o json --output-fields=MESSAGE", check=True).stdout
    times = [int(e["__REALTIME_TIMESTAMP"]) for e in map(json.loads, out.splitlines())
             if str(e.get("MESSAGE", "")).startswith(f"Stopped {unit}")]
    return max(times, default=0)


def test_a_pair_split_over_two_hosts_with_the_router_on_a_third(deployments: Deployments, lab: Lab) -> None:
    inv = deployments.inventory("split", pd_roles(), host="lab1", placed=["pre"],
                                extra_hosts={"lab2": (lab.address_of("lab2"), ["dec"]),
                                             "lab3": (lab.address_of("lab3"), ["rt"])})
    # --host of the router's host deploys the whole deployment, on all three hosts.
    res = gd("deploy", "--inventory", str(inv), "--host", "lab3")
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    for key in ("lab1/pre", "lab2/dec", "lab3/rt"):
        assert f"{key}: started" in out, out
    # The router started only after both engines were ready, and the deployment passed a real generation.
    ready = [re.search(rf"\[{k}\]\s+\S+s\s+ready", out) for k in ("lab1/pre", "lab2/dec")]
    assert all(ready) and out.index("[lab3/rt] started") > max(m.start() for m in ready if m), out
    assert re.search(r"deployment split: READY\n    smoke /generate through lab3/rt: TTFT \d+\.\d+ s, total", out), out
    code, body = http(f"http://{lab.address_of('lab3')}:8000/generate",
                      {"text": "hello", "sampling_params": {"max_new_tokens": 4}})
    assert code == 200 and '"text"' in body, body
    doc = status_json(inv)
    assert doc["deployments"]["split"]["healthy"], doc
    router = next(u for u in doc["hosts"]["lab3"]["units"] if u["role"] == "rt")
    assert sorted(w["type"] for w in router["workers"]) == ["decode", "prefill"], router
    assert all(w["healthy"] for w in router["workers"]), router
    pre = next(u for u in doc["hosts"]["lab1"]["units"] if u["role"] == "pre")
    assert pre["router_view"] == ["healthy in lab3/rt"], pre
    text = gd("status", "--inventory", str(inv)).stdout
    # (GPUS: each of the unit's GPUs and its health word, issue 49)
    assert re.search(r"split\s+lab1\s+pre\s+active/running.*200\s+0-1 ok\s+healthy in lab3/rt", text), text

    # Teardown of the deployment: router first, then decode, then prefill; nothing left.
    down = gd("teardown", "--inventory", str(inv), "--deployment", "split")
    assert down.returncode == 0 and down.stdout.count("clean: no process left") == 3, down.stdout
    order = [stopped_at(lab, h, unit_name("split", r)) for h, r in (("lab3", "rt"), ("lab2", "dec"), ("lab1", "pre"))]
    assert 0 < order[0] < order[1] < order[2], order


def test_decode_that_fails_its_start_stops_the_prefill_this_run_started(deployments: Deployments, lab: Lab) -> None:
    inv = deployments.inventory("dfail", pd_roles("oom-graph"), host="lab2", placed=[
        "pre", {"role": "dec", "numa_node": 1}, "rt"])
    res = gd("deploy", "--inventory", str(inv), "--host", "lab2")
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "lab2/dec: FAILED (failed)" in out and "cause: CUDA out of memory while capturing CUDA graphs" in out
    assert "lab2/rt: FAILED (skipped) not started:" in out, out
    assert "deployment dfail: FAILED: lab2/dec failed" in out, out
    assert "stopped what this run started: lab2/pre" in out and "running now: nothing of this deployment" in out
    assert lab.ssh("lab2", f"systemctl is-active {unit_name('dfail', 'pre')}").stdout.strip() != "active"


def test_a_failing_smoke_generation_fails_the_deployment_though_every_health_is_200(
        deployments: Deployments, lab: Lab) -> None:
    inv = deployments.inventory("smk", pd_roles("generate-500"), host="lab2", placed=[
        "pre", {"role": "dec", "numa_node": 1}, "rt"])
    res = gd("deploy", "--inventory", str(inv), "--host", "lab2")
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    for key in ("lab2/pre", "lab2/dec", "lab2/rt"):
        assert f"{key}: started" in out, out  # every unit passed its own /health gate
    assert re.search(r"deployment smk: FAILED: the smoke generation through lab2/rt failed: HTTP 5\d\d", out), out
    assert "stopped what this run started:" in out
    for role in ("pre", "dec", "rt"):
        assert lab.ssh("lab2", f"systemctl is-active {unit_name('smk', role)}").stdout.strip() != "active"


def test_keep_on_failure_leaves_the_pair_running_and_says_so(deployments: Deployments, lab: Lab) -> None:
    inv = deployments.inventory("keep", pd_roles("generate-500"), host="lab2", placed=[
        "pre", {"role": "dec", "numa_node": 1}, "rt"])
    res = gd("deploy", "--inventory", str(inv), "--host", "lab2", "--keep-on-failure")
    assert res.returncode == 1, res.stdout
    assert "running now: lab2/dec, lab2/pre, lab2/rt" in res.stdout, res.stdout
    assert lab.ssh("lab2", f"systemctl is-active {unit_name('keep', 'pre')}").stdout.strip() == "active"


def test_plan_refuses_a_pair_that_would_hang(tmp_path: Path, deployments: Deployments) -> None:
    roles = pd_roles()
    roles["dec"]["tp_size"] = 1
    roles["dec"]["model"] = {"path": "/models/tiny", "facts": {"kind": "mha", "weights_gib": 1, "layers": 2,
                                                                "kv_heads": 2, "head_dim": 64}}
    inv = deployments.inventory("hang", roles, host="lab2", placed=["pre", {"role": "dec", "numa_node": 1}, "rt"])
    res = gd("deploy", "--inventory", str(inv), "--host", "lab2")
    assert res.returncode == 1 and "SGLANG_DISAGG_STAGING_BUFFER=1" in res.stderr, res.stdout + res.stderr
    assert "Traceback" not in res.stderr


def test_a_host_behind_a_bastion_deploys_and_gates_with_its_port_closed_to_us(deployments: Deployments,
                                                                           lab: Lab) -> None:
    link = control.add_private_link("lab2", "lab3")  # lab3 answers at its private address only via lab2
    inv = deployments.inventory("bast", {"srv": standin_role(None)}, host="lab2", placed=[],
                                extra_hosts={"lab3": (link.private_address, ["srv"])},
                                host_settings={"lab3": {"ssh": {"proxy_jump": "lab2", "user": "root",
                                                                "key": "/var/lib/gpudeploy-lab/id_ed25519",
                                                                "known_hosts": "/var/lib/gpudeploy-lab/known_hosts"}}})
    code, _ = http(f"http://{link.private_address}:30000/health", timeout=2)
    assert code == 0, "the engine port must not be reachable from here"
    res = gd("deploy", "--inventory", str(inv), "--host", "lab3")
    assert res.returncode == 0 and "lab3/srv: started" in res.stdout, res.stdout + res.stderr
    doc = status_json(inv, "--host", "lab3")  # status (OpenSSH) goes through the bastion too
    [unit] = doc["hosts"]["lab3"]["units"]
    assert unit["healthy"] and unit["health"] == "200", unit
    down = gd("teardown", "--inventory", str(inv), "--host", "lab3", "--purge")
    assert down.returncode == 0 and "clean: no process left" in down.stdout, down.stdout
