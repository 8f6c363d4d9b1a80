"""What the host probe's GPU read costs on a real GPU node (issue 26: status's host-side time).

Run on the device machine (a real H100 or H200, its own nvidia-ml-py): ``python3 bench/device_probe_cost.py
--out DIR``. Prints and writes, medians of ``--runs`` fresh processes each: python's start, the
pynvml import, the whole probe with and without ``gpus``, and one in-process breakdown of the GPU
read (import, nvmlInit, the queries, nvmlShutdown), with NVML's persistence mode as the driver
reports it (without it, nvmlInit on an idle GPU can wait for the driver to load the GPU's state).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from gpudeploy.facts import probe  # noqa: E402


def fresh(argv: list[str], runs: int) -> dict[str, float]:
    xs = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, check=True)
        xs.append(time.perf_counter() - t)
    return {"median_ms": round(statistics.median(xs) * 1000, 1), "min_ms": round(min(xs) * 1000, 1),
            "max_ms": round(max(xs) * 1000, 1)}


BREAKDOWN = r"""
import json, time
t0 = time.perf_counter(); import pynvml; t1 = time.perf_counter()
pynvml.nvmlInit(); t2 = time.perf_counter()
n = pynvml.nvmlDeviceGetCount()
for i in range(n):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    pynvml.nvmlDeviceGetMemoryInfo(h); pynvml.nvmlDeviceGetPciInfo(h); pynvml.nvmlDeviceGetName(h)
    pynvml.nvmlDeviceGetUUID(h); pynvml.nvmlDeviceGetPowerUsage(h); pynvml.nvmlDeviceGetEnforcedPowerLimit(h)
    pynvml.nvmlDeviceGetUtilizationRates(h); pynvml.nvmlDeviceGetComputeRunningProcesses(h)
    try:
        pynvml.nvmlDeviceGetNumaNodeId(h)
    except Exception:
        pass
t3 = time.perf_counter()
try:
    pm = pynvml.nvmlDeviceGetPersistenceMode(pynvml.nvmlDeviceGetHandleByIndex(0))
except Exception as exc:
    pm = str(exc)
t4 = time.perf_counter(); pynvml.nvmlShutdown(); t5 = time.perf_counter()
print(json.dumps({"gpus": n, "import_ms": (t1 - t0) * 1000, "init_ms": (t2 - t1) * 1000,
                  "queries_ms": (t3 - t2) * 1000, "shutdown_ms": (t5 - t4) * 1000, "persistence_mode": pm}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    py = sys.executable
    res = {
        "python": sys.version.split()[0],
        "python -c pass": fresh([py, "-c", "pass"], args.runs),
        "import pynvml": fresh([py, "-c", "import pynvml"], args.runs),
        "probe, no gpus": fresh([py, "-c", probe.SOURCE, json.dumps({"units": []})], args.runs),
        "probe, gpus": fresh([py, "-c", probe.SOURCE, json.dumps({"units": [], "gpus": True})], args.runs),
        "breakdown": [json.loads(subprocess.run([py, "-c", BREAKDOWN], capture_output=True, text=True,
                                                check=True).stdout) for _ in range(5)],
        "nvidia-smi": subprocess.run(["nvidia-smi", "--query-gpu=name,persistence_mode,driver_version",
                                      "--format=csv,noheader"], capture_output=True, text=True).stdout.strip(),
    }
    text = json.dumps(res, indent=1)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "probe-cost.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
