"""Deterministic ports per unit, and a check that no two units on a host share one.

Scheme (overridable per role with ``ports:``): the n-th SGLang server on a host (in the order of the
host's ``roles:`` list, counting from 0) gets HTTP 30000+10n and NCCL 30000+10n+5; a prefill gets the
bootstrap port 8998+n; the router 8000; the n-th command server 18000+10n. A role that spans hosts
(``nnodes`` > 1) also gets the dist-init port 20000+10n, which only its leader binds (the
torch.distributed store; with DP attention SGLang also takes the next five ports for its ZMQ
sockets, hence the step of 10).
"""

from __future__ import annotations

from ..errors import Problem
from ..model import Host, Role

BASES = {"sglang": 30000, "command": 18000}
DIST_INIT_BASE = 20000


def assign_ports(host: Host, roles: dict[str, Role], problems: list[Problem]) -> dict[str, dict[str, int]]:
    slots = {"sglang": 0, "command": 0}
    out: dict[str, dict[str, int]] = {}
    for req in host.placements:
        role = roles.get(req.role)
        if role is None:
            continue
        ports: dict[str, int] = {}
        if role.engine == "sglang_router":
            ports["http"] = 8000
        else:
            n = slots[role.engine]
            slots[role.engine] += 1
            ports["http"] = BASES[role.engine] + 10 * n
            if role.engine == "sglang":
                ports["nccl"] = ports["http"] + 5
                if role.settings.get("disaggregation_mode") == "prefill":
                    ports["bootstrap"] = 8998 + n
                if role.nnodes > 1:
                    ports["dist_init"] = DIST_INIT_BASE + 10 * n
        ports.update(role.ports)
        out[role.name] = ports
    _check_collisions(host, roles, out, problems)
    return out


def _check_collisions(host: Host, roles: dict[str, Role], ports: dict[str, dict[str, int]],
                      problems: list[Problem]) -> None:
    seen: dict[int, tuple[str, str]] = {}
    for role_name, named in ports.items():
        for kind, port in named.items():
            if port in seen:
                other_role, other_kind = seen[port]
                role = roles[role_name]
                problems.append(Problem(
                    f"port {port} ({kind}) is also the {other_kind} port of role {other_role!r} on this "
                    "host; give one of them another port under ports:",
                    file=role.file, line=role.lines.get("ports"), host=host.name, role=role_name,
                    key=f"ports.{kind}"))
            else:
                seen[port] = (role_name, kind)
