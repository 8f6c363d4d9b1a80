"""The inventory ``gpudeploy init`` writes: YAML with the facts as values and where each came from as
comments, placeholders marked TODO where a host could not tell. Pure: text from :class:`Found`s.

Every string value is written as a JSON string (a YAML double-quoted scalar), so no address, path
or release can change the document's shape.
"""

from __future__ import annotations

import json
import textwrap
import time
from dataclasses import dataclass
from typing import Any

from ..facts import health
from .found import Found, engines, gpu_memory, numa_nodes, numa_policy, starter_roles


@dataclass(frozen=True)
class SshDefaults:
    user: str | None = None
    port: int | None = None
    key: str | None = None
    known_hosts: str | None = None


def q(value: Any) -> str:
    """A YAML scalar that reads back as ``value``'s text (a JSON string: a double-quoted YAML scalar)."""
    return json.dumps(str(value))


def comment(text: str, indent: str, width: int = 104) -> list[str]:
    """``text`` as YAML comment lines, wrapped (no control character survives)."""
    clean = "".join(ch if ch.isprintable() else " " for ch in text)
    lead = len(clean) - len(clean.lstrip(" "))
    wrapped = textwrap.wrap(clean, width=width - len(indent), initial_indent=" " * lead,
                            subsequent_indent=" " * (lead + 2), break_on_hyphens=False) or [""]
    return [f"{indent}# {line}".rstrip() for line in wrapped]


def inventory_text(hosts: list[Found], *, deployment: str, ssh: SshDefaults, python: str | None = None,
                   today: str | None = None) -> str:
    day = today or time.strftime("%Y-%m-%d")
    lines = [f"# Written by `gpudeploy init` on {day} from what the hosts reported: NVML (GPUs, memory, PCI bus",
             "# ids, NUMA nodes), the kernel (CPUs per NUMA node), their init system and their pythons' engines.",
             "# Check every TODO, then `gpudeploy plan` (touches nothing) and `gpudeploy deploy`.",
             "#",
             "# The roles placed below are gpudeploy's packaged ones (`gpudeploy roles` lists them): prefill and",
             "# decode serve the model their files name (model.path). To serve yours, copy them into ../roles",
             "# (a role file there overrides the packaged one of the same name) and set model.path and settings.",
             f"deployment: {deployment}", ""]
    lines.append("defaults:")
    ssh_lines = [f"    {k}: {q(v) if isinstance(v, str) else v}" for k, v in
                 (("user", ssh.user), ("port", ssh.port), ("key", ssh.key), ("known_hosts", ssh.known_hosts))
                 if v is not None]
    lines += ["  ssh:                              # host keys are always checked, never added", *ssh_lines] \
        if ssh_lines else ["  # ssh: {user: ..., key: ...}      # default: ~/.ssh/config, your agent and keys"]
    lines += ["", "hosts:"]
    router_placed = False
    for f in hosts:
        block, placed = _host_block(f, python, router=not router_placed)
        router_placed = router_placed or placed
        lines += block
    return "\n".join(lines) + "\n"


