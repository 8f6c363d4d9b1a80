"""A fleet of 8 hosts: bounded fan-out, a canary that stops a bad rollout, per-unit JSON records,
and a re-run of only what failed. Every wait is a condition polled against a deadline."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Lab
from deploytools import Deployments, gd, standin_role

import gpudeploy_lab as labctl
from gpudeploy.plan import unit_name

pytestmark = pytest.mark.lab

EXTRA = [f"lab{i}" for i in range(4, 9)]
FLEET = ["lab1", "lab2", "lab3", *EXTRA]


@pytest.fixture(scope="module", autouse=True)
def eight_hosts(lab: Lab) -> Iterator[list[str]]:
    labctl.up(0, extra=EXTRA)
    lab.refresh()
    yield FLEET
    labctl.down(EXTRA)
    lab.refresh()


def fleet(deployments: Deployments, lab: Lab, name: str, role: dict[str, Any],
          roles: dict[str, dict[str, Any]] | None = None, placed: dict[str, str] | None = None) -> Any:
    """One deployment per host (``<name>-<host>``), each of one unit of ``role`` (or of
    ``roles[placed[host]]``)."""
    roles = roles or {"srv": role}
    placed = placed or {}
    first, *rest = FLEET
    return deployments.inventory(
        name, roles, host=first, placed=[placed.get(first, "srv")],
        extra_hosts={h: (lab.address_of(h), [placed.get(h, "srv")]) for h in rest},
        host_settings={h: {"deployment": f"{name}-{h}"} for h in FLEET})


def test_a_bad_setting_fails_on_the_canary_and_leaves_the_rest_of_the_fleet_untouched(
        deployments: Deployments, lab: Lab) -> None:
    inv = fleet(deployments, lab, "can", standin_role("oom-graph", tp=1))
    res = gd("deploy", "--inventory", str(inv), "--serial", "1,50%,100%", "--json", timeout=300)
    assert res.returncode == 1, res.stderr
    doc = json.loads(res.stdout)
    deps = {d["deployment"]: d for d in doc["deployments"]}
    assert deps["can-lab1"]["batch"] == 1 and not deps["can-lab1"]["ok"] and not deps["can-lab1"]["untouched"]
    untouched = [d for d in deps.values() if d["untouched"]]
    assert len(untouched) == 7 and all("the rollout stopped after batch 1" in d["failure"] for d in untouched)
    [rec] = [u for u in doc["units"] if u["host"] == "lab1"]
    assert rec["outcome"] == "failed" and rec["phase"] == "capturing CUDA graphs" and rec["duration_s"] > 0
    assert rec["cause"]["kind"] == "oom-in-graph-capture", rec
    assert "left untouched: can-lab2" in res.stderr  # the report says so as it happens
    for h in [*EXTRA, "lab2", "lab3"]:  # nothing was written or started there
        assert lab.ssh(h, f"test -e /etc/systemd/system/{unit_name(f'can-{h}', 'srv')}").returncode != 0
    text = gd("deploy", "--inventory", str(inv), "--serial", "1,50%,100%", timeout=300).stdout
    assert "deployment can-lab8: NOT DEPLOYED, left untouched: not deployed: the rollout stopped after batch 1" \
        in text, text
    assert "summary: 8 deployments: 0 ready, 1 failed, 7 left untouched" in text, text


def test_json_records_per_unit_and_a_rerun_of_only_what_failed(deployments: Deployments, lab: Lab) -> None:
    good, bad = standin_role(None, tp=1), standin_role("kv-not-enough", tp=1)
    inv = fleet(deployments, lab, "rr", good, roles={"srv": good, "broken": bad}, placed={"lab5": "broken"})
    res = gd("deploy", "--inventory", str(inv), "--json", "--forks", "3", timeout=300)
    assert res.returncode == 1, res.stderr
    doc = json.loads(res.stdout)
    outcomes = {u["host"]: u for u in doc["units"]}
    assert all(outcomes[h]["outcome"] == "started" and outcomes[h]["phase"] == "ready" for h in FLEET if h != "lab5")
    assert outcomes["lab5"]["outcome"] == "failed" and outcomes["lab5"]["cause"]["kind"] == "kv-pool-empty"
    assert sorted(d["deployment"] for d in doc["deployments"] if not d["ok"]) == ["rr-lab5"]

    fixed = fleet(deployments, lab, "rr", good, roles={"srv": good, "broken": good}, placed={"lab5": "broken"})
    assert fixed == inv
    again = gd("deploy", "--inventory", str(inv), "--only-failed", "--json", timeout=300)
    assert again.returncode == 0, again.stderr
    assert "--only-failed: rr-lab5" in again.stderr
    redo = json.loads(again.stdout)
    assert [(u["host"], u["outcome"]) for u in redo["units"]] == [("lab5", "started")]
    nothing = gd("deploy", "--inventory", str(inv), "--only-failed")
    assert "nothing failed last time" in nothing.stderr and "nothing is placed" in nothing.stdout
