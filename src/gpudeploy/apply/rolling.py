"""A rolling update of a serving deployment through its router: no request dropped, no downtime.

Used by deploy for a deployment that serves now (a router in front, every engine active and
healthy) and whose engines changed. Per changed engine, prefill first, then decode, then plain
workers, one at a time, so the router always has a healthy worker of each kind:

  1. a *surge* copy of the engine with its new settings starts where there is room (spare GPUs
     and ports on its host, or another host of the deployment; a CPU engine needs only ports), on
     ports of its own, and is gated like any start;
  2. the router gets it (``POST /workers``) and lists it healthy; the old engine leaves the router
     (``DELETE /workers/<id>``), its in-flight requests finish (its own ``/v1/loads``, bounded by
     ``health.drain_s``), then it stops;
  3. the engine restarts in its own place with its new files, is gated, joins the router, and the
     surge copy leaves the router, drains and stops: the deployment ends as planned, under the
     planned unit names and ports (two starts per engine: the price of keeping identities fixed).
The router itself is replaced last, and only if it changed (one router cannot hand over to itself:
its restart takes ~1.5 s, said as such).

Where there is no room, nothing is done: the deploy is refused with the expected downtime (the
engines' last measured startup) unless ``--allow-downtime`` asks for the plain restart. A failure
mid-roll leaves the deployment serving on what was healthy before and says which engines are old and
which new; ``deploy`` again continues from there (the new ones are then unchanged). Ctrl-C stops
the roll where it is and says what the router sends to and which surge copy it left running; the
next deploy puts such a copy away first (surges.py), then rolls what is still old.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from typing import Any

from .. import interrupt
from ..errors import GpudeployError, InputError
from ..fanout import Cancel, say
from ..model import SURGE_SUFFIX, Host, PlacementRequest, Plan, Unit
from ..plan.build import build_plan
from ..remote.base import Transport
from ..supervisor.base import Supervisor, UnitState
from .deploy import Options, UnitOutcome, current_files, desired_files, file_hashes, start_and_gate
from .order import upstreams_of
from .surges import KINDS, shifted

REGISTER_S = 120.0  # a new worker's addition job: its health check must pass within this


@dataclass
class Session:
    """What rolling needs of deploy's host session."""

    host: Host
    remote: Transport
    supervisor: Supervisor
    facts: dict[str, Any]
    states: dict[str, UnitState]


@dataclass
class Roll:
    """One deployment's rolling update: what happened, for the report."""

    deployment: str
    ok: bool = True
    failure: str = ""
    steps: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)  # engines now on their new files
    old: list[str] = field(default_factory=list)  # engines still on their old files
    outcomes: list[UnitOutcome] = field(default_factory=list)
    seconds: float = 0.0
    sends_to: list[str] = field(default_factory=list)  # the engines the router sends to now, as far as we did
    touched: bool = False  # the router's workers were changed by this roll
    surges: dict[str, str] = field(default_factory=dict)  # surge copy's key -> its unit, while it runs
    # unit key -> the files it ran from before the roll replaced them (what a failed roll puts back)
    previous: dict[str, dict[str, tuple[bytes, int]]] = field(default_factory=dict)
    restored: list[str] = field(default_factory=list)  # units put back on those files, and how that went
    stage: dict[str, str] = field(default_factory=dict)  # engine key -> where its own roll stands, in words

    def fail(self, why: str) -> None:
        if self.ok:
            self.ok, self.failure = False, why

    def where(self) -> str:
        """Where the roll stands, in a sentence: what the router sends to."""
        engines = ", ".join(self.sends_to)
        return (f"the router sends to {engines}" if self.touched
                else f"the router was not touched: it still sends to {engines}")


def stop_hint(surge: Unit) -> str:
    return stop_hint_for(surge.deployment)


def stop_hint_for(deployment: str) -> str:
    return (f"`invoke deploy` again stops it and finishes the roll (`invoke teardown --deployment {deployment}` "
            "stops the whole deployment)")


def left_running(out: Roll) -> list[str]:
    """The surge copies an interrupted roll leaves running, each with how to stop it."""
    return [f"{key}: " + (interrupt.noted(key) or f"{name}: started; {stop_hint_for(out.deployment)}")
            for key, name in sorted(out.surges.items())]


