"""teardown: stop units, then PROVE nothing is left: empty cgroup, no recorded PID alive, GPUs free.

Whatever the check finds is killed by exact PID and start time (a PID reused since is never hit;
one without a start time is refused), and reported. Idempotent: tearing down what is already
down just verifies again. A whole deployment is the set of units whose own file names it
(``X-Gpudeploy-Deployment=``), never a name pattern. Takes the host lock, so a teardown waits for
a deploy's gate instead of looking to it like a crash.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import GpudeployError
from ..facts.probe import probe
from ..fanout import Cancel, for_each_host, say
from ..model import Host, Plan, Unit
from ..plan.build import ENV_DIR, STATE_ROOT, UNIT_DIR, unit_stem
from ..remote.ssh import Remote
from ..supervisor import for_host
from ..supervisor.base import UnitState
from .hostscripts import kill_exact_argv
from .lock import HostLock

RUNS_DIR = "/var/lib/gpudeploy/runs"
LINGER_S = 5.0  # a SIGKILLed process lingers until its parent reaps it
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


def teardown(plan: Plan, hosts: list[Host], *, purge: bool, whole_deployment: bool,
             cancel: Cancel | None = None, lock_wait_s: float = 600.0
             ) -> dict[str, list[TeardownOutcome] | GpudeployError]:
    deployment = plan.inventory.deployment if whole_deployment else None

    def one(host: Host) -> list[TeardownOutcome]:
        units = [u for u in plan.units if u.host.name == host.name]
        return teardown_host(host, units, deployment, purge, cancel=cancel, lock_wait_s=lock_wait_s)

    return for_each_host(hosts, one, cancel)


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


def owned_paths(name: str, meta: dict[str, str] | None, planned: Unit | None) -> list[str]:
    """The files and state directory of unit ``name`` that --purge removes: the paths gpudeploy
    derives for it, and only if the unit's own file names exactly those (never a pattern)."""
    paths = [f"{UNIT_DIR}/{name}", f"{RUNS_DIR}/{name}.json"]
    if planned is not None:
        return [*paths, planned.env_path, planned.state_dir]
    if meta and meta.get("deployment") and meta.get("role"):
        stem = unit_stem(meta["deployment"], meta["role"])
        if meta.get("env_file") == f"{ENV_DIR}/{stem}.env":
            paths.append(f"{ENV_DIR}/{stem}.env")
        if meta.get("state_directory") == f"gpudeploy/{stem}":
            paths.append(f"{STATE_ROOT}/gpudeploy/{stem}")
    return paths


def teardown_host(host: Host, units: list[Unit], deployment: str | None, purge: bool, *,
                  cancel: Cancel | None = None, lock_wait_s: float = 600.0) -> list[TeardownOutcome]:
    planned = {u.name: u for u in units}

    def waiting(who: str) -> None:
        say(f"[{host.name}] waiting for another gpudeploy run ({who})")

    supervisor = for_host(host)
    with Remote(host) as remote, HostLock(remote, lock_wait_s, waiting, cancel):
        spec: dict[str, Any] = {"units": list(planned), "gpus": True}
        if deployment:
            spec["deployment"] = deployment
        before = supervisor.states(probe(remote, spec))
        names = list(before)
        if not names:
            return []
        stop_timeout = max([u.role.stop_timeout_s for u in units] + [30.0])
        supervisor.stop(remote, names, stop_timeout + STOP_MARGIN_S)
        after_facts = probe(remote, {"units": names, "gpus": True})
        after = supervisor.states(after_facts)
        gpu_procs = (after_facts.get("gpus") or {}).get("processes", [])
        outcomes = []
        for name in names:
            now, then = after[name], before[name]
            record = now.record or then.record or {}
            meta = then.meta or {}
            role = planned[name].role.name if name in planned else meta.get("role") or record.get("role", "?")
            out = TeardownOutcome(name, role, then.state)
            left = survivors(now, record, gpu_procs)
            if left:
                cmds = {p["pid"]: p.get("cmd", "?") for p in now.procs + now.recorded_alive}
                for pid in left:
                    say(f"[{host.name}/{role}] process {pid} survived the stop ({cmds.get(pid, '?')[:80]}); "
                        "killing it by PID and start time")
                res = remote.run(kill_exact_argv(sorted(left.items())), check=False)
                for line in res.stdout.splitlines():
                    word, _, rest = line.partition(" ")
                    if word == "killed":
                        out.killed.append(int(rest))
                    elif word in ("refused", "spared"):
                        out.refused.append(rest)
            outcomes.append(out)
        deadline = time.monotonic() + LINGER_S
        while True:  # a SIGKILLed process lingers until its parent reaps it; wait for that, bounded
            final_facts = probe(remote, {"units": names, "gpus": True})
            final = supervisor.states(final_facts)
            if not any(st.procs or st.recorded_alive for st in final.values()) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
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
                out.purged = owned_paths(out.unit, before[out.unit].meta, planned.get(out.unit))
            remote.run(["rm", "-rf", "--", *(p for out in outcomes for p in out.purged)])
            supervisor.forget(remote, names)
        return outcomes
