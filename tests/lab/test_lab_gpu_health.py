"""GPU health tied to serving, on real hosts (issue 49): what NVML says of a GPU refuses a start, a driver's
Xid names an engine's death, an Xid while serving shows in `status --watch` within a second, `facts` shows
every field, and a healthy GPU changes nothing.

The hosts' NVML is the lab's stand-in (lab/shims/pynvml.py) and their kernel log a file it names: an nspawn
container has no kernel log of its own (gpudeploy_lab/gpu_faults.py says why). ``control.inject_xid`` writes
the driver's line there, with this machine's clock (the hosts share it), and the NVML state that goes with it.
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from conftest import Lab
from deploytools import REPO, Deployments, gd, standin_role, status_json, wait_for

from gpudeploy.plan import unit_name
from gpudeploy_lab import control

pytestmark = pytest.mark.lab
HOST = "lab3"


@pytest.fixture
def gpus_back(lab: Lab) -> Iterator[str]:
    """lab3 with every GPU healthy and an empty kernel log, before and after the test."""
    control.restore_gpu_health(HOST)
    yield HOST
    control.restore_gpu_health(HOST)


def planned_gpus(inventory: object) -> list[int]:
    plan = json.loads(gd("plan", "--inventory", str(inventory), "--json").stdout)
    gpus: list[int] = plan["units"][0]["gpus"]
    return gpus


def unit_file_exists(lab: Lab, unit: str) -> bool:
    return lab.ssh(HOST, f"test -e /etc/systemd/system/{unit}").returncode == 0


def test_a_healthy_gpu_changes_nothing(deployments: Deployments, gpus_back: str) -> None:
    inv = deployments.inventory("ghok", {"srv": standin_role(None)}, host=HOST)
    res = gd("deploy", "--inventory", str(inv))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "WARNING: GPU" not in res.stdout, res.stdout  # no degraded GPU said
    [unit] = status_json(inv)["hosts"][HOST]["units"]
    assert unit["healthy"] and {h["word"] for h in unit["gpu_health"].values()} == {"ok"}, unit
    assert unit["xids"] == []
    text = gd("status", "--inventory", str(inv)).stdout
    gpus = planned_gpus(inv)
    assert f"{gpus[0]}-{gpus[-1]} ok" in text, text


@pytest.mark.parametrize(("fault", "says"), [
    ({"lost": True}, "is lost (NVML answers NVML_ERROR_GPU_IS_LOST: it fell off the bus or stopped answering): "
                     "reset the GPU"),
    ({"remapped_rows": [0, 2, 1, 0]}, "has a pending row remap (rows remapped: 0 for correctable, 2 for "
                                      "uncorrectable errors; it is applied at the next reset)"),
], ids=["lost", "pending-remap"])
def test_an_unhealthy_gpu_refuses_the_deploy_naming_it_and_nothing_starts(
        deployments: Deployments, lab: Lab, gpus_back: str, fault: dict[str, object], says: str) -> None:
    name = "ghlost" if "lost" in fault else "ghremap"
    inv = deployments.inventory(name, {"srv": standin_role(None)}, host=HOST)
    gpu = planned_gpus(inv)[-1]
    control.set_gpu_health(HOST, gpu, **fault)
    res = gd("deploy", "--inventory", str(inv))
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "preflight failed, nothing was changed" in out, out
    assert f"GPU {gpu} (for role srv" in out and says in out, out
    assert "--force deploys anyway" in out and "Traceback" not in res.stderr
    unit = unit_name(name, "srv")
    assert not unit_file_exists(lab, unit)  # nothing was written, nothing started
    assert lab.ssh(HOST, f"systemctl is-active {unit}").stdout.strip() != "active"
    if "remapped_rows" in fault:  # --force overrides, as elsewhere (the stand-in engine serves anyway)
        forced = gd("deploy", "--inventory", str(inv), "--force")
        assert forced.returncode == 0, forced.stdout + forced.stderr


def test_an_xid_79_while_an_engine_starts_is_its_named_cause(deployments: Deployments, lab: Lab,
                                                             gpus_back: str) -> None:
    # the stand-in hangs mid start (capturing CUDA graphs) as an engine whose GPU fell off does
    inv = deployments.inventory("ghxid", {"srv": standin_role("hang")}, host=HOST)
    gpu = planned_gpus(inv)[0]
    unit = unit_name("ghxid", "srv")
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "--search-root", str(REPO), "deploy", "--inventory",
                             str(inv), "--timeout", "20"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        wait_for(lambda: lab.ssh(HOST, f"systemctl is-active {unit}").stdout.strip() == "active", 30,
                 "the engine to start")
        line = control.inject_xid(HOST, gpu, 79)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, out + err
    bus = line.split("(PCI:", 1)[1].split(")", 1)[0]  # the driver's "0000:1a:00"
    assert f"cause: GPU {gpu} ({bus}.0) reported Xid 79, fell off the bus, at " in out, out
    assert ": a hardware fault (the engine said: not ready after 20 s" in out, out
    assert "nothing to change in the settings" in out, out
    assert line.split(" kernel: ", 1)[1] in out  # the kernel's own line is the evidence
    assert "Traceback" not in err


def test_an_xid_48_after_ready_shows_in_status_watch_within_a_second(deployments: Deployments, lab: Lab,
                                                                     gpus_back: str) -> None:
    inv = deployments.inventory("ghwatch", {"srv": standin_role(None)}, host=HOST)
    res = gd("deploy", "--inventory", str(inv))
    assert res.returncode == 0, res.stdout + res.stderr
    gpu = planned_gpus(inv)[0]
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "--search-root", str(REPO), "status", "--watch",
                             "--inventory", str(inv)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    lines: queue.Queue[tuple[float, str]] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put((time.time(), line.rstrip("\n")))

    threading.Thread(target=read, daemon=True).start()
    seen: list[str] = []

    def next_line(want: str, timeout: float) -> tuple[float, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                at, line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            seen.append(line)
            if want in line:
                return at, line
        raise AssertionError(f"no line with {want!r} within {timeout} s; the watch said:\n" + "\n".join(seen))

    try:
        next_line("watching: a death is shown at once", 60)
        # the kernel-log follower reads from the first look's time on: a line written from now is never missed
        line = control.inject_xid(HOST, gpu, 48, pid=main_pid_of(lab, inv))
        logged = float(line.split(" ", 1)[0])  # the kernel line's own time (the host's clock is this machine's)
        shown, text = next_line("GPU FAULT", 10)
        proc.send_signal(signal.SIGINT)
        next_line("stopped watching", 30)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert f"{HOST}/srv: GPU FAULT: GPU {gpu} (" in text and "reported Xid 48, an uncorrectable double-bit ECC " \
        "memory error, at " in text, text
    assert "failing" in text  # its GPU's word changed with it
    print(f"status --watch: Xid 48 shown {shown - logged:.3f} s after the kernel line")
    assert shown - logged < 1.0, (shown - logged, seen)


def main_pid_of(lab: Lab, inv: object) -> int:
    unit = json.loads(gd("status", "--inventory", str(inv), "--json").stdout)["hosts"][HOST]["units"][0]
    pid: int = unit["main_pid"]
    return pid


def test_facts_shows_each_health_field_and_the_xids_since_boot(deployments: Deployments, gpus_back: str) -> None:
    inv = deployments.inventory("ghfacts", {"srv": standin_role(None)}, host=HOST)
    control.set_gpu_health(HOST, 1, pcie=[5, 5, 8, 16], clocks_event_reasons=0x48)
    control.inject_xid(HOST, 2, 48, pid=4242)
    doc = json.loads(gd("facts", "--inventory", str(inv), "--host", HOST, "--json").stdout)[HOST]
    fields = {"lost", "reset_required", "remapped_rows", "retired_pages", "ecc", "clocks_event_reasons",
              "temperature_c", "pcie", "nvlink"}
    assert all(set(g["health"]) == fields for g in doc["gpus"]), doc["gpus"][0]
    g1, g2 = doc["gpus"][1]["health"], doc["gpus"][2]["health"]
    assert g1["pcie"] == {"gen": 5, "max_gen": 5, "width": 8, "max_width": 16}
    assert g1["clocks_event_reasons"]["reasons"] == ["hw_slowdown", "hw_thermal_slowdown"]
    assert g2["ecc"]["uncorrected_volatile"] == 1 and g2["remapped_rows"]["pending"] is True
    kernel = doc["kernel_log"]
    assert kernel["source"] == "/var/log/gpudeploy-lab/kernel.log" and kernel["error"] is None
    [x] = kernel["xids"]
    assert (x["gpu"], x["xid"], x["pid"]) == (2, 48, 4242)
    text = gd("facts", "--inventory", str(inv), "--host", HOST).stdout
    for words in ("remapped rows 0 correctable/0 uncorrectable, pending no, failed no", "ECC on, uncorrected 0 "
                  "volatile/0 aggregate", "clocks idle", "PCIe gen5 x16 of gen5 x16", "NVLink none", "34 C",
                  "GPU 1: ", "PCIe gen5 x8 of gen5 x16", "clocks hw_slowdown, hw_thermal_slowdown",
                  "kernel log (/var/log/gpudeploy-lab/kernel.log): 1 Xid line(s) since boot",
                  "GPU 2 (0000:", "reported Xid 48"):
        assert words in text, (words, text)
    assert "FAILING" in text and "DEGRADED" in text, text
