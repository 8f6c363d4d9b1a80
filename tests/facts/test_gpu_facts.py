"""GPU facts from recorded NVML values (shared/reference/h200-nvml-probe.md), and the inventory checks."""

from __future__ import annotations

from pathlib import Path

from gpudeploy.facts.check import layout_problems, version_problems
from gpudeploy.facts.host import from_probe
from gpudeploy.facts.remote_probe import gpu_record, sysfs_bus_id
from gpudeploy.model import Host, NumaNode, SshConfig

# One H200, read with nvidia-ml-py on 2026-11-29 (h200-nvml-probe.md).
H200 = {"index": 0, "name": "NVIDIA H200", "uuid": "GPU-6e92d042-f5db-2c0f-70df-fc4595ae00fc",
        "bus_id": "00000000:00:06.0", "total": 150754820096, "used": 644939776, "free": 150109880320}


def _host(numa: int = 0, mem: float = 140.4) -> Host:
    return Host(name="h200", address="192.0.2.1", ssh=SshConfig(), numa_nodes=(NumaNode(numa, (0,), "0-15"),),
                gpu_memory_gib={0: mem}, engine_versions={}, python="python3", bind_address="0.0.0.0",
                numa_policy="none", env={}, placements=())


def test_the_numa_node_comes_from_sysfs_when_nvml_does_not_support_it(tmp_path: Path) -> None:
    # nvmlDeviceGetNumaNodeId raised NVMLError_NotSupported on that VM; the kernel knows the PCI device.
    (tmp_path / "0000:00:06.0").mkdir()
    (tmp_path / "0000:00:06.0" / "numa_node").write_text("1\n")
    rec = gpu_record(0, b"NVIDIA H200", "GPU-6e92d042-f5db-2c0f-70df-fc4595ae00fc", b"00000000:00:06.0",
                     H200["total"], H200["used"], H200["free"], None, sysfs=str(tmp_path))
    assert rec == {**H200, "numa_node": 1}
    assert gpu_record(0, "x", None, "00000000:00:06.0", 1, 0, None, None, sysfs=str(tmp_path / "none"))["numa_node"] \
        is None  # unknown stays unknown: never guessed
    assert sysfs_bus_id("00000000:1A:00.0") == "0000:1a:00.0"


def test_layout_mismatches_name_the_gpu_and_both_values() -> None:
    assert layout_problems(_host(), [{**H200, "numa_node": 0}]) == []
    assert layout_problems(_host(numa=0), [{**H200, "numa_node": 1}]) == [
        "inventory puts GPU 0 on NUMA node 0 but the host has it on NUMA node 1 (00000000:00:06.0); fix numa_nodes"]
    wrong = layout_problems(_host(mem=48.0), [{**H200, "numa_node": None}])
    assert wrong == ["inventory says GPU 0 has 48 GiB but NVML reports 140.4 GiB; fix gpu_memory_gib"]
    assert layout_problems(_host(), []) == ["declared GPUs [0] do not exist (NVML sees 0 GPUs)"]


def test_without_nvml_the_inventorys_gpus_are_shown_and_marked() -> None:
    facts = from_probe(_host(), {"gpus": {"source": None, "error": "pynvml is not installed for this python",
                                          "devices": [], "processes": []}, "init": "none (PID 1 is tini)"})
    assert facts.source == "inventory" and facts.nvml_error == "pynvml is not installed for this python"
    assert facts.gpus[0]["name"] == "(inventory)" and facts.gpus[0]["used"] is None


def test_a_host_running_another_release_than_planned_is_named() -> None:
    found = version_problems(_host(), [("decode", "/opt/sglang/bin/python", "sglang", "0.5.23")],
                             {"/opt/sglang/bin/python": {"sglang": "0.5.24"}})
    assert found and "has sglang 0.5.24, but the plan rendered role decode's flags for 0.5.23" in found[0]
    assert version_problems(_host(), [("decode", "py", "sglang", "0.5.23")], {"py": {"sglang": "0.5.23"}}) == []


def test_what_facts_reported_on_the_real_h200_checks_against_an_inventory() -> None:
    # `invoke facts --json` on the device's H200 (bench/device_process.py, 2026-12-01): NVML gave no
    # NUMA node there (NotSupported, and no sysfs node for the device), which stays unknown.
    import json

    doc = json.loads((Path(__file__).parent / "data" / "h200-facts-2026-12-01.json").read_text())["h200"]
    [gpu] = doc["gpus"]
    assert gpu["name"] == "NVIDIA H200" and gpu["uuid"].startswith("GPU-") and gpu["numa_node"] is None
    assert layout_problems(_host(mem=140.4), doc["gpus"]) == []
    assert layout_problems(_host(mem=48.0), doc["gpus"]) == [
        "inventory says GPU 0 has 48 GiB but NVML reports 140.4 GiB; fix gpu_memory_gib"]
