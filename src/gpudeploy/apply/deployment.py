"""deploy: whole deployments across hosts, in phases, each phase on every host in parallel.

    connect + lock every host   -> prepare (probe, preflight, what changed) -> upload
    -> engines (start + gate)   -> routers, once the engines they front are ready
    -> smoke: a real generation through each router, which must return text

A deployment succeeds or fails as one: a host that cannot be reached or fails its preflight fails
its deployments before anything of them is touched; a unit that fails its start, its gate or the
smoke fails its deployment, and then the units this run started there are stopped (routers, then
decode, then prefill), unless ``keep_on_failure``. The report says exactly what runs where.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import GpudeployError, InputError, LockLost
from ..facts.probe import probe
from ..fanout import Cancel, Interrupted, for_each_host, say, show_progress
from ..model import Host, Plan, Unit
from ..plan.calibrate import CalibrationStore
from ..plan.memcheck import memory_verdicts
from ..plan.render import Renderer
from ..progress import Board
from ..remote.base import Transport
from ..supervisor import for_host
from ..supervisor.base import Supervisor, UnitState
from ..supervisor.process import PROCESS
from ..supervisor.systemd import SYSTEMD
from ..verify.group import GroupLinks, rank_words, root_cause
from ..verify.liveness import live_urls, request_timeout
from . import check, pair_roll, preflight, probe_stages, rejoin, rolling, rollout, surges
from .deploy import (
    Options,
    UnitOutcome,
    calibrate,
    current_files,
    desired_files,
    file_hashes,
    secrets_for,
    start_and_gate,
)
from .early_locks import EarlyLocks
from .lock import HostLock
from .order import stop_rank, upstreams_of
from .sessions import open_sessions

if TYPE_CHECKING:
    from ..verify.smoke import SmokeResult

STOP_MARGIN_S = 30.0


@dataclass
class HostSession:
    """One host for the whole command: its connection, its lock, what it looked like at the start."""

    host: Host
    remote: Transport
    supervisor: Supervisor
    units: list[Unit]
    files: dict[str, dict[str, tuple[bytes, int]]] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)
    states: dict[str, UnitState] = field(default_factory=dict)
    healthy: dict[str, bool] = field(default_factory=dict)
    lock: HostLock | None = None  # the host lock's holder (it reads the probe's second stage)
    # unit -> the files it ran from before this deploy changed them (only units that were healthy):
    # what a failed redeploy puts back
    previous: dict[str, dict[str, tuple[bytes, int]]] = field(default_factory=dict)


@dataclass
class DeploymentOutcome:
    name: str
    ok: bool = True
    failure: str = ""  # what failed first, in a sentence
    batch: int = 0  # the rollout batch it was in (1 = the canary), 0: not tried
    untouched: bool = False  # the rollout stopped before its batch: nothing of it was changed
    smoke: list[tuple[Unit, SmokeResult]] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)  # host/role this run started and then stopped
    restored: list[str] = field(default_factory=list)  # host/role back on their previous files, and how that went
    rolled: list[str] = field(default_factory=list)  # the steps of a rolling update through the router
    running: list[str] = field(default_factory=list)  # host/role left running after a failure
    left: list[str] = field(default_factory=list)  # after Ctrl-C: what else this run left running, and how to stop it

    def fail(self, why: str) -> None:
        if self.ok:
            self.ok, self.failure = False, why


@dataclass
class DeployResult:
    hosts: dict[str, list[UnitOutcome] | GpudeployError]
    deployments: dict[str, DeploymentOutcome]


def reach_targets(unit: Unit, units: list[Unit]) -> list[dict[str, Any]]:
    """The ports ``unit``'s host must reach on other hosts: a router its engines' HTTP ports, a
    decode server its prefill's bootstrap port (where the KV handshake starts)."""
    out = []
    for up, kind in upstreams_of(unit, units):
        out.append({"address": up.host.address, "port": up.ports["http"], "what": f"{kind} {up.key} http",
                    "from": unit.key})
    if unit.group is not None and unit.group.rank > 0:
        # every rank joins the leader's torch.distributed store (NCCL then connects rank to rank)
        address, _, port = unit.group.dist_init.rpartition(":")
        out.append({"address": address.strip("[]"), "port": int(port),
                    "what": f"the dist-init port of its group's leader {unit.group.leader}", "from": unit.key})
    if unit.role.settings.get("disaggregation_mode") == "decode":
        for other in units:
            if other.deployment == unit.deployment and "bootstrap" in other.ports:
                out.append({"address": other.host.address, "port": other.ports["bootstrap"],
                            "what": f"prefill {other.key} bootstrap", "from": unit.key})
    return out


