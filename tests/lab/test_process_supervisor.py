"""The process supervisor on a real host without systemd: the same fault matrix as under systemd.

lab9 boots like a rented GPU container (``systemd-nspawn --as-pid2``: a stub init, sshd, no
systemd). The inventory says nothing about supervisors: gpudeploy finds no systemd there and runs
each server in a process group of its own under its monitor, with a log file per run and a run
file naming its PID and start time. Every wait is a condition polled against a deadline.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Lab, no_systemd_host
from deploytools import Deployments, gd, standin_role, status_json, wait_for
from test_deploy import FAULTS

from gpudeploy.plan import unit_name

pytestmark = pytest.mark.lab

HOST = "lab9"


@pytest.fixture(scope="module", autouse=True)
def bare_host(lab: Lab) -> Iterator[str]:
    yield from no_systemd_host(lab, HOST)


def inventory(deployments: Deployments, name: str, roles: dict[str, dict[str, Any]], **kw: Any) -> Any:
    return deployments.inventory(name, roles, host=HOST, **kw)  # supervisor: auto (the default)


def alive_exact(lab: Lab, pid: int, ticks: str) -> bool:
    out = lab.ssh(HOST, f"cut -d' ' -f22 /proc/{pid}/stat 2>/dev/null || true").stdout.strip()
    return out == ticks


def start_ticks(lab: Lab, pids: list[int]) -> dict[int, str]:
    return {p: lab.ssh(HOST, f"sed 's/.*) //' /proc/{p}/stat | cut -d' ' -f20").stdout.strip() for p in pids}


@pytest.mark.parametrize(("fault", "summary", "advice"), FAULTS, ids=[f[0] for f in FAULTS])
def test_startup_fault_is_reported_with_cause_and_next_step(deployments: Deployments, fault: str, summary: str,
                                                             advice: str) -> None:
    name = "p" + re.sub(r"[^a-z]", "", fault)[:10]
    inv = inventory(deployments, name, {"srv": standin_role(fault, timeout_s=60)})
    t0 = time.monotonic()
    res = gd("deploy", "--inventory", str(inv), "--host", HOST)
    took = time.monotonic() - t0
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "Traceback" not in res.stderr
    assert f"started {unit_name(name, 'srv')}" in out  # detected: no systemd there, yet it was started
    assert f"cause: {summary}" in out and "next step:" in out and advice in out, out
    if fault == "silent-exit":  # the monitor's words: the exit status, with no message before it
        assert "status=1" in out and "without an error message" in out, out
    assert took < 30, f"took {took:.1f} s, the health timeout (60 s) must not be what ends it"
    [unit] = status_json(inv)["hosts"][HOST]["units"]
    assert not unit["healthy"] and unit["state"].startswith("failed"), unit
    assert unit["last_failure"].startswith(summary.split(" (")[0]), unit


def test_hang_times_out_with_last_phase_and_leaves_nothing(deployments: Deployments, lab: Lab) -> None:
    inv = inventory(deployments, "phang", {"srv": standin_role("hang")})
    res = gd("deploy", "--inventory", str(inv), "--host", HOST, "--timeout", "4")
    assert res.returncode == 1
    assert "cause: not ready after 4 s; last phase reached: capturing CUDA graphs" in res.stdout, res.stdout
    assert "the unit was stopped so its GPUs are free again" in res.stdout
    [unit] = status_json(inv)["hosts"][HOST]["units"]
    assert unit["pids"] == [] and unit["orphans"] == [], unit


def test_crash_after_ready_shows_in_status(deployments: Deployments, lab: Lab) -> None:
    role = standin_role("crash-after-ready")
    role["env"]["SGLANG_STANDIN_FAULT_WHEN"] = "/run/gpudeploy-test-crash-now"
    inv = inventory(deployments, "pcrash", {"srv": role})
    lab.ssh(HOST, "rm -f /run/gpudeploy-test-crash-now", check=True)
    res = gd("deploy", "--inventory", str(inv), "--host", HOST)
    assert res.returncode == 0, res.stdout
    lab.ssh(HOST, "touch /run/gpudeploy-test-crash-now", check=True)
    unit = wait_for(lambda: next((u for u in status_json(inv)["hosts"][HOST]["units"]
                                  if u["state"].startswith("failed")), None), 20, "the crash to show")
    assert "illegal memory access" in (unit["last_failure"] or "") or unit["last_failure"], unit


def test_ignore_sigterm_and_a_leaked_setsid_worker_leave_nothing(deployments: Deployments, lab: Lab) -> None:
    inv = inventory(deployments, "pstub", {"deaf": standin_role("ignore-sigterm"),
                                           "leaky": standin_role("leak-worker")})
    res = gd("deploy", "--inventory", str(inv), "--host", HOST)
    assert res.returncode == 0, res.stdout
    units = {u["role"]: u for u in status_json(inv)["hosts"][HOST]["units"]}
    pids = units["deaf"]["pids"] + units["leaky"]["pids"]
    ticks = start_ticks(lab, pids)
    sessions = {lab.ssh(HOST, f"ps -o sid= -p {p}").stdout.strip() for p in pids}
    assert len(sessions) >= 3, "the leaked worker should run in a session of its own"
    down = gd("teardown", "--inventory", str(inv), "--host", HOST)
    assert down.returncode == 0 and down.stdout.count("clean: no process left") == 2, down.stdout
    assert [p for p in pids if alive_exact(lab, p, ticks[p])] == []


def test_a_failed_run_then_a_good_one_is_not_confused_by_the_old_log(deployments: Deployments) -> None:
    bad = inventory(deployments, "pagain", {"srv": standin_role("oom-graph")})
    assert gd("deploy", "--inventory", str(bad), "--host", HOST).returncode == 1
    good = inventory(deployments, "pagain", {"srv": standin_role(None)})
    res = gd("deploy", "--inventory", str(good), "--host", HOST)
    assert res.returncode == 0 and "out of memory" not in res.stdout.lower(), res.stdout
    logs = gd("logs", "--inventory", str(good), "--host", HOST, "--role", "srv").stdout
    assert "ready to roll" in logs and "Capture cuda graph failed" not in logs


def test_a_recorded_pid_that_belongs_to_another_process_now_is_never_signalled(deployments: Deployments,
                                                                              lab: Lab) -> None:
    inv = inventory(deployments, "preuse", {"srv": standin_role(None)})
    assert gd("deploy", "--inventory", str(inv), "--host", HOST).returncode == 0
    unit = unit_name("preuse", "srv")
    assert gd("teardown", "--inventory", str(inv), "--host", HOST).returncode == 0
    bystander = lab.ssh(HOST, "setsid sleep 600 > /dev/null 2>&1 < /dev/null & echo $!", check=True).stdout.strip()
    try:
        # The run file and the run record now name the bystander's PID, with another start time.
        for path in (f"/run/gpudeploy/units/{unit}.json", f"/var/lib/gpudeploy/runs/{unit}.json"):
            doc = json.loads(lab.ssh(HOST, f"cat {path}", check=True).stdout)
            doc["pid"] = int(bystander)
            doc["pids"] = [{"pid": int(bystander), "start_ticks": 1}]
            lab.ssh(HOST, f"cat > {path}", input=json.dumps(doc), check=True)
        down = gd("teardown", "--inventory", str(inv), "--host", HOST)
        assert down.returncode == 0, down.stdout
        assert lab.ssh(HOST, f"test -e /proc/{bystander}").returncode == 0, "a process that is not ours was killed"
    finally:
        lab.ssh(HOST, f"kill {bystander}")


def test_a_restart_ends_what_a_crashed_main_process_left_behind(deployments: Deployments, lab: Lab) -> None:
    # The main PID died, its workers lived on (one in a session of its own): a restart did not stop
    # them, the new run file dropped their tracking and a later stop said nothing was left.
    inv = inventory(deployments, "psurv", {"srv": standin_role("leak-worker")})
    assert gd("deploy", "--inventory", str(inv), "--host", HOST).returncode == 0
    [unit] = status_json(inv)["hosts"][HOST]["units"]
    old = [p for p in unit["pids"] if p != unit["main_pid"]]
    ticks = start_ticks(lab, old)
    lab.ssh(HOST, f"kill -9 {unit['main_pid']}", check=True)
    wait_for(lambda: status_json(inv)["hosts"][HOST]["units"][0]["state"].startswith("failed"), 20,
             "the killed main process to show")
    assert [p for p in old if alive_exact(lab, p, ticks[p])], "the workers should outlive their main process"
    res = gd("deploy", "--inventory", str(inv), "--host", HOST)
    assert res.returncode == 0, res.stdout
    assert "stopped what the previous run left behind when its main process died" in res.stdout, res.stdout
    assert [p for p in old if alive_exact(lab, p, ticks[p])] == []
    down = gd("teardown", "--inventory", str(inv), "--host", HOST)
    assert down.returncode == 0 and "clean: no process left" in down.stdout, down.stdout
