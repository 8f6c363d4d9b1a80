"""Engines that span hosts: which hosts form a role's group, who leads, and the group as one selection.

The group of a role with ``nnodes`` > 1 is, per deployment, the hosts that place it, in inventory
order; the first is the leader (node rank 0). Exactly ``nnodes`` hosts must place it: with fewer the
engine waits forever for the missing ranks, with more a rank would join a group that has no room
for it. Every rank must run the same engine release (their command lines and wire formats must
agree). Pure: reads the inventory and the planned ports only.
"""

from __future__ import annotations

from dataclasses import replace

from ..errors import Problem
from ..model import Group, Host, Inventory, Plan, Role, Unit
from ..versions import same_release
from .placement import role_of


def plan_groups(inv: Inventory, ports: dict[str, dict[str, dict[str, int]]],
                problems: list[Problem]) -> dict[tuple[str, str, str], Group]:
    """(deployment, role, host) -> that host's place in the role's group, for roles that span hosts."""
    members: dict[tuple[str, str], list[Host]] = {}
    for h in inv.hosts.values():
        for req in h.placements:
            role = role_of(req, inv.roles)
            if role is not None and role.nnodes > 1:
                members.setdefault((req.deployment or h.deployment, role.name), []).append(h)
    out: dict[tuple[str, str, str], Group] = {}
    for (deployment, name), hosts in members.items():
        role = inv.roles[name]
        if not _group_ok(role, deployment, hosts, problems):
            continue
        leader = hosts[0]
        port = ports.get(leader.name, {}).get(name, {}).get("dist_init")
        if port is None:
            continue  # the port problem is reported already
        names = tuple(h.name for h in hosts)
        for rank, h in enumerate(hosts):
            out[(deployment, name, h.name)] = Group(nnodes=role.nnodes, rank=rank, members=names,
                                                    dist_init=f"{_addr(leader.address)}:{port}")
            if rank:  # only the leader binds it; a follower's preflight must not demand it free
                ports[h.name][name] = {k: v for k, v in ports[h.name][name].items() if k != "dist_init"}
    return out


def _group_ok(role: Role, deployment: str, hosts: list[Host], problems: list[Problem]) -> bool:
    names = [h.name for h in hosts]

    def problem(message: str) -> Problem:
        return Problem(message, file=role.file, line=role.lines.get("nnodes"), role=role.name, key="nnodes")

    if len(hosts) != role.nnodes:
        problems.append(problem(
            f"nnodes {role.nnodes}: deployment {deployment!r} places this role on {len(hosts)} host(s) "
            f"({', '.join(names)}); a group needs exactly {role.nnodes} (place it on that many hosts, the "
            "leader first)"))
        return False
    releases = {h.name: role.version or h.engine_versions.get(role.engine) for h in hosts}
    first = next(iter(releases.values()))
    if any(v != first and (v is None or first is None or not same_release(v, first)) for v in releases.values()):
        shown = ", ".join(f"{h}: {v}" for h, v in releases.items())
        problems.append(problem(f"the ranks of one group must run the same {role.engine} release ({shown})"))
        return False
    return True


def _addr(address: str) -> str:
    return f"[{address}]" if ":" in address else address  # SGLang parses [v6]:port


def with_groups(units: tuple[Unit, ...], selected: tuple[Unit, ...]) -> tuple[Unit, ...]:
    """``selected`` plus every rank of a group that has a rank in it: a group starts and stops whole."""
    wanted = {(u.deployment, u.role.name) for u in selected if u.group is not None}
    if not wanted:
        return selected
    keys = {u.key + "@" + u.deployment for u in selected}
    extra = tuple(u for u in units if (u.deployment, u.role.name) in wanted and u.key + "@" + u.deployment not in keys)
    return selected + extra


def expand_groups(plan: Plan, all_units: tuple[Unit, ...]) -> Plan:
    return replace(plan, units=with_groups(all_units, plan.units))


def group_of(unit: Unit, units: tuple[Unit, ...] | list[Unit]) -> list[Unit]:
    """The ranks of ``unit``'s group among ``units``, by node rank (just ``unit`` when it has none)."""
    if unit.group is None:
        return [unit]
    mates = [u for u in units if u.deployment == unit.deployment and u.role.name == unit.role.name
             and u.group is not None]
    return sorted(mates, key=lambda u: u.group.rank if u.group else 0)