def deploy(plan: Plan, opts: Options, store: CalibrationStore | None = None,
           cancel: Cancel | None = None, early: EarlyLocks | None = None) -> DeployResult:
    """``early``: hosts' connections and lock holders started before the plan was (early_locks.py)."""
    refusals, warnings = memory_verdicts(plan)
    if refusals and not opts.force:
        raise InputError(refusals)
    for line in warnings:
        say(line)
    secrets = secrets_for(plan)
    renderer = Renderer(plan.inventory.templates_dir)
    cancel = cancel or Cancel()
    all_units = list(plan.units)
    names = sorted({u.deployment for u in all_units})
    result = DeployResult({}, {d: DeploymentOutcome(d) for d in names})
    outcomes: dict[str, UnitOutcome] = {}  # unit key -> outcome
    tried = failed = 0
    plan_batches = rollout.batches(names, list(opts.serial) or None)
    for number, batch in enumerate(plan_batches, 1):
        units = [u for u in all_units if u.deployment in batch]
        for d in batch:
            result.deployments[d].batch = number
        if len(plan_batches) > 1:
            say(f"-- batch {number} of {len(plan_batches)}{' (canary)' if number == 1 else ''}: {', '.join(batch)}")
        _batch(plan, units, secrets, renderer, opts, cancel, result, outcomes, store, early)
        tried += len(batch)
        failed += sum(1 for d in batch if not result.deployments[d].ok)
        if opts.serial and number < len(plan_batches) and rollout.over_budget(failed, tried, opts.max_fail_percent):
            rest = [d for b in plan_batches[number:] for d in b]
            why = (f"not deployed: the rollout stopped after batch {number}: {failed} of {tried} deployments failed "
                   f"(over --max-fail-percent {opts.max_fail_percent:g})")
            for d in rest:
                result.deployments[d] = DeploymentOutcome(d, ok=False, failure=why, untouched=True)
            say(f"-- {why}; left untouched: {', '.join(rest)}")
            break
    _collect(result, [u for u in all_units if not result.deployments[u.deployment].untouched], outcomes)
    return result


def _batch(plan: Plan, units: list[Unit], secrets: dict[str, str], renderer: Renderer, opts: Options,
           cancel: Cancel, result: DeployResult, outcomes: dict[str, UnitOutcome],
           store: CalibrationStore | None, early: EarlyLocks | None = None) -> None:
    """One batch of deployments: their hosts connected and locked for it, then the phases; what its
    engines measured is kept before the connections close."""
    hosts = list({u.host.name: u.host for u in units}.values())
    with ExitStack() as stack:
        show_progress(Board())
        stack.callback(show_progress, None)
        try:
            sessions = _open(hosts, units, opts, cancel, stack, result, early)
            _run(plan, sessions, units, secrets, renderer, opts, cancel, result, outcomes)
            if store is not None:
                # Before the connections close: closing 64 of them wakes 64 paramiko threads that
                # wind down on the GIL, and the store's write waited 0.05-0.7 s behind them.
                calibrate(store, [outcomes[u.key] for u in units if u.key in outcomes])
        except Interrupted as exc:
            for host, res in exc.results.items():
                if isinstance(res, GpudeployError):
                    result.hosts.setdefault(host, res)
            for d in {u.deployment for u in units}:
                result.deployments[d].fail("interrupted (Ctrl-C) before it was ready")
                result.deployments[d].running = result.deployments[d].running or sorted(
                    o.unit.key for o in outcomes.values() if o.unit.deployment == d
                    and o.action in ("started", "restarted", "unchanged", "interrupted"))
            _collect(result, units, outcomes)
            raise Interrupted(result) from None


def _collect(result: DeployResult, units: list[Unit], outcomes: dict[str, UnitOutcome]) -> None:
    for u in units:
        if isinstance(result.hosts.get(u.host.name), GpudeployError):
            continue
        listed = result.hosts.setdefault(u.host.name, [])
        assert isinstance(listed, list)
        o = outcomes.get(u.key) or UnitOutcome(u, "skipped", False, message=_why_skipped(result, u))
        if o not in listed:
            listed.append(o)


