"""Issue 17: a "PD pair" of GPU stand-ins on one real multi-GPU node, deployed by gpudeploy itself.

    python3 bench/device_pd.py --out DIR [--gib 8] [--dry-run --gpus 8]

Runs ON the GPU machine (``connection: local``, the process supervisor: the device has no systemd),
as a user would, with the layout the node allows:

    8+ GPUs: a TP4 "prefill" and a TP4 "decode"    4-7 GPUs: two TP2 servers
    2-3 GPUs: two TP1 servers                       1 GPU: one TP1 server (no pair: said so)

Each server is ``gpudeploy_lab.gpu_standin``: a launcher and one worker per TP rank that joins a
real NCCL group (a checked all-reduce) and allocates ``--gib`` GiB of real GPU memory. In order:
``invoke facts`` (indices, PCI bus ids, NUMA nodes, memory, processes) and an inventory built
from them; ``invoke plan``; ``invoke deploy`` of the whole deployment (its facts preflight checks
the inventory against the GPUs); per server, each rank's CUDA device UUID against the NVML UUID of
the GPU the plan gave that rank (CUDA_VISIBLE_DEVICES + PCI bus order against NVML's indices);
``invoke status`` (memory per GPU held by each run); a SIGKILL of one rank (its server fails with
that rank's cause); ``invoke teardown`` and NVML's memory per GPU against before. Every command's
output goes to DIR/transcript.txt, the figures to DIR/summary.json.

``--dry-run --gpus N``: the same flow on a machine without a GPU (inventory GPUs on paper, the
stand-in's dry run: no torch, no NCCL), to try the script before spending device time.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from devicecli import REPO, invoker

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
GIB = 1 << 30


def layout(gpus: int) -> tuple[int, list[str]]:
    """(TP per server, server roles) for a node of ``gpus`` GPUs."""
    if gpus >= 8:
        return 4, ["prefill", "decode"]
    if gpus >= 4:
        return 2, ["prefill", "decode"]
    if gpus >= 2:
        return 1, ["prefill", "decode"]
    return 1, ["prefill"]


def nvml_gpus() -> list[dict[str, Any]]:
    """NVML's view, in its index order: uuid, bus id, used bytes."""
    import pynvml

    pynvml.nvmlInit()
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            bus = pynvml.nvmlDeviceGetPciInfo(h).busId
            out.append({"index": i, "uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
                        "bus_id": bus.decode() if isinstance(bus, bytes) else bus,
                        "total": int(mem.total), "used": int(mem.used)})
        return out
    finally:
        pynvml.nvmlShutdown()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--gib", type=float, default=8.0, help="GiB each rank holds (8)")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--gpus", type=int, default=8, help="--dry-run: GPUs on paper (8)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path("/tmp/gpudeploy-device-pd")
    (work / "roles").mkdir(parents=True, exist_ok=True)
    py = sys.executable
    env = {**os.environ, **NO_MULTICAST,
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH")) if p)}
    gpu = not args.dry_run
    summary: dict[str, Any] = {"gpu": gpu}
    transcript = out / "transcript.txt"

    gd = invoker(py, env, work, transcript, summary)

    # What the node has (NVML, as facts will read it too); the inventory is built from it.
    before = nvml_gpus() if gpu else [{"index": i, "uuid": f"GPU-00000000-0000-0000-0000-{i:012d}",
                                       "bus_id": f"00000000:{i:02x}:00.0", "total": 150 * GIB, "used": 0}
                                      for i in range(args.gpus)]
    summary["nvml_before"] = before
    tp, servers = layout(len(before))
    summary["layout"] = {"gpus": len(before), "tp": tp, "servers": servers, "pair": len(servers) == 2}
    numa: dict[int, list[int]] = {}
    if gpu:
        for g in before:
            path = Path(f"/sys/bus/pci/devices/{g['bus_id'].lower()[4:]}/numa_node")
            node = int(path.read_text()) if path.exists() else -1
            numa.setdefault(max(node, 0), []).append(g["index"])  # -1: the kernel knows no NUMA node
    else:
        half = max(1, len(before) // 2)
        for g in before:
            numa.setdefault(g["index"] // half, []).append(g["index"])
    cpus = f"0-{(os.cpu_count() or 1) - 1}"
    import yaml

    for name in servers:
        argv = [py, "-m", "gpudeploy_lab.gpu_standin", "--port", "{{ port }}", "--tp", str(tp), "--gib", str(args.gib),
                "--model-path", name, *([] if gpu else ["--dry-run"])]
        role = {"engine": "command", "log_format": "sglang", "gpus": tp, "argv": argv,
                "env": {"PYTHONPATH": env["PYTHONPATH"], **NO_MULTICAST}, "health": {"timeout_s": 300},
                "stop_timeout_s": 15, "allow_span_numa": True}
        (work / "roles" / f"{name}.yml").write_text(yaml.safe_dump(role))
    host: dict[str, Any] = {"address": "127.0.0.1", "connection": "local", "python": py, "numa_policy": "none",
                            "numa_nodes": [{"id": n, "gpus": gs, "cpus": cpus} for n, gs in sorted(numa.items())],
                            "roles": servers}
    host["gpu_memory_gib"] = round(before[0]["total"] / GIB, 1)
    inv = {"deployment": "pd", "roles_dir": "roles", "hosts": {"node": host}}
    (work / "hosts.yml").write_text(yaml.safe_dump(inv))

    gd("teardown0", "teardown", "--purge")  # an earlier try's leftovers, by their own run records
    facts = json.loads(gd("facts", "facts", "--json").stdout or "{}").get("node", {})
    summary["facts"] = {"source": facts.get("source"), "init": facts.get("init"),
                        "gpus": [{k: g.get(k) for k in ("index", "uuid", "bus_id", "numa_node", "total", "used")}
                                 for g in facts.get("gpus") or []],
                        "processes": facts.get("processes")}
    plan = json.loads(gd("plan", "plan", "--json").stdout or "{}")
    placed = {u["role"]: u for u in plan.get("units", [])}
    summary["plan"] = {r: {"gpus": u["gpus"], "cuda_visible_devices": u["env"].get("CUDA_VISIBLE_DEVICES"),
                           "numa_node": u["numa_node"], "port": u["ports"].get("http")} for r, u in placed.items()}
    gd("deploy", "deploy", *([] if gpu else ["--force"]), timeout=600)  # on paper: no NVML to check against

    # Each rank's CUDA device is the NVML GPU the plan assigned it.
    uuids = {g["index"]: g["uuid"] for g in before}
    checks: dict[str, Any] = {}
    for name, u in placed.items():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{u['ports']['http']}/server_info", timeout=5) as r:
                info = json.loads(r.read())
        except OSError as e:
            checks[name] = {"error": str(e)}
            continue
        ranks = []
        for rk in info.get("ranks", []):
            want = uuids.get(u["gpus"][rk["rank"]])
            ranks.append({"rank": rk["rank"], "pid": rk["pid"], "planned_gpu": u["gpus"][rk["rank"]],
                          "cuda_uuid": rk["uuid"], "nvml_uuid": want, "match": rk["uuid"] == want,
                          "nccl_all_reduce_ms": rk.get("nccl_all_reduce_ms"),
                          "gpu_gib": round(rk.get("gpu_bytes_used", 0) / GIB, 2)})
        checks[name] = {"ranks": ranks, "all_match": bool(ranks) and all(r["match"] for r in ranks)}
    summary["uuid_checks"] = checks

    st = json.loads(gd("status", "status", "--json").stdout or "{}")
    units = {u["role"]: u for u in st.get("hosts", {}).get("node", {}).get("units", [])}
    summary["status"] = {r: {"state": u.get("state"), "health": u.get("health"), "pids": u.get("pids"),
                             "gpu_memory_gib": u.get("gpu_memory_gib")} for r, u in units.items()}

    # SIGKILL one rank of the last server: that server fails with the rank's cause; the other keeps running.
    victim_role = servers[-1]
    victim = next((r for r in checks.get(victim_role, {}).get("ranks", []) if r["rank"] == tp - 1), None)
    if victim is not None:
        killed_at = time.monotonic()
        os.kill(victim["pid"], signal.SIGKILL)
        deadline = killed_at + 30
        while time.monotonic() < deadline:
            st2 = json.loads(gd("status_after_kill", "status", "--json").stdout or "{}")
            now = {u["role"]: u for u in st2.get("hosts", {}).get("node", {}).get("units", [])}
            if str(now.get(victim_role, {}).get("state", "")).startswith("failed"):
                summary["after_rank_kill"] = {
                    "killed": {"role": victim_role, "rank": victim["rank"], "pid": victim["pid"]},
                    "state": now[victim_role]["state"], "last_failure": now[victim_role].get("last_failure"),
                    "seen_after_s": round(time.monotonic() - killed_at, 2),
                    "others": {r: u.get("state") for r, u in now.items() if r != victim_role}}
                break
            time.sleep(0.2)
    gd("teardown", "teardown", "--purge")
    if gpu:
        def freed(after: list[dict[str, Any]]) -> bool:  # each GPU back to what it held before (256 MiB slack)
            return all(a["used"] <= b["used"] + 256 * 2**20 for a, b in zip(after, before, strict=True))

        deadline = time.monotonic() + 20
        after = nvml_gpus()
        while time.monotonic() < deadline and not freed(after):
            time.sleep(0.2)
            after = nvml_gpus()
        summary["nvml_after_teardown"] = [{"index": a["index"], "used_gib": round(a["used"] / GIB, 2),
                                           "before_gib": round(b["used"] / GIB, 2)}
                                          for a, b in zip(after, before, strict=True)]
        summary["all_gpus_freed"] = freed(after)
    facts2 = json.loads(gd("facts_after", "facts", "--json").stdout or "{}").get("node", {})
    summary["processes_after_teardown"] = facts2.get("processes")
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
