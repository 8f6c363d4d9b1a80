"""A router kept running while engines it fronts restart in their own places (a plain restart of a
changed engine: a tune trial, a redeploy with rolling off, an engine that was down).

The real sglang-router 0.3.2 keeps what it learned of a worker across that worker's restart: it kept
a restarted engine's circuit open for 60 s and refused the smoke generation with "No available
prefill workers (all circuits open or unhealthy)". Restarting the router after its engines cleared
that, but restarted what had not changed: a prefill-only change restarted the router too (issue 47).
Instead each engine that restarts leaves the router before it stops (``DELETE /workers/<id>``: the
router stops sending there and drops what it knew of it) and joins again once its gate passed
(``POST /workers``, then listed healthy): the router and the unchanged engines keep running. A
router that does not answer its worker API is restarted after its engines, as before, and that is
said.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..model import Unit
from ..remote.base import Transport
from .order import upstreams_of
from .surges import KINDS

LEAVE_S = 30.0  # the router takes a worker out within this (its removal is a queued job)
REGISTER_S = 120.0  # a joining worker's health check must pass within this (as in a roll)


@dataclass(frozen=True)
class Rejoin:
    """A router that keeps running, and the engines it fronts that restart (with their worker kind)."""

    router: Unit
    engines: tuple[tuple[Unit, str], ...]


def kept_routers(units: list[Unit], restarting: set[str]) -> list[Rejoin]:
    """The routers that do not restart themselves (their files did not change and they are healthy)
    and front an engine that restarts: those keep running; their restarting engines leave and rejoin."""
    out = []
    for u in units:
        if u.role.engine != "sglang_router" or u.key in restarting:
            continue
        ups = tuple((e, KINDS.get(kind, "regular")) for e, kind in upstreams_of(u, units) if e.key in restarting)
        if ups:
            out.append(Rejoin(u, ups))
    return out


def url_of(unit: Unit) -> str:
    return f"http://{unit.host.address}:{unit.ports['http']}"


def leave(r: Rejoin, via: Transport) -> str:
    """Each restarting engine out of the router, before it stops: "" once all are out, else why not."""
    from ..verify import router_api  # (here: a deploy that restarts nothing needs no HTTP, issue 26)

    for e, _ in r.engines:
        why = router_api.take_out(r.router, via, url_of(e), timeout_s=LEAVE_S)
        if why:
            return f"{e.key}: {why}"
    return ""


def join(r: Rejoin, via: Transport, ready: set[str]) -> str:
    """The engines of ``r`` that are ready again back in the router, listed healthy: "" or why not."""
    from ..verify import router_api

    for e, kind in r.engines:
        if e.key not in ready:
            continue
        url = url_of(e)
        if not router_api.add(r.router, via, url, kind, e.ports.get("bootstrap")):
            return f"the router {r.router.key} refused to add {e.key} ({url}) again"
        if router_api.wait_listed(r.router, via, url, healthy=True, timeout_s=REGISTER_S) is None:
            return f"the router {r.router.key} did not list {e.key} ({url}) healthy within {REGISTER_S:g} s"
    return ""
