"""The health gate: wait for /health 200 while watching the unit's journal and state, and stop
at once, with the cause, when the server dies or prints a fatal line.

Three watchers share one ``threading.Event``:
  * the journal stream of THIS invocation (``journalctl -f -o json _SYSTEMD_INVOCATION_ID=<id> + UNIT=<u>``),
    so lines of an earlier run can never be mistaken for this one;
  * a light ``systemctl show`` poll, in case the journal is slow;
  * the HTTP poll itself, a tenacity retry whose sleep is ``Event.wait``, so a death wakes it at once.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import tenacity
from tenacity import retry_if_exception_type, retry_if_result, stop_after_delay, wait_exponential

from ..apply.ssh import Remote
from ..errors import GpudeployError
from ..model import Unit
from .causes import Cause, FlagName, classify, fatal_rule, log_format, phase_of


# Readiness must be seen within 1 s of /health turning 200: back off from 50 ms to at most the
# role's interval (default 0.25 s) and never further.
def health_wait(interval_s: float) -> tenacity.wait.wait_base:
    return wait_exponential(multiplier=0.05, min=0.05, max=interval_s)


STATE_POLL_S = 0.2
LOST_AFTER_S = 5.0  # a state poll unanswered this long means the host is cut off
JOURNAL_CATCH_UP_S = 0.3  # after a death, how long the stream may lag behind the unit's state
FATAL_GRACE_S = 0.4  # after a fatal line, collect the lines that explain it (e.g. "Possible solutions")


@dataclass
class GateResult:
    ok: bool
    phase: str
    elapsed_s: float
    cause: Cause | None = None
    lines: list[str] = field(default_factory=list)
    ready_at: float | None = None
    died_at: float | None = None


class _Watch:
    def __init__(self, unit: Unit, invocation: str, start_us: int,
                 on_phase: Callable[[str, float], None]) -> None:
        self.unit = unit
        self.invocation = invocation
        self.start_us = start_us
        self.on_phase = on_phase
        self.t0 = time.monotonic()
        self.stop = threading.Event()
        self.lines: list[str] = []
        self.phase = "starting"
        self.fatal_at: float | None = None
        self.exited: str | None = None  # systemd's words about the main process exit
        self.lost: str | None = None  # the ssh connection broke while we watched
        self.journal_saw_exit = threading.Event()  # the stream delivered systemd's exit message
        self.closing = threading.Event()
        self.died_at: float | None = None
        self.lock = threading.Lock()
        self.fmt = log_format(unit.role.log_format)

    def set_phase(self, phase: str) -> None:
        order = ["starting", "loading weights", "allocating KV cache", "capturing CUDA graphs",
                 "starting HTTP server", "warmup", "ready"]
        with self.lock:
            if order.index(phase) <= order.index(self.phase):
                return
            self.phase = phase
        self.on_phase(phase, time.monotonic() - self.t0)

    def died(self, how: str, *, from_journal: bool = False) -> None:
        with self.lock:
            # systemd's own journal words ("code=exited, status=1/FAILURE") beat the state poll's.
            if self.exited is None or (from_journal and "Main process exited" in how):
                self.exited = how
                self.died_at = time.monotonic()
        self.stop.set()

    def journal_entry(self, entry: dict[str, Any]) -> None:
        msg = entry.get("MESSAGE", "")
        if isinstance(msg, list):  # journald sends non-UTF-8 messages as byte arrays
            msg = bytes(msg).decode(errors="replace")
        if entry.get("_SYSTEMD_INVOCATION_ID") == self.invocation:
            for line in str(msg).splitlines() or [""]:
                self.lines.append(line)
                phase = phase_of(line, self.fmt)
                if phase:
                    self.set_phase(phase)
                if fatal_rule(line, self.fmt) and self.fatal_at is None:
                    self.fatal_at = time.monotonic()
                    timer = threading.Timer(FATAL_GRACE_S, self.stop.set)
                    timer.daemon = True  # never keeps the process alive after deploy has answered
                    timer.start()
            return
        # systemd's own messages about the unit: of this start only.
        inv = entry.get("INVOCATION_ID")
        ts = int(entry.get("__REALTIME_TIMESTAMP", "0"))
        if entry.get("UNIT") != self.unit.name or (inv and inv != self.invocation) or (not inv and ts < self.start_us):
            return
        if "Main process exited" in msg or "Failed with result" in msg or "Deactivated successfully" in msg:
            self.journal_saw_exit.set()  # everything the process wrote came before this
            self.died(str(msg), from_journal=True)


def run_gate(remote: Remote, unit: Unit, invocation: str, start_us: int, *,
             on_phase: Callable[[str, float], None], flag_name: FlagName | None = None,
             timeout_s: float | None = None) -> GateResult:
    watch = _Watch(unit, invocation, start_us, on_phase)
    timeout = timeout_s if timeout_s is not None else unit.role.health.timeout_s
    chan = remote.stream(["journalctl", "-f", "-o", "json", "--no-tail", "--no-pager",
                          f"_SYSTEMD_INVOCATION_ID={invocation}", "+", f"UNIT={unit.name}"])
    readers = [threading.Thread(target=_read_journal, args=(chan, watch), daemon=True),
               threading.Thread(target=_poll_state, args=(remote, unit, watch), daemon=True)]
    for t in readers:
        t.start()
    ready_at: float | None = None
    try:
        ready_at = _poll_health(unit, watch, timeout)
    finally:
        watch.stop.set()
        # Without a fatal line yet, the last lines decide the cause: let the stream catch up.
        if (ready_at is None and watch.died_at is not None and watch.fatal_at is None
                and not watch.journal_saw_exit.wait(JOURNAL_CATCH_UP_S)):
            # The state poll saw the death first and the stream lags: read this run's lines directly.
            _read_whole_run(remote, invocation, watch)
        watch.closing.set()
        chan.close()
    elapsed = time.monotonic() - watch.t0
    if ready_at is not None:
        watch.set_phase("ready")
        return GateResult(True, "ready", elapsed, lines=watch.lines, ready_at=ready_at)
    settings = dict(unit.role.settings)
    cause: Cause | None
    if watch.lost is not None and watch.exited is None:
        cause = Cause("connection-lost", f"lost the connection to {unit.host.name} while waiting "
                      f"(last phase reached: {watch.phase})", tuple(watch.lines[-5:]),
                      "the unit may still be starting there: check the network, then `invoke status`; "
                      "`invoke deploy` again converges, `invoke teardown` stops it")
        return GateResult(False, watch.phase, elapsed, cause, watch.lines)
    if watch.exited is not None or watch.fatal_at is not None:
        cause = classify(watch.lines, settings, flag_name, exited=watch.exited is not None,
                         exit_status=_exit_words(watch.exited or ""), fmt=watch.fmt)
        return GateResult(False, watch.phase, elapsed, cause, watch.lines, died_at=watch.died_at)
    tail = tuple(watch.lines[-8:])
    cause = Cause("timeout", f"not ready after {timeout:g} s; last phase reached: {watch.phase}", tail,
                  "raise health.timeout_s in the role if the model is just slow to load; otherwise the "
                  "server hangs in that phase: `invoke logs` shows the whole run")
    return GateResult(False, watch.phase, elapsed, cause, watch.lines)


def _exit_words(msg: str) -> str:
    # "Main process exited, code=exited, status=1/FAILURE" -> "code=exited, status=1/FAILURE"
    return msg.split("Main process exited, ", 1)[-1] if "Main process exited" in msg else msg


def _read_whole_run(remote: Remote, invocation: str, watch: _Watch) -> None:
    try:
        res = remote.run(["journalctl", "--no-pager", "-o", "cat", f"_SYSTEMD_INVOCATION_ID={invocation}"],
                         timeout=LOST_AFTER_S, check=False)
    except GpudeployError:
        return
    lines = res.stdout.splitlines()
    if len(lines) > len(watch.lines):
        watch.lines[:] = lines


def _read_journal(chan: Any, watch: _Watch) -> None:
    buf = b""
    chan.settimeout(0.2)
    try:
        while not watch.closing.is_set():
            try:
                data = chan.recv(65536)
            except TimeoutError:
                continue
            if not data:
                return
            buf += data
            *complete, buf = buf.split(b"\n")
            for raw in complete:
                try:
                    watch.journal_entry(json.loads(raw))
                except ValueError:
                    continue
    except OSError:
        return


def _poll_state(remote: Remote, unit: Unit, watch: _Watch) -> None:
    while not watch.stop.wait(STATE_POLL_S):
        try:
            res = remote.run(["systemctl", "show", "-p", "ActiveState,SubState,InvocationID,ExecMainStatus,Result",
                              unit.name], timeout=LOST_AFTER_S, check=False)
        except GpudeployError as exc:
            watch.lost = str(exc)
            watch.stop.set()
            return
        props = dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)
        if props.get("InvocationID") == watch.invocation and props.get("ActiveState") in ("failed", "inactive"):
            watch.died(f"Main process exited, status={props.get('ExecMainStatus')}, result={props.get('Result')}")


def _poll_health(unit: Unit, watch: _Watch, timeout: float) -> float | None:
    def attempt() -> bool:
        if watch.stop.is_set():
            return False
        try:
            with urllib.request.urlopen(unit.health_url, timeout=1.0) as resp:  # noqa: S310 - http(s) only
                ok = bool(resp.status == 200)
        except urllib.error.HTTPError as exc:
            if exc.code == 503:
                watch.set_phase("warmup")
            return False
        return ok

    retrying = tenacity.Retrying(
        stop=stop_after_delay(timeout) | _stopped(watch),
        wait=health_wait(unit.role.health.interval_s),
        retry=retry_if_result(lambda ok: not ok) | retry_if_exception_type(OSError),
        sleep=lambda s: _sleep(watch, s),
        retry_error_callback=lambda state: False,
    )
    ok = retrying(attempt)
    return time.monotonic() if ok and not watch.stop.is_set() else None


def _sleep(watch: _Watch, seconds: float) -> None:
    watch.stop.wait(seconds)  # returns early when a watcher saw the server die


class _stopped(tenacity.stop.stop_base):
    """Stop retrying as soon as a watcher saw the server die."""

    def __init__(self, watch: _Watch) -> None:
        self.watch = watch

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        return self.watch.stop.is_set()
