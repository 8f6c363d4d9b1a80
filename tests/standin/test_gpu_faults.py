"""The lab's GPU faults (gpudeploy_lab/gpu_faults.py) as gpudeploy's real host probe sees them through the
stand-in NVML (lab/shims/pynvml.py): an injected Xid is a kernel-log line with the GPU's bus and the host's
clock, and the NVML state that goes with it. Run here on a temporary root, without the lab's hosts."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from standin_support import PYTHON, REPO, Lab

from gpudeploy.facts.gpu_health import parse_short_unix, parse_xid
from gpudeploy.facts.probe import SOURCE
from gpudeploy_lab import gpu_faults


@pytest.fixture
def root(lab: Lab) -> Path:
    """A host's root as gpu_faults writes it: its gpus.json (the stand-in's 4 GPUs) in its place."""
    root = lab.tmp / "root"
    (root / "etc/gpudeploy-lab").mkdir(parents=True)
    (root / gpu_faults.GUEST_GPUS_JSON).write_text(lab.gpus_json.read_text())
    return root


def probe(lab: Lab, root: Path) -> dict[str, Any]:
    """gpudeploy's own host probe, run as on a lab host, its NVML the stand-in reading ``root``."""
    env = lab.env(GPUDEPLOY_LAB_GPUS=str(root / gpu_faults.GUEST_GPUS_JSON),
                  GPUDEPLOY_LAB_KERNEL_LOG=str(root / gpu_faults.GUEST_KERNEL_LOG))
    out = subprocess.run([PYTHON, "-c", SOURCE, json.dumps({"gpus": True, "xids": {"since": 0}})], env=env,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    facts: dict[str, Any] = json.loads(out)
    return facts


def test_a_healthy_stand_in_gpu_answers_as_the_real_h100_did(lab: Lab, root: Path) -> None:
    facts = probe(lab, root)
    [gpu0, *_] = facts["gpus"]["devices"]
    assert gpu0["health"] == {
        "lost": False, "reset_required": False,
        "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": False, "failed": False},
        "retired_pages": None, "ecc": {"enabled": True, "uncorrected_volatile": 0, "uncorrected_aggregate": 0,
                                       "corrected_volatile": 0},
        "clocks_event_reasons": {"mask": 1, "reasons": ["idle"]}, "temperature_c": 34,
        "pcie": {"gen": 5, "max_gen": 5, "width": 16, "max_width": 16}, "nvlink": None}
    assert facts["xids"] == {"source": str(root / gpu_faults.GUEST_KERNEL_LOG), "error": None, "xids": []}


def test_an_injected_xid_79_is_a_kernel_line_and_a_lost_gpu(lab: Lab, root: Path) -> None:
    before = time.time()
    line = gpu_faults.inject_xid(root, "lab2", 1, 79)
    at, message = parse_short_unix(line) or (0.0, "")
    assert before <= at <= time.time()  # the host's clock: the lab's hosts share this machine's
    assert message == "NVRM: Xid (PCI:0000:00:07): 79, GPU has fallen off the bus."  # GPU 1 is 00000000:00:07.0
    facts = probe(lab, root)
    devices = facts["gpus"]["devices"]
    assert [d["health"]["lost"] for d in devices] == [False, True, False, False]
    assert devices[1]["total"] is None and devices[1]["health"]["error"] == "NVMLError_GpuIsLost: GPU is lost"
    [x] = facts["xids"]["xids"]
    assert (x["xid"], x["gpu"], x["bus"]) == (79, 1, "0000:00:07")  # the lost GPU's bus: the one no other has


def test_an_injected_xid_48_adds_an_uncorrected_error_and_a_pending_remap(lab: Lab, root: Path) -> None:
    gpu_faults.inject_xid(root, "lab2", 2, 48, pid=4242)
    h = probe(lab, root)["gpus"]["devices"][2]["health"]
    assert h["ecc"]["uncorrected_volatile"] == 1 and h["ecc"]["uncorrected_aggregate"] == 1
    assert h["remapped_rows"]["pending"] is True
    [x] = probe(lab, root)["xids"]["xids"]
    assert (x["gpu"], x["xid"], x["pid"]) == (2, 48, 4242)


def test_nvml_state_alone_and_back_to_healthy(lab: Lab, root: Path) -> None:
    gpu_faults.set_health(root, 0, remapped_rows=[0, 1, 1, 0], pcie=[5, 5, 8, 16], clocks_event_reasons=0x8)
    gpu_faults.inject_xid(root, "lab2", 3, 119)
    devices = probe(lab, root)["gpus"]["devices"]
    assert devices[0]["health"]["remapped_rows"]["pending"] and devices[0]["health"]["pcie"]["width"] == 8
    assert devices[0]["health"]["clocks_event_reasons"]["reasons"] == ["hw_slowdown"]
    assert devices[3]["health"]["reset_required"] is True
    gpu_faults.healthy_again(root)
    facts = probe(lab, root)
    assert not any(d["health"].get("lost") or d["health"].get("reset_required") or
                   d["health"]["remapped_rows"]["pending"] for d in facts["gpus"]["devices"])
    assert facts["xids"]["xids"] == []


def test_the_state_each_xid_brings() -> None:
    assert gpu_faults.after_xid({}, 79) == {"lost": True}
    assert gpu_faults.after_xid({}, 63) == {"remapped_rows": [0, 0, 1, 0]}
    assert gpu_faults.after_xid({}, 64) == {"remapped_rows": [0, 0, 0, 1]}
    assert gpu_faults.after_xid({"ecc_uncorrected_volatile": 2}, 95)["ecc_uncorrected_volatile"] == 3
    assert gpu_faults.after_xid({}, 13) == {}  # an application's fault: NVML shows nothing
    parsed = parse_xid(gpu_faults.xid_line(1.0, "lab2", "00000000:1A:00.0", 154).split("kernel: ", 1)[1])
    assert parsed is not None and parsed["bus"] == "0000:1a:00" and parsed["xid"] == 154


def test_the_shim_is_what_the_lab_hosts_import() -> None:
    # lab/shims is on their PYTHONPATH (host.py binds it at config.GUEST_SHIMS): the shim names the file
    text = (REPO / "lab" / "shims" / "pynvml.py").read_text()
    assert "STANDIN_KERNEL_LOG" in text and "/var/log/gpudeploy-lab/kernel.log" in text
    assert gpu_faults.GUEST_KERNEL_LOG == "var/log/gpudeploy-lab/kernel.log"
