"""deploy / status / teardown / logs on real lab hosts (systemd + sshd) with the SGLang stand-in."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import Lab
from deploytools import REPO, Deployments, alive, gd, http, main_pid, standin_role, status_json, unit_pids, wait_for

pytestmark = pytest.mark.lab


# -- the main job: the shipped lab inventory, PD pair + router -------------------------------------

def test_pd_pair_and_router_deploy_serve_redeploy_and_teardown(lab: Lab) -> None:
    inv = str(REPO / "lab" / "inventory" / "lab.yml")
    try:
        res = gd("deploy", "--inventory", inv, "--host", "lab1")
        assert res.returncode == 0, res.stdout + res.stderr
        for role, port in (("prefill", 30000), ("decode", 30010), ("lab-router", 8000)):
            assert f"lab1/{role}: started" in res.stdout, res.stdout
            assert f"http://10.231.0.11:{port}" in res.stdout
        assert "memory: weights" in res.stdout  # the figures the engine logged
        # The deployment's own gate: a real generation through the real router, with its timing.
        assert re.search(r"deployment lab: READY\n    smoke /generate through lab1/lab-router: TTFT \d+\.\d+ s, "
                         r"total \d+\.\d+ s, text '\w", res.stdout), res.stdout
        # A real generation through the router (prefill + decode), not just /health.
        code, body = http("http://10.231.0.11:8000/v1/completions",
                          {"model": "qwen3-235b", "prompt": "hello there", "max_tokens": 8})
        assert code == 200 and '"text"' in body, body
        before = {u: main_pid(lab, "lab1", f"gpudeploy-lab.{u}.service") for u in ("prefill", "decode", "lab-router")}

        status = status_json(Path(inv), "--host", "lab1")
        units = {u["role"]: u for u in status["hosts"]["lab1"]["units"]}
        assert status["healthy"] and all(units[r]["healthy"] for r in before)
        assert {r: units[r]["main_pid"] for r in before} == before

        again = gd("deploy", "--inventory", inv, "--host", "lab1")
        assert again.returncode == 0 and again.stdout.count("unchanged and healthy") == 3, again.stdout
        assert {u: main_pid(lab, "lab1", f"gpudeploy-lab.{u}.service") for u in before} == before

        workers = unit_pids(lab, "lab1", "gpudeploy-lab.decode.service")
        assert len(workers) == 1 + 4  # main + one scheduler per TP rank
    finally:
        down = gd("teardown", "--inventory", inv, "--host", "lab1", "--purge")
    assert down.returncode == 0, down.stdout + down.stderr
    assert down.stdout.count("clean: no process left") == 3, down.stdout
    for pid in workers:
        assert not alive(lab, "lab1", pid)
    assert lab.ssh("lab1", "ls /etc/systemd/system/ | grep -cF gpudeploy-lab. || true").stdout.strip() == "0"


# -- every startup fault: fail fast, say why, say what to change -----------------------------------

FAULTS = [
    ("oom-graph", "CUDA out of memory while capturing CUDA graphs", "lower --mem-fraction-static"),
    ("kv-not-enough", "the KV cache pool came out empty", "raise --mem-fraction-static"),
    ("weights-oom", "CUDA out of memory while loading the weights: they do not fit", "use more GPUs"),
    ("mamba-oom", "the hybrid (mamba/linear-attention) state cache does not fit", "lower --max-running-requests"),
    ("silent-exit", "the server exited (", "run the same command"),
    ("worker-dies", "a TP worker (scheduler) process died", "invoke logs"),
    ("nccl-error", "NCCL failed between the TP workers", "NCCL_DEBUG=INFO"),
    ("port-in-use", "a port the server needs is already taken", "ports:"),
]


@pytest.mark.parametrize(("fault", "summary", "advice"), FAULTS, ids=[f[0] for f in FAULTS])
def test_startup_fault_is_reported_with_cause_and_next_step(deployments: Deployments, fault: str, summary: str,
                                                             advice: str) -> None:
    name = "f" + re.sub(r"[^a-z]", "", fault)[:10]
    inv = deployments.inventory(name, {"srv": standin_role(fault, timeout_s=60)})
    t0 = time.monotonic()
    res = gd("deploy", "--inventory", str(inv), "--host", "lab2")
    took = time.monotonic() - t0
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "Traceback" not in res.stderr  # the engine's own traceback may be evidence; ours never
    assert f"cause: {summary}" in out, out
    assert "next step:" in out and advice in out, out
    if fault == "silent-exit":  # systemd's words or the state poll's, whichever came first
        assert "status=1" in out and "without an error message" in out, out
    assert took < 30, f"took {took:.1f} s, the health timeout (60 s) must not be what ends it"
    status = status_json(inv)
    [unit] = status["hosts"]["lab2"]["units"]
    assert not unit["healthy"] and unit["state"].startswith("failed")
    assert unit["last_failure"].startswith(summary.split(" (")[0]), unit


def test_hang_times_out_with_last_phase_and_is_stopped(deployments: Deployments, lab: Lab) -> None:
    inv = deployments.inventory("hang", {"srv": standin_role("hang")})
    res = gd("deploy", "--inventory", str(inv), "--host", "lab2", "--timeout", "4")
    assert res.returncode == 1
    assert "cause: not ready after 4 s; last phase reached: capturing CUDA graphs" in res.stdout, res.stdout
    assert "the unit was stopped so its GPUs are free again" in res.stdout
    assert unit_pids(lab, "lab2", "gpudeploy-hang.srv.service") == []


def test_crash_after_ready_shows_in_status(deployments: Deployments, lab: Lab) -> None:
    # The crash comes when the test says (a file appears), not after a delay that a slow gate outlasts.
    role = standin_role("crash-after-ready")
    role["env"]["SGLANG_STANDIN_FAULT_WHEN"] = "/run/gpudeploy-test-crash-now"
    inv = deployments.inventory("crash", {"srv": role})
    lab.ssh("lab2", "rm -f /run/gpudeploy-test-crash-now", check=True)
    res = gd("deploy", "--inventory", str(inv), "--host", "lab2")
    assert res.returncode == 0, res.stdout
    assert gd("status", "--inventory", str(inv)).returncode == 0
    lab.ssh("lab2", "touch /run/gpudeploy-test-crash-now", check=True)
    unit = wait_for(lambda: next((u for u in status_json(inv)["hosts"]["lab2"]["units"]
                                  if u["state"].startswith("failed")), None), 20, "the crash to show")
    assert unit["last_failure"], unit
    assert gd("status", "--inventory", str(inv)).returncode == 1


def test_failed_deploy_then_good_one_is_not_confused_by_old_journal(deployments: Deployments) -> None:
    bad = deployments.inventory("again", {"srv": standin_role("oom-graph")})
    assert gd("deploy", "--inventory", str(bad), "--host", "lab2").returncode == 1
    good = deployments.inventory("again", {"srv": standin_role(None)})
    res = gd("deploy", "--inventory", str(good), "--host", "lab2")
    assert res.returncode == 0, res.stdout
    assert "out of memory" not in res.stdout.lower() and "lab2/srv: started" in res.stdout


def test_changed_role_restarts_unchanged_does_not(deployments: Deployments, lab: Lab,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("API_TOKEN", "s3cret-value-1")
    inv = deployments.inventory("chg", {"srv": standin_role(None, secret_env=["API_TOKEN"])})
    assert gd("deploy", "--inventory", str(inv), "--host", "lab2").returncode == 0
    first = main_pid(lab, "lab2", "gpudeploy-chg.srv.service")
    env_file = lab.ssh("lab2", "stat -c %a /etc/gpudeploy/chg.srv.env; cat /etc/gpudeploy/chg.srv.env").stdout
    assert env_file.startswith("600\n") and "API_TOKEN=s3cret-value-1" in env_file
    unit_file = lab.ssh("lab2", "cat /etc/systemd/system/gpudeploy-chg.srv.service").stdout
    assert "s3cret" not in unit_file
    same = gd("deploy", "--inventory", str(inv), "--host", "lab2")
    assert "unchanged and healthy" in same.stdout and main_pid(lab, "lab2", "gpudeploy-chg.srv.service") == first
    assert "s3cret" not in same.stdout + gd("status", "--inventory", str(inv), "--json").stdout

    monkeypatch.setenv("API_TOKEN", "s3cret-value-2")
    inv = deployments.inventory("chg", {"srv": standin_role(None, settings={"max_running_requests": 64},
                                                            secret_env=["API_TOKEN"])})
    check = gd("deploy", "--inventory", str(inv), "--host", "lab2", "--check")
    assert check.returncode == 0, check.stdout
    assert "+ExecStart=" in check.stdout and "--max-running-requests 64" in check.stdout
    assert "chg.srv.env (only a secret value differs)" in check.stdout and "s3cret" not in check.stdout
    assert "lab2/srv: would restart (--check: nothing was changed)" in check.stdout
    assert main_pid(lab, "lab2", "gpudeploy-chg.srv.service") == first
    res = gd("deploy", "--inventory", str(inv), "--host", "lab2")
    assert res.returncode == 0 and "lab2/srv: restarted" in res.stdout, res.stdout
    assert main_pid(lab, "lab2", "gpudeploy-chg.srv.service") not in (0, first)


def test_ignore_sigterm_and_leaked_worker_leave_nothing_after_teardown(deployments: Deployments, lab: Lab) -> None:
    inv = deployments.inventory("stubborn", {"deaf": standin_role("ignore-sigterm"),
                                             "leaky": standin_role("leak-worker")})
    res = gd("deploy", "--inventory", str(inv), "--host", "lab2")
    assert res.returncode == 0, res.stdout
    pids = unit_pids(lab, "lab2", "gpudeploy-stubborn.deaf.service") + \
        unit_pids(lab, "lab2", "gpudeploy-stubborn.leaky.service")
    sessions = {int(lab.ssh("lab2", f"ps -o sid= -p {p}").stdout.strip() or 0) for p in pids}
    assert len(sessions - {0}) >= 3, "the leaked worker should run in a session of its own"
    down = gd("teardown", "--inventory", str(inv), "--host", "lab2")
    assert down.returncode == 0 and down.stdout.count("clean: no process left") == 2, down.stdout
    assert [p for p in pids if alive(lab, "lab2", p)] == []
    again = gd("teardown", "--inventory", str(inv), "--host", "lab2")  # idempotent
    assert again.returncode == 0 and again.stdout.count("clean") == 2


def test_two_deploys_at_once_are_serialized(deployments: Deployments) -> None:
    a = deployments.inventory("para", {"one": standin_role(None)}, host="lab3")
    b = deployments.inventory("parb", {"two": standin_role(None, ports={"http": 30100, "nccl": 30105})}, host="lab3",
                              placed=[{"role": "two", "numa_node": 1}])
    cmd = [sys.executable, "-m", "invoke", "--search-root", str(REPO), "deploy", "--host", "lab3", "--inventory"]
    procs = [subprocess.Popen([*cmd, str(p)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for p in (a, b)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert any("waiting for another gpudeploy run" in o for o in outs), outs


def test_unreachable_host_is_a_per_host_error(deployments: Deployments) -> None:
    inv = deployments.inventory("reach", {"srv": standin_role(None)}, host="lab2", placed=[],
                                extra_hosts={"ghost": ("10.231.0.99", ["srv"])}, connect_timeout_s=2)
    res = gd("deploy", "--inventory", str(inv), "--host", "ghost")
    assert res.returncode == 1 and "ghost: FAILED:" in res.stdout and "Traceback" not in res.stderr, res.stdout
    st = gd("status", "--inventory", str(inv))
    assert st.returncode == 1
    assert re.search(r"ghost\s+-\s+UNREACHABLE", st.stdout) and re.search(r"lab2\s+-\s+no gpudeploy units", st.stdout)


def test_network_cut_during_deploy_gives_clear_error_and_consistent_state(deployments: Deployments,
                                                                        lab: Lab) -> None:
    inv = deployments.inventory("cut", {"srv": standin_role(None, speed=4.0, timeout_s=120)}, host="lab3")
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "--search-root", str(REPO), "deploy", "--host", "lab3",
                             "--inventory", str(inv)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if "loading weights" in line:
                break
        subprocess.run(["ip", "link", "set", "gdlab-lab3", "down"], check=True)
        out = "".join(seen) + proc.communicate(timeout=90)[0]
    finally:
        subprocess.run(["ip", "link", "set", "gdlab-lab3", "up"], check=True)
    assert proc.returncode == 1, out
    # The host's outcome says exactly what happened: this unit, its gate cut off at this phase.
    assert re.search(r"lab3/srv: FAILED \(failed\)\n    cause: lost the connection to lab3 while waiting "
                     r"\(last phase reached: (loading weights|allocating KV cache); .+\)", out), out
    assert "`invoke deploy` again converges" in out
    assert "Traceback" not in out
    # Once the network is back, the state is consistent: status sees the unit, a deploy converges.
    wait_for(lambda: lab.ssh("lab3", "true").returncode == 0, 30, "lab3 reachable again")
    res = gd("deploy", "--inventory", str(inv), "--host", "lab3")
    assert res.returncode == 0, res.stdout
    assert status_json(inv)["healthy"]


def test_logs_show_only_the_current_run(deployments: Deployments) -> None:
    inv = deployments.inventory("logs", {"srv": standin_role("oom-graph")})
    gd("deploy", "--inventory", str(inv), "--host", "lab2")
    inv = deployments.inventory("logs", {"srv": standin_role(None)})
    assert gd("deploy", "--inventory", str(inv), "--host", "lab2").returncode == 0
    res = gd("logs", "--inventory", str(inv), "--host", "lab2", "--role", "srv")
    assert res.returncode == 0
    assert "ready to roll" in res.stdout and "Capture cuda graph failed" not in res.stdout


def test_measured_memory_figures_feed_the_next_plan(deployments: Deployments) -> None:
    facts = {"kind": "mha", "weights_gib": 16, "layers": 32, "kv_heads": 8, "head_dim": 128}
    # A model path no other test deploys, so no earlier measurement exists for it in this session.
    inv = deployments.inventory("calib", {"srv": standin_role(None, model={"path": "/models/calib", "facts": facts})})
    before = json.loads(gd("plan", "--inventory", str(inv), "--json").stdout)["units"][0]["memory"]
    assert before["verdict"] == "fits" and not before["measured"]
    assert gd("deploy", "--inventory", str(inv), "--host", "lab2").returncode == 0
    after = json.loads(gd("plan", "--inventory", str(inv), "--json").stdout)["units"][0]["memory"]
    assert after["measured"]["weights_gib"]["measured"] == 8.0  # what the engine logged per rank
    assert "predicted" in after["measured"]["weights_gib"]
    text = gd("plan", "--inventory", str(inv)).stdout
    assert "measured weights_gib: 8.0 (predicted" in text


def test_status_reads_the_same_facts_over_paramiko_without_an_ssh_client(deployments: Deployments,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from gpudeploy.plan import load_plan
    from gpudeploy.remote import openssh
    from gpudeploy.verify.status import status

    inv = deployments.inventory("both", {"srv": standin_role(None)})
    assert gd("deploy", "--inventory", str(inv), "--host", "lab2").returncode == 0
    plan = load_plan(str(inv), memory=False)
    hosts = list(plan.inventory.hosts.values())
    via_openssh = status(plan, hosts)["lab2"]
    monkeypatch.setattr(openssh, "available", lambda: False)
    via_paramiko = status(plan, hosts)["lab2"]
    assert isinstance(via_openssh, list) and isinstance(via_paramiko, list)
    assert [(s.unit, s.state, s.main_pid, s.healthy) for s in via_openssh] == \
        [(s.unit, s.state, s.main_pid, s.healthy) for s in via_paramiko]
    assert via_paramiko[0].healthy


def test_a_failed_redeploy_puts_the_previous_files_back_and_serves_again(deployments: Deployments,
                                                                         lab: Lab) -> None:
    # A failed redeploy stopped the changed unit and never restored its files: a failed canary left
    # that host serving nothing.
    inv = deployments.inventory("rback", {"srv": standin_role(None)})
    assert gd("deploy", "--inventory", str(inv), "--host", "lab2").returncode == 0
    before = lab.ssh("lab2", "cat /etc/gpudeploy/rback.srv.env", check=True).stdout
    bad = deployments.inventory("rback", {"srv": standin_role("oom-graph")})
    res = gd("deploy", "--inventory", str(bad), "--host", "lab2")
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "lab2/srv: FAILED" in out and "out of memory" in out.lower()  # the new run's cause is still said
    assert "back on the files they ran from before this deploy: lab2/srv (healthy again)" in out, out
    assert "running now: lab2/srv" in out, out
    assert lab.ssh("lab2", "cat /etc/gpudeploy/rback.srv.env", check=True).stdout == before
    [unit] = status_json(inv)["hosts"]["lab2"]["units"]
    assert unit["healthy"], unit


def test_serial_batches_never_stop_an_earlier_batchs_failure_again(deployments: Deployments, lab: Lab) -> None:
    # --serial re-ran every earlier batch's clean-up on the hosts it shared with the current batch:
    # their stopped units were stopped again and listed twice.
    good = standin_role(None, tp=1)
    bad = standin_role("kv-not-enough", tp=1, ports={"http": 30100, "nccl": 30105})
    later = standin_role(None, tp=1, ports={"http": 30200, "nccl": 30205})
    inv = deployments.inventory("sa", {"ok": good, "bad": bad, "later": later}, host="lab2",
                                placed=[{"role": "ok", "gpus": [0]}, {"role": "bad", "gpus": [1]},
                                        {"role": "later", "gpus": [4], "deployment": "sb"}])
    res = gd("deploy", "--inventory", str(inv), "--serial", "1", "--max-fail-percent", "100")
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    [line] = [x for x in out.splitlines() if "stopped what this run started" in x]
    assert line.strip() == "stopped what this run started: lab2/ok", out
    assert "deployment sb: READY" in out, out
