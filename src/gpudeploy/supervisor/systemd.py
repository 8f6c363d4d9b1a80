"""systemd as the supervisor of gpudeploy's servers (see ``base.py`` for the interface).

A run is one start of a unit, named by systemd's InvocationID; its log lines are the journal
entries with ``_SYSTEMD_INVOCATION_ID=<id>``, so a line of an earlier run can never be taken for
this one. :class:`Watch` follows every run started on a host in one deploy through ONE journal
stream and ONE state poll, whatever the number of units: sshd allows 10 sessions per connection
by default, and a stream and a poll per unit ran out of them with 8 units on a host.
"""

from __future__ import annotations

import shlex
import threading
from collections.abc import Mapping
from typing import Any

from ..errors import GpudeployError, RemoteError
from ..model import Unit
from ..plan.build import UNIT_DIR
from ..remote.base import Stream, Transport
from ..remote.jsonlines import json_lines
from .base import Run, Sink, UnitState
from .cutoff import CutOff

STATE_POLL_S = 0.2
LOST_AFTER_S = 5.0  # one state poll waits this long (cutoff.CUT_OFF_S of them unanswered: cut off)
START_MARGIN_S = 60.0  # what `systemctl restart` may take beyond the old run's stop timeout
STATE_PROPS = "Id,ActiveState,SubState,InvocationID,ExecMainStatus,Result"
EXIT_WORDS = ("Main process exited", "Failed with result", "Deactivated successfully")


def restart_timeout(stop_timeout_s: float) -> float:
    """`systemctl restart` first stops the old run (up to its TimeoutStopSec=), then starts."""
    return stop_timeout_s + START_MARGIN_S


def restart(remote: Transport, unit: str, *, was_active: bool, stop_timeout_s: float) -> Run:
    """Forget an earlier failure, note the host's clock, (re)start, read the new run: one round trip."""
    q = shlex.quote(unit)
    script = (f"systemctl reset-failed {q} 2>/dev/null; date +%s%6N; systemctl restart {q} && "
              f"systemctl show -p InvocationID,MainPID {q}")
    res = remote.run(["sh", "-c", script], timeout=restart_timeout(stop_timeout_s), check=False)
    lines = res.stdout.splitlines()
    props = dict(line.split("=", 1) for line in lines[1:] if "=" in line)
    if res.rc != 0 or not props.get("InvocationID") or not lines:
        msg = (res.stderr or res.stdout).strip()[-400:]
        raise RemoteError(remote.host.name, f"systemctl restart {unit} failed: {msg}")
    return Run(unit, props["InvocationID"], int(props.get("MainPID", "0") or 0), int(lines[0]), was_active)


def stop(remote: Transport, units: list[str], timeout_s: float) -> None:
    remote.run(["systemctl", "stop", "--", *units], timeout=timeout_s, check=False)


def run_lines(remote: Transport, invocation: str, timeout_s: float = LOST_AFTER_S) -> list[str]:
    """Every line one run wrote, read directly (when the stream lags behind the run's end)."""
    res = remote.run(["journalctl", "--no-pager", "-o", "cat", f"_SYSTEMD_INVOCATION_ID={invocation}"],
                     timeout=timeout_s, check=False)
    return res.stdout.splitlines()


def journal_argv(runs: list[Run], tail: int | None = None) -> list[str]:
    """One follow stream for every run: its own lines, plus systemd's messages about each unit.

    journalctl ORs matches of one field and ``+`` ORs the groups; ``--all`` keeps fields longer
    than 4096 bytes (without it they come as null); ``--no-tail`` starts at the first match,
    ``-n N`` at the last N entries of them all.
    """
    start = ["-n", str(tail)] if tail is not None else ["--no-tail"]
    argv = ["journalctl", "-f", "-o", "json", "--all", *start, "--no-pager"]
    argv += [f"_SYSTEMD_INVOCATION_ID={r.invocation}" for r in runs]
    argv.append("+")
    argv += [f"UNIT={r.unit}" for r in runs]
    return argv


def message_text(entry: Mapping[str, Any]) -> str | None:
    """A journal entry's MESSAGE as text: journald sends non-UTF-8 ones as byte arrays; a missing
    or null one (a field journalctl left out) is None."""
    msg = entry.get("MESSAGE")
    if isinstance(msg, list):
        return bytes(b for b in msg if isinstance(b, int) and 0 <= b < 256).decode(errors="replace")
    if msg is None:
        return None
    return str(msg)


def route(entry: Mapping[str, Any], runs: Mapping[str, Run]) -> tuple[str, str, str] | None:
    """Which run a journal entry belongs to: (unit, "line" | "exit", text), or None to ignore it.

    Pure, so it is tested on recorded entries. ``runs`` maps unit name -> run. systemd's own
    messages about a unit carry INVOCATION_ID (not always, in older releases): one of another
    run, or one older than this start, is ignored.
    """
    text = message_text(entry)
    own = entry.get("_SYSTEMD_INVOCATION_ID")
    if own:
        for run in runs.values():
            if run.invocation == own:
                return (run.unit, "line", text or "")
        return None
    unit_run = runs.get(str(entry.get("UNIT", "")))
    if unit_run is None or text is None:
        return None
    run = unit_run
    inv = entry.get("INVOCATION_ID")
    try:
        ts = int(entry.get("__REALTIME_TIMESTAMP", "0"))
    except (TypeError, ValueError):
        ts = 0
    if (inv and inv != run.invocation) or (not inv and ts < run.start_us):
        return None
    if any(w in text for w in EXIT_WORDS):
        return (run.unit, "exit", text)
    return None


