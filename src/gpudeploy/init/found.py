"""What ``gpudeploy init`` learned of one host, from the host probe's JSON (facts/remote_probe.py), and
the layout it makes of it: NUMA nodes with their GPUs and CPUs, the python that has the engines, and
the starter placements (a TP4 prefill and a TP4 decode per host where the GPUs allow). Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..inventory import NAME_RE

ENGINE_PACKAGES = ("sglang", "sglang-router", "vllm")
# Where the engines' interpreters usually are: the probe's own, PATH's, the system's, and virtualenvs
# under /opt and the SSH user's home (a glob each; the probe lists what exists, at most 16).
PYTHONS = ("self", "python3", "/usr/bin/python3", "/usr/local/bin/python3", "/opt/*/bin/python3",
           "/opt/*/venv/bin/python3", "/opt/*/.venv/bin/python3", "/opt/*/*/venv/bin/python3",
           "/opt/*/*/*/venv/bin/python3", "~/.venv/bin/python3", "~/*/.venv/bin/python3", "~/*/venv/bin/python3")
TP = 4  # the starter roles' TP (the packaged prefill and decode)


@dataclass(frozen=True)
class Found:
    name: str  # its name in the inventory
    address: str
    user: str | None
    port: int | None
    hostname: str
    gpus: tuple[dict[str, Any], ...]  # NVML's devices: index, name, uuid, bus_id, numa_node, total, used
    nvml_error: str | None  # why there are none (no NVML, no driver); None when NVML answered
    standin: str | None  # the NVML there says it is a stand-in (the lab's), in its words
    driver: str | None
    processes: tuple[dict[str, Any], ...]
    cpu_nodes: dict[int, str]  # the kernel's NUMA node -> its CPU list
    cpus: int | None
    init: str  # "systemd", or "none (PID 1 is ...)"
    engines: dict[str, dict[str, Any]] = field(default_factory=dict)  # python -> {package: version}
    kernel: dict[str, Any] = field(default_factory=dict)  # the kernel log's Xid lines since boot (gpu_health.py)


def from_probe(name: str, address: str, user: str | None, port: int | None, facts: dict[str, Any]) -> Found:
    g = facts.get("gpus") or {}
    topo = facts.get("topology") or {}
    nodes = {}
    for key, cpus in (topo.get("numa_nodes") or {}).items():
        if str(key).isdigit() and cpus:
            nodes[int(key)] = str(cpus)
    return Found(name=name, address=address, user=user, port=port, hostname=str(facts.get("hostname") or ""),
                 gpus=tuple(g.get("devices") or ()), nvml_error=g.get("error") if not g.get("devices") else None,
                 standin=g.get("standin"), driver=g.get("driver"), processes=tuple(g.get("processes") or ()),
                 cpu_nodes=nodes, cpus=topo.get("cpus"), init=str(facts.get("init") or "unknown"),
                 engines={str(p): v for p, v in (facts.get("engines") or {}).items() if isinstance(v, dict)},
                 kernel=facts.get("xids") or {})


def host_name(hostname: str, address: str, taken: set[str]) -> str:
    """A name for the inventory: the host's own (its first label), else the address's, made to fit
    the inventory's rule, and unique."""
    for raw in (hostname.split(".")[0], address if not re.fullmatch(r"[\d.:]+", address) else "",
                "host-" + re.sub(r"[^0-9a-z]+", "-", address.lower())):
        name = re.sub(r"[^a-z0-9_-]+", "-", raw.lower()).strip("-_")[:41]
        if name and NAME_RE.fullmatch(name):
            break
    else:
        name = "host"
    unique, n = name, 2
    while unique in taken:
        unique, n = f"{name[:38]}-{n}", n + 1
    return unique


@dataclass(frozen=True)
class Node:
    id: int
    gpus: tuple[int, ...]
    cpus: str
    todo: str = ""  # what init could not tell (a placeholder was written)