def _why_skipped(result: DeployResult, u: Unit) -> str:
    failure = result.deployments[u.deployment].failure
    return f"not started: {failure}" if failure else "not started"


def probe_spec(host: Host, mine: list[Unit], units: list[Unit]) -> dict[str, Any]:
    """What deploy's one probe of ``host`` reads: its units' states and files, ports, GPUs, the ports
    it must reach, its engines' releases, and each unit's health (asked on the host, all at once, as
    status asks it, verify/liveness.py: the answer counts only for a unit that is active)."""
    # Both supervisors' unit files are hashed: which one the host uses is known only then.
    candidates = [p for u in mine for p in (SYSTEMD.unit_path(u.name), PROCESS.unit_path(u.name), u.env_path)]
    health = {u.name: live_urls(u, host) for u in mine if u.health_url}
    return {"units": [u.name for u in mine] + surges.probe_names(units, host.name), "ports": True, "gpus": True,
            "files": candidates,
            "reach": [t for u in mine for t in reach_targets(u, units)],
            "versions": preflight.versions_spec(host, mine), "http": health,
            "http_timeout": max([request_timeout(u) for u in mine if u.health_url] or [2.0])}


def _open(hosts: list[Host], units: list[Unit], opts: Options, cancel: Cancel, stack: ExitStack,
          result: DeployResult, early: EarlyLocks | None = None) -> dict[str, HostSession]:
    # The probe rides on the lock's round trip: deploy's facts are read once the lock is held.
    # In two stages (probe_stages.py): what a start needs is read only if something will start.
    specs = {h.name: probe_stages.staged(probe_spec(h, [u for u in units if u.host.name == h.name], units))
             for h in hosts}
    opened, errors = open_sessions(hosts, opts.lock_wait_s, cancel, stack, specs, early)
    for name, error in errors.items():
        _host_failed(result, units, name, error)
    return {name: HostSession(s.host, s.remote, s.supervisor, [u for u in units if u.host.name == name],
                              facts=probe_stages.first_facts(s.facts or {}), lock=s.lock)
            for name, s in opened.items()}


def _unreachable(host: Host, facts: dict[str, Any]) -> list[str]:
    return [f"{r['from']} cannot reach {r['address']}:{r['port']} ({r['what']}) from {host.name}: {r['result']}"
            for r in facts.get("reach", []) if r["result"].startswith("unreachable")]


def _unchanged(s: HostSession, u: Unit) -> bool:
    """The unit's files are what the plan wants, and it runs and answers healthy: it stays as it is."""
    want = file_hashes(s.files[u.name])
    return all(s.facts["files"].get(p) == h for p, h in want.items()) and s.states[u.name].active \
        and bool(s.healthy.get(u.name))


def _all_unchanged(sessions: dict[str, HostSession], units: list[Unit]) -> bool:
    """Every unit on every host stays as it is, and no surge copy of an earlier roll is there."""
    found = {n: surges.Where(s.remote, s.supervisor, s.states, s.facts) for n, s in sessions.items()}
    return all(_unchanged(s, u) for s in sessions.values() for u in s.units) \
        and not surges.left([u for u in units if u.host.name in sessions], found)


def _host_failed(result: DeployResult, units: list[Unit], host: str, error: GpudeployError) -> None:
    result.hosts[host] = error
    for dep in {u.deployment for u in units if u.host.name == host}:
        result.deployments[dep].fail(f"host {host} failed: {str(error).splitlines()[0]}")


def _lost_host(result: DeployResult, units: list[Unit], sessions: dict[str, HostSession], error: LockLost) -> None:
    """A host whose lock was lost in a step outside a phase (a roll, a surge copy put away): it fails
    and drops out of the run, as in a phase."""
    _host_failed(result, units, error.host, error)
    sessions.pop(error.host, None)


