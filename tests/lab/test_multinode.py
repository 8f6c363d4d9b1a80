"""An engine that spans hosts: one unit per node, gated, failed and torn down as one group.

A TP4 stand-in over two lab hosts (two GPUs each, ``--nnodes 2``): the leader on lab1 serves the
API and the rendezvous on its dist-init port, the rank on lab2 joins it. Behind the real
sglang-router on lab3, which reaches the leader only. Every wait is a condition against a deadline.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from conftest import Lab
from deploytools import Deployments, gd, http, standin_role, status_json, unit_pids, wait_for

from gpudeploy.plan import unit_name
from gpudeploy_lab import engine

pytestmark = [pytest.mark.lab, pytest.mark.skipif(not engine.ROUTER.is_built(),
                                                  reason="the lab's sglang-router venv is not built "
                                                         "(python -m gpudeploy_lab engine)")]

MODEL = {"path": "/models/tiny"}
UNIT = unit_name("mn", "big")


def roles() -> dict[str, dict[str, Any]]:
    big = standin_role(None, tp=4, model=MODEL, nnodes=2)
    rt = {"engine": "sglang_router", "upstreams": {"workers": ["big"]}, "python": engine.ROUTER_GUEST_PYTHON,
          "extra_args": ["--disable-circuit-breaker"], "health": {"timeout_s": 60}, "stop_timeout_s": 5}
    return {"big": big, "rt": rt}


def unit_state(lab: Lab, host: str, unit: str = UNIT) -> str:
    return lab.ssh(host, f"systemctl is-active {unit}").stdout.strip()


def test_a_group_over_two_hosts_gates_fails_with_the_killed_ranks_cause_and_tears_down_clean(
        deployments: Deployments, lab: Lab) -> None:
    inv = deployments.inventory("mn", roles(), host="lab1", placed=["big"],
                                extra_hosts={"lab2": (lab.address_of("lab2"), ["big"]),
                                             "lab3": (lab.address_of("lab3"), ["rt"])})
    res = gd("deploy", "--inventory", str(inv), "--host", "lab1")
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "lab1/big: started" in out and "lab2/big: started" in out, out
    assert re.search(r"deployment mn: READY\n    smoke /generate through lab3/rt", out), out
    leader = lab.ssh("lab1", f"systemctl show -p ExecStart --value {UNIT}", check=True).stdout
    follower = lab.ssh("lab2", f"systemctl show -p ExecStart --value {UNIT}", check=True).stdout
    dist = f"--dist-init-addr {lab.address_of('lab1')}:20000 --nnodes 2"
    assert f"{dist} --node-rank 0" in leader and f"{dist} --node-rank 1" in follower, (leader, follower)
    # The follower ran group ranks 2 and 3 on its own two GPUs, after waiting for the group.
    journal = lab.ssh("lab2", f"journalctl -u {UNIT} -o cat", check=True).stdout
    assert re.search(r"TP2\] Init parallel begin", journal), journal  # 0.5.23: it waits there for the group
    assert re.search(r"TP3\] Load weight end", journal), journal
    code, body = http(f"http://{lab.address_of('lab3')}:8000/generate",
                      {"text": "hello", "sampling_params": {"max_new_tokens": 4}})
    assert code == 200 and '"text"' in body, body
    doc = status_json(inv)
    assert doc["deployments"]["mn"]["healthy"], doc
    ranks = {h: next(u for u in doc["hosts"][h]["units"] if u["role"] == "big") for h in ("lab1", "lab2")}
    assert ranks["lab1"]["group"] == "rank 0 of 2 (leader)", ranks
    assert ranks["lab2"]["group"] == "rank 1 of 2 (leader lab1)", ranks
    router = next(u for u in doc["hosts"]["lab3"]["units"] if u["role"] == "rt")
    assert [w["url"] for w in router["workers"]] == [f"http://{lab.address_of('lab1')}:30000"], router

    # Kill one TP rank on the other node (a scheduler process, not the launcher): the group fails,
    # the leader with it, and status names the killed rank as the cause on every rank.
    main = int(lab.ssh("lab2", f"systemctl show -p MainPID --value {UNIT}", check=True).stdout)
    victim = next(p for p in unit_pids(lab, "lab2", UNIT) if p != main)
    lab.ssh("lab2", f"kill -9 {victim}", check=True)
    wait_for(lambda: unit_state(lab, "lab2") == "failed" and unit_state(lab, "lab1") == "failed", 30,
             "both ranks of the group to fail")
    down_doc = status_json(inv)
    assert not down_doc["deployments"]["mn"]["healthy"], down_doc
    after = {h: next(u for u in down_doc["hosts"][h]["units"] if u["role"] == "big") for h in ("lab1", "lab2")}
    assert "scheduler) process died" in (after["lab2"]["last_failure"] or ""), after
    assert "another node of this group went away" in (after["lab1"]["last_failure"] or ""), after
    assert "rank 1 on lab2: a TP worker (scheduler) process died" in (after["lab1"]["group_down"] or ""), after
    leader_log = lab.ssh("lab1", f"journalctl -u {UNIT} -o cat", check=True).stdout
    assert f"Connection closed by peer [{lab.address_of('lab2')}]" in leader_log, leader_log[-2000:]

    # Teardown of one rank stops the whole group and proves both nodes clean.
    td = gd("teardown", "--inventory", str(inv), "--host", "lab2", "--role", "big")
    assert td.returncode == 0, td.stdout + td.stderr
    assert "also on lab1: the other ranks" in td.stdout, td.stdout
    assert td.stdout.count("clean: no process left") == 2, td.stdout
    for h in ("lab1", "lab2"):
        assert unit_pids(lab, h, UNIT) == []
        # one record per file, without a newline at its end: one per line here
        records = lab.ssh(h, 'for f in /run/gpudeploy-lab/gpu-procs/*.json; do [ -e "$f" ] && cat "$f" && echo; '
                             'done').stdout
        pids = [json.loads(line)["pid"] for line in records.splitlines() if line.strip()]
        assert all(lab.ssh(h, f"test -e /proc/{p}").returncode != 0 for p in pids), (h, pids)
    assert unit_state(lab, "lab3", unit_name("mn", "rt")) == "active"  # no rank of the group: left alone


def test_a_rank_that_fails_while_starting_fails_the_group_with_its_own_cause(
        deployments: Deployments, lab: Lab) -> None:
    # Only lab2's rank runs out of memory capturing CUDA graphs (the fault is lab2's host env).
    inv = deployments.inventory("mn", {"big": roles()["big"]}, host="lab1", placed=["big"],
                                extra_hosts={"lab2": (lab.address_of("lab2"), ["big"])},
                                host_settings={"lab2": {"env": {"SGLANG_STANDIN_FAULT": "oom-graph"}}})
    res = gd("deploy", "--inventory", str(inv), "--host", "lab2", "--role", "big")  # one rank selects both
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "deployment mn: FAILED: rank 1 of 2 (lab2/big) failed: CUDA out of memory while capturing CUDA graphs" \
        in out, out
    assert "lab1/big: FAILED" in out, out
    wait_for(lambda: unit_state(lab, "lab1") != "active" and unit_state(lab, "lab2") != "active", 30,
             "no rank of the failed group left running")
