"""Who fronts whom in a deployment, and the order units stop in (routers, decode, prefill)."""

from __future__ import annotations

from ..model import Unit
from ..plan.build import unit_kind


def upstreams_of(router: Unit, units: list[Unit]) -> list[tuple[Unit, str]]:
    """The engine units a router fronts, with their kind (prefill, decode, workers): the units of
    its deployment whose role (or role file: a named instance) it names in ``upstreams``."""
    out = []
    for kind, roles in router.role.upstreams.items():
        out += [(u, kind) for u in units if u.deployment == router.deployment and u.role.named_in(roles)]
    return out


RANKS = {"router": 0, "decode": 1, "server": 2, "prefill": 3}


def stop_rank(unit: Unit) -> int:
    """Stop order: the router first (it stops sending work), then decode (it pulls KV from
    prefill), then anything else, prefill last."""
    return RANKS[unit_kind(unit.role)]


def kind_rank(kind: str | None) -> int:
    """The same order for a unit known only by its file's X-Gpudeploy-Kind (or not at all)."""
    return RANKS.get(kind or "server", 2)