class RollInterrupted(KeyboardInterrupt):
    """Ctrl-C in the middle of a roll: ``roll`` says how far it got and what it left running."""

    def __init__(self, roll: Roll) -> None:
        self.roll = roll
        super().__init__("interrupted")


def serving(units: list[Unit], states: dict[str, UnitState], healthy: dict[str, bool]) -> bool:
    """The deployment serves now: a router, and every engine of it active and healthy."""
    routers = [u for u in units if u.role.engine == "sglang_router"]
    engines = [u for u in units if u.role.engine != "sglang_router"]
    return bool(routers) and bool(engines) and all(
        states[u.name].active and healthy.get(u.name) for u in engines)


def surge_unit(plan: Plan, unit: Unit, host: Host, gpus: tuple[int, ...] | None) -> Unit:
    """The engine's surge copy on ``host`` (``gpus`` of it; None for a CPU engine): the same role
    under ``<role>-surge`` with every port shifted, planned by the same code as the engine itself."""
    inv = plan.inventory
    role = replace(unit.role, name=unit.role.name + SURGE_SUFFIX, ports=shifted(unit.ports))
    # A named instance's copy is an instance of the same role file (plan/placement.py role_of).
    req = PlacementRequest(role=role.name, gpus=gpus, deployment=unit.deployment,
                           role_file=unit.role.instance_of or None)
    hosts = dict(inv.hosts)
    hosts[host.name] = replace(inv.hosts[host.name], placements=(*inv.hosts[host.name].placements, req))
    surge_inv = replace(inv, hosts=hosts, roles={**inv.roles, role.name: role})
    planned = build_plan(surge_inv, memory=False)
    return next(u for u in planned.units if u.role.name == role.name and u.host.name == host.name)


def _spare_gpus(plan: Plan, host: Host, facts: dict[str, Any], need: int) -> tuple[int, ...] | None:
    """``need`` GPUs of ``host`` that no unit of the inventory is placed on and no process uses,
    on one NUMA node; None when there are not so many."""
    everything = build_plan(plan.inventory, memory=False).units
    taken = {g for u in everything if u.host.name == host.name for g in u.gpus}
    busy = {p["gpu"] for p in (facts.get("gpus") or {}).get("processes", [])}
    for node in host.numa_nodes:
        free = [g for g in node.gpus if g not in taken and g not in busy]
        if len(free) >= need:
            return tuple(free[:need])
    return None


def room(plan: Plan, unit: Unit, sessions: dict[str, Session], mine: list[Unit]) -> tuple[Unit | None, str]:
    """Where the engine's surge copy can run: (its unit, "") or (None, why there is no room). Only on
    the hosts of its own deployment (``mine``: its units): the next deploy looks for a leftover copy
    there, and so does ``teardown --deployment``; a copy on another deployment's host would be lost."""
    ours = {u.host.name for u in mine}
    hosts = [unit.host] + [s.host for s in sessions.values() if s.host.name != unit.host.name and s.host.name in ours]
    why = []
    for host in hosts:
        s = sessions.get(host.name)
        if s is None:
            continue
        gpus: tuple[int, ...] | None = None
        if unit.gpus:
            gpus = _spare_gpus(plan, host, s.facts, len(unit.gpus))
            if gpus is None:
                why.append(f"{host.name} has no {len(unit.gpus)} spare GPUs on one NUMA node")
                continue
        try:
            surge = surge_unit(plan, unit, host, gpus)
        except InputError as exc:
            why.append(f"{host.name}: {str(exc).splitlines()[-1].strip()}")
            continue
        listening = {int(k) for k in (s.facts.get("listening") or {})}
        taken = sorted(p for kind, p in surge.ports.items() if kind != "mooncake_rpc" and p in listening)
        if taken:
            why.append(f"{host.name} has port(s) {', '.join(map(str, taken))} in use")
            continue
        return surge, ""
    return None, "; ".join(why) or "no host of the deployment to run a second copy on"


def last_startup_s(state: UnitState) -> float | None:
    """How long the engine's last start took to be ready, from its run record on the host."""
    rec = state.record or {}
    if rec.get("state") == "ready" and rec.get("started_us") and rec.get("recorded_at"):
        return max(0.0, float(rec["recorded_at"]) - float(rec["started_us"]) / 1e6)
    return None


