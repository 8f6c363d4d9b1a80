"""The unit-level steps of deploy on one host: the files a unit needs, start and gate a wave of
units together, record each run. ``deployment.py`` runs these across hosts, in phases.

One unit's failure (a start that times out, a gate that breaks) is that unit's outcome: the
others of the wave are still gated and recorded.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import interrupt
from ..errors import GpudeployError, InputError, LockLost, Problem
from ..fanout import Cancel, progress, progress_done, say
from ..model import Plan, Unit
from ..plan.build import render_env
from ..plan.calibrate import CalibrationStore, Measured, parse_memory_log
from ..plan.flags import PROGRAM, flag_for
from ..plan.pd import pair_facts
from ..plan.render import Renderer
from ..remote.base import Transport
from ..supervisor.base import Run, Supervisor, UnitState
from ..verify.group import GroupLinks
from .held import reading
from .ready_record import write_ready

if TYPE_CHECKING:
    # Imported where a unit starts: a redeploy that starts nothing never needs the gate, its
    # causes' hundreds of patterns or tenacity (issue 26: ~0.026 s of a 3-host redeploy's CPU).
    from ..verify.causes import FlagName
    from ..verify.gate import GateResult

RUNS_DIR = "/var/lib/gpudeploy/runs"
STOP_MARGIN_S = 30.0  # what a stop may take beyond the unit's own stop timeout


@dataclass
class UnitOutcome:
    unit: Unit
    action: str  # unchanged | started | restarted | failed | skipped | interrupted | would ...
    ok: bool
    main_pid: int = 0
    gate: GateResult | None = None
    message: str = ""
    pids: list[int] = field(default_factory=list)
    run: Run | None = None  # the start this deploy made, where it made one
    measured: Measured | None = None  # an SGLang engine's memory figures from its startup log (calibrate)

    @property
    def left_running(self) -> bool:
        """Started by this run and neither ready nor stopped: still starting on the host."""
        return self.action == "interrupted"


@dataclass(frozen=True)
class Options:
    force: bool = False
    timeout_s: float | None = None
    keep_on_failure: bool = False  # leave what this run started (and a failed unit) running, for debugging
    lock_wait_s: float = 600.0
    check: bool = False  # show what would change (with diffs) and touch nothing
    serial: tuple[int | float, ...] = ()  # rolling batches of deployments (rollout.parse_serial)
    max_fail_percent: float = 0.0
    rolling: str = "auto"  # auto: roll a serving deployment through its router; always; never
    allow_downtime: bool = False  # no room to roll: restart plainly instead of refusing


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


def calibrate(store: CalibrationStore, outcomes: Iterable[UnitOutcome]) -> None:
    """Keep what the engines measured, so the next plan prefers it over estimates (one write)."""
    runs = []
    for o in outcomes:
        measured = o.measured or _measured(o.unit, o.gate)
        if measured is None:
            continue
        if measured.weights_gib is None and measured.oom_tried_gib is None and measured.failure is None:
            continue
        runs.append((o.unit.host.name, str(o.unit.role.model.get("path", o.unit.role.name)), o.unit.role.settings,
                     measured))
    store.put_many(runs)


def _measured(u: Unit, gate: GateResult | None) -> Measured | None:
    if gate is None or u.role.engine != "sglang":
        return None
    return parse_memory_log(gate.lines)


def desired_files(unit: Unit, secrets: dict[str, str], renderer: Renderer,
                  supervisor: Supervisor) -> dict[str, tuple[bytes, int]]:
    """path -> (bytes, mode): the supervisor's unit file, and the env file re-rendered here with
    the real secret values (0600)."""
    problems: list[Problem] = []
    env_text = render_env(renderer, unit.name, unit.host.name, unit.role.name, unit.env, unit.secret_names,
                          {k: secrets[k] for k in unit.secret_names}, problems)
    if env_text is None:
        raise InputError(problems)
    path, text = supervisor.unit_file(unit)
    return {path: (text.encode(), 0o644), unit.env_path: (env_text.encode(), 0o600)}


def file_hashes(files: dict[str, tuple[bytes, int]]) -> dict[str, str]:
    return {p: hashlib.sha256(data).hexdigest() for p, (data, _) in files.items()}


def _flag_name(u: Unit) -> FlagName:
    program = PROGRAM.get(u.role.engine)

    def flag_name(name: str) -> str:
        if program and u.engine_version:
            return flag_for(program, u.engine_version, name)
        return "--" + name.replace("_", "-")

    return flag_name


def start_and_gate(remote: Transport, supervisor: Supervisor, units: list[Unit], files: dict[str, Any],
                    states: dict[str, UnitState], opts: Options, cancel: Cancel | None,
                    links: GroupLinks | None = None, stop_it: str | None = None) -> list[UnitOutcome]:
    """``stop_it``: how to stop a unit left starting by Ctrl-C, where its role cannot say (a surge copy)."""
    from ..verify.causes import Cause
    from ..verify.gate import GateResult, gate_runs
    from ..verify.xid import unit_cause

    host = remote.host.name
    outcomes: dict[str, UnitOutcome] = {}
    started: list[tuple[Unit, Run]] = []
    for u in units:
        if cancel is not None and cancel.is_set():
            outcomes[u.name] = UnitOutcome(u, "skipped", False, message="not started: interrupted")
            continue
        hint = stop_it or f"`invoke teardown --host {host} --role {u.role.name}` stops it"
        interrupt.note(u.key, f"{u.name}: its start was asked for; {hint}")
        try:
            run = supervisor.start(remote, u.name, was_active=states[u.name].active,
                                   stop_timeout_s=u.role.stop_timeout_s)
        except LockLost:  # nothing was started: the host fails as a whole (apply/held.py)
            interrupt.clear(u.key)
            raise
        except GpudeployError as exc:
            # e.g. the old run ignored SIGTERM past the restart's timeout: systemd is still at it.
            cause = Cause("start-failed", f"could not be started: {str(exc).splitlines()[0]}", (),
                          "`invoke status` shows where it is")
            outcomes[u.name] = UnitOutcome(u, "failed", False, message=f"{exc}; `invoke status` shows where it is",
                                           gate=GateResult(False, "starting", 0.0, cause, died_at=time.monotonic()))
            say(f"[{host}/{u.role.name}] FAILED to start: {exc}")
            interrupt.clear(u.key)
            if links is not None:
                links.failed(u)  # the other ranks of its group need not wait out their health timeout
            continue
        action = "restarted" if run.restarted else "started"
        interrupt.note(u.key, f"{u.name} MainPID {run.main_pid}, still starting; {hint}")
        say(f"[{host}/{u.role.name}] {action} {u.name}: MainPID {run.main_pid}, invocation {run.invocation[:12]}")
        for note in run.notes:
            say(f"[{host}/{u.role.name}] WARNING: {note}")
        _record(remote, u, {"state": "starting", "invocation": run.invocation, "main_pid": run.main_pid,
                            "started_us": run.start_us, "files": file_hashes(files[u.name])})
        started.append((u, run))
    if not started:
        return [outcomes[u.name] for u in units]

    def on_phase(u: Unit, phase: str, elapsed: float, detail: str, fraction: float | None) -> None:
        progress(u.key, f"{elapsed:6.1f}s  {phase}" + (f"  {detail}" if detail else ""), phase=phase,
                 fraction=fraction)

    def on_done(u: Unit, gate: GateResult) -> None:
        # Said when it happens: the report (and the exit) wait for the slowest unit of the fleet.
        if not gate.ok and gate.cause is not None and gate.cause.kind != "interrupted":
            say(f"[{host}/{u.role.name}] FAILED after {gate.elapsed_s:.1f} s ({gate.phase}): {gate.cause.summary}")

    def hardware(u: Unit, run: Run, engine: Cause | None) -> Cause | None:
        # the Xids its GPUs reported since this run started (the host's clock), named before the engine's words
        return unit_cause(reading(remote), u, run.start_us, engine)

    try:
        # the gate only reads: it may finish its watch after the host lock is lost (apply/held.py)
        gates = gate_runs(reading(remote), supervisor, started, on_phase=on_phase, flag_name=_flag_name,
                          timeout_s=opts.timeout_s, cancel=cancel, links=links, on_done=on_done,
                          hardware=hardware)
    except GpudeployError as exc:  # the watch could not even start (connection lost right then)
        gates = {u.name: GateResult(False, "starting", 0.0, Cause("connection-lost", str(exc)),
                                    died_at=time.monotonic()) for u, _ in started}
        for u, _ in started:
            if links is not None:
                links.failed(u)
    lost: LockLost | None = None
    for u, run in started:
        progress_done(u.key)
        try:
            outcomes[u.name] = _after_gate(remote, supervisor, u, run, gates[u.name], files, opts)
        except LockLost as exc:  # not recorded, not stopped: the host fails as a whole, below
            lost = exc
            outcomes[u.name] = UnitOutcome(u, "failed", False, run.main_pid, gates[u.name], message=str(exc))
        except GpudeployError as exc:
            outcomes[u.name] = UnitOutcome(u, "failed", False, run.main_pid, gates[u.name],
                                           message=f"after the gate: {exc}")
        outcomes[u.name].run = run
        # Read here, in this host's thread while other hosts still start: at 64 hosts, 64 logs read
        # after the last gate were ~0.3 s of the command's tail (regexes over every line, one core).
        outcomes[u.name].measured = _measured(u, gates[u.name])
        if not outcomes[u.name].left_running:
            interrupt.clear(u.key)  # ready, or failed and dealt with: nothing left half done there
    if lost is not None:
        raise lost
    return [outcomes[u.name] for u in units]


def _after_gate(remote: Transport, supervisor: Supervisor, u: Unit, run: Run, gate: GateResult,
                files: dict[str, Any], opts: Options) -> UnitOutcome:
    action = "restarted" if run.restarted else "started"
    cause = gate.cause
    base = {"invocation": run.invocation, "main_pid": run.main_pid, "started_us": run.start_us}
    if cause is not None and cause.kind == "connection-lost":
        return UnitOutcome(u, "failed", False, run.main_pid, gate)  # nothing can be recorded there now
    if cause is not None and cause.kind == "interrupted":
        return UnitOutcome(u, "interrupted", False, run.main_pid, gate, message="left running (still starting)")
    if gate.ok:
        # One round trip: the unit's processes found and the record written with them.
        record = {**_record_head(u), "state": "ready", **base, "files": file_hashes(files[u.name])}
        pids = write_ready(remote, supervisor, u, f"{RUNS_DIR}/{u.name}.json", record)
        return UnitOutcome(u, action, True, run.main_pid, gate, pids=[p["pid"] for p in pids])
    stopped = ""
    if gate.died_at is None and not opts.keep_on_failure:
        # A server that hangs, or printed a fatal line but lingers, still holds its GPUs:
        # stop it so the node is not left half started (--keep-failed keeps it for debugging).
        supervisor.stop(remote, [u.name], u.role.stop_timeout_s + STOP_MARGIN_S)
        stopped = "stopped"
    _record(remote, u, {"state": "failed", **base, "stopped_after_failure": bool(stopped),
                        "cause": {"kind": cause.kind, "summary": cause.summary,
                                  "next_step": cause.next_step} if cause else None})
    return UnitOutcome(u, "failed", False, run.main_pid, gate, message=stopped)


def _record_head(unit: Unit) -> dict[str, Any]:
    head = {"unit": unit.name, "host": unit.host.name, "deployment": unit.deployment, "role": unit.role.name,
            "recorded_at": time.time()}
    if unit.role.settings.get("disaggregation_mode") in ("prefill", "decode"):
        # What this run pairs with: a rolling update checks the other side's new engines against it.
        head["pair"] = pair_facts(unit)
    return head


def _record(remote: Transport, unit: Unit, data: dict[str, Any]) -> None:
    record = {**_record_head(unit), **data}
    remote.put(f"{RUNS_DIR}/{unit.name}.json", json.dumps(record, indent=1).encode(), 0o644)


def current_files(remote: Transport, files: dict[str, tuple[bytes, int]]) -> dict[str, tuple[bytes, int]]:
    """The files a healthy unit runs from now, read before this deploy overwrites them (a failed
    redeploy puts them back); {} if any cannot be read, so nothing half is restored."""
    out: dict[str, tuple[bytes, int]] = {}
    for path, (_, mode) in files.items():
        res = remote.run(["cat", "--", path], check=False, timeout=30)
        if res.rc != 0:
            return {}
        out[path] = (res.stdout.encode(), mode)
    return out
