"""Preflight over recorded host facts: what stops a deploy before any file is touched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpudeploy.apply.preflight import problems
from gpudeploy.plan import load_plan
from gpudeploy.supervisor.systemd import SYSTEMD

REPO = Path(__file__).resolve().parents[2]


def _facts(listening: dict[str, list[int]], procs: list[int]) -> dict[str, Any]:
    unit = load_plan(str(REPO / "lab" / "inventory" / "lab.yml"), host="lab1", role="prefill", memory=False).units[0]
    return {"systemd": True, "listening": listening,
            "gpus": {"devices": [{"index": g, "total": 96 * 2**30, "used": 0} for g in range(8)], "processes": []},
            "units": {unit.name: {"procs": [{"pid": p} for p in procs], "props": {}}}}


def _check(facts: dict[str, Any], force: bool = False) -> list[str]:
    plan = load_plan(str(REPO / "lab" / "inventory" / "lab.yml"), host="lab1", role="prefill", memory=False)
    return problems(plan.inventory.hosts["lab1"], list(plan.units), facts, SYSTEMD.states(facts), SYSTEMD,
                    force=force)


def test_a_port_held_by_a_process_we_cannot_see_is_not_free() -> None:
    # /proc/net/tcp lists the socket but no /proc/PID/fd points at it (another PID namespace, a
    # kernel socket): before, an empty owner list passed as "ours".
    found = _check(_facts({"30000": []}, procs=[]))
    assert any("port 30000 (http of role prefill) is already in use by a process gpudeploy cannot see" in p
               for p in found), found


def test_a_port_held_by_the_unit_itself_is_fine_and_anyone_elses_is_not() -> None:
    assert _check(_facts({"30000": [41]}, procs=[41])) == []
    assert any("already in use by pid 99" in p for p in _check(_facts({"30000": [99]}, procs=[41])))


def test_gpus_nvml_cannot_read_stop_the_deploy_unless_forced() -> None:
    facts = {**_facts({}, procs=[]), "gpus": {"error": "NVML init failed: NVML Shared Library Not Found"}}
    assert _check(facts) == ["cannot check the declared GPUs: NVML init failed: NVML Shared Library Not Found "
                             "(--force deploys without the check)"]
    assert _check(facts, force=True) == []


def test_the_memory_preflight_runs_again_with_what_nvml_says_is_free(tmp_path: Path) -> None:
    """Deploy's second look (issue 22): the plan took the GPU class's free memory; the host's NVML says
    35 GiB are free on GPU 2 (a display or a driver holding memory no compute process lists), so the
    field's FP8 MoE at 0.85 has no room for its KV pool: refused with the GPU and the figure, unless
    --force. With the whole card free it passes."""
    import sys

    sys.path.insert(0, str(REPO / "tests" / "plan"))
    from test_memory_cli import make

    inv = make(tmp_path, {"mem_fraction_static": 0.85})
    plan = load_plan(str(inv))
    host = plan.inventory.hosts["node171"]

    def facts(free_gib: dict[int, float]) -> dict[str, Any]:
        devices = [{"index": g, "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition", "total": int(95.6 * 2**30),
                    "used": int((95.6 - free_gib.get(g, 95.0)) * 2**30), "free": int(free_gib.get(g, 95.0) * 2**30),
                    "numa_node": 0} for g in range(4)]
        return {"systemd": True, "listening": {}, "gpus": {"devices": devices, "processes": []},
                "units": {plan.units[0].name: {"procs": [], "props": {}}}}

    def check(f: dict[str, Any], force: bool = False) -> list[str]:
        return problems(host, list(plan.units), f, SYSTEMD.states(f), SYSTEMD, force=force)

    assert check(facts({})) == []
    found = check(facts({2: 35.0}))
    assert len(found) == 1 and found[0].startswith("GPU 2 (for role srv) has 35.00 GiB free by NVML")
    assert "kv-pool-empty" in found[0] and "(or --force)" in found[0]
    assert check(facts({2: 35.0}), force=True) == []