def parse_states(text: str) -> dict[str, dict[str, str]]:
    """`systemctl show -p ... A B` output (blocks separated by blank lines) -> Id -> props."""
    out: dict[str, dict[str, str]] = {}
    for block in text.split("\n\n"):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if props.get("Id"):
            out[props["Id"]] = props
    return out


class Watch:
    """Follows several runs on one host: one journal stream, one state poll, events to sinks."""

    def __init__(self, remote: Transport, runs: list[Run], sinks: Mapping[str, Sink], *, tail: int | None = None,
                 poll_s: float | None = None, cut_off: CutOff | None = None) -> None:
        self.remote = remote
        self.runs = {r.unit: r for r in runs}
        self.cut_off = cut_off
        self.sinks = sinks
        self.tail = tail
        self.poll_s = poll_s if poll_s is not None else STATE_POLL_S
        self.done = threading.Event()
        self.chan: Any = None
        self.threads: list[threading.Thread] = []
        self.errors: list[str] = []

    def __enter__(self) -> Watch:
        self.chan = self.remote.stream(journal_argv(list(self.runs.values()), self.tail))
        self.threads = [threading.Thread(target=self._read, daemon=True),
                        threading.Thread(target=self._poll, daemon=True)]
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        if self.chan is not None:
            self.chan.close()

    def _deliver(self, entry: Mapping[str, Any]) -> None:
        routed = route(entry, self.runs)
        if routed is None:
            return
        unit, kind, text = routed
        sink = self.sinks[unit]
        if kind == "line":
            for line in text.splitlines() or [""]:
                sink.line(line)
        else:
            sink.exited(text, from_log=True)

    def _read(self) -> None:
        for entry in json_lines(self.chan, self.done):
            if isinstance(entry, dict):
                try:
                    self._deliver(entry)
                except Exception as exc:  # a sink's bug must not end the stream for every run
                    self.errors.append(f"{type(exc).__name__}: {exc}")

    def _poll(self) -> None:
        argv = ["systemctl", "show", "-p", STATE_PROPS, "--", *self.runs]
        cut_off = self.cut_off or CutOff()
        while not self.done.wait(self.poll_s):
            try:
                res = self.remote.run(argv, timeout=LOST_AFTER_S, check=False)
            except GpudeployError as exc:
                if not cut_off.failed():
                    continue
                for sink in self.sinks.values():
                    sink.lost(str(exc))
                return
            cut_off.answered()
            for unit, props in parse_states(res.stdout).items():
                run = self.runs.get(unit)
                if (run is not None and props.get("InvocationID") == run.invocation
                        and props.get("ActiveState") in ("failed", "inactive")):
                    self.sinks[unit].exited(f"Main process exited, status={props.get('ExecMainStatus')}, "
                                            f"result={props.get('Result')}", from_log=False)


def unit_state(name: str, uf: Mapping[str, Any]) -> UnitState:
    """One unit of the host probe's facts (``systemctl show`` properties and friends) -> UnitState."""
    props = uf.get("props") or {}
    active = props.get("ActiveState", "unknown")
    return UnitState(
        name=name, installed=props.get("LoadState") == "loaded", state=active, detail=props.get("SubState", "?"),
        main_pid=int(props.get("MainPID", "0") or 0), run_id=props.get("InvocationID", ""),
        failed=active == "failed" or props.get("Result", "success") not in ("success", ""),
        exit_words=f"status={props.get('ExecMainStatus')}, result={props.get('Result')}",
        procs=list(uf.get("procs") or []), recorded_alive=list(uf.get("recorded_alive") or []),
        record=uf.get("record"), log_tail=list(uf.get("journal") or []), meta=uf.get("meta"))


class Systemd:
    """The Supervisor interface on systemd units (``gpudeploy-<deployment>.<role>.service``)."""

    name = "systemd"

    def unavailable(self, facts: dict[str, Any]) -> str | None:
        return None if facts.get("systemd") else "systemd is not running as the init system (no /run/systemd/system)"

    def states(self, facts: dict[str, Any]) -> dict[str, UnitState]:
        return {name: unit_state(name, uf) for name, uf in facts.get("units", {}).items()}

    def installed(self, transport: Transport) -> None:
        transport.run(["systemctl", "daemon-reload"], timeout=60)

    def start(self, transport: Transport, unit: str, *, was_active: bool, stop_timeout_s: float) -> Run:
        return restart(transport, unit, was_active=was_active, stop_timeout_s=stop_timeout_s)

    def watch(self, transport: Transport, runs: list[Run], sinks: dict[str, Sink], *, tail: int | None = None,
              poll_s: float | None = None) -> Watch:
        return Watch(transport, runs, sinks, tail=tail, poll_s=poll_s)

    def run_lines(self, transport: Transport, run: Run) -> list[str]:
        return run_lines(transport, run.invocation)

    def unit_path(self, unit: str) -> str:
        return f"{UNIT_DIR}/{unit}"

    def unit_file(self, unit: Unit) -> tuple[str, str]:
        path = self.unit_path(unit.name)  # rendered by the plan (templates/engine.service.j2)
        return path, unit.files[path]

    def logs(self, transport: Transport, unit: str, run_id: str, *, lines: int, follow: bool) -> Stream:
        argv = ["journalctl", "--no-pager", "-o", "short-iso", "-n", str(lines), f"_SYSTEMD_INVOCATION_ID={run_id}"]
        return transport.stream([*argv, "-f"] if follow else argv)

    def stop(self, transport: Transport, units: list[str], timeout_s: float) -> None:
        stop(transport, units, timeout_s)

    def forget(self, transport: Transport, units: list[str]) -> None:
        transport.run(["systemctl", "daemon-reload"])
        transport.run(["systemctl", "reset-failed", "--", *units], check=False)


SYSTEMD = Systemd()
