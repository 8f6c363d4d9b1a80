"""Check gpudeploy's NVML facts on a real GPU (run on the device machine, not in CI).

What it shows: the host probe's GPU view (facts/remote_probe.gpus) on real NVML; a GPU process
that detached into its own session (an orphaned TP worker) is seen with its memory; teardown's
kill-by-PID-and-start-time ends it; and how fast NVML shows the memory free again. Prints JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from gpudeploy.apply.hostscripts import KILL_EXACT
from gpudeploy.facts.remote_probe import gpus, proc_info

HOLD = """
import os, sys, time, torch
os.setsid()
x = torch.empty(int(float(sys.argv[1]) * 2**30), dtype=torch.uint8, device="cuda")
x.fill_(1); torch.cuda.synchronize()
print("held", flush=True)
time.sleep(600)
"""


def main() -> None:
    report: dict[str, object] = {"before": gpus()}
    child = subprocess.Popen([sys.executable, "-c", HOLD, "6"], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "held"
    info = proc_info(child.pid)
    report["leaked_worker"] = info
    t0 = time.time()
    seen = None
    while time.time() - t0 < 20:
        g = gpus()
        seen = [p for p in g["processes"] if p["pid"] == child.pid]
        if seen:
            break
        time.sleep(0.05)
    report["probe_sees_worker"] = seen
    report["during"] = gpus()
    torch_total = subprocess.run([sys.executable, "-c", "import torch;print(torch.cuda.get_device_properties(0)"
                                  ".total_memory)"], capture_output=True, text=True).stdout.strip()
    report["torch_total_bytes"] = int(torch_total) if torch_total else None
    t_kill = time.time()
    subprocess.run([sys.executable, "-c", KILL_EXACT, str(child.pid), str(info["start_ticks"] if info else "")],
                   check=True)
    child.wait(timeout=10)
    freed_after = None
    while time.time() - t_kill < 20:
        g = gpus()
        if not any(p["pid"] == child.pid for p in g["processes"]) and g["devices"][0]["used"] < 2**30:
            freed_after = time.time() - t_kill
            break
        time.sleep(0.02)
    report["freed_after_s"] = freed_after
    report["after"] = gpus()
    # A reused PID must never be hit: a wrong start time leaves a live process alone.
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    subprocess.run([sys.executable, "-c", KILL_EXACT, str(other.pid), "1"], check=True)
    time.sleep(0.2)
    report["wrong_start_time_spared"] = other.poll() is None
    other.kill()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
