"""What must hold on a host before deploy touches a file: pure, over the host probe's facts."""

from __future__ import annotations

from typing import Any

from ..errors import RemoteError
from ..facts import health
from ..facts.check import layout_problems, version_problems
from ..model import Host, Unit
from ..plan.calibrate import CalibrationStore
from ..plan.memcheck import DEFAULT_STORE, free_memory_problems
from ..supervisor.base import Supervisor, UnitState

PACKAGE = {"sglang": "sglang", "sglang_router": "sglang-router"}


def engine_releases(host: Host, units: list[Unit]) -> list[tuple[str, str, str, str]]:
    """(role, python, package, planned release) of every engine unit whose flags the plan checked."""
    return [(u.role.name, u.role.python or host.python, PACKAGE[u.role.engine], u.engine_version)
            for u in units if u.role.engine in PACKAGE and u.engine_version]


def versions_spec(host: Host, units: list[Unit]) -> dict[str, list[str]]:
    """What the host probe must read: python -> the engine packages it runs."""
    out: dict[str, list[str]] = {}
    for _, python, package, _ in engine_releases(host, units):
        out.setdefault(python, [])
        if package not in out[python]:
            out[python].append(package)
    return out


def problems(host: Host, units: list[Unit], facts: dict[str, Any], states: dict[str, UnitState],
             supervisor: Supervisor, *, force: bool) -> list[str]:
    """Every reason not to deploy ``units`` on ``host`` now (empty when it may go ahead)."""
    out: list[str] = []
    missing_supervisor = supervisor.unavailable(facts)
    if missing_supervisor:
        out.append(missing_supervisor)
    gpus = facts.get("gpus") or {}
    wanted = sorted({g for u in units for g in u.gpus})
    if wanted and gpus.get("error"):
        # Not a certainty that the engine cannot run (a container may lack the NVML library but
        # not CUDA), so --force may go ahead; without it, GPUs nobody can see are not assumed.
        if not force:
            out.append(f"cannot check the declared GPUs: {gpus['error']} (--force deploys without the check)")
    elif wanted:
        out += layout_problems(host, gpus.get("devices", []), wanted)
        if not force:
            # a GPU that is lost, or whose memory reports uncorrected errors or a row remap to apply:
            # an engine started there dies or computes on bad memory (facts/health.py)
            out += health.refusals(gpus.get("devices", []), gpu_roles(units))
    out += version_problems(host, engine_releases(host, units), facts.get("versions") or {})
    mine = {u.name: {p["pid"] for p in states[u.name].procs} for u in units}
    all_mine = set().union(*mine.values()) if mine else set()
    if wanted and not gpus.get("error") and not force:
        # the memory preflight again with what NVML says is free now (issue 22)
        out += free_memory_problems(host, units, gpus.get("devices", []), gpus.get("processes", []), all_mine,
                                    CalibrationStore(DEFAULT_STORE))
    for p in gpus.get("processes", []):
        if p["gpu"] in wanted and p["pid"] not in all_mine and not force:
            owner = next((u.role.name for u in units if p["gpu"] in u.gpus), "?")
            cmd = f", {p['cmd'][:80]}" if p.get("cmd") else ""
            out.append(f"GPU {p['gpu']} (for role {owner}) is in use by pid {p['pid']} "
                       f"({p['used'] / 2**30:.1f} GiB{cmd}), which belongs to no unit being deployed; "
                       "stop it or use --force")
    listening = {int(k): v for k, v in facts.get("listening", {}).items()}
    for u in units:
        for kind, port in u.ports.items():
            if kind == "mooncake_rpc":
                continue  # a range mooncake picks a free port of itself, not one port it must have
            owners = listening.get(port)
            if owners is None:
                continue
            if not owners:
                # A listening socket whose process we cannot see is someone's: never assume ours.
                out.append(f"port {port} ({kind} of role {u.role.name}) is already in use by a process "
                           "gpudeploy cannot see (`ss -ltnp` on the host names it)")
            elif not set(owners) <= mine[u.name]:
                who = ", ".join(str(p) for p in owners)
                out.append(f"port {port} ({kind} of role {u.role.name}) is already in use by pid {who}")
    return out


def gpu_roles(units: list[Unit]) -> dict[int, str]:
    """GPU index -> the role placed on it (the first, where several share it)."""
    out: dict[int, str] = {}
    for u in units:
        for g in u.gpus:
            out.setdefault(g, u.role.name)
    return out


def warnings(units: list[Unit], facts: dict[str, Any]) -> list[str]:
    """What deploy says but does not refuse: a unit's GPU that runs slower than it should (a degraded
    PCIe link, clocks held down by the hardware, an NVLink down)."""
    gpus = facts.get("gpus") or {}
    if gpus.get("error"):
        return []
    return health.warnings(gpus.get("devices") or [], gpu_roles(units))


def refuse(host: Host, found: list[str]) -> None:
    """Stop the host's deploy before anything of it changed, naming every problem ``found``."""
    if found:
        raise RemoteError(host.name, "preflight failed, nothing was changed:\n"
                          + "\n".join(f"  - {p}" for p in found))