def _run(plan: Plan, sessions: dict[str, HostSession], units: list[Unit], secrets: dict[str, str],
         renderer: Renderer, opts: Options, cancel: Cancel, result: DeployResult,
         outcomes: dict[str, UnitOutcome]) -> None:
    deps = result.deployments

    def live(host: str) -> list[HostSession]:
        return [s for s in sessions.values() if s.host.name == host or host == "*"]

    def prepare(host: Host) -> None:
        s = sessions[host.name]
        if not s.facts:  # the lock's holder could not probe: ask on our own (its error is the one to say)
            s.facts = probe(s.remote, probe_spec(host, s.units, units))
        s.supervisor = for_host(host, s.facts)
        s.files = {u.name: desired_files(u, secrets, renderer, s.supervisor) for u in s.units}
        s.states = s.supervisor.states(s.facts)
        s.healthy = {u.name: (s.facts.get("http", {}).get(u.name) or {}).get("status") == 200
                     for u in s.units if u.health_url and s.states[u.name].active}

    def check_host(host: Host) -> None:
        s = sessions[host.name]
        if not probe_stages.complete(s.facts):
            more = s.lock.more() if s.lock is not None else None
            if more is None:  # the holder could not answer: ask on our own (its error is the one to say)
                more = probe(s.remote, probe_stages.second_spec(probe_spec(host, s.units, units)))
            s.facts = probe_stages.merged(s.facts, more)
            s.states = s.supervisor.states(s.facts)  # as of the same moment as the GPUs and ports
        preflight.refuse(host, preflight.problems(host, s.units, s.facts, s.states, s.supervisor, force=opts.force)
                + _unreachable(host, s.facts))
        for line in preflight.warnings(s.units, s.facts):
            say(f"[{host.name}] WARNING: {line}")

    def check_reach(host: Host) -> None:
        preflight.refuse(host, _unreachable(host, sessions[host.name].facts))

    def each_host(step: Callable[[Host], None]) -> None:
        for name, res in for_each_host([s.host for s in live("*")], step, cancel).items():
            if isinstance(res, GpudeployError):
                _host_failed(result, units, name, res)
                sessions.pop(name)

    each_host(prepare)
    # Nothing to start anywhere (a redeploy where nothing changed): nothing for the rest of the
    # preflight to guard; a peer the host cannot reach breaks what runs, so that is still said.
    each_host(check_host if opts.check or not _all_unchanged(sessions, units) else check_reach)
    if opts.check:
        for s in sessions.values():
            for u in s.units:
                action = check.check_unit(s.remote, u, s.files[u.name], s.facts, s.states[u.name],
                                          s.healthy.get(u.name, False))
                outcomes[u.key] = UnitOutcome(u, action, True, s.states[u.name].main_pid)
        return

    # Surge copies an earlier roll left behind go first: the roll below needs their room.
    found = {n: surges.Where(s.remote, s.supervisor, s.states, s.facts) for n, s in sessions.items()}
    kept: list[str] = []
    try:
        kept = surges.put_away([u for u in units if u.host.name in sessions], found,
                               {name: h for s in sessions.values() for name, h in s.healthy.items()})
    except LockLost as exc:  # outside a phase: the host fails as it would in one
        _lost_host(result, units, sessions, exc)
    stop_first: set[str] = set()
    rolled = _roll_serving(plan, sessions, units, secrets, renderer, opts, cancel, result, outcomes, stop_first)
    if rolled:
        units = [u for u in units if u.deployment not in rolled]
        for s in sessions.values():
            s.units = [u for u in s.units if u.deployment not in rolled]

    def ok(u: Unit) -> bool:
        return deps[u.deployment].ok and u.host.name in sessions

    to_start: dict[str, list[Unit]] = {}

    def upload(host: Host) -> None:
        s = sessions[host.name]
        changed = False
        for u in (u for u in s.units if ok(u)):
            want = file_hashes(s.files[u.name])
            state = s.states[u.name]
            if _unchanged(s, u):
                outcomes[u.key] = UnitOutcome(u, "unchanged", True, state.main_pid,
                                              message="unchanged and healthy; not restarted")
                say(f"[{host.name}/{u.role.name}] unchanged and healthy (MainPID {state.main_pid}); not restarted")
                continue
            to_start.setdefault(host.name, []).append(u)
            if s.healthy.get(u.name) and not opts.keep_on_failure:
                s.previous[u.name] = current_files(s.remote, s.files[u.name])
            for path, (data, mode) in s.files[u.name].items():
                if s.facts["files"].get(path) != want[path]:
                    s.remote.put(path, data, mode)
                    changed = True
        if changed or to_start.get(host.name):
            s.supervisor.installed(s.remote)

    _phase(sessions, upload, units, result, cancel)
    # A group restarts whole: one rank restarted alone would find no peers (theirs broke).
    restart = {(u.deployment, u.role.name) for us in to_start.values() for u in us if u.group is not None}
    for u in units:
        if u.group is not None and (u.deployment, u.role.name) in restart and u.host.name in sessions \
                and u not in to_start.get(u.host.name, []):
            outcomes.pop(u.key, None)
            to_start.setdefault(u.host.name, []).append(u)
            say(f"[{u.host.name}/{u.role.name}] restarted with its group (another rank changed)")

    # A router whose engines restart keeps running (rejoin.py): each restarting engine leaves it before
    # it stops and joins again once ready, so the router forgets what it knew of the old one (the
    # real sglang-router 0.3.2 kept a restarted engine's circuit open for 60 s). Only a router that
    # does not answer its worker API is restarted after its engines, as before.
    restarting = {u.key for us in to_start.values() for u in us}
    rejoins: list[rejoin.Rejoin] = []
    for r in rejoin.kept_routers(units, restarting):
        u = r.router
        if u.host.name not in sessions or not ok(u):
            continue
        why = rejoin.leave(r, sessions[u.host.name].remote)
        if not why:
            rejoins.append(r)
            say(f"[{u.host.name}/{u.role.name}] kept running: {', '.join(e.key for e, _ in r.engines)} left it "
                "while restarting and join again once ready")
            continue
        outcomes.pop(u.key, None)
        to_start.setdefault(u.host.name, []).append(u)
        say(f"[{u.host.name}/{u.role.name}] restarted after its engines ({why}: its view of them would be stale)")

    def join_again(ready: set[str]) -> None:
        for r in rejoins:
            if r.router.host.name in sessions and not cancel.is_set():
                why = rejoin.join(r, sessions[r.router.host.name].remote, ready)
                if why:
                    deps[r.router.deployment].fail(why)

    def wave(routers: bool) -> None:
        links = GroupLinks(u for us in to_start.values() for u in us)
        starts = {name: mine for name, us in to_start.items()
                  if (mine := [u for u in us if ok(u) and (u.role.engine == "sglang_router") == routers
                               and (not routers or all(outcomes.get(e.key) and outcomes[e.key].ok
                                                       for e, _ in upstreams_of(u, units)))])}

        def one(host: Host) -> None:
            s = sessions[host.name]
            mine = starts[host.name]
            try:
                gated = start_and_gate(s.remote, s.supervisor, mine, s.files, s.states, opts, cancel, links)
            except Exception:
                for u in mine:  # this host failed as a whole: its ranks' groups fail now, not at their timeout
                    links.failed(u)
                raise
            for o in gated:
                outcomes[o.unit.key] = o
        _phase(sessions, one, units, result, cancel, only=set(starts))
        for o in _group_first(list(outcomes.values())):
            if not o.ok and deps[o.unit.deployment].ok and not o.action.startswith("would"):
                deps[o.unit.deployment].fail(f"{rank_words(o.unit)} {o.action}"
                                             + (f": {o.gate.cause.summary}" if o.gate and o.gate.cause else ""))

    _stop_before_start(sessions, units, stop_first, result, cancel)
    wave(routers=False)
    join_again({k for k, o in outcomes.items() if o.ok and o.action in ("started", "restarted")})
    wave(routers=True)

    def smokes(s: HostSession) -> list[Unit]:
        return [u for u in s.units
                if u.role.engine == "sglang_router" and u.role.smoke is not None and ok(u) and outcomes.get(u.key)]

    def smoke(host: Host) -> None:
        from ..verify.smoke import smoke_test  # (here: a deploy without a router never needs HTTP here)

        s = sessions[host.name]
        for u in smokes(s):
            res = smoke_test(u, [e for e, _ in upstreams_of(u, units)], via=s.remote)
            deps[u.deployment].smoke.append((u, res))
            ttft = f"TTFT {res.ttft_s:.3f} s, " if res.ttft_s is not None else ""
            say(f"[{host.name}/{u.role.name}] smoke {res.endpoint}: "
                + (f"{ttft}total {res.total_s:.3f} s: {res.text.strip()[:60]!r}" if res.ok else
                   f"FAILED: {res.message}"))
            if not res.ok:
                deps[u.deployment].fail(f"the smoke generation through {u.key} failed: {res.message}")

    _phase(sessions, smoke, units, result, cancel, only={n for n, s in sessions.items() if smokes(s)})
    _clean_up_failures(sessions, units, opts, result, outcomes, cancel)
    _restore_previous(sessions, units, opts, result, outcomes, cancel)
    join_again({k for d in deps.values() if d.restored for k in d.running})  # back on their old files
    if kept:
        try:
            surges.put_away_now_ready([u for u in units if u.host.name in sessions and deps[u.deployment].ok],
                                      found, kept)
        except LockLost as exc:
            _lost_host(result, units, sessions, exc)


