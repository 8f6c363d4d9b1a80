"""One role of one deployment as Kubernetes sees it: all its units behind one pod template.

Every pod of a role runs one template, so what the plan lets differ between the role's hosts
(ports packed around other roles, host env, the hosts' ``kubernetes:`` settings) must agree; where
it does not, ``same`` makes that a problem naming the hosts, not a silent pick.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import Problem
from ..model import K8S_FIELDS, K8sSettings, Plan, Role, Unit, Where


@dataclass(frozen=True)
class Manifest:
    doc: dict[str, Any]
    deployment: str
    role: Role
    sources: dict[str, Where] = field(default_factory=dict)  # kubernetes: key -> where its value came from

    @property
    def kind(self) -> str:
        return str(self.doc["kind"])

    @property
    def name(self) -> str:
        return str(self.doc["metadata"]["name"])

    def __str__(self) -> str:
        return f"{self.kind} {self.name} (role {self.role.name}, deployment {self.deployment})"


@dataclass(frozen=True)
class RoleSet:
    """One role of one deployment: its units (every rank of every group), leaders first by group."""

    deployment: str
    role: Role
    units: tuple[Unit, ...]

    @property
    def leaders(self) -> tuple[Unit, ...]:
        return tuple(u for u in self.units if u.group is None or u.group.rank == 0)

    @property
    def replicas(self) -> int:
        return len(self.leaders)

    @property
    def size(self) -> int:
        return self.role.nnodes

    @property
    def settings(self) -> K8sSettings:
        """The role's ``kubernetes:`` over its first host's (``agree`` checks the other hosts)."""
        return self.units[0].host.kubernetes.under(self.role.kubernetes)

    def manifest(self, doc: dict[str, Any]) -> Manifest:
        return Manifest(doc, self.deployment, self.role, sources=dict(self.settings.where))

    def agree(self, problems: list[Problem]) -> bool:
        """Whether every host of the role gives the same ``kubernetes:`` settings (else a problem)."""
        per_host = {u.host.name: _values(u.host.kubernetes.under(self.role.kubernetes)) for u in self.units}
        return same(self, "kubernetes settings", per_host, problems) is not None


def _values(s: K8sSettings) -> dict[str, Any]:
    return {f: getattr(s, f) for f in K8S_FIELDS if getattr(s, f) is not None}


def role_sets(plan: Plan) -> dict[str, list[RoleSet]]:
    """deployment -> its roles in plan order (engines before routers), each with all its units."""
    found: dict[tuple[str, str], list[Unit]] = {}
    for u in plan.units:
        found.setdefault((u.deployment, u.role.name), []).append(u)
    out: dict[str, list[RoleSet]] = {}
    for (dep, _), units in found.items():
        ranked = sorted(units, key=lambda u: u.group.rank if u.group else 0)
        out.setdefault(dep, []).append(RoleSet(dep, units[0].role, tuple(ranked)))
    for sets in out.values():
        sets.sort(key=lambda s: s.role.engine == "sglang_router")
    return out


def same(rs: RoleSet, what: str, per_host: dict[str, Any], problems: list[Problem]) -> Any:
    """The one value every pod of the role gets, or None (and a problem) where the hosts differ."""
    values = list(per_host.values())
    if all(v == values[0] for v in values):
        return values[0]
    first_host = next(iter(per_host))
    others = [h for h, v in per_host.items() if v != values[0]]
    shown = "; ".join(f"{h}: {_diff(values[0], per_host[h])}" for h in others)
    problems.append(problem(rs, None, (
        f"one pod template serves this role's {len(per_host)} hosts, but its {what} differs from "
        f"{first_host}'s on {shown}; make them agree (pin ports in the role's ports:, the same env, release "
        "and kubernetes: settings on every host)")))
    return None


def _diff(a: Any, b: Any) -> str:
    if isinstance(a, list) and isinstance(b, list):
        i = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        return f"word {i} is {b[i] if i < len(b) else '(none)'!r}, not {a[i] if i < len(a) else '(none)'!r}"
    if isinstance(a, dict) and isinstance(b, dict):
        keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        return ", ".join(f"{k}={b.get(k)!r} (not {a.get(k)!r})" for k in keys)
    return f"{b!r}, not {a!r}"


def problem(rs: RoleSet, key: str | None, message: str) -> Problem:
    """A problem of the role's manifests, at ``key`` of its role file."""
    return Problem(f"deployment {rs.deployment}: {message}", file=rs.role.file,
                   line=rs.role.lines.get(key) if key else None, role=rs.role.name, key=key)


def setting_problem(rs: RoleSet, key: str, message: str) -> Problem:
    """A problem with the ``kubernetes.<key>`` setting in force for the role, at the file and line
    it came from (the role file, or the inventory for a host's setting), else at the role file."""
    where = rs.settings.where.get(key)
    file = where.file if where else rs.role.file
    return Problem(f"deployment {rs.deployment}: {message}", file=file, line=where.line if where else None,
                   role=rs.role.name, key=f"kubernetes.{key}")