def url_of(unit: Unit) -> str:
    return f"http://{unit.host.address}:{unit.ports['http']}"


def roll(plan: Plan, units: list[Unit], changed: list[Unit], sessions: dict[str, Session],
         files: dict[str, dict[str, tuple[bytes, int]]], secrets: dict[str, str], renderer: Any,
         opts: Options, cancel: Cancel) -> Roll:
    """Roll ``changed`` (engines and maybe the router) of one serving deployment through its router.
    Ctrl-C raises :class:`RollInterrupted`: how far it got, what the router sends to, what runs."""
    t0 = time.monotonic()
    out = Roll(units[0].deployment)
    [router] = [u for u in units if u.role.engine == "sglang_router"][:1] or [None]  # type: ignore[list-item]
    assert router is not None
    out.sends_to = [u.key for u, _ in upstreams_of(router, units)]
    try:
        broken = _roll(plan, units, changed, router, sessions, files, secrets, renderer, opts, cancel, out)
        if cancel.is_set():  # a gate that saw Ctrl-C returns before the main thread hears of it
            raise KeyboardInterrupt
        if broken:
            from .roll_back import restore

            restore(out, units, sessions, files, opts, cancel)
    except KeyboardInterrupt:
        out.fail(f"interrupted (Ctrl-C) in the middle of its rolling update; {out.where()}")
        raise RollInterrupted(out) from None
    finally:
        out.seconds = time.monotonic() - t0
    return out


def _roll(plan: Plan, units: list[Unit], changed: list[Unit], router: Unit, sessions: dict[str, Session],
          files: dict[str, dict[str, tuple[bytes, int]]], secrets: dict[str, str], renderer: Any,
          opts: Options, cancel: Cancel, out: Roll) -> bool:
    """The roll itself; True when it failed after its engines (or router) were replaced: the new router
    failed, the smoke generation failed, or a started engine broke since. Then the deployment no longer
    serves as it did, and what it ran from before is put back (roll_back.py)."""
    # Imported here and in _one/_join: only a roll needs HTTP to a router or the gate's causes, and
    # a deploy that starts nothing imports neither (apply/deploy.py).
    from ..verify.smoke import smoke_test
    from .after_roll import broken_since_start

    via = sessions[router.host.name].remote
    kinds = {e.key: KINDS.get(kind, "regular") for e, kind in upstreams_of(router, units)}
    order = {"prefill": 0, "decode": 1, "regular": 2}
    engines = sorted((u for u in changed if u.role.engine != "sglang_router"),
                     key=lambda u: order[kinds.get(u.key, "regular")])
    out.old = [u.key for u in engines]
    for e in engines:
        if cancel.is_set():
            raise KeyboardInterrupt
        surge, why = room(plan, e, sessions, units)
        assert surge is not None, why  # checked before the roll began (plan_roll)
        if not _one(plan, e, surge, router, via, kinds.get(e.key, "regular"), sessions, files, secrets, renderer,
                    opts, cancel, out):
            break
        out.old.remove(e.key)
        out.new.append(e.key)
    if out.ok and router in changed:
        say(f"[{router.host.name}/{router.role.name}] the router changed: restarting it last (one router cannot "
            "hand over to itself; its restart takes seconds)")
        s = sessions[router.host.name]
        out.previous[router.key] = current_files(s.remote, files[router.name])
        _upload(s, router, files[router.name])
        [o] = start_and_gate(s.remote, s.supervisor, [router], files, s.states, opts, cancel)
        out.outcomes.append(o)
        if not o.ok:
            out.fail(f"the new router failed: {o.gate.cause.summary if o.gate and o.gate.cause else o.action}")
            return True
    if not out.ok:
        return False  # an engine's own step failed: the deployment serves on what was healthy before
    res = smoke_test(router, [e for e, _ in upstreams_of(router, units)], via=via)
    out.steps.append(f"smoke {res.endpoint} through {router.key}: " + (
        f"TTFT {res.ttft_s:.3f} s, total {res.total_s:.3f} s" if res.ok and res.ttft_s is not None
        else "ok" if res.ok else f"FAILED: {res.message}"))
    if not res.ok:
        out.fail(f"the smoke generation through {router.key} failed after the roll: {res.message}")
        return True

    def host_of(name: str) -> tuple[Transport, Supervisor]:
        return sessions[name].remote, sessions[name].supervisor

    for o, cause in broken_since_start(out.outcomes, host_of):
        say(f"[{o.unit.host.name}/{o.unit.role.name}] BROKEN while serving: {cause.summary}")
        out.fail(f"{o.unit.key} broke after its start, while the roll went on: {cause.summary}; {cause.next_step}")
    return not out.ok