def _roll_serving(plan: Plan, sessions: dict[str, HostSession], units: list[Unit], secrets: dict[str, str],
                  renderer: Renderer, opts: Options, cancel: Cancel, result: DeployResult,
                  outcomes: dict[str, UnitOutcome], stop_first: set[str]) -> set[str]:
    """Deployments that serve now and whose engines changed are rolled through their router
    (rolling.py) instead of restarted; returns those dealt with here (rolled, or refused for want
    of room or because new and old engines must not pair, pair_roll.py). A multi-node group is not
    rolled (its ranks restart together). ``stop_first`` gets the engines (keys) that a plain restart
    must stop before anything starts again."""
    done: set[str] = set()
    if opts.rolling == "never":
        return done
    views = {n: rolling.Session(s.host, s.remote, s.supervisor, s.facts, s.states) for n, s in sessions.items()}
    files = {u.name: s.files[u.name] for s in sessions.values() for u in s.units}
    for dep in sorted({u.deployment for u in units}):
        mine = [u for u in units if u.deployment == dep]
        if not result.deployments[dep].ok or any(u.host.name not in sessions for u in mine) \
                or any(u.group is not None for u in mine):
            continue
        states = {u.name: sessions[u.host.name].states[u.name] for u in mine}
        healthy = {u.name: sessions[u.host.name].healthy.get(u.name, False) for u in mine}
        changed = rolling.changed_units(mine, files, {n: s.facts for n, s in sessions.items()}, states)
        engines = [u for u in changed if u.role.engine != "sglang_router"]
        if not engines or not rolling.serving(mine, states, healthy):
            if opts.rolling == "always" and engines:
                result.deployments[dep].fail("--rolling: it does not serve now (a router and every engine "
                                             "healthy), so there is nothing to roll through")
                done.add(dep)
            continue
        crossing = pair_roll.crossings(mine, changed, states)
        if crossing and opts.allow_downtime:
            say(f"-- {dep}: its change cannot be rolled (a new prefill would pair with an old decode); restarting "
                "it plainly (--allow-downtime), every changed engine stopped before any starts again")
            stop_first.update(u.key for u in engines)
            continue
        if crossing:
            done.add(dep)
            result.deployments[dep].fail(pair_roll.refusal_text(dep, crossing, rolling.downtime(engines, states)))
            for u in mine:
                outcomes[u.key] = UnitOutcome(u, "skipped", False, states[u.name].main_pid,
                                              message="not changed: its change cannot be rolled")
            continue
        blocked = [(u, why) for u in engines for surge, why in [rolling.room(plan, u, views, mine)] if surge is None]
        if blocked and opts.allow_downtime:
            say(f"-- {dep}: no room for a rolling update; restarting it plainly (--allow-downtime)")
            continue
        done.add(dep)
        if blocked:
            result.deployments[dep].fail(rolling.no_room_text(dep, blocked, states))
            for u in mine:
                outcomes[u.key] = UnitOutcome(u, "skipped", False, states[u.name].main_pid,
                                              message="not changed: no room for a rolling update")
            continue
        say(f"-- {dep} serves now: rolling {', '.join(u.key for u in changed)} through "
            f"{next(u.key for u in mine if u.role.engine == 'sglang_router')}")
        dep_out = result.deployments[dep]
        try:
            r = rolling.roll(plan, mine, changed, views, files, secrets, renderer, opts, cancel)
        except LockLost as exc:  # a host of the roll: it fails as it would in a phase; the roll stops there
            dep_out.fail(f"its rolling update stopped: {exc}")  # (also where the host was only a surge's)
            _lost_host(result, units, sessions, exc)
            views.pop(exc.host, None)
            continue
        except rolling.RollInterrupted as exc:
            dep_out.rolled, dep_out.left = exc.roll.steps, rolling.left_running(exc.roll)
            dep_out.fail(exc.roll.failure)
            dep_out.running = sorted(u.key for u in mine)
            started = {o.unit.key: o for o in exc.roll.outcomes}  # its start on the new files, if it came to that
            for u in mine:
                rolled = u.key in exc.roll.new
                stage = exc.roll.stage.get(u.key)
                if stage is not None:  # Ctrl-C in the middle of this engine's own roll: where it stands
                    o = started.get(u.key)
                    outcomes[u.key] = UnitOutcome(u, o.action if o else "skipped", False,
                                                  o.main_pid if o else states[u.name].main_pid,
                                                  message=f"its roll was interrupted (Ctrl-C): {stage}")
                    continue
                outcomes.setdefault(u.key, UnitOutcome(
                    u, "unchanged" if u not in changed else "restarted" if rolled else "skipped",
                    u not in changed or rolled, states[u.name].main_pid,
                    message="" if u not in changed or rolled else "not rolled (Ctrl-C): still on its old files"))
            raise Interrupted({}) from None
        dep_out.rolled, dep_out.restored = r.steps, r.restored
        for o in r.outcomes:
            outcomes[o.unit.key] = o
        for u in mine:
            outcomes.setdefault(u.key, UnitOutcome(u, "unchanged" if u not in changed else "skipped", u not in changed,
                                                   states[u.name].main_pid,
                                                   message="unchanged and healthy; not restarted"
                                                   if u not in changed else "not rolled: the roll stopped before it"))
        if not r.ok:
            dep_out.fail(r.failure + (f" (new: {', '.join(r.new)}; still old: {', '.join(r.old)})"
                                      if r.new or r.old else ""))
        dep_out.running = sorted(u.key for u in mine)
    return done