def cpu_list(cpus: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5" (systemd's and the kernel's syntax)."""
    out: list[str] = []
    for c in sorted(set(cpus)):
        if out and "-" in out[-1] and int(out[-1].split("-")[1]) == c - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{c}"
        elif out and "-" not in out[-1] and int(out[-1]) == c - 1:
            out[-1] = f"{out[-1]}-{c}"
        else:
            out.append(str(c))
    return ",".join(out)


def expand(cpus: str) -> list[int]:
    out: list[int] = []
    for part in cpus.replace(" ", "").split(","):
        if "-" in part:
            a, b = part.split("-", 1)
            out += range(int(a), int(b) + 1)
        elif part.isdigit():
            out.append(int(part))
    return out


def all_cpus(f: Found) -> str:
    listed = [c for cpus in f.cpu_nodes.values() for c in expand(cpus)]
    if listed:
        return cpu_list(listed)
    return f"0-{f.cpus - 1}" if f.cpus and f.cpus > 1 else "0"


def numa_nodes(f: Found) -> list[Node]:
    """NUMA nodes as the inventory needs them: each GPU's node (NVML's, else the kernel's for its PCI
    device, as the probe reports it) with that node's CPUs; a node the kernel lists no CPUs for gets
    all CPUs, marked TODO. Without NVML: the kernel's nodes, their GPUs a TODO."""
    if not f.gpus:
        nodes = sorted(f.cpu_nodes.items()) or [(0, all_cpus(f))]
        return [Node(i, (), cpus, "GPUs unknown (no NVML): list this node's GPUs") for i, cpus in nodes]
    by: dict[int | None, list[int]] = {}
    for g in f.gpus:
        numa = g.get("numa_node")
        by.setdefault(numa if isinstance(numa, int) and numa >= 0 else None, []).append(int(g["index"]))
    out: list[Node] = []
    if None in by:
        lost = by.pop(None)
        free = next(i for i in range(len(by) + len(f.cpu_nodes) + 1) if i not in by)
        out.append(Node(free, tuple(sorted(lost)), all_cpus(f),
                        "neither NVML nor the kernel gives these GPUs a NUMA node (`nvidia-smi topo -m` shows "
                        "their affinity); all CPUs given"))
    for numa in sorted(k for k in by if k is not None):
        cpus = f.cpu_nodes.get(numa)
        todo = "" if cpus else (f"the kernel lists no CPUs for NUMA node {numa} (its nodes: "
                                f"{', '.join(map(str, sorted(f.cpu_nodes))) or 'none'}); all CPUs given")
        out.append(Node(numa, tuple(sorted(by[numa])), cpus or all_cpus(f), todo))
    return sorted(out, key=lambda n: n.id)


def numa_policy(f: Found, nodes: list[Node]) -> tuple[str, str]:
    """bind (memory on the GPUs' node) where the kernel has every node the GPUs are on; else none:
    binding memory to a node the kernel does not have fails the unit."""
    missing = [n.id for n in nodes if n.gpus and n.id not in f.cpu_nodes]
    if missing:
        return "none", (f"NVML puts GPUs on NUMA node(s) {', '.join(map(str, missing))}, which the kernel here "
                        "does not list: memory binding would fail (CPU affinity still applies)")
    return "bind", ""


def gpu_memory(f: Found) -> float | dict[int, float] | None:
    """GiB per GPU, NVML's total rounded down to 0.1 (what the memory check starts from)."""
    sizes = {int(g["index"]): int(g["total"] * 10 / 2**30) / 10 for g in f.gpus if g.get("total")}
    if not sizes:
        return None
    values = set(sizes.values())
    return values.pop() if len(values) == 1 else sizes


@dataclass(frozen=True)
class Engines:
    python: str | None  # the interpreter that has SGLang (else vLLM), for the host's ``python``
    versions: dict[str, str]  # engine_versions: sglang, sglang_router (of that python)
    notes: tuple[str, ...]  # every engine found, and where


def engines(f: Found, asked: str | None = None) -> Engines:
    def has(python: str, package: str) -> str | None:
        v = f.engines.get(python, {}).get(package)
        return str(v) if isinstance(v, str) and v else None

    order = list(f.engines)
    if asked is not None:
        order = [p for p in order if p == asked] + [p for p in order if p != asked]
    python = next((p for p in order if has(p, "sglang")), None) or next((p for p in order if has(p, "vllm")), None)
    versions: dict[str, str] = {}
    if python is not None:
        for package, key in (("sglang", "sglang"), ("sglang-router", "sglang_router")):
            v = has(python, package)
            if v:
                versions[key] = v
    notes = []
    for p in order:
        found = [f"{pkg} {has(p, pkg)}" for pkg in ENGINE_PACKAGES if has(p, pkg)]
        if found:
            notes.append(f"{p}: {', '.join(found)}")
    if python is not None and "sglang_router" not in versions:
        router = next((p for p in order if has(p, "sglang-router")), None)
        if router:
            notes.append(f"the router's python is {router}: give the router role `python: {router}`")
    return Engines(python, versions, tuple(notes))


@dataclass(frozen=True)
class Place:
    role: str
    gpus: tuple[int, ...] = ()
    numa: int | None = None


def starter_roles(nodes: list[Node], router: bool) -> tuple[list[Place], str]:
    """A TP4 prefill and a TP4 decode where the host has 4 GPUs of one NUMA node for each (the
    packaged roles), the router where asked; else nothing, and why."""
    free = {n.id: list(n.gpus) for n in nodes}
    out: list[Place] = []
    for role in ("prefill", "decode"):
        node = next((n for n in nodes if len(free[n.id]) >= TP and not any(p.numa == n.id for p in out)), None) \
            or next((n for n in nodes if len(free[n.id]) >= TP), None)
        if node is None:
            sizes = ", ".join(f"node {n.id}: {len(n.gpus)}" for n in nodes) or "none"
            return [], (f"no starter roles: a TP{TP} prefill and a TP{TP} decode need {TP} GPUs of one NUMA node "
                        f"each (GPUs per NUMA node here: {sizes})")
        out.append(Place(role, tuple(free[node.id][:TP]), node.id))
        del free[node.id][:TP]
    if router:
        out.append(Place("router"))
    return out, ""
