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


# -- GPU health (issue 49): what NVML says of the unit's GPUs (lab.yml's prefill on lab1 has GPUs 0-3) ----------

HEALTHY = {"lost": False, "reset_required": False,
           "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": False, "failed": False},
           "retired_pages": None,
           "ecc": {"enabled": True, "uncorrected_volatile": 0, "uncorrected_aggregate": 0, "corrected_volatile": 0},
           "clocks_event_reasons": {"mask": 1, "reasons": ["idle"]}, "temperature_c": 34,
           "pcie": {"gen": 5, "max_gen": 5, "width": 16, "max_width": 16}, "nvlink": None}


def _with_health(**by_gpu: dict[str, Any]) -> dict[str, Any]:
    """lab1's facts with every GPU healthy but those given (``g2={...}``: GPU 2's health changed so)."""
    facts = _facts({}, procs=[])
    for d in facts["gpus"]["devices"]:
        d["bus_id"] = f"00000000:{0x41 + d['index']:02X}:00.0"
        d["health"] = {**HEALTHY, **by_gpu.get(f"g{d['index']}", {})}
    return facts


def _warnings(facts: dict[str, Any]) -> list[str]:
    from gpudeploy.apply.preflight import warnings

    plan = load_plan(str(REPO / "lab" / "inventory" / "lab.yml"), host="lab1", role="prefill", memory=False)
    return warnings(list(plan.units), facts)


def test_a_healthy_gpu_changes_nothing() -> None:
    assert _check(_with_health()) == [] and _warnings(_with_health()) == []


def test_a_lost_gpu_refuses_the_start_naming_the_gpu_and_what_to_do() -> None:
    facts = _with_health(g2={"lost": True})
    [found] = _check(facts)
    assert found.startswith("GPU 2 (for role prefill, 0000:43:00.0) is lost (NVML answers NVML_ERROR_GPU_IS_LOST: "
                            "it fell off the bus or stopped answering): reset the GPU (`nvidia-smi -r -i 2` with "
                            "nothing running on it); if it stays lost, drain the node and reboot it"), found
    assert found.endswith("--force deploys anyway")
    assert _check(facts, force=True) == []


def test_a_lost_gpu_as_the_probe_reports_it_has_no_size_to_compare() -> None:
    """A lost GPU answers no NVML call: the probe lists it without its memory (remote_probe.lost_record),
    which must be refused for being lost, not for "inventory says 96 GiB but NVML reports 0"."""
    facts = _with_health()
    facts["gpus"]["devices"][1] = {"index": 1, "name": "", "uuid": "", "bus_id": "", "total": None, "used": None,
                                   "free": None, "numa_node": None,
                                   "health": {"lost": True, "reset_required": False, "error": "GPU is lost"}}
    [found] = _check(facts)
    assert found.startswith("GPU 1 (for role prefill) is lost"), found


def test_a_pending_or_failed_row_remap_refuses_the_start() -> None:
    pending = _check(_with_health(g0={"remapped_rows": {"correctable": 0, "uncorrectable": 2, "pending": True,
                                                        "failed": False}}))
    assert pending == ["GPU 0 (for role prefill, 0000:41:00.0) has a pending row remap (rows remapped: 0 for "
                       "correctable, 2 for uncorrectable errors; it is applied at the next reset): reset the GPU "
                       "(`nvidia-smi -r -i 0` with nothing running on it) now, while nothing runs on it; drain the "
                       "node (move its work elsewhere) if the reset does not clear it; --force deploys anyway"]
    failed = _check(_with_health(g3={"remapped_rows": {"correctable": 1, "uncorrectable": 9, "pending": False,
                                                       "failed": True}}))
    assert len(failed) == 1 and "GPU 3 (for role prefill, 0000:44:00.0) has a failed row remap" in failed[0]
    assert "drain the node: the GPU needs service (RMA)" in failed[0]


def test_uncorrected_volatile_ecc_errors_refuse_the_start_and_the_gpus_history_does_not() -> None:
    now = _check(_with_health(g1={"ecc": {**HEALTHY["ecc"], "uncorrected_volatile": 3, "uncorrected_aggregate": 5}}))
    assert len(now) == 1 and "GPU 1 (for role prefill, 0000:42:00.0) has 3 uncorrected ECC error(s) since the " \
        "driver loaded (volatile count)" in now[0]
    assert _check(_with_health(g1={"ecc": {**HEALTHY["ecc"], "uncorrected_aggregate": 5}})) == []


def test_a_gpu_of_no_unit_being_deployed_refuses_nothing() -> None:
    assert _check(_with_health(g6={"lost": True})) == []  # prefill runs on 0-3


def test_a_degraded_link_or_hardware_slowdown_is_a_warning_not_a_refusal() -> None:
    narrow = _with_health(g1={"pcie": {"gen": 5, "max_gen": 5, "width": 8, "max_width": 16}},
                          g2={"clocks_event_reasons": {"mask": 0x48, "reasons": ["hw_slowdown",
                                                                                 "hw_thermal_slowdown"]}})
    assert _check(narrow) == []
    assert _warnings(narrow) == [
        "GPU 1 (for role prefill, 0000:42:00.0) has its PCIe link at x8 of x16: reseat the card or check its riser "
        "and slot (host-to-GPU copies run slower)",
        "GPU 2 (for role prefill, 0000:43:00.0) has its clocks held down: hardware slowdown (HW_SLOWDOWN: the board's "
        "power or temperature sensors); hardware thermal slowdown (too hot): check its cooling and power "
        "(`nvidia-smi -q -d PERFORMANCE` names the reason)"]


def test_a_lower_link_generation_counts_only_while_the_gpu_is_busy() -> None:
    # an idle GPU may train its link down to save power (the H100 probe's stayed at gen5; others do not)
    idle = _with_health(g0={"pcie": {"gen": 1, "max_gen": 5, "width": 16, "max_width": 16}})
    assert _warnings(idle) == []
    busy = _with_health(g0={"pcie": {"gen": 3, "max_gen": 5, "width": 16, "max_width": 16},
                            "clocks_event_reasons": {"mask": 0x4, "reasons": ["sw_power_cap"]}})
    assert _warnings(busy) == ["GPU 0 (for role prefill, 0000:41:00.0) has its PCIe link at gen3 of gen5 while busy: "
                               "check the slot's BIOS settings, the riser or the card (host-to-GPU copies run slower)"]