def _step(out: Roll, text: str) -> None:
    out.steps.append(text)
    say(f"   roll {out.deployment}: {text}")


def _upload(s: Session, unit: Unit, unit_files: dict[str, tuple[bytes, int]]) -> None:
    for path, (data, mode) in unit_files.items():
        s.remote.put(path, data, mode)
    s.supervisor.installed(s.remote)


def _one(plan: Plan, e: Unit, surge: Unit, router: Unit, via: Transport, kind: str, sessions: dict[str, Session],
         files: dict[str, dict[str, tuple[bytes, int]]], secrets: dict[str, str], renderer: Any, opts: Options,
         cancel: Cancel, out: Roll) -> bool:
    """Roll one engine; False (with ``out`` failed, the deployment serving) when a step failed."""
    from ..verify import router_api

    drain_s = e.role.health.drain_s
    here, there = sessions[e.host.name], sessions[surge.host.name]
    boot = surge.ports.get("bootstrap")
    surge_files = desired_files(surge, secrets, renderer, there.supervisor)
    # 1. the surge copy, with the new settings, gated like any start
    out.stage[e.key] = f"still on its old files and in the router (its new copy {surge.key} was starting)"
    out.surges[surge.key] = surge.name
    _upload(there, surge, surge_files)
    [so] = start_and_gate(there.remote, there.supervisor, [surge], {surge.name: surge_files},
                          {surge.name: UnitState(surge.name, True, "inactive", "dead", 0, "", False, "")}, opts, cancel,
                          stop_it=stop_hint(surge))
    if not so.ok:
        _remove_surge(there, surge, surge_files)
        out.surges.pop(surge.key, None)
        out.fail(f"the new {e.key} failed its gate (as {surge.key}): "
                 f"{so.gate.cause.summary if so.gate and so.gate.cause else so.action}; the old engines keep "
                 "serving and the router was not touched")
        out.outcomes.append(so)
        return False
    _step(out, f"{surge.key} (new {e.role.name}) ready in {so.gate.elapsed_s if so.gate else 0:.1f} s")
    # 2. into the router, the old one out, drained, stopped
    if not _join(router, via, surge, kind, boot, out):
        _remove_surge(there, surge, surge_files)
        out.surges.pop(surge.key, None)
        return False
    why = router_api.take_out(router, via, url_of(e))
    if why:
        out.fail(f"{e.key} could not be taken out of the router ({why}), so it was not stopped: it serves on its "
                 f"old files beside its new copy {surge.key} (`invoke deploy` again puts the copy away and retries)")
        return False
    _left_router(out, e)
    out.stage[e.key] = "out of the router, still on its old files (its requests were draining)"
    drained, took = router_api.drain(e, via=here.remote, timeout_s=drain_s)
    _step(out, f"{e.key} left the router; " + (f"its requests finished in {took:.1f} s" if drained else
                                                f"still busy after the drain limit ({drain_s:g} s): stopping it"))
    out.stage[e.key] = "out of the router and stopping (its new copy serves in its place)"
    here.supervisor.stop(here.remote, [e.name], e.role.stop_timeout_s + 30)
    # 3. back in its own place with the new files, into the router, the surge out
    out.previous[e.key] = current_files(here.remote, files[e.name])
    out.stage[e.key] = "starting on its new files, out of the router (its new copy serves in its place)"
    _upload(here, e, files[e.name])
    [eo] = start_and_gate(here.remote, here.supervisor, [e], files, here.states, opts, cancel)
    out.outcomes.append(eo)
    if not eo.ok:
        out.fail(f"{e.key} did not come back on its new files: "
                 f"{eo.gate.cause.summary if eo.gate and eo.gate.cause else eo.action}; its new copy "
                 f"{surge.key} keeps serving in the router in its place (`invoke deploy` again retries)")
        return False
    out.stage[e.key] = f"on its new files, joining the router (its copy {surge.key} serves)"
    if not _join(router, via, e, kind, e.ports.get("bootstrap"), out):
        return False
    out.stage[e.key] = f"on its new files and in the router (its copy {surge.key} was being put away)"
    why = router_api.take_out(router, via, url_of(surge))
    if why:
        out.fail(f"{e.key} is new and back in the router, but its copy {surge.key} could not be taken out of the "
                 f"router ({why}), so it keeps running (`invoke deploy` again puts it away)")
        return False
    _left_router(out, surge)
    router_api.drain(surge, via=there.remote, timeout_s=drain_s)
    _remove_surge(there, surge, surge_files)
    out.surges.pop(surge.key, None)
    out.stage.pop(e.key, None)
    _step(out, f"{e.key} is new and back in the router; {surge.key} stopped")
    return True


