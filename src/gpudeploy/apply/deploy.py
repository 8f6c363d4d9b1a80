"""deploy: preflight, upload, start only what changed, record the run, and gate it.

Per host, under the host lock: one probe gathers every fact; nothing is uploaded unless the whole
preflight passes; unchanged healthy units are left alone (same MainPID); engines start together
and are gated together; routers start after their engines are ready.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import shlex
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import GpudeployError, InputError, Problem, RemoteError
from ..model import Host, Plan, Unit
from ..plan.build import SECRET_MASK, render_env
from ..plan.calibrate import CalibrationStore, parse_memory_log
from ..plan.flags import PROGRAM, flag_for
from ..plan.memcheck import memory_verdicts
from ..plan.render import Renderer
from ..verify.gate import GateResult, run_gate
from ..verify.status import health_code
from .lock import HostLock
from .parallel import for_each_host, say
from .ssh import Remote

RUNS_DIR = "/var/lib/gpudeploy/runs"
GPU_MEMORY_TOLERANCE = 0.06  # NVML reports a "96 GB" card as 95.6 GiB


@dataclass
class UnitOutcome:
    unit: Unit
    action: str  # unchanged | started | restarted | failed | skipped
    ok: bool
    main_pid: int = 0
    gate: GateResult | None = None
    message: str = ""
    pids: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Options:
    force: bool = False
    timeout_s: float | None = None
    keep_failed: bool = False
    lock_wait_s: float = 600.0
    check: bool = False  # show what would change (with diffs) and touch nothing


def secrets_for(plan: Plan) -> dict[str, str]:
    """Secret values from the deploying user's environment; all missing ones reported at once."""
    problems, values = [], {}
    for unit in plan.units:
        for name in unit.secret_names:
            if name in os.environ:
                values[name] = os.environ[name]
            else:
                problems.append(Problem(f"secret {name} is not set in your environment", file=unit.role.file,
                                        host=unit.host.name, role=unit.role.name, key="secret_env"))
    if problems:
        raise InputError(problems)
    return values


def deploy(plan: Plan, opts: Options, store: CalibrationStore | None = None
           ) -> dict[str, list[UnitOutcome] | GpudeployError]:
    refusals, warnings = memory_verdicts(plan)
    if refusals and not opts.force:
        raise InputError(refusals)
    for line in warnings:
        say(line)
    secrets = secrets_for(plan)
    renderer = Renderer(plan.inventory.templates_dir)
    hosts: dict[str, Host] = {}
    for unit in plan.units:
        hosts.setdefault(unit.host.name, unit.host)

    def one(host: Host) -> list[UnitOutcome]:
        units = [u for u in plan.units if u.host.name == host.name]
        outcomes = deploy_host(host, units, secrets, renderer, opts)
        if store is not None:
            for o in outcomes:
                _calibrate(store, o)
        return outcomes

    return for_each_host(list(hosts.values()), one)


def _calibrate(store: CalibrationStore, o: UnitOutcome) -> None:
    """Keep what the engine measured, so the next plan prefers it over estimates."""
    if o.gate is None or o.unit.role.engine != "sglang":
        return
    measured = parse_memory_log(o.gate.lines)
    if measured.weights_gib is None and measured.oom_tried_gib is None:
        return
    store.put(o.unit.host.name, str(o.unit.role.model.get("path", o.unit.role.name)), o.unit.role.settings, measured)


def desired_files(unit: Unit, secrets: dict[str, str], renderer: Renderer) -> dict[str, tuple[bytes, int]]:
    """path -> (bytes, mode). The env file is re-rendered here with the real secret values."""
    problems: list[Problem] = []
    env_text = render_env(renderer, unit.name, unit.host.name, unit.role.name, unit.env, unit.secret_names,
                          {k: secrets[k] for k in unit.secret_names}, problems)
    if env_text is None:
        raise InputError(problems)
    return {unit.unit_path: (unit.files[unit.unit_path].encode(), 0o644), unit.env_path: (env_text.encode(), 0o600)}


