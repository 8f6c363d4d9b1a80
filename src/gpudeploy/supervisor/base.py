"""What gpudeploy needs of whatever starts its servers on a host: the supervisor interface.

Deploy, the gate, status and teardown speak only these words; ``systemd.py`` implements them with
systemd units. A supervisor for hosts without systemd (a process group, a pidfile with the PID's
start time, a log file per run) is one new file implementing :class:`Supervisor`:

  * ``start(transport, unit, was_active=, stop_timeout_s=)`` -> :class:`Run`: (re)start the unit
    from the files the plan rendered (already written by deploy) and name this run.
  * ``installed(transport)``: the unit files changed; make the supervisor read them again.
  * ``watch(transport, runs, sinks, tail=, poll_s=)``: a context manager that feeds each run's log
    lines and its exit to that run's :class:`Sink` (one stream for all runs on the host), and
    ``lost`` when the host stops answering. From each run's first line, or with ``tail=N`` from
    about its last N (following a server that has run for days, as ``status --watch`` does);
    ``poll_s`` slows the supervisor's own state poll where the caller polls the host itself.
  * ``run_lines(transport, run)``: every line of one run, read directly, and
    ``logs(transport, unit, run_id, lines=, follow=)``: a stream of them for ``invoke logs``.
  * ``unit_file(unit)``: the (path, text) of the file it runs the unit from (a systemd unit, a
    JSON spec), rendered from the plan; ``unit_path(name)`` where that file lives.
  * ``states(facts)``: the host probe's facts -> :class:`UnitState` per unit, in neutral words.
  * ``stop(transport, units, timeout_s)``: stop units, killing what does not stop in time, and
    ``forget(transport, units)`` after their files were removed.
  * ``unavailable(facts)``: why this supervisor cannot run on the host (None when it can).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..model import Unit
from ..remote.base import Stream, Transport


@dataclass(frozen=True)
class Run:
    """One start of a unit: what the gate and the run record need to find it again."""

    unit: str
    invocation: str  # the supervisor's name for this run (systemd's InvocationID)
    main_pid: int
    start_us: int  # the host's clock (µs since the epoch) just before the start
    restarted: bool  # it replaced a run that was active
    notes: tuple[str, ...] = ()  # what the supervisor could not do as planned (e.g. NUMA binding), said by deploy


class Sink(Protocol):
    """Where a watched run's events go (the gate's per-unit watcher)."""

    def line(self, text: str) -> None: ...

    def exited(self, words: str, *, from_log: bool) -> None:
        """The main process ended. ``from_log``: the log stream said so, so every line the
        process wrote has already been delivered."""

    def lost(self, reason: str) -> None: ...


@dataclass(frozen=True)
class UnitState:
    """One unit as its supervisor sees it now."""

    name: str
    installed: bool  # the supervisor knows the unit (its file is there)
    state: str  # active | activating | deactivating | failed | inactive | unknown
    detail: str  # the supervisor's own word for it (systemd's SubState)
    main_pid: int
    run_id: str  # the current (or last) run's identity
    failed: bool  # the last run ended in failure
    exit_words: str  # how it ended, e.g. "status=1, result=exit-code"
    procs: list[dict[str, Any]] = field(default_factory=list)  # processes of the unit now
    recorded_alive: list[dict[str, Any]] = field(default_factory=list)  # recorded PIDs alive (start time checked)
    record: dict[str, Any] | None = None  # gpudeploy's run record on the host
    log_tail: list[str] = field(default_factory=list)  # the last lines of a failed run
    meta: dict[str, str] | None = None  # what the unit's own file says (deployment, role, paths)

    @property
    def active(self) -> bool:
        return self.state == "active"


class Supervisor(Protocol):
    name: str

    def unavailable(self, facts: dict[str, Any]) -> str | None: ...

    def states(self, facts: dict[str, Any]) -> dict[str, UnitState]: ...

    def installed(self, transport: Transport) -> None: ...

    def start(self, transport: Transport, unit: str, *, was_active: bool, stop_timeout_s: float) -> Run: ...

    def watch(self, transport: Transport, runs: list[Run], sinks: dict[str, Sink], *, tail: int | None = None,
              poll_s: float | None = None) -> AbstractContextManager[object]: ...

    def run_lines(self, transport: Transport, run: Run) -> list[str]: ...

    def logs(self, transport: Transport, unit: str, run_id: str, *, lines: int, follow: bool) -> Stream: ...

    def unit_path(self, unit: str) -> str: ...

    def unit_file(self, unit: Unit) -> tuple[str, str]: ...

    def stop(self, transport: Transport, units: list[str], timeout_s: float) -> None: ...

    def forget(self, transport: Transport, units: list[str]) -> None: ...
