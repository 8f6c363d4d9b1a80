"""`invoke facts`: what a host really has (GPUs through NVML with their health, the driver's Xid lines
since boot, NUMA, CPUs, init system, engines), next to what the inventory says, one probe per host,
hosts in parallel."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import GpudeployError
from ..fanout import for_each_host
from ..model import Host, Plan
from ..remote import connect
from .probe import probe

PACKAGES = {"sglang": ["sglang"], "sglang_router": ["sglang-router", "sglang_router"], "command": []}


@dataclass
class HostFacts:
    host: str
    gpus: list[dict[str, Any]]  # NVML's, or the inventory's (then ``source`` says so)
    source: str  # "nvml", or "inventory" when the host has no NVML
    nvml_error: str | None
    processes: list[dict[str, Any]]
    driver: str | None
    topology: dict[str, Any]
    init: str
    versions: dict[str, Any] = field(default_factory=dict)  # python -> {package: version}
    # the kernel log's Xid lines since boot: {"source": journal | kmsg | dmesg | a stand-in's file,
    # "error": why none could be read, "xids": [{"at", "bus", "gpu", "xid", "pid", "name", "text"}]}
    xids: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "source": self.source, "nvml_error": self.nvml_error, "driver": self.driver,
                "gpus": self.gpus, "processes": self.processes, "topology": self.topology, "init": self.init,
                "versions": self.versions, "kernel_log": self.xids}


def wanted_versions(plan: Plan, host: Host) -> dict[str, list[str]]:
    """python -> the engine packages of the roles placed on ``host`` that run with it."""
    out: dict[str, list[str]] = {}
    for u in plan.units:
        if u.host.name == host.name and PACKAGES.get(u.role.engine):
            python = u.role.python or host.python
            out.setdefault(python, [])
            out[python] += [p for p in PACKAGES[u.role.engine] if p not in out[python]]
    return out


def inventory_gpus(host: Host) -> list[dict[str, Any]]:
    return [{"index": g, "name": "(inventory)", "uuid": "", "bus_id": "", "numa_node": host.numa_of(g),
             "total": int(host.gpu_memory_gib.get(g, 0) * 2**30), "used": None, "free": None} for g in host.gpus]


def from_probe(host: Host, facts: dict[str, Any]) -> HostFacts:
    """Pure: the host probe's JSON -> HostFacts (falls back to the inventory without NVML)."""
    gpus = facts.get("gpus") or {}
    devices = gpus.get("devices") or []
    return HostFacts(host=host.name, gpus=devices or inventory_gpus(host),
                     source="nvml" if devices else "inventory", nvml_error=gpus.get("error"),
                     processes=gpus.get("processes") or [], driver=gpus.get("driver"),
                     topology=facts.get("topology") or {}, init=str(facts.get("init", "unknown")),
                     versions=facts.get("versions") or {}, xids=facts.get("xids") or {})


def gather(plan: Plan, hosts: list[Host]) -> dict[str, HostFacts | GpudeployError]:
    def one(host: Host) -> HostFacts:
        with connect(host) as remote:
            return from_probe(host, probe(remote, {"gpus": True, "topology": True, "xids": {"since": 0},
                                                   "versions": wanted_versions(plan, host)}))

    return for_each_host(hosts, one)
