"""Rolling updates of a serving PD deployment through the real router (issue 23).

Under load on the real SGLang pair (lab/inventory/lab-sglang.yml): no request fails, the router ends
with exactly the planned engines, each new. With stand-in GPU engines: a new engine that fails its
gate leaves the old ones serving and the router untouched; with no room for a second copy the
deploy is refused with the expected downtime, and ``--allow-downtime`` restarts plainly.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import Lab
from deploytools import REPO, Deployments, gd, http, interrupt_at, main_pid
from test_pd import pd_roles, stopped_at

from gpudeploy.plan import unit_name
from gpudeploy_lab import engine
from gpudeploy_lab.load import Load

pytestmark = pytest.mark.lab

PAIR = REPO / "lab" / "inventory" / "lab-sglang.yml"
ROUTER = "http://10.231.0.13:8000"


def workers(router: str) -> list[tuple[str, str, bool]]:
    code, body = http(f"{router}/workers")
    assert code == 200, body
    return sorted((w["url"], w["worker_type"], w["is_healthy"]) for w in json.loads(body)["workers"])


def evidence(lab: Lab, out: str, load: Load, t0: float) -> str:
    """What a failed roll under load leaves to read: deploy's words, each request's times (seconds
    from the load's start), and the three hosts' journals since the test began (the lab goes down
    with the test, and with it the journals)."""
    times = "\n".join(f"  {s.start - t0:8.3f} {s.end - t0:8.3f} {s.status} {s.error}" for s in load.sent
                      if not s.ok or s.latency_s > 2)
    journal = ("journalctl -o short-precise --no-pager -n 400 | grep -v -e sshd -e systemd-logind -e session- "
               "| cut -c-400")
    logs = [f"--- journal of {h} ---\n" + lab.ssh(h, journal).stdout for h in ("lab1", "lab2", "lab3")]
    return "\n".join([f"--- deploy ---\n{out}", f"--- failed or slow requests ---\n{times}", *logs])


def serves_at_once(router: str, lab: Lab) -> bool:
    """A few rounds of two requests at once through a pair just started, each answered in time.

    Once in CI (never in 9 tries here since, under two busy loops) the real 0.5.23 CPU pair, just
    deployed, left the first two requests sent at the same moment hanging for over 60 s, and the one
    after them; from then on it served. The roll is what the test measures, so a pair that does not serve two
    requests at once is not where it starts: its logs are printed and it is deployed afresh."""
    with Load(f"{router}/generate", clients=2, timeout_s=30, limit_s=120) as warm:
        deadline = time.monotonic() + 90
        while len([s for s in warm.sent if s.ok]) < 8 and time.monotonic() < deadline \
                and not any(not s.ok for s in warm.sent):
            time.sleep(0.2)
    if len(warm.sent) >= 8 and all(s.ok for s in warm.sent):
        return True
    print(f"warm-up: {[(round(s.latency_s, 1), s.status, s.error) for s in warm.sent]}")
    print(evidence(lab, "", warm, 0.0))
    return False


def changed_pair(root: Path, marker: str, model_path: str | None = None) -> Path:
    """lab/inventory/lab-sglang.yml with both engines' env changed (so both roll), roles copied beside it;
    ``model_path``: both engines serve that checkpoint instead."""
    inv = yaml.safe_load(PAIR.read_text())
    (root / "roles").mkdir(parents=True, exist_ok=True)
    for name in ("sglang-cpu-prefill", "sglang-cpu-decode", "sglang-cpu-router"):
        role = yaml.safe_load((REPO / "lab" / "roles" / f"{name}.yml").read_text())
        if name != "sglang-cpu-router":
            role["env"]["GPUDEPLOY_TEST_VERSION"] = marker
            if model_path:
                role["model"]["path"] = model_path
        (root / "roles" / f"{name}.yml").write_text(yaml.safe_dump(role, sort_keys=False))
    inv.update(roles_dir=str(root / "roles"))
    path = root / "hosts.yml"
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path


@pytest.mark.sglang
def test_a_rolling_update_under_load_drops_no_request(lab: Lab, tmp_path: Path) -> None:
    engine.ensure_sglang()
    engine.ensure_router()  # run alone, nothing else built it
    first = changed_pair(tmp_path / "a", "1")
    try:
        for attempt in range(3):
            res = gd("deploy", "--inventory", str(first), timeout=900)
            assert res.returncode == 0, res.stdout + res.stderr
            if serves_at_once(ROUTER, lab):
                break
            print(f"warm-up {attempt + 1}: the real pair did not serve two requests at once; deploying it afresh")
            gd("teardown", "--inventory", str(first), "--purge", timeout=300)
        else:
            pytest.fail("the real pair never served two requests at once after its start (3 fresh deploys)")
        before = {h: main_pid(lab, h, unit_name("lab-sglang", r)) for h, r in
                  (("lab1", "sglang-cpu-prefill"), ("lab2", "sglang-cpu-decode"))}
        second = changed_pair(tmp_path / "b", "2")
        t0 = time.monotonic()
        with Load(f"{ROUTER}/generate", clients=2) as load:
            res = gd("deploy", "--inventory", str(second), timeout=900)
        out = res.stdout + res.stderr
        if res.returncode == 1 and "BROKEN while serving: the prefill's KV transfer thread died" in out:
            # SGLang 0.5.23's own race (mooncake conn.py reads a room another thread has just cleared),
            # seen once under two busy loops: no roll can keep those requests; saying so is the job.
            print(evidence(lab, out, load, t0))
            pytest.xfail("the real prefill's KV transfer thread died mid roll (SGLang 0.5.23's race); the roll "
                         "named it instead of READY")
        assert res.returncode == 0, evidence(lab, out, load, t0)
        assert "rolling lab1/sglang-cpu-prefill, lab2/sglang-cpu-decode through lab3/sglang-cpu-router" in out, out
        failed = [s for s in load.sent if not s.ok]
        print(f"rolling update under load: {len(load.sent)} requests, {len(failed)} failed")
        assert len(load.sent) > 20 and failed == [], evidence(lab, out, load, t0)
        assert workers(ROUTER) == [("http://10.231.0.11:30000", "prefill", True),
                                   ("http://10.231.0.12:30000", "decode", True)]
        after = {h: main_pid(lab, h, unit_name("lab-sglang", r)) for h, r in
                 (("lab1", "sglang-cpu-prefill"), ("lab2", "sglang-cpu-decode"))}
        assert all(after[h] not in (0, before[h]) for h in before), (before, after)  # new engines
        assert lab.ssh("lab1", "ls /etc/systemd/system/ | grep -c surge || true").stdout.strip() == "0"
        # Another checkpoint on both sides (issue 43, item 1): the router would pair the new prefill with
        # the old decode mid roll, so the deploy is refused with its downtime and nothing is touched.
        for h in ("lab1", "lab2"):
            lab.ssh(h, "ln -sfn /opt/gpudeploy/engines/vllm/model /opt/tiny-b", check=True)
        third = changed_pair(tmp_path / "c", "3", model_path="/opt/tiny-b")
        with Load(f"{ROUTER}/generate", clients=2) as load:
            res = gd("deploy", "--inventory", str(third), timeout=900)
        out = res.stdout + res.stderr
        assert res.returncode == 1, out
        assert "its change cannot be rolled through its router" in out, out
        assert ("new prefill lab1/sglang-cpu-prefill with decode lab2/sglang-cpu-decode as it runs now serve "
                "different models") in out, out
        assert "nothing was touched" in out and "`invoke deploy --allow-downtime`" in out, out
        assert "(the last measured startup)" in out, out
        assert {h: main_pid(lab, h, unit_name("lab-sglang", r)) for h, r in
                (("lab1", "sglang-cpu-prefill"), ("lab2", "sglang-cpu-decode"))} == after  # untouched
        failed = [s for s in load.sent if not s.ok]
        assert load.sent and failed == [], evidence(lab, out, load, t0)
        assert workers(ROUTER) == [("http://10.231.0.11:30000", "prefill", True),
                                   ("http://10.231.0.12:30000", "decode", True)]
    finally:
        gd("teardown", "--inventory", str(first), "--purge", timeout=300)


def _tp4(roles: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    for r in ("pre", "dec"):
        roles[r]["tp_size"] = 4
    return roles


def test_a_new_engine_that_fails_its_gate_leaves_the_old_ones_serving(deployments: Deployments, lab: Lab) -> None:
    inv = deployments.inventory("rgate", pd_roles(), host="lab2", placed=["pre", "dec", "rt"])
    assert gd("deploy", "--inventory", str(inv)).returncode == 0
    router = "http://10.231.0.12:8000"
    old = workers(router)
    dec = main_pid(lab, "lab2", unit_name("rgate", "dec"))
    # TP2 engines leave two spare GPUs on each NUMA node: room for a second copy
    inv = deployments.inventory("rgate", pd_roles("oom-graph"), host="lab2", placed=["pre", "dec", "rt"])
    res = gd("deploy", "--inventory", str(inv))
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "failed its gate (as lab2/dec-surge)" in out, out
    assert "the old engines keep serving and the router was not touched" in out, out
    assert workers(router) == old
    assert main_pid(lab, "lab2", unit_name("rgate", "dec")) == dec
    assert "surge" not in lab.ssh("lab2", "ls /etc/systemd/system/").stdout


def test_no_room_for_a_second_copy_is_refused_with_the_expected_downtime(deployments: Deployments,
                                                                           lab: Lab) -> None:
    # TP4 prefill and TP4 decode take all 8 GPUs of the host: a second copy has nowhere to go.
    inv = deployments.inventory("rroom", _tp4(pd_roles()), host="lab2", placed=["pre", "dec", "rt"])
    assert gd("deploy", "--inventory", str(inv)).returncode == 0
    dec = main_pid(lab, "lab2", unit_name("rroom", "dec"))
    roles = _tp4(pd_roles())
    roles["dec"]["env"]["GPUDEPLOY_TEST_VERSION"] = "2"
    inv = deployments.inventory("rroom", roles, host="lab2", placed=["pre", "dec", "rt"])
    res = gd("deploy", "--inventory", str(inv))
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "a rolling update needs room for a second copy of each engine, and there is none" in out, out
    assert "lab2/dec: lab2 has no 4 spare GPUs on one NUMA node" in out, out
    assert "a plain restart takes it down for about" in out and "(the last measured startup)" in out, out
    assert main_pid(lab, "lab2", unit_name("rroom", "dec")) == dec  # nothing was touched
    res = gd("deploy", "--inventory", str(inv), "--allow-downtime")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "no room for a rolling update; restarting it plainly (--allow-downtime)" in res.stdout, res.stdout
    assert main_pid(lab, "lab2", unit_name("rroom", "dec")) != dec


def test_a_standin_pair_rolls_with_no_failed_request(deployments: Deployments, lab: Lab) -> None:
    roles = pd_roles()
    inv = deployments.inventory("rsta", roles, host="lab2", placed=["pre", "dec", "rt"])
    assert gd("deploy", "--inventory", str(inv)).returncode == 0
    roles["dec"]["env"]["GPUDEPLOY_TEST_VERSION"] = "2"
    roles["pre"]["env"]["GPUDEPLOY_TEST_VERSION"] = "2"
    inv = deployments.inventory("rsta", roles, host="lab2", placed=["pre", "dec", "rt"])
    with Load("http://10.231.0.12:8000/generate", clients=2) as load:
        res = gd("deploy", "--inventory", str(inv))
    assert res.returncode == 0, res.stdout + res.stderr
    failed = [s for s in load.sent if not s.ok]
    assert load.sent and failed == [], failed[:5]


def test_an_engine_that_breaks_while_the_roll_goes_on_is_not_called_ready(deployments: Deployments, lab: Lab) -> None:
    # A loaded run's real 0.5.23 prefill lost its KV transfer thread 30 s after its gate, while the
    # decode rolled; it kept answering /health, the smoke generation took a path that worked, and the
    # roll said READY while half the requests hung. Here the new prefill's thread dies once the roll
    # has moved on to the decode.
    roles = pd_roles()
    inv = deployments.inventory("rbrk", roles, host="lab2", placed=["pre", "dec", "rt"])
    assert gd("deploy", "--inventory", str(inv)).returncode == 0
    trigger = "/run/gpudeploy-test-rbrk-thread-dies"
    lab.ssh("lab2", f"rm -f {trigger}", check=True)
    roles["pre"]["env"].update(GPUDEPLOY_TEST_VERSION="2", SGLANG_STANDIN_FAULT="transfer-thread-dies",
                               SGLANG_STANDIN_FAULT_WHEN=trigger)
    roles["dec"]["env"]["GPUDEPLOY_TEST_VERSION"] = "2"
    inv = deployments.inventory("rbrk", roles, host="lab2", placed=["pre", "dec", "rt"])
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "--search-root", str(REPO), "deploy", "--inventory",
                             str(inv)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "lab2/pre is new and back in the router" in line:
            lab.ssh("lab2", f"touch {trigger}", check=True)  # the decode's roll is still to come
            break
    seen += proc.stdout.readlines()
    out = "".join(seen)
    assert proc.wait(timeout=300) == 1, out
    assert "lab2/dec is new and back in the router" in out, out  # it broke after its own step
    assert "[lab2/pre] BROKEN while serving: the prefill's KV transfer thread died" in out, out
    assert "lab2/pre broke after its start, while the roll went on" in out and "restart this server" in out, out
    assert "READY" not in out.split("deployment rbrk:")[-1].splitlines()[0], out


def test_ctrl_c_mid_roll_says_what_is_left_and_the_next_deploy_finishes_the_roll(deployments: Deployments,
                                                                                  lab: Lab) -> None:
    roles = pd_roles()
    inv = deployments.inventory("rint", roles, host="lab2", placed=["pre", "dec", "rt"])
    assert gd("deploy", "--inventory", str(inv)).returncode == 0
    router = "http://10.231.0.12:8000"
    old = workers(router)
    pre = main_pid(lab, "lab2", unit_name("rint", "pre"))
    # The new prefill hangs in its CUDA-graph capture: Ctrl-C while its surge copy is gated.
    roles["pre"]["env"].update(GPUDEPLOY_TEST_VERSION="2", SGLANG_STANDIN_FAULT="hang")
    inv = deployments.inventory("rint", roles, host="lab2", placed=["pre", "dec", "rt"])
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "--search-root", str(REPO), "deploy", "--inventory",
                             str(inv)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, took = interrupt_at(proc, "capturing CUDA graphs")
    assert proc.returncode == 130 and "Traceback" not in out, out
    assert took < 10, f"{took:.1f} s"
    surge = unit_name("rint", "pre-surge")
    assert f"lab2/pre-surge: {surge} MainPID" in out, out  # left running, still starting: said so
    assert "the router was not touched: it still sends to lab2/pre, lab2/dec" in out, out
    assert workers(router) == old and main_pid(lab, "lab2", unit_name("rint", "pre")) == pre  # true
    # Deploy again, with a new prefill that starts: the copy left behind is stopped, then the roll runs.
    roles["pre"]["env"].update(GPUDEPLOY_TEST_VERSION="3", SGLANG_STANDIN_FAULT="")
    inv = deployments.inventory("rint", roles, host="lab2", placed=["pre", "dec", "rt"])
    res = gd("deploy", "--inventory", str(inv))
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "lab2/pre-surge, left by an interrupted or failed rolling update: stopped and removed" in out, out
    assert "rolling lab2/pre through lab2/rt" in out, out
    assert "surge" not in lab.ssh("lab2", "ls /etc/systemd/system/ /etc/gpudeploy/").stdout
    assert sorted(w[1:] for w in workers(router)) == [("decode", True), ("prefill", True)]
    assert main_pid(lab, "lab2", unit_name("rint", "pre")) not in (0, pre)


def started_at(lab: Lab, host: str, unit: str) -> int:
    """When systemd last logged "Started <unit>" (µs since the epoch; 0 if never)."""
    out = lab.ssh(host, f"journalctl -u {unit} -o json --output-fields=MESSAGE", check=True).stdout
    times = [int(e["__REALTIME_TIMESTAMP"]) for e in map(json.loads, out.splitlines())
             if str(e.get("MESSAGE", "")).startswith(f"Started {unit}")]
    return max(times, default=0)


def test_a_new_checkpoint_restarts_plainly_with_no_old_engine_beside_a_new_one(deployments: Deployments,
                                                                               lab: Lab) -> None:
    # Issue 43, item 1, with --allow-downtime: every changed engine is stopped before any starts again,
    # so the router never lists a new prefill beside an old decode.
    roles = pd_roles()
    inv = deployments.inventory("rckpt", roles, host="lab2", placed=["pre", "dec", "rt"])
    assert gd("deploy", "--inventory", str(inv)).returncode == 0
    for r in ("pre", "dec"):
        roles[r]["model"] = {"path": "/models/tiny-b"}
    inv = deployments.inventory("rckpt", roles, host="lab2", placed=["pre", "dec", "rt"])
    res = gd("deploy", "--inventory", str(inv))
    out = res.stdout + res.stderr
    assert res.returncode == 1 and "its change cannot be rolled through its router" in out, out
    assert "new prefill lab2/pre with decode lab2/dec as it runs now serve different models" in out, out
    res = gd("deploy", "--inventory", str(inv), "--allow-downtime")
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "restarting it plainly (--allow-downtime), every changed engine stopped before any starts again" in out
    pre, dec = unit_name("rckpt", "pre"), unit_name("rckpt", "dec")
    assert max(stopped_at(lab, "lab2", pre), stopped_at(lab, "lab2", dec)) \
        < min(started_at(lab, "lab2", pre), started_at(lab, "lab2", dec)), out


def test_a_named_decode_instance_rolls_under_load_as_a_decode_worker(deployments: Deployments, lab: Lab) -> None:
    # Issue 43, item 2: upstreams name the role file (dec); the instance is dec-a.
    roles = pd_roles()
    placed: list[Any] = ["pre", {"role": "dec", "name": "dec-a", "gpus": [4, 5]}, "rt"]
    inv = deployments.inventory("rnamed", roles, host="lab2", placed=placed)
    assert gd("deploy", "--inventory", str(inv)).returncode == 0
    router = "http://10.231.0.12:8000"
    dec = main_pid(lab, "lab2", unit_name("rnamed", "dec-a"))
    roles["dec"]["env"]["GPUDEPLOY_TEST_VERSION"] = "2"
    inv = deployments.inventory("rnamed", roles, host="lab2", placed=placed)
    with Load(f"{router}/generate", clients=2) as load:
        res = gd("deploy", "--inventory", str(inv))
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "lab2/dec-a-surge joined the router as a decode worker" in out, out
    failed = [s for s in load.sent if not s.ok]
    assert load.sent and failed == [], failed[:5]
    # dec-a is back on its planned port (the second placement: 30010) as the router's decode worker
    assert workers(router) == [("http://10.231.0.12:30000", "prefill", True),
                               ("http://10.231.0.12:30010", "decode", True)]
    assert main_pid(lab, "lab2", unit_name("rnamed", "dec-a")) not in (0, dec)
