"""teardown: stop units, then PROVE nothing is left: empty cgroup, no recorded PID alive, GPUs free.

Whatever the check finds is killed by exact PID and start time (a PID reused since is never hit;
one without a start time is refused), and reported. Idempotent: tearing down what is already
down just verifies again. A whole deployment is the set of units whose own file names it
(``X-Gpudeploy-Deployment=``), never a name pattern. Takes the host lock, so a teardown waits for
a deploy's gate instead of looking to it like a crash. Units stop in order across hosts: routers,
then decode, then the rest, prefill last.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from ..errors import GpudeployError
from ..facts.probe import probe
from ..fanout import Cancel, for_each_host, say
from ..model import Host, Plan, Unit
from ..plan.build import ENV_DIR, STATE_ROOT, unit_stem
from ..remote.base import Transport
from ..supervisor import for_host
from ..supervisor.base import Supervisor, UnitState
from .hostscripts import kill_exact_argv
from .order import RANKS, kind_rank, stop_rank
from .sessions import Session, open_sessions

RUNS_DIR = "/var/lib/gpudeploy/runs"
LINGER_S = 10.0  # how long a stopped run's processes and GPU memory may take to go
STOP_MARGIN_S = 30.0  # what a stop may take beyond the units' own stop timeouts


@dataclass
class TeardownOutcome:
    unit: str
    role: str
    was: str
    killed: list[int] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # what the exact kill would not touch, and why
    left: list[int] = field(default_factory=list)
    gpu_left: list[dict[str, Any]] = field(default_factory=list)
    gpu_used_gib: dict[int, float] = field(default_factory=dict)
    purged: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.left and not self.gpu_left


def teardown(plan: Plan, hosts: list[Host], *, purge: bool, deployments: list[str],
             cancel: Cancel | None = None, lock_wait_s: float = 600.0, group_hosts: tuple[str, ...] = ()
             ) -> dict[str, list[TeardownOutcome] | GpudeployError]:
    """Stop in order across every host (routers, then decode, then the rest, prefill last), then
    prove each host clean. Units of ``deployments`` that the plan no longer has are found by their
    own files and stopped too. On ``group_hosts`` (there only for the other ranks of a selected
    multi-node group) only the planned units are stopped."""
    names = sorted(deployments)
    results: dict[str, list[TeardownOutcome] | GpudeployError] = {}
    with ExitStack() as stack:
        sessions, errors = open_sessions(hosts, lock_wait_s, cancel, stack)
        results.update(errors)
        planned = {h: {u.name: u for u in plan.units if u.host.name == h} for h in sessions}
        found: dict[str, dict[str, UnitState]] = {}

        def inspect(host: Host) -> None:
            spec = {"units": list(planned[host.name]), "gpus": True,
                    "deployments": [] if host.name in group_hosts else names}
            session = sessions[host.name]
            facts = probe(session.remote, spec)
            session.supervisor = for_host(host, facts)
            found[host.name] = session.supervisor.states(facts)

        _each(sessions, inspect, results, cancel)
        for rank in sorted(RANKS.values()):
            def stop(host: Host, rank: int = rank) -> None:
                mine = [n for n, st in found[host.name].items() if _rank(n, st, planned[host.name]) == rank]
                if mine:
                    timeout = max([u.role.stop_timeout_s for u in planned[host.name].values()] + [30.0])
                    s = sessions[host.name]
                    s.supervisor.stop(s.remote, mine, timeout + STOP_MARGIN_S)

            _each(sessions, stop, results, cancel)

        def prove(host: Host) -> list[TeardownOutcome]:
            s = sessions[host.name]
            return prove_clean(s.remote, s.supervisor, host, found[host.name], planned[host.name], purge)

        for name, res in for_each_host([s.host for s in sessions.values()], prove, cancel).items():
            results.setdefault(name, res)
    return {h.name: results[h.name] for h in hosts}


def _rank(name: str, state: UnitState, planned: dict[str, Unit]) -> int:
    unit = planned.get(name)
    return stop_rank(unit) if unit is not None else kind_rank((state.meta or {}).get("kind"))


def _each(sessions: dict[str, Session], fn: Callable[[Host], None],
          results: dict[str, list[TeardownOutcome] | GpudeployError], cancel: Cancel | None) -> None:
    """``fn`` on every host still in the run; a host that fails reports its error and drops out."""
    for name, res in for_each_host([s.host for s in sessions.values()], fn, cancel).items():
        if isinstance(res, GpudeployError):
            results[name] = res
            sessions.pop(name)


def survivors(state: UnitState, record: dict[str, Any], gpu_processes: list[dict[str, Any]]) -> dict[int, int | None]:
    """PID -> start ticks of every process of a stopped unit still alive: the unit's own, recorded
    by the deploy (start time checked by the probe), or on a GPU under a recorded PID."""
    found: dict[int, int | None] = {p["pid"]: p.get("start_ticks") for p in state.procs}
    found.update({p["pid"]: p.get("start_ticks") for p in state.recorded_alive})
    recorded = {r["pid"]: r.get("start_ticks") for r in record.get("pids", [])}
    for p in gpu_processes:
        if p["pid"] in recorded and p["pid"] not in found:
            found[p["pid"]] = recorded[p["pid"]]
    return found


def owned_paths(name: str, meta: dict[str, str] | None, planned: Unit | None, unit_file: str) -> list[str]:
    """The files and state directory of unit ``name`` that --purge removes: the paths gpudeploy
    derives for it, and only if the unit's own file names exactly those (never a pattern)."""
    paths = [unit_file, f"{RUNS_DIR}/{name}.json"]
    if planned is not None:
        return [*paths, planned.env_path, planned.state_dir]
    if meta and meta.get("deployment") and meta.get("role"):
        stem = unit_stem(meta["deployment"], meta["role"])
        if meta.get("env_file") == f"{ENV_DIR}/{stem}.env":
            paths.append(f"{ENV_DIR}/{stem}.env")
        if meta.get("state_directory") == f"gpudeploy/{stem}":
            paths.append(f"{STATE_ROOT}/gpudeploy/{stem}")
    return paths


