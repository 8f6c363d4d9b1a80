"""status: every gpudeploy unit on the selected hosts, checked in parallel, one probe per host."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..controlchars import printable
from ..errors import GpudeployError
from ..facts import health as nvml_health
from ..facts.probe import probe
from ..fanout import for_each_host
from ..model import Host, Plan, Unit
from ..plan.build import deployments
from ..remote import connect, openssh
from ..supervisor import for_host
from ..supervisor.base import UnitState
from . import xid
from .causes import Cause, classify, log_format
from .head_start import HeadStart
from .http import status_of
from .liveness import live_urls, local_url


@dataclass
class UnitStatus:
    host: str
    unit: str
    role: str
    deployment: str
    state: str  # ActiveState/SubState
    main_pid: int
    uptime_s: float | None
    ports: dict[str, int]
    health: str  # "200", "503", "down", "-" (not deployed)
    healthy: bool
    deployed: bool
    procs: list[dict[str, Any]] = field(default_factory=list)
    orphans: list[dict[str, Any]] = field(default_factory=list)
    last_failure: str | None = None
    next_step: str | None = None
    failure_lines: list[str] = field(default_factory=list)  # the run's own lines that show the failure
    address: str = ""
    workers: list[dict[str, Any]] | None = None  # a router's own view of its workers (/workers)
    gpu_memory: dict[int, float] = field(default_factory=dict)  # GPU -> GiB its run's processes hold (NVML)
    router_view: list[str] = field(default_factory=list)  # an engine as its routers see it
    group: str | None = None  # a multi-node rank: "rank 1 of 2 (leader lab1)"
    group_down: str | None = None  # another rank of its group is down: which, and why
    # GPU -> what NVML says it draws and does now (power_w, power_limit_w, sm_util_pct, mem_util_pct,
    # used_gib), for the unit's GPUs; empty without NVML. gpu_standin: the NVML there is a stand-in's.
    gpu_load: dict[int, dict[str, Any]] = field(default_factory=dict)
    gpu_standin: str | None = None
    # GPU -> {"word": ok | degraded | failing | lost | "-", "why": [...]} of the unit's GPUs (NVML, and
    # the Xids that came while its run served: verify/xid.py); empty without NVML or GPUs
    gpu_health: dict[int, dict[str, Any]] = field(default_factory=dict)
    xids: list[dict[str, Any]] = field(default_factory=list)  # its GPUs' Xids since its run started
    failure_kind: str | None = None  # last_failure's kind (verify/causes.py), e.g. oom-while-serving

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "unit": self.unit, "role": self.role, "deployment": self.deployment,
                "state": self.state, "workers": self.workers, "router_view": self.router_view,
                "gpu_memory_gib": {str(g): v for g, v in self.gpu_memory.items()},
                "main_pid": self.main_pid, "uptime_s": self.uptime_s, "ports": self.ports, "health": self.health,
                "healthy": self.healthy, "deployed": self.deployed, "pids": [p["pid"] for p in self.procs],
                "orphans": [{"pid": p["pid"], "cmd": p["cmd"]} for p in self.orphans],
                "last_failure": self.last_failure, "next_step": self.next_step,
                "group": self.group, "group_down": self.group_down,
                "gpus": {str(g): v for g, v in self.gpu_load.items()}, "gpu_standin": self.gpu_standin,
                "gpu_health": {str(g): v for g, v in self.gpu_health.items()}, "xids": self.xids}


def status(plan: Plan, hosts: list[Host], group_hosts: tuple[str, ...] = (), early: HeadStart | None = None
           ) -> dict[str, list[UnitStatus] | GpudeployError]:
    """``group_hosts``: hosts looked at only for the ranks of a selected multi-node group (their
    other units are not shown). ``early``: probes already started (head_start.py)."""
    by_host = {h.name: [u for u in plan.units if u.host.name == h.name] for h in hosts}
    names = sorted(deployments(plan.inventory))
    results = for_each_host(hosts, lambda h: host_status(h, by_host[h.name], [] if h.name in group_hosts else names,
                                                         plan.inventory.deployment, early))
    across_hosts(results, plan.units)
    return results


def across_hosts(results: dict[str, list[UnitStatus] | GpudeployError], units: tuple[Unit, ...]) -> None:
    """What one host's statuses cannot say alone: how each router sees each engine, and a
    multi-node group that is down on another host."""
    found = [s for r in results.values() if not isinstance(r, GpudeployError) for s in r]
    _router_views(found)
    _group_views(found, units, results)


def _group_views(found: list[UnitStatus], units: tuple[Unit, ...], results: dict[str, Any]) -> None:
    """A multi-node group is one engine: a rank that is down (or unreachable) makes every rank unhealthy."""
    groups: dict[tuple[str, str], list[tuple[Unit, UnitStatus | None]]] = {}
    for u in units:
        if u.group is not None:
            mine = next((s for s in found if s.host == u.host.name and s.unit == u.name), None)
            groups.setdefault((u.deployment, u.role.name), []).append((u, mine))
    for ranks in groups.values():
        down = []
        for u, s in ranks:
            assert u.group is not None
            if s is None:
                res = results.get(u.host.name)
                down.append(f"rank {u.group.rank} on {u.host.name} "
                            + ("unreachable" if isinstance(res, GpudeployError) else "not looked at"))
            elif not s.healthy:
                why = s.last_failure or ("not deployed" if not s.deployed else f"{s.state}, health {s.health}")
                down.append(f"rank {u.group.rank} on {u.host.name}: {why}")
        for u, s in ranks:
            if s is None or u.group is None:
                continue
            lead = "leader" if u.group.rank == 0 else f"leader {u.group.leader}"
            s.group = f"rank {u.group.rank} of {u.group.nnodes} ({lead})"
            others = [d for d in down if not d.startswith(f"rank {u.group.rank} on")]
            if others and s.deployed:
                s.group_down = "; ".join(others)
                s.healthy = False


# How long status gives each server (all at once) before calling it down. SGLang's is asked its
# /server_info, which answers in milliseconds (verify/liveness.py); a release without it, its
# /health, which generates a token and answers after 1 s at the earliest (verify/gate.py).
STATUS_HTTP_S = 5.0


def probe_spec(host: Host, units: list[Unit], deployment_names: list[str], *, light: bool = False) -> dict[str, Any]:
    """What the host probe is asked for status: every unit's state, the health of each (asked fast:
    verify/liveness.py) and each router's /workers, read on the host itself (one round trip, and
    the servers' ports need not be open to the operator's machine); a failed run's last lines and
    the GPUs' processes unless ``light`` (status --watch's periodic poll: its runs' lines come from
    their stream)."""
    http: dict[str, str | list[str]] = {u.name: live_urls(u, host) for u in units if u.health_url}
    http.update({f"{u.name}#workers": local_url(f"http://{u.host.address}:{u.ports['http']}/workers", host)
                 for u in units if u.role.engine == "sglang_router" and "http" in u.ports})
    journal_lines = 1 if light else max([log_format(u.role.log_format).journal_lines for u in units] + [60])
    gpus = not light and any(u.gpus for u in units)
    spec = {"units": [u.name for u in units], "deployments": deployment_names, "journal_lines": journal_lines,
            "http": http, "http_timeout": STATUS_HTTP_S, "gpus": gpus}
    if gpus:  # the driver's Xid lines since boot: each unit's are those since its run started
        spec["xids"] = {"since": 0}
    return spec


def host_status(host: Host, units: list[Unit], deployment_names: list[str], default: str,
                early: HeadStart | None = None) -> list[UnitStatus]:
    spec = probe_spec(host, units, deployment_names)
    facts = early.probe(host, spec) if early is not None else None
    if facts is None:
        facts = host_probe(host, spec)
    return [s for s, _ in read_facts(host, units, facts, default)]


def host_probe(host: Host, spec: dict[str, Any]) -> dict[str, Any]:
    if host.connection == "ssh" and openssh.available():
        return probe(openssh.OpenSsh(host), spec)
    with connect(host) as remote:  # this machine itself, or paramiko where there is no OpenSSH client
        return probe(remote, spec)


def read_facts(host: Host, units: list[Unit], facts: dict[str, Any], default: str
               ) -> list[tuple[UnitStatus, UnitState]]:
    """The probe's facts -> each unit's status, with its supervisor's own view of it (its run)."""
    states = for_host(host, facts).states(facts)
    planned = {u.name: u for u in units}
    out = []
    for name, st in states.items():
        unit = planned.get(name)
        got = facts.get("http", {}).get(name)
        health = "-" if unit is None or not unit.health_url else str(got["status"]) if got and got["status"] else "down"
        s = _status(host, st, unit, health, facts["now"], default)
        mine = {p["pid"] for p in st.procs}
        nvml = facts.get("gpus") or {}
        for p in nvml.get("processes", []):
            if p["pid"] in mine:
                s.gpu_memory[p["gpu"]] = round(s.gpu_memory.get(p["gpu"], 0.0) + p["used"] / 2**30, 2)
        s.gpu_load, s.gpu_standin = gpu_load(nvml, set(unit.gpus) if unit else set(s.gpu_memory))
        if unit is not None and unit.gpus and nvml.get("devices") is not None and not nvml.get("error"):
            gpu_health(s, st, unit, nvml, facts.get("xids") or {})
        workers = facts.get("http", {}).get(f"{name}#workers")
        if workers is not None and workers.get("status") == 200:
            s.workers = parse_workers(workers.get("json"))
        out.append((s, st))
    return out


