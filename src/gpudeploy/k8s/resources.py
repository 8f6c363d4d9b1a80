"""What a pod asks for (CPU, memory, GPUs, RDMA), its QoS class, and its ``/dev/shm``.

A pod that requests only GPUs is BestEffort (Kubernetes' QoS counts CPU and memory only): the
first evicted and OOM-killed. So every pod asks for CPU and memory. An engine's figures are its
share of the NUMA node(s) its GPUs are on, as the inventory describes them: ``share`` = its GPUs
there / the node's GPUs; CPUs = floor(share x (the node's CPUs - ``reserved_cpus``)), at least 1;
memory = floor(share x (``numa_nodes[].memory_gib`` - ``reserved_memory_gib``)) GiB where the
inventory gives the node's memory. ``reserved_*`` (per NUMA node, inventory ``kubernetes:``;
defaults 2 CPUs and 16 GiB) is what the kubelet, the system and daemonsets keep there: set them to
your kubelet's reservations. A role's ``kubernetes.cpus``/``memory_gib`` replace the share; a
router asks for 1 CPU and 2 GiB (OME's router runtime) unless its role says otherwise.

QoS (``kubernetes.qos``): ``burstable`` (default) requests CPU and memory, limits memory to its
request (a pod over its request is the first OOM victim) and does not limit CPU (the server may use
idle CPUs of the node). ``guaranteed`` limits both to the request, whole CPUs: only such pods get
exclusive CPUs and one NUMA node from a kubelet with CPU Manager ``static`` and Topology Manager
``single-numa-node`` (llm-d's SGLang pods: requests = limits).

``/dev/shm`` is a Memory emptyDir with a size limit (``kubernetes.shm_gib``, default 16 GiB as
llm-d's SGLang PD pods; Dynamo's operator gives 8 Gi): its pages count against the pod's memory,
so the memory must exceed it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..errors import Problem
from ..model import Host, Unit
from .roleset import RoleSet, same, setting_problem

GPU_RESOURCE = "nvidia.com/gpu"
RESERVED_CPUS = 2
RESERVED_MEMORY_GIB = 16.0
ROUTER_CPUS = 1  # OME's router runtime: limits cpu 1, memory 2Gi (config/runtimes/srt/*-pd-rt.yaml)
ROUTER_MEMORY_GIB = 2.0
SHM_GIB = 16.0  # llm-d's SGLang PD pods (guides/pd-disaggregation/modelserver/gpu/sglang/base)


@dataclass(frozen=True)
class Figures:
    cpus: int
    memory_gib: float | None  # None: unknown (the inventory gives no memory of the NUMA node)
    gpus: int
    rdma_resource: str | None
    guaranteed: bool
    shm_gib: float

    def resources(self) -> dict[str, Any]:
        """A container's ``resources``."""
        requests: dict[str, Any] = {"cpu": self.cpus}
        limits: dict[str, Any] = {"cpu": self.cpus} if self.guaranteed else {}
        if self.memory_gib is not None:
            requests["memory"] = limits["memory"] = quantity(self.memory_gib)
        for name, count in ((GPU_RESOURCE, self.gpus), (self.rdma_resource, 1)):
            if name and count:
                requests[name] = limits[name] = count
        return {"requests": requests, "limits": limits} if limits else {"requests": requests}


def quantity(gib: float) -> str:
    return f"{int(gib)}Gi" if float(gib).is_integer() else f"{math.floor(gib * 1024)}Mi"


def figures(rs: RoleSet, rdma_resource: str | None, problems: list[Problem]) -> Figures | None:
    """The figures every pod of the role gets (its hosts must agree), or None with a problem."""
    s = rs.settings
    guaranteed = s.qos == "guaranteed"
    shm = s.shm_gib or SHM_GIB
    per_host = {u.host.name: _share(u) for u in rs.units}
    share = same(rs, "share of its NUMA nodes (their CPUs, memory and reserves)", per_host, problems)
    if share is None:
        return None
    cpus, memory = share
    if rs.role.engine != "sglang":
        cpus, memory = ROUTER_CPUS, ROUTER_MEMORY_GIB
    cpus = s.cpus or cpus
    memory = s.memory_gib or memory
    if guaranteed and memory is None:
        problems.append(setting_problem(rs, "qos", (
            "qos guaranteed needs a memory size (requests = limits for CPU and memory): give the NUMA nodes' "
            "memory_gib in the inventory or kubernetes.memory_gib in the role")))
        return None
    if rs.role.engine == "sglang" and memory is not None and memory <= shm:  # routers mount no /dev/shm
        problems.append(setting_problem(rs, "memory_gib" if s.memory_gib else "shm_gib", (
            f"the pod's memory ({quantity(memory)}) must exceed its /dev/shm ({quantity(shm)}): a Memory emptyDir's "
            "pages count against the pod's memory; raise kubernetes.memory_gib or lower kubernetes.shm_gib")))
        return None
    gpus = len(rs.units[0].gpus)
    return Figures(cpus=cpus, memory_gib=memory, gpus=gpus, rdma_resource=rdma_resource, guaranteed=guaranteed,
                   shm_gib=shm)


def reserved(host: Host) -> tuple[int, float]:
    """(CPUs, GiB) each NUMA node of the host keeps for the kubelet, the system and daemonsets."""
    k = host.kubernetes
    return (RESERVED_CPUS if k.reserved_cpus is None else k.reserved_cpus,
            RESERVED_MEMORY_GIB if k.reserved_memory_gib is None else k.reserved_memory_gib)


def _share(u: Unit) -> tuple[int, float | None]:
    """(CPUs, GiB or None) of a unit's share of the NUMA nodes its GPUs are on."""
    keep_cpus, keep_mem = reserved(u.host)
    cpus, memory = 0.0, 0.0
    known = True
    for node in u.host.numa_nodes:
        mine = [g for g in u.gpus if g in node.gpus]
        if not mine:
            continue
        share = len(mine) / len(node.gpus)
        cpus += share * max(0, cpu_count(node.cpus) - keep_cpus)
        if node.memory_gib is None:
            known = False
        else:
            memory += share * max(0.0, node.memory_gib - keep_mem)
    return max(1, math.floor(cpus)), (math.floor(memory) if known and u.gpus else None)


def cpu_count(cpus: str) -> int:
    """CPUs in a systemd CPU list ("0-31,64-95" -> 64)."""
    total = 0
    for part in cpus.split(","):
        if part:
            a, _, b = part.partition("-")
            total += int(b or a) - int(a) + 1
    return total


def qos_class(pod_spec: dict[str, Any]) -> str:
    """Kubernetes' QoS class of a pod spec (CPU and memory only, as the kubelet computes it)."""
    containers = list(pod_spec.get("containers") or []) + list(pod_spec.get("initContainers") or [])
    any_set, all_guaranteed = False, True
    for c in containers:
        res = c.get("resources") or {}
        requests, limits = res.get("requests") or {}, res.get("limits") or {}
        for name in ("cpu", "memory"):
            if name in requests or name in limits:
                any_set = True
            limit = limits.get(name)
            if limit is None or str(requests.get(name, limit)) != str(limit):
                all_guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if all_guaranteed else "Burstable"
