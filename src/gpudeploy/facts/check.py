"""Inventory against reality: what the host's GPUs (NVML) say about what the inventory declares.

Pure. Used by ``invoke facts`` (to show mismatches) and by deploy's preflight (to stop before
anything is touched): a mismatch names the host, the GPU and both values.
"""

from __future__ import annotations

from typing import Any

from ..model import Host
from ..versions import same_release

GPU_MEMORY_TOLERANCE = 0.06  # NVML reports a "96 GB" card as 95.6 GiB


def layout_problems(host: Host, devices: list[dict[str, Any]], gpus: list[int] | None = None) -> list[str]:
    """Declared GPUs (all, or ``gpus``) missing, of another size, or on another NUMA node."""
    real = {d["index"]: d for d in devices}
    wanted = sorted(host.gpus if gpus is None else gpus)
    out = []
    missing = [g for g in wanted if g not in real]
    if missing:
        out.append(f"declared GPUs {missing} do not exist (NVML sees {len(real)} GPUs)")
    for g in wanted:
        d = real.get(g)
        if d is None or d.get("total") is None:
            continue  # missing (said above), or lost: NVML cannot read it (facts/health.py says so)
        total = d["total"] / 2**30
        declared = host.gpu_memory_gib.get(g, 0.0)
        if abs(total - declared) > GPU_MEMORY_TOLERANCE * total:
            out.append(f"inventory says GPU {g} has {declared:g} GiB but NVML reports {total:.1f} GiB; "
                       "fix gpu_memory_gib")
        numa = d.get("numa_node")
        try:
            declared_numa = host.numa_of(g)
        except KeyError:
            continue
        if numa is not None and numa != declared_numa:
            out.append(f"inventory puts GPU {g} on NUMA node {declared_numa} but the host has it on NUMA node "
                       f"{numa} ({d.get('bus_id') or 'bus id unknown'}); fix numa_nodes")
    return out


def version_problems(host: Host, wanted: list[tuple[str, str, str, str]], versions: dict[str, Any]) -> list[str]:
    """(role, python, package, planned release): the release the host's python really has must be
    the one the plan rendered flags for. ``versions``: the probe's python -> {package: version}."""
    out = []
    for role, python, package, planned in wanted:
        found = (versions.get(python) or {}).get(package)
        if found is not None and not same_release(str(found), planned):
            out.append(f"{python} on {host.name} has {package} {found}, but the plan rendered role {role}'s flags "
                       f"for {planned}; set engine_versions (or the role's version) to \"{found}\" "
                       "(gpudeploy reads the flags of a release it has not captured from the host)")
    return out