def run_start(st: UnitState) -> float | None:
    """When the unit's current (or last) run started, by the host's clock, from deploy's run record of
    it; None when the record is of another run."""
    record = st.record or {}
    if record.get("started_us") and record.get("invocation") == st.run_id:
        return float(record["started_us"]) / 1e6
    return None


def gpu_health(s: UnitStatus, st: UnitState, unit: Unit, nvml: dict[str, Any], kernel: dict[str, Any]) -> None:
    """Each of the unit's GPUs' one word, and the Xids its GPUs reported since its run started: a run that
    failed names them first in its last failure (verify/xid.py)."""
    since = run_start(st)
    s.xids = xid.on_gpus(kernel.get("xids") or [], unit.gpus, since) if since is not None else []
    devices = {int(d["index"]): d for d in nvml.get("devices") or [] if "index" in d}
    for g in unit.gpus:
        d = devices.get(g)
        mine = [x for x in s.xids if x.get("gpu") in (g, None)] if st.active else []
        why = [f.fact for f in nvml_health.findings(d)] if d is not None else [
            "NVML does not list it (it fell off the bus, or the inventory names a GPU the host lacks: `invoke facts`)"]
        why += [xid.sentence(x) for x in mine if xid.xid_word(int(x["xid"])) != "ok"]
        s.gpu_health[g] = {"word": xid.gpu_word(d, mine) if d is not None else "lost", "why": why}
    if st.failed and s.xids:
        engine = Cause("", s.last_failure or "", tuple(s.failure_lines), s.next_step or "")
        named = xid.cause(s.xids, engine if s.last_failure else None)
        if named is not None:
            s.last_failure, s.next_step, s.failure_lines = named.summary, named.next_step, list(named.evidence)