def deploy_host(host: Host, units: list[Unit], secrets: dict[str, str], renderer: Renderer,
                opts: Options) -> list[UnitOutcome]:
    with Remote(host) as remote, HostLock(remote, opts.lock_wait_s,
                                          lambda who: say(f"[{host.name}] waiting for another gpudeploy run ({who})")):
        files = {u.name: desired_files(u, secrets, renderer) for u in units}
        facts = remote.probe({"units": [u.name for u in units], "files": [p for f in files.values() for p in f],
                              "ports": True, "gpus": True})
        healthy = {u.name: health_code(u) == "200" for u in units
                   if facts["units"][u.name]["props"].get("ActiveState") == "active"}
        preflight(host, units, facts, opts)

        if opts.check:
            return [_check_unit(remote, u, files[u.name], facts, healthy.get(u.name, False)) for u in units]

        outcomes: dict[str, UnitOutcome] = {}
        to_start: list[Unit] = []
        for u in units:
            want = {p: hashlib.sha256(data).hexdigest() for p, (data, _) in files[u.name].items()}
            same = all(facts["files"].get(p) == h for p, h in want.items())
            props = facts["units"][u.name]["props"]
            if same and props.get("ActiveState") == "active" and healthy.get(u.name):
                outcomes[u.name] = UnitOutcome(u, "unchanged", True, int(props.get("MainPID", "0")),
                                               message="unchanged and healthy; not restarted")
                say(f"[{host.name}/{u.role.name}] unchanged and healthy "
                    f"(MainPID {props.get('MainPID')}); not restarted")
                continue
            to_start.append(u)
            for path, (data, mode) in files[u.name].items():
                if facts["files"].get(path) != want[path]:
                    remote.put(path, data, mode)
        if to_start:
            remote.run(["systemctl", "daemon-reload"], timeout=60)
        engines = [u for u in to_start if u.role.engine != "sglang_router"]
        routers = [u for u in to_start if u.role.engine == "sglang_router"]
        for wave in (engines, routers):
            if not wave:
                continue
            if any(not o.ok for o in outcomes.values()) and wave is routers:
                for u in wave:
                    outcomes[u.name] = UnitOutcome(u, "skipped", False, message="not started: an engine failed")
                    say(f"[{host.name}/{u.role.name}] not started because an engine on this host failed")
                continue
            results = _start_and_gate(remote, wave, files, facts, opts)
            outcomes.update({o.unit.name: o for o in results})
        return [outcomes[u.name] for u in units]


def _check_unit(remote: Remote, u: Unit, files: dict[str, tuple[bytes, int]], facts: dict[str, Any],
                healthy: bool) -> UnitOutcome:
    """--check: what deploy would do to this unit, with a diff of each file it would change."""
    props = facts["units"][u.name]["props"]
    changed = [p for p, (data, _) in files.items() if facts["files"].get(p) != hashlib.sha256(data).hexdigest()]
    tag = f"[{u.host.name}/{u.role.name}]"
    for path in changed:
        old = remote.run(["cat", path], check=False).stdout if facts["files"].get(path) else ""
        new = u.files[path]  # the planned text, secrets masked
        if path == u.env_path:
            old = _mask(old, u.secret_names)
        diff = "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                            fromfile=f"{u.host.name}:{path}", tofile=f"planned:{path}"))
        say(f"{tag} {'would change' if old else 'would create'} {path}" + (f"\n{diff.rstrip()}" if diff else
                                                                             " (only a secret value differs)"))
    active = props.get("ActiveState") == "active"
    if not changed and active and healthy:
        action = "unchanged"
    elif active:
        action = "would restart"
    else:
        action = "would start"
    say(f"{tag} {action}")
    return UnitOutcome(u, action, True, int(props.get("MainPID", "0") or 0))


def _mask(env_text: str, secret_names: tuple[str, ...]) -> str:
    lines = []
    for line in env_text.splitlines(True):
        name = line.split("=", 1)[0]
        lines.append(f"{name}={SECRET_MASK}\n" if name in secret_names and "=" in line else line)
    return "".join(lines)


def preflight(host: Host, units: list[Unit], facts: dict[str, Any], opts: Options) -> None:
    """Everything that must hold before a file is touched; all failures reported together."""
    problems: list[str] = []
    if not facts.get("systemd"):
        problems.append("systemd is not running as the init system (no /run/systemd/system)")
    gpus = facts.get("gpus") or {}
    devices = {d["index"]: d for d in gpus.get("devices", [])}
    wanted = sorted({g for u in units for g in u.gpus})
    if wanted and gpus.get("error"):
        problems.append(f"cannot check the declared GPUs: {gpus['error']}")
    elif wanted:
        missing = [g for g in wanted if g not in devices]
        if missing:
            problems.append(f"declared GPUs {missing} do not exist (NVML sees {len(devices)} GPUs)")
        for g in wanted:
            if g in devices:
                real = devices[g]["total"] / 2**30
                declared = host.gpu_memory_gib.get(g, 0.0)
                if abs(real - declared) > GPU_MEMORY_TOLERANCE * real:
                    problems.append(f"inventory says GPU {g} has {declared:g} GiB but NVML reports {real:.1f} GiB; "
                                    "fix gpu_memory_gib")
    mine = {u.name: {p["pid"] for p in facts["units"][u.name]["procs"]} for u in units}
    all_mine = set().union(*mine.values()) if mine else set()
    for p in gpus.get("processes", []):
        if p["gpu"] in wanted and p["pid"] not in all_mine and not opts.force:
            owner = next((u.role.name for u in units if p["gpu"] in u.gpus), "?")
            problems.append(f"GPU {p['gpu']} (for role {owner}) is in use by pid {p['pid']} "
                            f"({p['used'] / 2**30:.1f} GiB), which belongs to no unit being deployed; "
                            "stop it or use --force")
    listening = {int(k): v for k, v in facts.get("listening", {}).items()}
    for u in units:
        for kind, port in u.ports.items():
            owners = listening.get(port)
            if owners is not None and not set(owners) <= mine[u.name]:
                who = ", ".join(str(p) for p in owners) or "an unknown process"
                problems.append(f"port {port} ({kind} of role {u.role.name}) is already in use by pid {who}")
    if problems:
        raise RemoteError(host.name, "preflight failed, nothing was changed:\n"
                          + "\n".join(f"  - {p}" for p in problems))