def _stop_before_start(sessions: dict[str, HostSession], units: list[Unit], keys: set[str], result: DeployResult,
                       cancel: Cancel) -> None:
    """Stop these engines (decode before prefill) before any engine starts: a plain restart of a change
    that must not pair new with old (pair_roll.py) lets no old engine serve beside a new one."""
    stopping = [u for u in units if u.key in keys and u.host.name in sessions and result.deployments[u.deployment].ok]
    for rank in sorted({stop_rank(u) for u in stopping}):
        batch = [u for u in stopping if stop_rank(u) == rank]

        def stop(host: Host, batch: list[Unit] = batch) -> None:
            s = sessions[host.name]
            mine = [u for u in batch if u.host.name == host.name]
            timeout = max(u.role.stop_timeout_s for u in mine) + STOP_MARGIN_S
            s.supervisor.stop(s.remote, [u.name for u in mine], timeout)
            for u in mine:
                say(f"[{host.name}/{u.role.name}] stopped before the restart (old and new must not pair)")

        _phase(sessions, stop, units, result, cancel, only={u.host.name for u in batch})


def _group_first(outcomes: list[UnitOutcome]) -> list[UnitOutcome]:
    """Outcomes with each multi-node group's root cause first: the deployment's failure names the
    rank that failed first, not one that lost its peers because of it."""
    groups: dict[tuple[str, str], list[UnitOutcome]] = {}
    for o in outcomes:
        if o.unit.group is not None:
            groups.setdefault((o.unit.deployment, o.unit.role.name), []).append(o)
    first = []
    for members in groups.values():
        root = root_cause([(o.unit, o.gate.cause if o.gate else None, o.gate.died_at if o.gate else None)
                           for o in members if not o.ok])
        if root is not None:
            first += [o for o in members if o.unit is root[0]]
    return first + [o for o in outcomes if o not in first]


