"""Rolling updates of a serving PD deployment through the real router (issue 23).

Under load on the real SGLang pair (inventory/lab-sglang.yml): no request fails, the router ends
with exactly the planned engines, each new. With stand-in GPU engines: a new engine that fails its
gate leaves the old ones serving and the router untouched; with no room for a second copy the
deploy is refused with the expected downtime, and ``--allow-downtime`` restarts plainly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import Lab
from deploytools import REPO, Deployments, gd, http, main_pid
from test_pd import pd_roles

from gpudeploy.plan import unit_name
from gpudeploy_lab import engine
from gpudeploy_lab.load import Load

pytestmark = pytest.mark.lab

PAIR = REPO / "inventory" / "lab-sglang.yml"
ROUTER = "http://10.231.0.13:8000"


def workers(router: str) -> list[tuple[str, str, bool]]:
    code, body = http(f"{router}/workers")
    assert code == 200, body
    return sorted((w["url"], w["worker_type"], w["is_healthy"]) for w in json.loads(body)["workers"])


def changed_pair(root: Path, marker: str) -> Path:
    """inventory/lab-sglang.yml with both engines' env changed (so both roll), roles copied beside it."""
    inv = yaml.safe_load(PAIR.read_text())
    (root / "roles").mkdir(parents=True, exist_ok=True)
    for name in ("sglang-cpu-prefill", "sglang-cpu-decode", "sglang-cpu-router"):
        role = yaml.safe_load((REPO / "roles" / f"{name}.yml").read_text())
        if name != "sglang-cpu-router":
            role["env"]["GPUDEPLOY_TEST_VERSION"] = marker
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
        res = gd("deploy", "--inventory", str(first), timeout=900)
        assert res.returncode == 0, res.stdout + res.stderr
        before = {h: main_pid(lab, h, unit_name("lab-sglang", r)) for h, r in
                  (("lab1", "sglang-cpu-prefill"), ("lab2", "sglang-cpu-decode"))}
        second = changed_pair(tmp_path / "b", "2")
        with Load(f"{ROUTER}/generate", clients=2) as load:
            res = gd("deploy", "--inventory", str(second), timeout=900)
        out = res.stdout + res.stderr
        assert res.returncode == 0, out
        assert "rolling lab1/sglang-cpu-prefill, lab2/sglang-cpu-decode through lab3/sglang-cpu-router" in out, out
        failed = [s for s in load.sent if not s.ok]
        print(f"rolling update under load: {len(load.sent)} requests, {len(failed)} failed")
        assert len(load.sent) > 20 and failed == [], failed[:5]
        assert workers(ROUTER) == [("http://10.231.0.11:30000", "prefill", True),
                                   ("http://10.231.0.12:30000", "decode", True)]
        after = {h: main_pid(lab, h, unit_name("lab-sglang", r)) for h, r in
                 (("lab1", "sglang-cpu-prefill"), ("lab2", "sglang-cpu-decode"))}
        assert all(after[h] not in (0, before[h]) for h in before), (before, after)  # new engines
        assert lab.ssh("lab1", "ls /etc/systemd/system/ | grep -c surge || true").stdout.strip() == "0"
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