def gpu_words(found: dict[int, dict[str, Any]]) -> str:
    """Each GPU's health word, runs of GPUs with the same word together: "0-3 ok", "0 ok, 1 failing, 2-3 ok"."""
    return nvml_health.grouped({g: h["word"] for g, h in found.items()})


def gpu_load(nvml: dict[str, Any], gpus: set[int]) -> tuple[dict[int, dict[str, Any]], str | None]:
    """The probe's NVML devices -> GPU -> its power, utilisation and memory now, for ``gpus``; and
    what a stand-in NVML says of itself (None for a real driver)."""
    out: dict[int, dict[str, Any]] = {}
    for d in nvml.get("devices") or []:
        if d.get("index") in gpus:
            out[int(d["index"])] = {"power_w": d.get("power_w"), "power_limit_w": d.get("power_limit_w"),
                                    "sm_util_pct": d.get("sm_util_pct"), "mem_util_pct": d.get("mem_util_pct"),
                                    "used_gib": round(d["used"] / 2**30, 2) if d.get("used") is not None else None}
    return out, nvml.get("standin") if out else None


def parse_workers(doc: Any) -> list[dict[str, Any]]:
    """sglang-router's /workers answer -> [{"url", "type", "healthy"}] (a list, or {"workers": [...]})."""
    items = doc.get("workers", []) if isinstance(doc, dict) else doc if isinstance(doc, list) else []
    out = []
    for w in items:
        if isinstance(w, dict) and w.get("url"):
            healthy = w.get("is_healthy", w.get("healthy"))
            out.append({"url": str(w["url"]).rstrip("/"), "type": w.get("worker_type") or w.get("type"),
                        "healthy": bool(healthy) if healthy is not None else None})
    return out