def _host_block(f: Found, python: str | None, router: bool) -> tuple[list[str], bool]:
    out = [f"  {f.name}:"]
    shown = f.hostname and f.hostname not in (f.name, f.address)
    known_as = f"   # its hostname: {_clean(f.hostname)}" if shown else ""
    out.append(f"    address: {q(f.address)}{known_as}")
    if f.user or f.port:
        out.append("    ssh: {" + ", ".join(x for x in (f"user: {q(f.user)}" if f.user else "",
                                                       f"port: {f.port}" if f.port else "") if x) + "}")
    out += comment(_gpu_summary(f), "    ")
    for g in f.gpus:
        used = f", {int(g['used']) / 2**30:.1f} GiB in use" if g.get("used") and int(g["used"]) > 2**30 else ""
        out += comment(f"  GPU {g['index']}: {g.get('name') or '?'}, PCI {g.get('bus_id') or '?'}, "
                       f"NUMA {g.get('numa_node') if g.get('numa_node') is not None else '?'}, "
                       f"{int(g.get('total') or 0) / 2**30:.1f} GiB, {g.get('uuid') or ''}{used}"
                       + (f", health {health.word(g)}" if health.word(g) != "-" else ""), "    ")
        for finding in health.findings(g):
            out += comment(f"  TODO: {finding.text()}", "    ")
    for x in (f.kernel.get("xids") or [])[-5:]:
        out += comment(f"  the kernel logged since boot: {_clean(str(x.get('text') or ''))} (GPU {x.get('gpu', '?')})",
                       "    ")
    for p in f.processes:
        out += comment(f"  TODO: GPU {p.get('gpu')} holds a process already: pid {p.get('pid')} "
                       f"({int(p.get('used') or 0) / 2**30:.1f} GiB, {str(p.get('cmd') or '?')[:60]}); "
                       "deploy refuses busy GPUs", "    ")
    if not f.init.startswith("systemd"):
        out += comment(f"init: {f.init}: no systemd, so gpudeploy supervises the servers itself", "    ")
        out.append("    supervisor: process")
    eng = engines(f, python)
    if eng.python is not None:
        out.append(f"    python: {q(eng.python)}")
        if eng.versions:
            out.append("    engine_versions: {" + ", ".join(f"{k}: {q(v)}" for k, v in eng.versions.items()) + "}")
    else:
        out += comment("TODO: no SGLang or vLLM was found in the pythons looked at: set python to the engines' "
                       "interpreter and engine_versions to the release installed there", "    ")
        out.append(f"    python: {q(python or '/usr/bin/python3')}")
        out.append('    engine_versions: {sglang: "TODO"}')
    for note in eng.notes:
        out += comment(f"engines: {note}", "    ")
    memory = gpu_memory(f)
    if isinstance(memory, float):
        out.append(f"    gpu_memory_gib: {memory}              # per GPU, NVML's total")
    elif isinstance(memory, dict):
        out.append("    gpu_memory_gib: {" + ", ".join(f"{g}: {v}" for g, v in sorted(memory.items())) +
                   "}   # per GPU, NVML's totals")
    nodes = numa_nodes(f)
    policy, why = numa_policy(f, nodes)
    if policy != "bind":
        out.append(f"    numa_policy: {policy}")
        out += comment(why, "    ")
    out.append("    numa_nodes:")
    for n in nodes:
        if n.todo:
            out += comment(f"TODO: {n.todo}", "      ")
        out.append(f"      - {{id: {n.id}, gpus: [{', '.join(map(str, n.gpus))}], cpus: {q(n.cpus)}}}")
    if not f.gpus:
        out.append("    roles: []                       # TODO: place roles once the GPUs are listed "
                   "(gpudeploy roles)")
        return out, False
    places, why_not = starter_roles(nodes, router)
    if not places:
        out.append(f"    roles: []                       # {why_not}")
        return out, False
    out.append("    roles:")
    for place in places:
        if place.gpus:
            out.append(f"      - {{role: {place.role}, gpus: [{', '.join(map(str, place.gpus))}]}}"
                       f"   # TP{len(place.gpus)} on NUMA node {place.numa}")
        else:
            out.append(f"      - {place.role}                       # in front of every prefill and decode of the "
                       "deployment")
    return out, any(place.role == "router" for place in places)


def _clean(text: str) -> str:
    return "".join(ch if ch.isprintable() else " " for ch in text)


def _gpu_summary(f: Found) -> str:
    if not f.gpus:
        return (f"TODO: no NVML on this host ({_clean(f.nvml_error or 'no GPUs listed')}): list each NUMA node's "
                "GPUs (`nvidia-smi topo -m` shows their NUMA affinity) and gpu_memory_gib, then place roles")
    names = sorted({str(g.get("name") or "?") for g in f.gpus})
    head = f"{len(f.gpus)} x {', '.join(names)} (NVML" + (f", driver {f.driver}" if f.driver else "") + ")"
    if f.standin:
        head += f"; this NVML says it is a stand-in, not a GPU driver: {_clean(f.standin)}"
    return head + f"; {f.cpus or '?'} CPUs; init: {_clean(f.init)}"