def _phase(sessions: dict[str, HostSession], fn: Any, units: list[Unit], result: DeployResult,
           cancel: Cancel, only: set[str] | None = None) -> None:
    """Run ``fn(host)`` on every live host in parallel (``only``: just those hosts, the others have
    nothing to do in this phase); a host that fails drops out of the run."""
    hosts = [s.host for s in sessions.values() if only is None or s.host.name in only]
    for name, res in for_each_host(hosts, fn, cancel).items():
        if isinstance(res, GpudeployError):
            _host_failed(result, units, name, res)
            sessions.pop(name)


def _clean_up_failures(sessions: dict[str, HostSession], units: list[Unit], opts: Options, result: DeployResult,
                       outcomes: dict[str, UnitOutcome], cancel: Cancel) -> None:
    """In each failed deployment of this batch, stop what this run started (routers, then decode, then
    prefill); earlier batches' failures were dealt with in their own batch."""
    this_batch = {u.deployment for u in units}
    for dep in result.deployments.values():
        if dep.ok or cancel.is_set() or dep.name not in this_batch:
            continue
        mine = [o for o in outcomes.values() if o.unit.deployment == dep.name]
        # A unit that failed its own gate was already stopped if it still ran (start_and_gate).
        started = [o for o in mine if o.ok and o.action in ("started", "restarted")]
        if opts.keep_on_failure:
            dep.running = sorted(o.unit.key for o in mine if o.action in ("started", "restarted", "unchanged"))
            continue
        for rank in sorted({stop_rank(o.unit) for o in started}):
            batch = [o for o in started if stop_rank(o.unit) == rank and o.unit.host.name in sessions]

            def stop(host: Host, batch: list[UnitOutcome] = batch) -> None:
                s = sessions[host.name]
                names = [o.unit.name for o in batch if o.unit.host.name == host.name]
                if names:
                    timeout = max(o.unit.role.stop_timeout_s for o in batch) + STOP_MARGIN_S
                    s.supervisor.stop(s.remote, names, timeout)

            done = for_each_host(list({o.unit.host.name: o.unit.host for o in batch}.values()), stop, cancel)
            for name, res in done.items():  # e.g. its lock was lost: nothing was stopped there
                if isinstance(res, GpudeployError) and name in sessions:
                    _host_failed(result, units, name, res)
                    sessions.pop(name)
            for o in batch:
                if isinstance(done.get(o.unit.host.name), GpudeployError):
                    continue
                dep.stopped.append(o.unit.key)
                if o.ok:
                    o.message = "stopped: its deployment failed"
        dep.running = sorted(o.unit.key for o in mine if o.action == "unchanged")