def _router_views(all_status: list[UnitStatus]) -> None:
    """Next to each engine: how each router that lists it sees it."""
    for router in all_status:
        for w in router.workers or []:
            for s in all_status:
                if s.ports.get("http") and w["url"] == f"http://{s.address}:{s.ports['http']}":
                    word = {True: "healthy", False: "UNHEALTHY", None: "listed"}[w["healthy"]]
                    s.router_view.append(f"{word} in {router.host}/{router.role}")


def health_code(unit: Unit) -> str:
    """The HTTP status of the unit's health path as text, "down" when nothing answers, "-" without one."""
    if not unit.health_url:
        return "-"
    code = status_of(unit.health_url, timeout=STATUS_HTTP_S)
    return "down" if code is None else str(code)


def _status(host: Host, st: UnitState, unit: Unit | None, health: str, now: float, default: str) -> UnitStatus:
    record = st.record or {}
    uptime = None
    if st.active and record.get("started_us") and record.get("invocation") == st.run_id:
        uptime = max(0.0, now - record["started_us"] / 1e6)
    # Processes of a recorded run still alive while the unit is not running: orphans, by exact PID.
    orphans = list(st.recorded_alive) if not st.active else []
    orphans += [p for p in st.procs if not st.active and p not in orphans]
    failure = next_step = kind = None
    evidence: list[str] = []
    if st.failed:
        cause = classify([printable(t) for t in st.log_tail], dict(unit.role.settings) if unit else {}, exited=True,
                         exit_status=st.exit_words, fmt=log_format(unit.role.log_format if unit else None))
        if cause:
            failure, next_step, evidence, kind = cause.summary, cause.next_step, list(cause.evidence), cause.kind
    elif record.get("state") == "failed" and record.get("cause"):
        failure = record["cause"].get("summary")
        next_step = record["cause"].get("next_step")
        kind = record["cause"].get("kind")
    return UnitStatus(
        host=host.name, unit=st.name, role=unit.role.name if unit else record.get("role", "?"),
        deployment=unit.deployment if unit else (st.meta or {}).get("deployment") or record.get("deployment", default),
        address=host.address,
        state=f"{st.state}/{st.detail}" if st.installed else "not deployed",
        main_pid=st.main_pid, uptime_s=uptime,
        ports=dict(unit.ports) if unit else {}, health=health, healthy=st.active and health == "200",
        deployed=st.installed, procs=st.procs, orphans=orphans, last_failure=failure, next_step=next_step,
        failure_lines=evidence, failure_kind=kind)


def fmt_uptime(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    return time.strftime("%H:%M:%S", time.gmtime(s)) if s < 86400 else f"{s // 86400}d{(s % 86400) // 3600}h"
