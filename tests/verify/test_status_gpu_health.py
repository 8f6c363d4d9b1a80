"""Status: one health word per GPU of each unit (NVML's reading, and the Xids its GPUs reported while its
run served), and a failed unit's cause with its GPU's fault named first."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from gpudeploy.plan import load_plan
from gpudeploy.report import status_text
from gpudeploy.verify.status import gpu_words, probe_spec, read_facts

REPO = Path(__file__).resolve().parents[2]
PLAN = load_plan(str(REPO / "lab" / "inventory" / "lab.yml"), host="lab1", memory=False)
LAB1 = PLAN.inventory.hosts["lab1"]
UNITS = [u for u in PLAN.units if u.host.name == "lab1"]
PREFILL = next(u for u in UNITS if u.role.name == "prefill")  # GPUs 0-3
DECODE = next(u for u in UNITS if u.role.name == "decode")  # GPUs 4-7
STARTED = 1_765_100_000.0
HEALTHY = {"lost": False, "reset_required": False,
           "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": False, "failed": False},
           "ecc": {"enabled": True, "uncorrected_volatile": 0, "uncorrected_aggregate": 0, "corrected_volatile": 0},
           "clocks_event_reasons": {"mask": 0, "reasons": []},
           "pcie": {"gen": 5, "max_gen": 5, "width": 16, "max_width": 16}, "nvlink": None}


def facts(decode_failed: bool = False, health: dict[int, dict[str, Any]] | None = None,
          xids: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    units = {}
    for u in UNITS:
        failed = u is DECODE and decode_failed
        props = {"Id": u.name, "LoadState": "loaded", "ActiveState": "failed" if failed else "active",
                 "SubState": "failed" if failed else "running", "MainPID": "0" if failed else "41",
                 "InvocationID": f"inv-{u.role.name}", "Result": "exit-code" if failed else "success",
                 "ExecMainStatus": "1" if failed else "0"}
        units[u.name] = {"props": props, "procs": [], "meta": {"deployment": "lab", "role": u.role.name},
                         "journal": ["RuntimeError: CUDA error: unspecified launch failure"] if failed else [],
                         "record": {"invocation": f"inv-{u.role.name}", "started_us": int(STARTED * 1e6),
                                    "state": "ready"}}
    devices = [{"index": g, "bus_id": f"00000000:{0x41 + g:02X}:00.0", "used": 2**30, "total": 96 * 2**30,
                "health": copy.deepcopy({**HEALTHY, **(health or {}).get(g, {})})} for g in range(8)]
    return {"systemd": True, "now": STARTED + 100, "units": units, "process_units": {},
            "http": {u.name: {"status": 200} for u in UNITS},
            "gpus": {"devices": devices, "processes": []},
            "xids": {"source": "journal", "error": None, "xids": xids or []}}


def statuses(f: dict[str, Any]) -> dict[str, Any]:
    return {s.role: s for s, _ in read_facts(LAB1, UNITS, f, "lab")}


def test_status_asks_for_the_kernel_logs_xids_where_it_reads_gpus() -> None:
    spec = probe_spec(LAB1, UNITS, ["lab"])
    assert spec["gpus"] and spec["xids"] == {"since": 0}
    assert "xids" not in probe_spec(LAB1, UNITS, ["lab"], light=True)  # the watch's light poll


def test_each_gpu_of_a_unit_has_one_word() -> None:
    got = statuses(facts(health={1: {"remapped_rows": {**HEALTHY["remapped_rows"], "pending": True}},
                                 2: {"pcie": {"gen": 5, "max_gen": 5, "width": 8, "max_width": 16}},
                                 3: {"lost": True}}))
    prefill, router = got["prefill"], got["lab-router"]
    assert {g: h["word"] for g, h in prefill.gpu_health.items()} == {0: "ok", 1: "failing", 2: "degraded", 3: "lost"}
    assert prefill.gpu_health[2]["why"] == ["has its PCIe link at x8 of x16"]
    assert gpu_words(prefill.gpu_health) == "0 ok, 1 failing, 2 degraded, 3 lost"
    assert gpu_words(got["decode"].gpu_health) == "4-7 ok"
    assert router.gpu_health == {}  # no GPUs
    text, _ = status_text({"lab1": list(got.values())})
    header, *rows = text.splitlines()
    assert "GPUS" in header
    assert any("prefill" in r and "0 ok, 1 failing, 2 degraded, 3 lost" in r for r in rows), text
    assert "lab1/prefill: GPU 1 FAILING: has a pending row remap" in text
    assert "lab1/prefill: GPU 3 LOST: is lost (NVML answers NVML_ERROR_GPU_IS_LOST" in text
    doc = prefill.to_json()
    assert doc["gpu_health"]["1"]["word"] == "failing" and doc["xids"] == []


def test_a_hardware_xid_while_the_run_serves_makes_its_gpu_failing_and_an_older_one_does_not() -> None:
    dbe = {"at": STARTED + 50, "bus": "0000:45:00", "gpu": 4, "xid": 48, "pid": 9, "name": "python3",
           "text": "NVRM: Xid (PCI:0000:45:00): 48, pid=9, name=python3, DBE"}
    before = {**dbe, "at": STARTED - 3600}
    got = statuses(facts(xids=[before, dbe]))
    decode = got["decode"]
    assert decode.xids == [dbe]
    assert decode.gpu_health[4]["word"] == "failing"
    assert any("reported Xid 48, an uncorrectable double-bit ECC memory error" in w
               for w in decode.gpu_health[4]["why"])
    assert gpu_words(got["prefill"].gpu_health) == "0-3 ok"  # another unit's GPU: its own words


def test_a_failed_unit_names_its_gpus_fault_before_the_engines_words() -> None:
    fell = {"at": STARTED + 60, "bus": "0000:46:00", "gpu": 5, "xid": 79, "pid": None, "name": None,
            "text": "NVRM: Xid (PCI:0000:46:00): 79, GPU has fallen off the bus."}
    decode = statuses(facts(decode_failed=True, health={5: {"lost": True}}, xids=[fell]))["decode"]
    assert decode.last_failure is not None
    assert decode.last_failure.startswith("GPU 5 (0000:46:00.0) reported Xid 79, fell off the bus, at "), \
        decode.last_failure
    assert decode.next_step is not None and decode.next_step.endswith("nothing to change in the settings")
    assert decode.failure_lines[0].endswith("kernel: NVRM: Xid (PCI:0000:46:00): 79, GPU has fallen off the bus.")