def _restore_previous(sessions: dict[str, HostSession], units: list[Unit], opts: Options, result: DeployResult,
                      outcomes: dict[str, UnitOutcome], cancel: Cancel) -> None:
    """A failed redeploy must not leave a deployment down that was serving before it: the units it
    stopped that were healthy on their previous files get those files back, are started again
    (engines, then routers) and gated like any start. What this says is in ``dep.restored``."""
    this_batch = {u.deployment for u in units}
    for dep in result.deployments.values():
        if dep.ok or cancel.is_set() or dep.name not in this_batch or opts.keep_on_failure:
            continue
        # What this run (re)started there, stopped since or failed on its new files, and that served
        # on the old ones before.
        tried = {o.unit.key for o in outcomes.values() if o.unit.deployment == dep.name
                 and o.action in ("started", "restarted", "failed")}
        back = [u for u in units if u.deployment == dep.name and u.key in tried
                and u.host.name in sessions and sessions[u.host.name].previous.get(u.name)]
        if not back:
            continue
        for routers in (False, True):
            _restore_wave(dep, sessions, [u for u in back if (u.role.engine == "sglang_router") == routers], opts,
                          cancel)
        dep.running.sort()


def _restore_wave(dep: DeploymentOutcome, sessions: dict[str, HostSession], wave: list[Unit], opts: Options,
                  cancel: Cancel) -> None:
    def one(host: Host) -> None:
        s = sessions[host.name]
        mine = [u for u in wave if u.host.name == host.name]
        for u in mine:
            for path, (data, mode) in s.previous[u.name].items():
                s.remote.put(path, data, mode)
        s.supervisor.installed(s.remote)
        # (the new run's failure stays the unit's outcome in the report; this says what followed)
        for o in start_and_gate(s.remote, s.supervisor, mine, s.previous, s.states, opts, cancel):
            words = "healthy again" if o.ok else \
                f"FAILED again: {o.gate.cause.summary if o.gate and o.gate.cause else o.action}"
            dep.restored.append(f"{o.unit.key} ({words})")
            if o.ok:
                if o.unit.key in dep.stopped:
                    dep.stopped.remove(o.unit.key)
                dep.running.append(o.unit.key)

    for name, res in for_each_host(list({u.host.name: u.host for u in wave}.values()), one, cancel).items():
        if isinstance(res, GpudeployError):
            dep.restored += [f"{u.key} (FAILED: {res})" for u in wave if u.host.name == name]
