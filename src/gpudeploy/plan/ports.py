"""Deterministic ports per unit, and a check that no two units on a host share one.

Scheme (overridable per role with ``ports:``): the n-th SGLang server on a host (in the order of the
host's ``roles:`` list, counting from 0) gets HTTP 30000+10n and NCCL 30000+10n+5; a prefill gets the
bootstrap port 8998+n; the router 8000; the n-th command server 18000+10n. A placement's own ``port``
(http) and ``ports`` win over its role file's ``ports:``, which win over the scheme; so the instances
of one role file (``{role: decode, name: decode-a}``) get a slot each, like different roles. A role that spans hosts
(``nnodes`` > 1) also gets the dist-init port 20000+10n, which only its leader binds (the
torch.distributed store; with DP attention SGLang also takes the next five ports for its ZMQ
sockets, hence the step of 10). A prefill or decode server whose KV transfer is mooncake's (SGLang's
default backend, or mooncake_tcp) gets the RPC port range 24000+100n .. +99 (``mooncake_rpc``, its
first port; handed to mooncake as MC_MIN_RPC_PORT/MC_MAX_RPC_PORT), so two engines on one host never
pick the same RPC port: mooncake picks one at random in its range, 15000-17000 unless told. The range
must lie in 1024-32767: mooncake-transfer-engine 0.3.13.post1 refuses anything else, measured here
("Invalid port range [32700, 32799], falling back to default [15000, 17000]").
"""

from __future__ import annotations

from ..errors import Problem
from ..model import Host, PlacementRequest, Role
from .placement import role_of

BASES = {"sglang": 30000, "command": 18000}
DIST_INIT_BASE = 20000
MOONCAKE_RPC_BASE = 24000
MOONCAKE_RPC_PORTS = 100
MOONCAKE_PORT_LIMITS = (1024, 32767)
MOONCAKE_BACKENDS = ("mooncake", "mooncake_tcp")


def uses_mooncake(role: Role) -> bool:
    """A PD server whose KV cache crosses with mooncake's transfer engine (SGLang's default backend)."""
    return role.engine == "sglang" and role.settings.get("disaggregation_mode") in ("prefill", "decode") \
        and role.settings.get("disaggregation_transfer_backend", "mooncake") in MOONCAKE_BACKENDS


def port_span(kind: str) -> int:
    """How many ports from a port of this kind on are the unit's (a range for mooncake's RPC)."""
    return MOONCAKE_RPC_PORTS if kind == "mooncake_rpc" else 1


def assign_ports(host: Host, roles: dict[str, Role], problems: list[Problem]) -> dict[str, dict[str, int]]:
    slots = {"sglang": 0, "command": 0}
    out: dict[str, dict[str, int]] = {}
    for req in host.placements:
        role = role_of(req, roles)
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
                if uses_mooncake(role):
                    ports["mooncake_rpc"] = MOONCAKE_RPC_BASE + MOONCAKE_RPC_PORTS * n
        ports.update(role.ports)
        ports.update(req.ports)  # the placement's own (``port: N`` is http), over the role file's
        out[role.name] = ports
    _check_collisions(host, roles, out, problems)
    return out


def _where(role: Role, req: PlacementRequest | None, kind: str) -> tuple[str, int | None, int]:
    """Where a port was decided, and how surely by the user: 2, the placement's ``port:``/``ports:``
    (the inventory's line); 1, the role file's ``ports:``; 0, gpudeploy's scheme (then the placement
    made it: the inventory's line of the placement, which a role file without ``ports:`` lacks)."""
    if req is not None and kind in req.ports and req.where is not None:
        return req.where.file, req.where.line, 2
    if kind in role.ports:
        return role.file, role.lines.get(f"ports.{kind}", role.lines.get("ports")), 1
    if req is not None and req.where is not None:
        return req.where.file, req.where.line, 0
    return role.file, None, 0


def _check_collisions(host: Host, roles: dict[str, Role], ports: dict[str, dict[str, int]],
                      problems: list[Problem]) -> None:
    seen: dict[int, tuple[str, str]] = {}
    requests = {p.role: p for p in host.placements}
    for role_name, named in ports.items():
        role = roles[role_name]
        req = requests.get(role_name)
        for kind, first in named.items():
            file, line, _ = _where(role, req, kind)
            if kind == "mooncake_rpc":
                low, high = MOONCAKE_PORT_LIMITS
                if not low <= first <= high - MOONCAKE_RPC_PORTS + 1:
                    problems.append(Problem(
                        f"mooncake's RPC range {first}-{first + MOONCAKE_RPC_PORTS - 1} must lie within "
                        f"{low}-{high} (mooncake falls back to 15000-17000 otherwise)", file=file,
                        line=line, host=host.name, role=role_name, key=f"ports.{kind}"))
            for port in range(first, first + port_span(kind)):
                if port in seen:
                    other_role, other_kind = seen[port]
                    problems.append(_collision(host, port, (role_name, kind), (other_role, other_kind),
                                               roles, requests))
                    break
                seen[port] = (role_name, kind)


def _collision(host: Host, port: int, this: tuple[str, str], other: tuple[str, str], roles: dict[str, Role],
               requests: dict[str, PlacementRequest]) -> Problem:
    """Two units on one port, blamed on the one the user set (the inventory's ``port: 8000`` over the
    scheme's router port), at the line where it was set."""
    sides = [(name, kind, *_where(roles[name], requests.get(name), kind)) for name, kind in (this, other)]
    blamed, unblamed = sides if sides[0][4] >= sides[1][4] else sides[::-1]
    name, kind, file, line, _ = blamed
    other_name, other_kind, other_file, other_line, how = unblamed
    by = "by default" if how == 0 else f"set at {other_file}:{other_line}" if other_line else f"set in {other_file}"
    return Problem(f"port {port} ({kind}) is also the {other_kind} port of role {other_name!r} on this host "
                   f"({by}); give one of them another port (ports: in its role, or port:/ports: where it is placed)",
                   file=file, line=line, host=host.name, role=name, key=f"ports.{kind}")