def _join(router: Unit, via: Transport, engine: Unit, kind: str, bootstrap: int | None, out: Roll) -> bool:
    from ..verify import router_api

    url = url_of(engine)
    if not router_api.add(router, via, url, kind, bootstrap):
        out.fail(f"the router refused to add {engine.key} ({url})")
        return False
    out.touched = True
    if engine.key not in out.sends_to:
        out.sends_to.append(engine.key)
    if router_api.wait_listed(router, via, url, healthy=True, timeout_s=REGISTER_S) is None:
        out.fail(f"the router did not list {engine.key} ({url}) healthy within {REGISTER_S:g} s")
        return False
    _step(out, f"{engine.key} joined the router as a {kind} worker")
    return True


def _left_router(out: Roll, engine: Unit) -> None:
    out.touched = True
    if engine.key in out.sends_to:
        out.sends_to.remove(engine.key)


def _remove_surge(s: Session, surge: Unit, surge_files: dict[str, tuple[bytes, int]]) -> None:
    """Stop the surge copy and remove its files (exact paths: its unit/spec and env file, its record)."""
    s.supervisor.stop(s.remote, [surge.name], surge.role.stop_timeout_s + 30)
    paths = [*surge_files, f"/var/lib/gpudeploy/runs/{surge.name}.json"]
    s.remote.run(["rm", "-f", "--", *paths], check=False)
    s.supervisor.installed(s.remote)
    s.supervisor.forget(s.remote, [surge.name])


def downtime(engines: list[Unit], states: dict[str, UnitState]) -> str:
    """What a plain restart of ``engines`` costs, in words: their slowest last measured startup."""
    estimate = [last_startup_s(states[u.name]) for u in engines if u.name in states]
    known = [x for x in estimate if x is not None]
    return (f"about {max(known):.0f} s (the last measured startup)" if known
            else "a whole startup (no startup of these engines was measured yet)")


def no_room_text(dep: str, blocked: list[tuple[Unit, str]], states: dict[str, UnitState]) -> str:
    """Why a rolling update cannot be done, and what a plain restart would cost."""
    cost = downtime([u for u, _ in blocked], states)
    lines = [f"deployment {dep} serves now and its engines changed, but a rolling update needs room for a second "
             "copy of each engine, and there is none:"]
    lines += [f"  - {u.key}: {why}" for u, why in blocked]
    lines.append(f"a plain restart takes it down for {cost}: `invoke deploy --allow-downtime` does that")
    return "\n".join(lines)


def record_text(roll_: Roll) -> str:
    return json.dumps({"deployment": roll_.deployment, "ok": roll_.ok, "new": roll_.new, "old": roll_.old})


def changed_units(units: list[Unit], files: dict[str, dict[str, tuple[bytes, int]]], facts: dict[str, dict[str, Any]],
                  states: dict[str, UnitState]) -> list[Unit]:
    """Units whose files differ from the host's, or that are not active."""
    out = []
    for u in units:
        want = file_hashes(files[u.name])
        host_files = facts[u.host.name].get("files", {})
        if not (all(host_files.get(p) == h for p, h in want.items()) and states[u.name].active):
            out.append(u)
    return out


__all__ = ["Roll", "RollInterrupted", "Session", "changed_units", "no_room_text", "roll", "room", "serving",
           "surge_unit"]


class RollRefused(GpudeployError):
    """A rolling update is needed and impossible, and downtime was not allowed."""
