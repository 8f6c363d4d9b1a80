"""gpudeploy on a host without systemd, with `connection: local`, on a real GPU (the device's H200).

    python3 bench/device_process.py --out DIR [--gib 40] [--dry-run]

Runs ON the GPU machine, as a user would: `invoke facts`, `invoke deploy` of a GPU stand-in role
(gpudeploy_lab.gpu_standin: a launcher and one worker per TP rank that allocates real GPU memory
with torch), `invoke status` (memory per GPU held by the run), the rank's CUDA device UUID against
NVML's, a SIGKILL of the rank (the run fails with that rank's cause), a role whose rank asks for more
than the GPU has (torch's real OOM, classified), and `invoke teardown` with its proof that the GPU
is free again. Every output is saved under DIR; a summary of the figures is printed and saved.
``--dry-run``: the same flow without a GPU (the stand-in's dry run, no GPUs in the inventory), to
try the script on a machine without one.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from devicecli import REPO, invoker


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--gib", type=float, default=40.0)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path("/tmp/gpudeploy-device")
    (work / "roles").mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    py = sys.executable
    gpu = not args.dry_run

    def role(extra: list[str]) -> dict[str, Any]:
        argv = [py, "-m", "gpudeploy_lab.gpu_standin", "--port", "{{ port }}", "--tp", "1", "--gib", str(args.gib),
                *([] if gpu else ["--dry-run"]), *extra]
        return {"engine": "command", "log_format": "sglang", "gpus": 1 if gpu else 0, "argv": argv,
                "env": {"PYTHONPATH": env["PYTHONPATH"]}, "health": {"timeout_s": 180}, "stop_timeout_s": 10}

    import yaml

    for name, extra in (("gpu", []), ("gpuoom", ["--fault", "oom"])):
        (work / "roles" / f"{name}.yml").write_text(yaml.safe_dump(role(extra)))
    facts0 = _nvml_total()
    inv = {"deployment": "dev", "roles_dir": "roles",
           "hosts": {"h200": {"address": "127.0.0.1", "connection": "local", "python": py, "numa_policy": "none",
                              "numa_nodes": [{"id": 0, "gpus": [0] if gpu else [], "cpus": f"0-{os.cpu_count() - 1}"}],
                              **({"gpu_memory_gib": round(facts0 / 2**30, 1)} if gpu else {}),
                              "roles": ["gpu"]}}}
    (work / "hosts.yml").write_text(yaml.safe_dump(inv))
    # The OOM role wants the same GPU: an inventory of its own (a GPU is given to one role only).
    inv["hosts"]["h200"]["roles"] = ["gpuoom"]
    (work / "hosts-oom.yml").write_text(yaml.safe_dump(inv))
    summary: dict[str, Any] = {"gpu": gpu}

    transcript = out / "transcript.txt"

    gd = invoker(py, env, work, transcript, summary)

    gd("teardown0", "teardown", "--purge")  # an earlier try's leftovers, by their own records
    gd("teardown0_oom", "teardown", "--purge", inventory="hosts-oom.yml")
    facts = gd("facts", "facts", "--json")
    doc = json.loads(facts.stdout or "{}").get("h200", {})
    summary["facts_source"] = doc.get("source")
    summary["nvml_uuid"] = (doc.get("gpus") or [{}])[0].get("uuid")
    summary["init"] = doc.get("init")
    gd("deploy", "deploy", "--host", "h200", "--role", "gpu")
    st = gd("status", "status", "--json")
    units = {u["role"]: u for u in json.loads(st.stdout or "{}").get("hosts", {}).get("h200", {}).get("units", [])}
    summary["gpu_memory_held_gib"] = units.get("gpu", {}).get("gpu_memory_gib")
    summary["pids"] = units.get("gpu", {}).get("pids")
    logs = gd("logs", "logs", "--host", "h200", "--role", "gpu").stdout
    rank_uuid = next((line.rsplit(": ", 1)[1].strip() for line in logs.splitlines() if "GPU UUID of rank 0" in line),
                     None)
    summary["rank0_uuid"] = rank_uuid
    summary["uuid_matches_nvml"] = rank_uuid is not None and rank_uuid == summary["nvml_uuid"]
    # SIGKILL the rank (not the launcher): the run must fail with the rank's cause.
    main_pid = units.get("gpu", {}).get("main_pid")
    workers = [p for p in summary["pids"] or [] if p != main_pid]
    if workers:
        killed_at = time.monotonic()
        os.kill(workers[0], signal.SIGKILL)
        for _ in range(100):
            st2 = json.loads(gd("status_after_kill", "status", "--json").stdout or "{}")
            unit = next(iter(st2.get("hosts", {}).get("h200", {}).get("units", [])), {})
            if unit.get("state", "").startswith("failed"):
                summary["after_rank_kill"] = {"state": unit["state"], "last_failure": unit.get("last_failure"),
                                              "seen_after_s": round(time.monotonic() - killed_at, 2)}
                break
            time.sleep(0.2)
    gd("teardown", "teardown", "--host", "h200", "--role", "gpu")
    summary["nvml_used_after_teardown_gib"] = round(_nvml_used() / 2**30, 2) if gpu else None
    oom = gd("deploy_oom", "deploy", "--host", "h200", "--role", "gpuoom", inventory="hosts-oom.yml")
    cause = next((line.strip() for line in oom.stdout.splitlines() if line.strip().startswith("cause:")), None)
    summary["oom_cause"] = cause
    summary["oom_evidence"] = next((line.strip() for line in oom.stdout.splitlines() if "OutOfMemoryError" in line),
                                   None)
    gd("teardown_oom", "teardown", "--purge", inventory="hosts-oom.yml")
    gd("teardown_all", "teardown", "--purge")
    summary["nvml_used_at_end_gib"] = round(_nvml_used() / 2**30, 2) if gpu else None
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


def _nvml(field: str) -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(getattr(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)), field))
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return 0


def _nvml_total() -> int:
    return _nvml("total")


def _nvml_used() -> int:
    return _nvml("used")


if __name__ == "__main__":
    main()
