"""Surge copies a rolling update left behind, found and put away by the next deploy.

A roll (rolling.py) starts a *surge* copy of each engine beside it. Ctrl-C in the middle of a roll
leaves that copy running (it says so), and so does an engine that did not come back on its new
files (its copy keeps serving in its place). The next deploy must not trip over it: its ports make
the host look full for a new roll, and a plain restart of the engine restarts the router with the
planned engines only, so the copy would run on, serving nothing, holding its ports and GPUs.

A copy is found by its exact unit name (``<deployment>.<role>-surge`` of each engine of a deployment
with a router, on each host of the deployment), never by a pattern. It is put away only while the
engine it stands in for is healthy: that engine is in the router (added back if the roll had taken
it out), the copy leaves the router, its requests finish, it stops and its files go. Otherwise it
keeps serving in the engine's place, and is put away after this deploy has made the deployment
ready again (the same steps, then).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..fanout import say
from ..model import SURGE_SUFFIX, Unit
from ..plan.build import ENV_DIR, unit_name, unit_stem
from ..remote.base import Transport
from ..supervisor.base import Supervisor, UnitState
from .order import upstreams_of

SHIFT = {"http": 1000, "nccl": 1000, "bootstrap": 100, "mooncake_rpc": 3000, "dist_init": 1000}
KINDS = {"prefill": "prefill", "decode": "decode", "workers": "regular"}
RUNS_DIR = "/var/lib/gpudeploy/runs"


@dataclass
class Where:
    """A host as the put-away needs it: its connection, supervisor and what the probe found there
    (``states`` and ``facts`` are the deploy's own: a copy put away leaves them as if never found)."""

    remote: Transport
    supervisor: Supervisor
    states: dict[str, UnitState]
    facts: dict[str, Any]


def surge_name(engine: Unit) -> str:
    return unit_name(engine.deployment, engine.role.name + SURGE_SUFFIX)


def shifted(ports: dict[str, int]) -> dict[str, int]:
    """A surge copy's ports: each of the engine's moved by its kind's shift."""
    return {k: v + SHIFT.get(k, 1000) for k, v in ports.items()}


def probe_names(units: list[Unit], host: str) -> list[str]:
    """The surge copies' unit names deploy's probe of ``host`` asks about: every engine of every
    deployment with a router that has a unit on ``host``."""
    deps = {u.deployment for u in units if u.host.name == host}
    routed = {u.deployment for u in units if u.role.engine == "sglang_router"}
    planned = {u.name for u in units}
    return sorted({surge_name(u) for u in units if u.deployment in deps & routed and u.role.engine != "sglang_router"}
                  - planned)


def copy_of(engine: Unit, where: str, hosts: dict[str, Any]) -> Unit:
    """The surge copy of ``engine`` on host ``where``, as far as putting it away needs it: its
    name, address, ports and files (it was planned on spare GPUs this plan does not know)."""
    host = hosts[where]
    name = surge_name(engine)
    return replace(engine, host=host, name=name, role=replace(engine.role, name=engine.role.name + SURGE_SUFFIX),
                   ports=shifted(engine.ports),
                   env_path=f"{ENV_DIR}/{unit_stem(engine.deployment, engine.role.name + SURGE_SUFFIX)}.env")


def left(units: list[Unit], sessions: dict[str, Where]) -> list[tuple[Unit, Unit]]:
    """(engine, its surge copy) for every copy installed on a host of the run."""
    hosts = {u.host.name: u.host for u in units}
    planned = {u.name for u in units}
    out = []
    for e in units:
        # A planned unit is never a copy (the inventory reserves the suffix; this holds even so).
        if e.role.engine == "sglang_router" or surge_name(e) in planned:
            continue
        for name, s in sessions.items():
            st = s.states.get(surge_name(e))
            if st is not None and st.installed and name in hosts:
                out.append((e, copy_of(e, name, hosts)))
    return out


def put_away(units: list[Unit], sessions: dict[str, Where], healthy: dict[str, bool]) -> list[str]:
    """Put away every surge copy whose engine is healthy (``healthy``: unit name -> it is); the
    keys of those left serving in their engine's place."""
    kept = []
    for e, copy in left(units, sessions):
        if not healthy.get(e.name):
            say(f"-- {e.deployment}: {copy.key}, left by an interrupted or failed rolling update, keeps serving "
                f"in {e.key}'s place until {e.key} is healthy again")
            kept.append(copy.key)
            continue
        if not _put_away(e, copy, units, sessions):
            kept.append(copy.key)
    return kept


def put_away_now_ready(units: list[Unit], sessions: dict[str, Where], keys: list[str]) -> None:
    """After the deployment came up ready: put away the copies kept before (their engines, just gated,
    are healthy; ask once more, as a copy must never leave the router while its engine is down)."""
    from ..verify.http import status_of  # (here: a deploy with no copy kept never needs it; apply/deploy.py)

    for e, copy in left(units, sessions):
        if copy.key in keys:
            s = sessions[e.host.name]
            if e.health_url and status_of(e.health_url, timeout=10, via=s.remote) == 200:
                _put_away(e, copy, units, sessions)


def _put_away(e: Unit, copy: Unit, units: list[Unit], sessions: dict[str, Where]) -> bool:
    """Put the copy away; False (and it keeps running, said so) when a router did not confirm that the
    engine is in and the copy out: stopping it then could leave the router sending to nothing."""
    from ..verify import router_api  # (here: only a copy put away needs HTTP to a router)

    for router, kind in _routers_of(e, units):
        via = sessions[router.host.name].remote
        listed = router_api.workers(router, via)
        url = _url(e)
        why = "" if listed is not None else f"router {router.key} did not answer GET /workers"
        if not why and not any(w.url == url for w in listed or []) \
                and not _back_in(router, via, url, KINDS.get(kind, "regular"), e.ports.get("bootstrap")):
            why = f"router {router.key} did not take {e.key} back"  # (the roll had taken it out)
        why = why or router_api.take_out(router, via, _url(copy))
        if why:
            say(f"-- {e.deployment}: {copy.key}, left by an interrupted or failed rolling update, keeps running: "
                f"{why} (`invoke deploy` again retries)")
            return False
    there = sessions[copy.host.name]
    router_api.drain(copy, via=there.remote, timeout_s=e.role.health.drain_s)
    there.supervisor.stop(there.remote, [copy.name], e.role.stop_timeout_s + 30)
    paths = [there.supervisor.unit_path(copy.name), copy.env_path, f"{RUNS_DIR}/{copy.name}.json"]
    there.remote.run(["rm", "-f", "--", *paths], check=False)
    there.supervisor.installed(there.remote)
    there.supervisor.forget(there.remote, [copy.name])
    _forget_found(there, copy)
    say(f"-- {e.deployment}: {copy.key}, left by an interrupted or failed rolling update: stopped and removed "
        f"({e.key} serves in the router)")
    return True


def _back_in(router: Unit, via: Transport, url: str, kind: str, bootstrap: int | None) -> bool:
    from ..verify import router_api

    return bool(router_api.add(router, via, url, kind, bootstrap)) \
        and router_api.wait_listed(router, via, url, healthy=True, timeout_s=120) is not None


def _forget_found(there: Where, copy: Unit) -> None:
    """The copy's ports and GPUs are free again for what this deploy does next (a roll looks for room)."""
    st = there.states.pop(copy.name, None)
    pids = {p["pid"] for p in st.procs} if st is not None else set()
    listening = there.facts.get("listening") or {}
    for port in copy.ports.values():
        listening.pop(str(port), None)
    nvml = there.facts.get("gpus") or {}
    if nvml.get("processes"):
        nvml["processes"] = [p for p in nvml["processes"] if p.get("pid") not in pids]


def _routers_of(engine: Unit, units: list[Unit]) -> list[tuple[Unit, str]]:
    out = []
    for r in units:
        if r.role.engine == "sglang_router" and r.deployment == engine.deployment:
            out += [(r, kind) for up, kind in upstreams_of(r, units) if up.key == engine.key]
    return out


def _url(unit: Unit) -> str:
    return f"http://{unit.host.address}:{unit.ports['http']}"
