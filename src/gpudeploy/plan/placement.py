"""Which GPUs, NUMA node and CPUs each role gets on its host.

A TP group must sit on one NUMA node: crossing the inter-socket link for every all-reduce costs
more than any gain from a wider spread, so spanning is an explicit opt-in (``allow_span_numa``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import Problem
from ..model import Host, PlacementRequest, Role


@dataclass(frozen=True)
class Placement:
    gpus: tuple[int, ...]
    numa_node: int | None
    cpus: str | None


def role_of(req: PlacementRequest, roles: dict[str, Role]) -> Role | None:
    """The role a placement runs: the one placed under its name, if that is read from the placement's
    role file (a name refused for standing for two role files plans nothing of the second)."""
    role = roles.get(req.role)
    return role if role is not None and role.file_role == req.file_role else None


def place_host(host: Host, roles: dict[str, Role], problems: list[Problem]) -> dict[str, Placement]:
    """Place every role listed on ``host``, in list order, so results are deterministic."""
    free = {n.id: list(n.gpus) for n in host.numa_nodes}
    owner: dict[int, str] = {}
    out: dict[str, Placement] = {}
    # Explicit GPU lists first: they are the user's decision and must win over automatic picks.
    ordered = sorted(host.placements, key=lambda p: p.gpus is None)
    for req in ordered:
        role = role_of(req, roles)
        if role is None:
            continue
        placed = _place_one(host, role, req, free, owner, problems)
        if placed is not None:
            out[role.name] = placed
            for g in placed.gpus:
                owner[g] = role.name
                free[host.numa_of(g)].remove(g)
    return {p.role: out[p.role] for p in host.placements if p.role in out}


def _place_one(host: Host, role: Role, req: PlacementRequest, free: dict[int, list[int]],
               owner: dict[int, str], problems: list[Problem]) -> Placement | None:
    def fail(message: str, key: str = "roles") -> None:
        problems.append(Problem(message, file=req.where.file if req.where else None,
                                line=req.where.line if req.where else None, host=host.name,
                                role=role.name, key=key))

    need = role.gpus_needed
    if need == 0:
        return Placement(gpus=(), numa_node=None, cpus=None)
    per_node = role.tp_size // role.nnodes
    if role.engine == "sglang" and need != per_node:
        spread = f" on each of its {role.nnodes} nodes" if role.nnodes > 1 else ""
        fail(f"SGLang uses one GPU per TP rank: tp_size {role.tp_size} needs {per_node} GPUs{spread}, "
             f"not {need}", key="gpus")
        return None

    if req.gpus is not None:
        bad = [g for g in req.gpus if g not in host.gpus]
        if bad:
            fail(f"GPUs {bad} are not declared on this host (it has {list(host.gpus)})", "gpus")
            return None
        taken = [g for g in req.gpus if g in owner]
        if taken:
            fail(f"GPUs {taken} are already given to role {owner[taken[0]]!r}", "gpus")
            return None
        if len(req.gpus) != need:
            fail(f"role needs {need} GPUs ({_need_source(role)}), {len(req.gpus)} listed in gpus; list {need} "
                 f"GPUs here, or change the role's {'gpus' if role.gpus is not None else 'tp_size'}", "gpus")
            return None
        nodes = {host.numa_of(g) for g in req.gpus}
        if len(nodes) > 1 and not role.allow_span_numa:
            fail(f"GPUs {list(req.gpus)} span NUMA nodes {sorted(nodes)}; set allow_span_numa: true "
                 "in the role to allow it", "gpus")
            return None
        return _placement(host, tuple(req.gpus))

    largest = max((len(n.gpus) for n in host.numa_nodes), default=0)
    if need > largest and not role.allow_span_numa:
        over = f" over {role.nnodes} nodes" if role.nnodes > 1 else ""
        fail(f"needs {need} GPUs (tp_size {role.tp_size}{over}) but the largest NUMA node of this host has "
             f"{largest}; use a smaller TP or set allow_span_numa: true in the role", "tp_size")
        return None
    candidates = [n for n in host.numa_nodes if req.numa_node is None or n.id == req.numa_node]
    if req.numa_node is not None and not candidates:
        fail(f"NUMA node {req.numa_node} is not declared on this host", "numa_node")
        return None
    for node in candidates:
        if len(free[node.id]) >= need:
            return _placement(host, tuple(sorted(free[node.id])[:need]))
    if role.allow_span_numa and req.numa_node is None:
        pool = sorted(g for gs in free.values() for g in gs)
        if len(pool) >= need:
            return _placement(host, tuple(pool[:need]))
    state = "; ".join(f"NUMA {n.id}: free {sorted(free[n.id])}" for n in candidates)
    fail(f"needs {need} GPUs on one NUMA node but not enough are free ({state})")
    return None


def _placement(host: Host, gpus: tuple[int, ...]) -> Placement:
    nodes = sorted({host.numa_of(g) for g in gpus})
    if len(nodes) == 1:
        cpus = next(n.cpus for n in host.numa_nodes if n.id == nodes[0])
        return Placement(gpus=gpus, numa_node=nodes[0], cpus=cpus or None)
    cpus = ",".join(n.cpus for n in host.numa_nodes if n.id in nodes and n.cpus)
    return Placement(gpus=gpus, numa_node=None, cpus=cpus or None)


def _need_source(role: Role) -> str:
    """Where a role's GPU count comes from, with the file and line to change it."""
    key = "gpus" if role.gpus is not None else "tp_size"
    line = role.lines.get(key)
    at = f"{role.file}:{line}" if line else role.file
    if key == "gpus":
        return f"gpus: {role.gpus} at {at}"
    spread = f" over nnodes {role.nnodes}" if role.nnodes > 1 else ""
    return f"tp_size: {role.tp_size}{spread} at {at}"