def _start_and_gate(remote: Remote, units: list[Unit], files: dict[str, Any], facts: dict[str, Any],
                    opts: Options) -> list[UnitOutcome]:
    host = remote.host.name
    started: list[tuple[Unit, str, int, int, str]] = []
    outcomes: list[UnitOutcome] = []
    for u in units:
        was_active = facts["units"][u.name]["props"].get("ActiveState") == "active"
        q = shlex.quote(u.name)
        # One round trip: forget an earlier failure, note the host's clock, (re)start, read the new run.
        script = (f"systemctl reset-failed {q} 2>/dev/null; date +%s%6N; systemctl restart {q} && "
                  f"systemctl show -p InvocationID,MainPID {q}")
        res = remote.run(["sh", "-c", script], timeout=120, check=False)
        lines = res.stdout.splitlines()
        props = dict(line.split("=", 1) for line in lines[1:] if "=" in line)
        if res.rc != 0 or not props.get("InvocationID"):
            msg = (res.stderr or res.stdout).strip()[-400:]
            outcomes.append(UnitOutcome(u, "failed", False, message=f"systemctl restart failed: {msg}"))
            say(f"[{host}/{u.role.name}] FAILED to start: {msg}")
            continue
        start_us = int(lines[0])
        invocation, main_pid = props["InvocationID"], int(props.get("MainPID", "0"))
        action = "restarted" if was_active else "started"
        say(f"[{host}/{u.role.name}] {action} {u.name}: MainPID {main_pid}, invocation {invocation[:12]}")
        _record(remote, u, {"state": "starting", "invocation": invocation, "main_pid": main_pid,
                            "started_us": start_us, "files": {p: hashlib.sha256(d).hexdigest()
                                                              for p, (d, _) in files[u.name].items()}})
        started.append((u, invocation, start_us, main_pid, action))

    results: dict[str, UnitOutcome] = {}

    def gate_one(u: Unit, invocation: str, start_us: int, main_pid: int, action: str) -> None:
        program = PROGRAM.get(u.role.engine)

        def flag_name(name: str) -> str:
            if program and u.engine_version:
                return flag_for(program, u.engine_version, name)
            return "--" + name.replace("_", "-")

        def on_phase(phase: str, elapsed: float) -> None:
            say(f"[{host}/{u.role.name}] {elapsed:6.1f}s  {phase}")

        try:
            gate = run_gate(remote, u, invocation, start_us, on_phase=on_phase, flag_name=flag_name,
                            timeout_s=opts.timeout_s)
        except GpudeployError as exc:
            results[u.name] = UnitOutcome(u, "failed", False, main_pid, message=str(exc))
            return
        results[u.name] = UnitOutcome(u, action if gate.ok else "failed", gate.ok, main_pid, gate)

    threads = [threading.Thread(target=gate_one, args=s) for s in started]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    for u, invocation, start_us, main_pid, _action in started:
        out = results[u.name]
        cause = out.gate.cause if out.gate else None
        if cause is not None and cause.kind == "connection-lost":
            outcomes.append(out)  # nothing more can be done or recorded on that host now
            continue
        if out.ok:
            procs = remote.probe({"units": [u.name]})["units"][u.name]["procs"]
            out.pids = [p["pid"] for p in procs]
            _record(remote, u, {"state": "ready", "invocation": invocation, "main_pid": main_pid,
                                "started_us": start_us, "pids": [{"pid": p["pid"], "start_ticks": p["start_ticks"]}
                                                                 for p in procs],
                                "files": {p: hashlib.sha256(d).hexdigest() for p, (d, _) in files[u.name].items()}})
        else:
            stopped = ""
            still_running = out.gate is None or out.gate.died_at is None
            if still_running and not opts.keep_failed:
                # A server that hangs, or printed a fatal line but lingers, still holds its GPUs:
                # stop it so the node is not left half started (--keep-failed keeps it for debugging).
                remote.run(["systemctl", "stop", u.name], timeout=u.role.stop_timeout_s + 30, check=False)
                stopped = "stopped"
            _record(remote, u, {"state": "failed", "invocation": invocation, "main_pid": main_pid,
                                "started_us": start_us, "stopped_after_failure": bool(stopped),
                                "cause": {"kind": cause.kind, "summary": cause.summary,
                                          "next_step": cause.next_step} if cause else None})
            out.message = stopped
        outcomes.append(out)
    return outcomes


def _record(remote: Remote, unit: Unit, data: dict[str, Any]) -> None:
    record = {"unit": unit.name, "host": unit.host.name, "role": unit.role.name, "recorded_at": time.time(), **data}
    remote.put(f"{RUNS_DIR}/{unit.name}.json", json.dumps(record, indent=1).encode(), 0o644)
