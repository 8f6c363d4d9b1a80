"""The supervisor for hosts without systemd (rented GPU containers): process groups and pidfiles.

The host side is ``process_host.py`` (a stdlib script run there): a unit is a JSON spec file, a run
is a server in its own session and process group, watched by a monitor that records its exit
status, with stdout+stderr in a log file of that run only and a run file naming its PID and the
PID's start time. Nothing is ever found by name: processes of a run are the server's session and
descendants and the PIDs recorded at gate time, each checked against its start time.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import GpudeployError, RemoteError
from ..model import Unit
from ..plan.build import unit_kind
from ..plan.process_spec import spec_path, spec_text
from ..remote.base import Stream, Transport
from ..remote.jsonlines import json_lines
from . import process_host
from .base import Run, Sink, UnitState
from .cutoff import CutOff

SOURCE = Path(process_host.__file__).read_text()
LOG_DIR = process_host.LOG_DIR
RUNS_DIR = process_host.RUNS_DIR
START_MARGIN_S = 60.0
ALIVE_POLL_S = 1.0
LOST_AFTER_S = 5.0  # one liveness poll waits this long (cutoff.CUT_OFF_S of them unanswered: cut off)


def _host_cmd(command: str, arg: Mapping[str, Any], python: str) -> list[str]:
    return [python, "-c", SOURCE, command, json.dumps(arg)]


def unit_state(name: str, uf: Mapping[str, Any]) -> UnitState:
    """One unit of the probe's ``process_units`` facts -> UnitState (the same words as systemd's)."""
    run = uf.get("run") or {}
    exit_info = uf.get("exit")
    alive = bool(uf.get("alive"))
    if alive:
        state, detail = "active", "running"
    elif exit_info is None and run:
        state, detail = "failed", "gone"  # no monitor wrote an exit: it was killed too (or a reboot)
    elif exit_info is not None:
        # as systemd: a stop that had to SIGKILL the server (its stop timeout ran out) leaves the unit
        # failed (Result=timeout), a stop it obeyed leaves it inactive
        killed = exit_info.get("code") == "killed" and exit_info.get("status") == "KILL"
        ok = (exit_info.get("stopped") and not killed) or (exit_info.get("code") == "exited"
                                                           and exit_info.get("status") == "0")
        state, detail = ("inactive", "dead") if ok else ("failed", "failed")
    else:
        state, detail = "inactive", "dead"
    words = f"code={exit_info.get('code')}, status={exit_info.get('status')}" if exit_info else ""
    return UnitState(
        name=name, installed=uf.get("spec") is not None, state=state, detail=detail,
        main_pid=int(run.get("pid", 0)) if alive else 0, run_id=str(run.get("run_id", "")),
        failed=state == "failed", exit_words=words, procs=list(uf.get("procs") or []),
        recorded_alive=list(uf.get("recorded_alive") or []), record=uf.get("record"),
        log_tail=list(uf.get("log_tail") or []), meta=uf.get("meta"))


class ProcessWatch:
    """One stream for every run on the host (their logs and exits) and a light liveness poll."""

    def __init__(self, transport: Transport, runs: list[Run], sinks: Mapping[str, Sink], python: str, *,
                 tail: int | None = None, poll_s: float | None = None, cut_off: CutOff | None = None) -> None:
        self.transport = transport
        self.cut_off = cut_off
        self.runs = runs
        self.sinks = sinks
        self.python = python
        self.tail = tail
        self.poll_s = poll_s if poll_s is not None else ALIVE_POLL_S
        self.done = threading.Event()
        self.stream: Stream | None = None
        self.errors: list[str] = []

    def __enter__(self) -> ProcessWatch:
        arg: dict[str, Any] = {"runs": [{"unit": r.unit, "run_id": r.invocation} for r in self.runs]}
        if self.tail is not None:
            arg["tail"] = self.tail
        self.stream = self.transport.stream(_host_cmd("watch", arg, self.python))
        for target in (self._read, self._poll):
            threading.Thread(target=target, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        if self.stream is not None:
            self.stream.close()

    def _read(self) -> None:
        stream = self.stream
        assert stream is not None
        for event in json_lines(stream, self.done):
            if isinstance(event, dict) and "unit" not in event:
                continue  # the host side's keepalive
            try:
                sink = self.sinks[event["unit"]]
                if "line" in event:
                    sink.line(str(event["line"]))
                elif "exit" in event:
                    sink.exited(str(event["exit"]), from_log=True)
            except (KeyError, TypeError) as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def _poll(self) -> None:
        cut_off = self.cut_off or CutOff()
        while not self.done.wait(self.poll_s):
            try:
                self.transport.run(["true"], timeout=LOST_AFTER_S)
            except GpudeployError as exc:
                if not cut_off.failed():
                    continue
                for sink in self.sinks.values():
                    sink.lost(str(exc))
                return
            cut_off.answered()


class Process:
    """The Supervisor interface on process groups, for hosts without systemd."""

    name = "process"

    def __init__(self, python: str = "python3") -> None:
        self.python = python

    def unavailable(self, facts: dict[str, Any]) -> str | None:
        return None

    def unit_path(self, unit: str) -> str:
        return spec_path(unit)

    def unit_file(self, unit: Unit) -> tuple[str, str]:
        return spec_path(unit.name), spec_text(unit, unit_kind(unit.role))

    def states(self, facts: dict[str, Any]) -> dict[str, UnitState]:
        return {name: unit_state(name, uf) for name, uf in facts.get("process_units", {}).items()}

    def installed(self, transport: Transport) -> None:
        return None  # the spec is read at each start

    def start(self, transport: Transport, unit: str, *, was_active: bool, stop_timeout_s: float) -> Run:
        res = transport.run(_host_cmd("start", {"unit": unit}, transport.host.python or self.python),
                            timeout=stop_timeout_s + START_MARGIN_S, check=False)
        try:
            run = json.loads(res.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise RemoteError(transport.host.name, f"starting {unit} failed: "
                              f"{(res.stderr or res.stdout).strip()[-400:]}") from None
        return Run(unit, run["run_id"], int(run["pid"]), int(run["start_us"]), bool(run.get("restarted")),
                   tuple(str(n) for n in run.get("notes") or ()))

    def watch(self, transport: Transport, runs: list[Run], sinks: dict[str, Sink], *, tail: int | None = None,
              poll_s: float | None = None) -> ProcessWatch:
        return ProcessWatch(transport, runs, sinks, transport.host.python or self.python, tail=tail, poll_s=poll_s)

    def run_lines(self, transport: Transport, run: Run) -> list[str]:
        res = transport.run(["cat", "--", f"{LOG_DIR}/{run.unit}/{run.invocation}.log"], timeout=LOST_AFTER_S,
                            check=False)
        return res.stdout.splitlines()

    def logs(self, transport: Transport, unit: str, run_id: str, *, lines: int, follow: bool) -> Stream:
        arg = {"unit": unit, "run_id": run_id, "lines": lines, "follow": follow}
        return transport.stream(_host_cmd("logs", arg, transport.host.python or self.python))

    def stop(self, transport: Transport, units: list[str], timeout_s: float) -> None:
        transport.run(_host_cmd("stop", {"units": units, "timeout_s": timeout_s},
                                transport.host.python or self.python), timeout=timeout_s + 30, check=False)

    def forget(self, transport: Transport, units: list[str]) -> None:
        paths = [f"{RUNS_DIR}/{u}.json" for u in units] + [f"{LOG_DIR}/{u}" for u in units]
        transport.run(["rm", "-rf", "--", *paths], check=False)


PROCESS = Process()
