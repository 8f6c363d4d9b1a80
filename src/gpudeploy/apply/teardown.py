"""teardown: stop units, then PROVE nothing is left: empty cgroup, no recorded PID alive, GPUs free.

Whatever the check finds is killed by exact PID (and start time, so a reused PID is never hit),
and reported. Idempotent: tearing down what is already down just verifies again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import GpudeployError
from ..model import Host, Plan, Unit
from .hostscripts import KILL_EXACT
from .parallel import for_each_host, say
from .ssh import Remote

RUNS_DIR = "/var/lib/gpudeploy/runs"


@dataclass
class TeardownOutcome:
    unit: str
    role: str
    was: str
    killed: list[int] = field(default_factory=list)
    left: list[int] = field(default_factory=list)
    gpu_left: list[dict[str, Any]] = field(default_factory=list)
    gpu_used_gib: dict[int, float] = field(default_factory=dict)
    purged: bool = False

    @property
    def clean(self) -> bool:
        return not self.left and not self.gpu_left


def teardown(plan: Plan, hosts: list[Host], *, purge: bool, whole_deployment: bool
             ) -> dict[str, list[TeardownOutcome] | GpudeployError]:
    prefix = f"gpudeploy-{plan.inventory.deployment}-"

    def one(host: Host) -> list[TeardownOutcome]:
        units = [u for u in plan.units if u.host.name == host.name]
        return teardown_host(host, units, prefix if whole_deployment else None, purge)

    return for_each_host(hosts, one)


def teardown_host(host: Host, units: list[Unit], prefix: str | None, purge: bool) -> list[TeardownOutcome]:
    planned = {u.name: u for u in units}
    with Remote(host) as remote:
        spec: dict[str, Any] = {"units": list(planned), "gpus": True}
        if prefix:
            spec.update(all_units=True, prefix=prefix)
        before = remote.probe(spec)
        names = list(before["units"])
        if not names:
            return []
        stop_timeout = max([u.role.stop_timeout_s for u in units] + [30.0])
        remote.run(["systemctl", "stop", "--", *names], timeout=stop_timeout + 30, check=False)
        after = remote.probe({**spec, "all_units": False, "units": names})
        outcomes = []
        for name in names:
            uf = after["units"][name]
            record = uf.get("record") or before["units"][name].get("record") or {}
            out = TeardownOutcome(name, planned[name].role.name if name in planned else record.get("role", "?"),
                                  before["units"][name]["props"].get("ActiveState", "?"))
            survivors = {p["pid"]: p for p in uf["procs"]}
            survivors.update({p["pid"]: p for p in uf.get("recorded_alive", [])})
            ours = {r["pid"] for r in record.get("pids", [])} | set(survivors)
            for p in after["gpus"]["processes"] if after.get("gpus") else []:
                if p["pid"] in ours:
                    survivors.setdefault(p["pid"], {"pid": p["pid"], "start_ticks": None})
            for pid, info in survivors.items():
                say(f"[{host.name}/{out.role}] process {pid} survived the stop ({info.get('cmd', '?')[:80]}); "
                    "killing it by PID")
                _kill_exact(remote, pid, info.get("start_ticks"))
                out.killed.append(pid)
            outcomes.append(out)
        deadline = time.monotonic() + 5.0
        while True:  # a SIGKILLed process lingers until its parent reaps it; wait for that, bounded
            final = remote.probe({"units": names, "gpus": True})
            lingering = any(u["procs"] or u.get("recorded_alive") for u in final["units"].values())
            if not lingering or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        gpus = final.get("gpus") or {}
        for out in outcomes:
            uf = final["units"][out.unit]
            out.left = [p["pid"] for p in uf["procs"]] + [p["pid"] for p in uf.get("recorded_alive", [])]
            unit = planned.get(out.unit)
            if unit is not None:
                used = {d["index"]: d["used"] / 2**30 for d in gpus.get("devices", [])}
                out.gpu_used_gib = {g: round(used[g], 2) for g in unit.gpus if g in used}
                out.gpu_left = [p for p in gpus.get("processes", []) if p["gpu"] in unit.gpus]
        if purge:
            paths = [f"/etc/systemd/system/{n}" for n in names] + [f"{RUNS_DIR}/{n}.json" for n in names]
            paths += [u.env_path for u in units]
            remote.run(["rm", "-f", "--", *paths])
            remote.run(["systemctl", "daemon-reload"])
            remote.run(["systemctl", "reset-failed", "--", *names], check=False)
            for out in outcomes:
                out.purged = True
        return outcomes


def _kill_exact(remote: Remote, pid: int, start_ticks: int | None) -> None:
    remote.run(["python3", "-c", KILL_EXACT, str(pid), str(start_ticks)], check=False)
