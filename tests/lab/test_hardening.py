"""What a review found, on real hosts: scope of teardown, exact unit files, sessions, locks, Ctrl-C.

Every wait is a condition polled against a deadline.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest
from conftest import Lab
from deploytools import REPO, Deployments, gd, interrupt_at, main_pid, standin_role, status_json

from gpudeploy.apply.lock import holder_argv
from gpudeploy.plan import load_plan, unit_name
from gpudeploy_lab import ssh_argv

pytestmark = pytest.mark.lab

INVOKE = [sys.executable, "-m", "invoke", "--search-root", str(REPO)]


def _active(lab: Lab, host: str, unit: str) -> str:
    return lab.ssh(host, f"systemctl is-active {unit}").stdout.strip()


def _exists(lab: Lab, host: str, path: str) -> bool:
    return lab.ssh(host, f"test -e {path}").returncode == 0


def test_teardown_of_a_deployment_never_touches_another_one(deployments: Deployments, lab: Lab) -> None:
    # "pd-test" starts with "pd-": the old glob gpudeploy-pd-* stopped it and --purge deleted its files.
    pd = deployments.inventory("pd", {"a": standin_role(None)}, host="lab3")
    other = deployments.inventory("pd-test", {"b": standin_role(None, ports={"http": 30100, "nccl": 30105})},
                                  host="lab3", placed=[{"role": "b", "numa_node": 1}])
    for inv in (pd, other):
        res = gd("deploy", "--inventory", str(inv), "--host", "lab3")
        assert res.returncode == 0, res.stdout + res.stderr
    # A unit named like pd's but whose own file says it belongs to someone else is not pd's either.
    foreign = "gpudeploy-pd.foreign.service"
    lab.ssh("lab3", f"printf '[Unit]\\nX-Gpudeploy-Deployment=someone-else\\n[Service]\\nExecStart=/bin/sleep 600\\n'"
                    f" > /etc/systemd/system/{foreign} && systemctl daemon-reload && systemctl start {foreign}",
            check=True)
    try:
        down = gd("teardown", "--inventory", str(pd), "--host", "lab3", "--purge")
        assert down.returncode == 0, down.stdout
        assert "lab3/a: was active" in down.stdout and "/b:" not in down.stdout and "foreign" not in down.stdout
        other_unit = unit_name("pd-test", "b")
        assert _active(lab, "lab3", other_unit) == "active"
        assert _active(lab, "lab3", foreign) == "active"
        assert _exists(lab, "lab3", f"/etc/systemd/system/{other_unit}")
        assert _exists(lab, "lab3", "/etc/gpudeploy/pd-test.b.env")
        assert not _exists(lab, "lab3", f"/etc/systemd/system/{unit_name('pd', 'a')}")
        [b] = status_json(other)["hosts"]["lab3"]["units"]
        assert b["role"] == "b" and b["healthy"]
    finally:
        lab.ssh("lab3", f"systemctl stop {foreign}; rm -f /etc/systemd/system/{foreign}; systemctl daemon-reload")


ECHO_ARGV = """
import http.server, json, os, sys
print("ARGV " + json.dumps(sys.argv[2:]), flush=True)
print("ENV " + json.dumps(os.environ.get("PROMPT")), flush=True)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), H).serve_forever()
"""
AWKWARD = ["50%", "$HOME", "${PATH}", 'say "hi"', "back\\slash", "two  spaces", "tab\there", "ünïcödé", "%n%%", "'"]


def test_awkward_values_reach_the_server_exactly_and_the_unit_verifies(deployments: Deployments, lab: Lab) -> None:
    role = {"engine": "command", "gpus": 0, "description": '50% "quoted" \\ back',
            "argv": ["/usr/bin/python3", "-c", ECHO_ARGV, "{{ port }}", *AWKWARD],
            "env": {"PROMPT": 'costs $5, `date`, "quoted" and \\ backslash'}, "health": {"timeout_s": 30},
            "stop_timeout_s": 3}
    inv = deployments.inventory("awk", {"echo": role})
    res = gd("deploy", "--inventory", str(inv), "--host", "lab2")
    assert res.returncode == 0, res.stdout + res.stderr
    unit = unit_name("awk", "echo")
    verify = lab.ssh("lab2", f"SYSTEMD_LOG_COLOR=0 systemd-analyze verify /etc/systemd/system/{unit}")
    assert verify.returncode == 0 and not verify.stdout.strip() and not verify.stderr.strip(), verify
    logs = gd("logs", "--inventory", str(inv), "--host", "lab2", "--role", "echo").stdout
    argv_line = next(line for line in logs.splitlines() if "ARGV " in line)
    assert json.loads(argv_line.split("ARGV ", 1)[1]) == AWKWARD
    env_line = next(line for line in logs.splitlines() if "ENV " in line)
    assert json.loads(env_line.split("ENV ", 1)[1]) == role["env"]["PROMPT"]  # type: ignore[index]
    desc = lab.ssh("lab2", f"systemctl show -p Description --value {unit}").stdout.strip()
    assert desc == 'gpudeploy awk/echo (command) 50% "quoted" \\ back'


def test_two_deploys_at_once_are_serialized(deployments: Deployments, lab: Lab) -> None:
    """A held lock makes deploy wait, and it starts nothing until the lock is let go."""
    inv = deployments.inventory("ser", {"one": standin_role(None)}, host="lab3")
    # The test holds the host lock itself, with gpudeploy's own holder script (no heartbeat needed:
    # its timeout is set to 600 s).
    argv = holder_argv("/usr/bin/python3", 300, '{"by": "the test"}')
    argv[-1] = "600"
    holder = subprocess.Popen(ssh_argv(lab.address_of("lab3"), " ".join(shlex.quote(a) for a in argv)),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    deploy: subprocess.Popen[str] | None = None
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        deploy = subprocess.Popen([*INVOKE, "deploy", "--inventory", str(inv), "--host", "lab3"], cwd=REPO,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert deploy.stdout is not None
        first = deploy.stdout.readline()
        assert "waiting for another gpudeploy run" in first and "the test" in first, first
        released = time.monotonic()
        assert holder.stdin is not None
        holder.stdin.close()
        out = first + deploy.communicate(timeout=120)[0]
        assert deploy.returncode == 0, out
    finally:
        holder.kill()
        holder.wait()
        if deploy is not None and deploy.poll() is None:
            deploy.kill()
    # The unit's process started after the lock was let go (CLOCK_MONOTONIC is the kernel's, shared).
    started = int(lab.ssh("lab3", f"systemctl show -p ExecMainStartTimestampMonotonic --value "
                                  f"{unit_name('ser', 'one')}").stdout) / 1e6
    assert started > released, (started, released)


def test_eight_units_on_one_host_within_sshds_session_limit(deployments: Deployments, lab: Lab) -> None:
    # sshd allows 10 sessions per connection by default; one journal stream and one state poll per
    # unit, plus the lock, ran out of them with 8 units. Here the host allows only 4.
    lab.sshd_drop_in("lab3", "00-test-sessions.conf", "MaxSessions 4\n")
    try:
        roles = {f"r{i}": standin_role(None, tp=1) for i in range(8)}
        inv = deployments.inventory("eight", roles, host="lab3")
        res = gd("deploy", "--inventory", str(inv), "--host", "lab3", timeout=240)
        assert res.returncode == 0, res.stdout + res.stderr
        assert res.stdout.count(": started in ") == 8, res.stdout
    finally:
        lab.sshd_drop_in("lab3", "00-test-sessions.conf", None)


@pytest.fixture
def cores() -> Iterator[Callable[[], None]]:
    """Call it to load both cores (two `while True: pass`), as on the busy machines where Ctrl-C was lost."""
    loops: list[subprocess.Popen[bytes]] = []

    def load() -> None:
        loops.extend(subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2))

    yield load
    for p in loops:
        p.kill()
        p.wait()


def _lock_is_free(lab: Lab, host: str) -> bool:
    """Nobody holds the host lock: a holder with no wait gets it at once."""
    argv = holder_argv("/usr/bin/python3", 0, '{"by": "the probe"}')
    res = lab.ssh(host, " ".join(shlex.quote(a) for a in argv), input="")
    return res.stdout.splitlines()[:1] == ["locked"]


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "both-cores-busy"])
def test_ctrl_c_stops_waiting_at_once_and_says_what_is_left_running(deployments: Deployments, lab: Lab,
                                                                    cores: Callable[[], None], busy: bool) -> None:
    inv = deployments.inventory("intr", {"srv": standin_role("hang", timeout_s=600)})
    if busy:
        cores()
    proc = subprocess.Popen([*INVOKE, "deploy", "--inventory", str(inv), "--host", "lab2"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, took = interrupt_at(proc, "capturing CUDA graphs")
    print(f"ctrl-c in the gate ({'both cores busy' if busy else 'idle'}): deploy exited {took:.2f} s after SIGINT")
    assert proc.returncode == 130, out
    assert f"lab2/srv: {unit_name('intr', 'srv')} MainPID" in out, out
    assert "deployment intr: FAILED: interrupted (Ctrl-C) before it was ready" in out, out
    assert "running now: lab2/srv" in out, out
    assert "Traceback" not in out
    # Under load a deploy once kept waiting, and kept the host lock, for over seven minutes.
    assert took < 10, f"{took:.1f} s (the bound is 1.5 s plus the process's exit)"
    assert _lock_is_free(lab, "lab2")
    assert _active(lab, "lab2", unit_name("intr", "srv")) == "active"  # what it said is true


def test_ctrl_c_while_waiting_for_a_host_lock_under_load(deployments: Deployments, lab: Lab,
                                                        cores: Callable[[], None]) -> None:
    inv = deployments.inventory("intl", {"one": standin_role(None)}, host="lab3")
    argv = holder_argv("/usr/bin/python3", 300, '{"by": "the test"}')
    argv[-1] = "600"
    holder = subprocess.Popen(ssh_argv(lab.address_of("lab3"), " ".join(shlex.quote(a) for a in argv)),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        cores()
        proc = subprocess.Popen([*INVOKE, "deploy", "--inventory", str(inv), "--host", "lab3"], cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out, took = interrupt_at(proc, "waiting for another gpudeploy run")
        print(f"ctrl-c while waiting for the host lock (both cores busy): exited {took:.2f} s after SIGINT")
        assert proc.returncode == 130 and "Traceback" not in out, out
        assert took < 10, f"{took:.1f} s"
        assert "interrupted" in out, out
    finally:
        holder.kill()
        holder.wait()
    assert _active(lab, "lab3", unit_name("intl", "one")) != "active"  # nothing was started


def test_the_gate_ignores_the_operators_http_proxy(deployments: Deployments) -> None:
    inv = deployments.inventory("proxy", {"srv": standin_role(None, timeout_s=30)})
    env = {**os.environ, "http_proxy": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9", "no_proxy": ""}
    res = subprocess.run([*INVOKE, "deploy", "--inventory", str(inv), "--host", "lab2"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    st = subprocess.run([*INVOKE, "status", "--inventory", str(inv), "--json"], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=60)
    assert json.loads(st.stdout)["healthy"], st.stdout


def test_purge_removes_what_the_plan_no_longer_has(deployments: Deployments, lab: Lab,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OLD_TOKEN", "purge-me-secret")
    both = deployments.inventory("prg", {"keep": standin_role(None), "gone": standin_role(
        None, secret_env=["OLD_TOKEN"], ports={"http": 30100, "nccl": 30105})},
        placed=["keep", {"role": "gone", "numa_node": 1}])
    assert gd("deploy", "--inventory", str(both), "--host", "lab2").returncode == 0
    paths = [f"/etc/gpudeploy/prg.{r}.env" for r in ("keep", "gone")] + \
        [f"/var/lib/gpudeploy/prg.{r}" for r in ("keep", "gone")] + \
        [f"/var/lib/gpudeploy/runs/{unit_name('prg', r)}.json" for r in ("keep", "gone")]
    assert all(_exists(lab, "lab2", p) for p in paths)
    only_keep = deployments.inventory("prg", {"keep": standin_role(None)})  # "gone" left the inventory
    down = gd("teardown", "--inventory", str(only_keep), "--host", "lab2", "--purge")
    assert down.returncode == 0 and down.stdout.count("(purged)") == 2, down.stdout
    assert [p for p in paths if _exists(lab, "lab2", p)] == []
    assert "purge-me-secret" not in lab.ssh("lab2", "cat /etc/gpudeploy/*.env 2>/dev/null; true").stdout


def test_teardown_waits_for_a_deploy_that_is_gating(deployments: Deployments, lab: Lab) -> None:
    inv = deployments.inventory("tdw", {"srv": standin_role(None, speed=3.0, timeout_s=120)})
    deploy = subprocess.Popen([*INVOKE, "deploy", "--inventory", str(inv), "--host", "lab2"], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert deploy.stdout is not None
    seen = []
    for line in deploy.stdout:
        seen.append(line)
        if "loading weights" in line:
            break
    down = gd("teardown", "--inventory", str(inv), "--host", "lab2")
    out = "".join(seen) + deploy.communicate(timeout=120)[0]
    # The deploy finished its gate undisturbed; only then did the teardown stop the unit.
    assert deploy.returncode == 0 and "lab2/srv: started" in out, out
    assert "waiting for another gpudeploy run" in down.stdout and "clean: no process left" in down.stdout, down.stdout
    assert _active(lab, "lab2", unit_name("tdw", "srv")) in ("inactive", "failed")


def test_a_reused_pid_in_a_run_record_is_never_signalled(deployments: Deployments, lab: Lab) -> None:
    inv = deployments.inventory("reuse", {"srv": standin_role(None)})
    assert gd("deploy", "--inventory", str(inv), "--host", "lab2").returncode == 0
    unit = unit_name("reuse", "srv")
    pid = main_pid(lab, "lab2", unit)
    assert gd("teardown", "--inventory", str(inv), "--host", "lab2").returncode == 0
    # A process that is not ours now has a PID the record lists: put it there with another start time.
    bystander = lab.ssh("lab2", "setsid sleep 600 > /dev/null 2>&1 < /dev/null & echo $!", check=True).stdout.strip()
    record_path = f"/var/lib/gpudeploy/runs/{unit}.json"
    record = json.loads(lab.ssh("lab2", f"cat {record_path}", check=True).stdout)
    record["pids"] = [{"pid": int(bystander), "start_ticks": 1}, {"pid": pid, "start_ticks": 1}]
    lab.ssh("lab2", f"cat > {record_path}", input=json.dumps(record), check=True)
    try:
        down = gd("teardown", "--inventory", str(inv), "--host", "lab2")
        assert down.returncode == 0, down.stdout
        assert lab.ssh("lab2", f"test -e /proc/{bystander}").returncode == 0, "a process that is not ours was killed"
    finally:
        lab.ssh("lab2", f"kill {bystander}")


def test_plan_and_lab_inventories_name_units_unambiguously() -> None:
    plan = load_plan(str(REPO / "lab" / "inventory" / "lab.yml"), memory=False)
    assert sorted(u.name for u in plan.units) == [unit_name("lab", r) for r in ("decode", "lab-router", "prefill")]



def test_a_host_that_refuses_port_forwarding_is_gated_on_the_host_itself(lab: Lab) -> None:
    # The gate's HTTP went through direct-tcpip channels only: on a host with `AllowTcpForwarding no`
    # (rented containers, hardened hosts) every poll was refused and the gate timed out in silence.
    lab.sshd_drop_in("lab1", "00-test-forwarding.conf", "AllowTcpForwarding no\n")
    inv = str(REPO / "lab" / "inventory" / "lab.yml")
    try:
        res = gd("deploy", "--inventory", inv, "--host", "lab1", timeout=300)
        out = res.stdout + res.stderr
        assert res.returncode == 0, out
        assert "[lab1] the ssh server of lab1 refuses port forwarding" in out, out
        assert "gpudeploy makes its HTTP requests on the host itself" in out, out
        assert "smoke /generate through lab1/lab-router: TTFT" in out, out
        assert status_json(REPO / "lab" / "inventory" / "lab.yml", "--host", "lab1")["healthy"]
    finally:
        gd("teardown", "--inventory", inv, "--host", "lab1", "--purge")
        lab.sshd_drop_in("lab1", "00-test-forwarding.conf", None)