def prove_clean(remote: Transport, supervisor: Supervisor, host: Host, before: dict[str, UnitState],
                planned: dict[str, Unit], purge: bool) -> list[TeardownOutcome]:
    """After the stop: kill what survived (by PID and start time), wait for it to go, check the
    GPUs, and with ``purge`` remove the units' files."""
    names = list(before)
    if not names:
        return []
    after_facts = probe(remote, {"units": names, "gpus": True})
    after = supervisor.states(after_facts)
    gpu_procs = (after_facts.get("gpus") or {}).get("processes", [])
    outcomes = []
    survived = False
    for name in names:
        now, then = after[name], before[name]
        record = now.record or then.record or {}
        meta = then.meta or {}
        role = planned[name].role.name if name in planned else meta.get("role") or record.get("role", "?")
        out = TeardownOutcome(name, role, then.state)
        left = survivors(now, record, gpu_procs)
        if left:
            survived = True
            cmds = {p["pid"]: p.get("cmd", "?") for p in now.procs + now.recorded_alive}
            for pid in left:
                say(f"[{host.name}/{role}] process {pid} survived the stop ({cmds.get(pid, '?')[:80]}); "
                    "killing it by PID and start time")
            res = remote.run(kill_exact_argv(remote.host.python or "python3", sorted(left.items())), check=False)
            for line in res.stdout.splitlines():
                word, _, rest = line.partition(" ")
                if word == "killed":
                    out.killed.append(int(rest))
                elif word in ("refused", "spared"):
                    out.refused.append(rest)
        outcomes.append(out)
    unit_gpus = {g for u in planned.values() for g in u.gpus}
    deadline = time.monotonic() + LINGER_S
    # When nothing survived the stop, the facts just read are the first look of the wait (probing
    # again at once cost every host one more probe: ~90 ms of its CPU, a quarter of a teardown).
    final_facts: dict[str, Any] | None = None if survived else after_facts
    while True:
        # A SIGKILLed process lingers until its parent reaps it, and the driver frees a dead
        # process's GPU memory a moment later: wait for both, bounded.
        if final_facts is None:
            final_facts = probe(remote, {"units": names, "gpus": True})
        final = supervisor.states(final_facts)
        on_gpus = [p for p in (final_facts.get("gpus") or {}).get("processes", []) if p["gpu"] in unit_gpus]
        if not any(st.procs or st.recorded_alive for st in final.values()) and not on_gpus:
            break
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
        final_facts = None
    gpus = final_facts.get("gpus") or {}
    for out in outcomes:
        st = final[out.unit]
        out.left = [p["pid"] for p in st.procs] + [p["pid"] for p in st.recorded_alive]
        unit = planned.get(out.unit)
        if unit is not None:
            used = {d["index"]: d["used"] / 2**30 for d in gpus.get("devices", [])}
            out.gpu_used_gib = {g: round(used[g], 2) for g in unit.gpus if g in used}
            out.gpu_left = [p for p in gpus.get("processes", []) if p["gpu"] in unit.gpus]
    if purge:
        for out in outcomes:
            out.purged = owned_paths(out.unit, before[out.unit].meta, planned.get(out.unit),
                                     supervisor.unit_path(out.unit))
        remote.run(["rm", "-rf", "--", *(p for out in outcomes for p in out.purged)])
        supervisor.forget(remote, names)
    return outcomes
