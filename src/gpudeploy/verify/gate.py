"""The health gate: wait for /health 200 while watching each run's log and state, and stop at
once, with the cause, when a server dies or prints a fatal line.

Per host, every run started in one wave is gated together. The supervisor's ``watch`` feeds one
watcher per run (a :class:`~gpudeploy.supervisor.base.Sink`) from one log stream and one state
poll; each run's HTTP poll is a tenacity retry whose sleep is ``Event.wait`` on that
watcher's ``stop``, so a death, a fatal line or Ctrl-C (the command's one :class:`Cancel`) wakes
it at once. A run whose log shows no progress for the phase's ``health.stall_s`` is reported as
stalled, with its last lines and its processes' Python stacks (``stall.py``, ``stacks.py``), and
waited on or stopped, as the role's ``health.on_stall`` says.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import tenacity
from tenacity import retry_if_result, stop_after_delay, wait_exponential

from ..controlchars import printable
from ..errors import GpudeployError
from ..fanout import Cancel, say
from ..model import Unit
from ..progress import progress_of
from ..remote.base import Transport
from ..supervisor.base import Run, Supervisor
from .causes import Cause, FlagName, LogFormat, classify, fatal_rule, log_format, phase_of
from .group import GroupLinks, rank_words
from .http import status_of
from .liveness import request_timeout
from .stacks import python_stacks
from .stall import LAST_LINES, Clock, Stall


# Readiness must be seen within 1 s of /health turning 200: back off from 50 ms to at most the
# role's interval (default 0.25 s) and never further.
def health_wait(interval_s: float) -> tenacity.wait.wait_base:
    return wait_exponential(multiplier=0.05, min=0.05, max=interval_s)


# A server that answers 503 has its HTTP up and is warming up; it turns 200 the moment its warmup
# request ends (0.5.23 http_server.py sets ServerStatus.Up, then logs the ready line, which reaches
# us through journald up to 250 ms later). Its 503 costs it nothing (health_generate returns before
# touching a scheduler), so ask every WARMUP_POLL_S then, not at the backoff's step (up to the
# role's interval): the command returns sooner after the last host is ready (issue 26). The gates of
# one command together ask at most WARMUP_RATE times a second: 64 hosts warming up at once would
# otherwise be 1,280 requests a second through their SSH connections.
WARMUP_POLL_S = 0.05
WARMUP_RATE = 160.0


class Warming:
    """The gates whose server last answered 503; the warmup poll's interval grows with their count."""

    def __init__(self, rate: float = WARMUP_RATE) -> None:
        self.rate = rate
        self.lock = threading.Lock()
        self.gates: set[int] = set()

    def mark(self, gate: object, warming: bool) -> None:
        with self.lock:
            (self.gates.add if warming else self.gates.discard)(id(gate))

    def interval(self, cap_s: float) -> float:
        with self.lock:
            n = len(self.gates)
        return min(cap_s, max(WARMUP_POLL_S, n / self.rate))


WARMING = Warming()


JOURNAL_CATCH_UP_S = 0.3  # after a death, how long the stream may lag behind the unit's state
FATAL_GRACE_S = 0.4  # after a fatal line, collect the lines that explain it (e.g. "Possible solutions")
# A fatal line that opens a Python traceback ("Scheduler hit an exception: Traceback ...") is
# explained by the traceback's last line ("RuntimeError: Not enough GPU memory for hybrid ..."): the
# grace lasts until that line came, at most this long. The server writes it in one write(2), but
# journald stores it one entry per line, and on a loaded machine a follower can read the first line
# well before the rest (the loaded suite: the gate ended 0.4 s after the first line, with no more,
# and named a generic exception instead of the mamba state that did not fit).
FATAL_TRACEBACK_S = 5.0
TRACEBACK_HEAD = "Traceback (most recent call last):"
LOG_RECORD = re.compile(r"\[\d{4}-\d\d-\d\d ")  # SGLang's record head: another process's line, mid-traceback
# Lines between the tracebacks of a chained exception: the traceback goes on after them.
TRACEBACK_CHAIN = ("The above exception was the direct cause of the following exception:",
                   "During handling of the above exception, another exception occurred:")
# A rank stopped because another rank of its group failed may be dying of its own cause at the same
# moment: when rank 1 runs out of memory, rank 0 sees its link close and its death can reach us
# first. Listen this long for this rank's own death before calling it a consequence.
GROUP_GRACE_S = 3.0
PHASE_ORDER = ("starting", "loading weights", "allocating KV cache", "capturing CUDA graphs",
               "starting HTTP server", "warmup", "ready")

# (unit, phase, seconds since start, the engine's own progress or "", fraction done or None)
OnPhase = Callable[[Unit, str, float, str, "float | None"], None]
# (unit, its result): called as each unit's gate ends, while the others of the wave may still wait
OnDone = Callable[[Unit, "GateResult"], None]
# (unit, what to say): a start that stalled and is waited on (health.on_stall: wait), or moves again
OnStall = Callable[[Unit, str], None]
# (unit, its run, the engine's own cause) -> the cause with its GPUs' hardware faults named first
# (verify/xid.py: the Xids logged since the run started), or None when its GPUs reported none
Hardware = Callable[[Unit, Run, "Cause | None"], "Cause | None"]
STALL_CHECK_S = 1.0  # how often each gate asks its run's clock whether it stalled


@dataclass
class GateResult:
    ok: bool
    phase: str
    elapsed_s: float
    cause: Cause | None = None
    lines: list[str] = field(default_factory=list)
    ready_at: float | None = None
    died_at: float | None = None


class _Stop(threading.Event):
    """A gate's stop: setting it (a death, a fatal line, Ctrl-C, its group) also wakes the health poll."""

    def __init__(self, wake: threading.Event) -> None:
        super().__init__()
        self.wake = wake

    def set(self) -> None:
        super().set()
        self.wake.set()


class _Watch:
    """One run's view of its log and state; a Sink of the supervisor's watch."""

    def __init__(self, unit: Unit, run: Run, on_phase: OnPhase, links: GroupLinks | None = None) -> None:
        self.unit = unit
        self.run = run
        self.on_phase = on_phase
        self.links = links
        self.t0 = time.monotonic()
        # wakes the health poll's sleep: a new phase in the log (above all "ready") is when /health may
        # have turned 200, so ask now, not at the backoff's next step (up to the role's interval later)
        self.wake = threading.Event()
        self.stop = _Stop(self.wake)
        self.lines: list[str] = []
        self.phase = "starting"
        self.fatal_at: float | None = None
        self.traceback_open = False  # a traceback's head came and its last line not yet
        self.exit_words: str | None = None  # the supervisor's words about the main process exit
        self.lost_reason: str | None = None  # the connection broke while we watched
        self.log_saw_exit = threading.Event()  # the log stream delivered the exit message
        self.ended = threading.Event()  # the run's main process exited (by the log or the state poll)
        self.closed = False
        self.died_at: float | None = None
        self.lock = threading.Lock()
        self.fmt = log_format(unit.role.log_format)
        self.clock = Clock()  # the last sign of progress
        self.stall: Stall | None = None  # the last stall reported
        self.stalled = False  # the gate gave up on a stall (health.on_stall: stop)
        self.warming = False  # the server's last answer to /health was 503: its HTTP is up, warmup runs
        self.on_resume: Callable[[float], None] = lambda quiet_s: None

    def moved(self) -> None:
        was = self.clock.moved()
        if was is not None:
            self.on_resume(was)

    def set_phase(self, phase: str) -> None:
        with self.lock:
            if PHASE_ORDER.index(phase) <= PHASE_ORDER.index(self.phase):
                return
            self.phase = phase
        self.wake.set()
        self.moved()
        self.on_phase(self.unit, phase, time.monotonic() - self.t0, "", None)

    def reached(self, text: str) -> None:
        """The phase a log line (made printable) says the run reached, if it says one."""
        phase = phase_of(text, self.fmt)
        if phase:
            self.set_phase(phase)

    # -- Sink ------------------------------------------------------------------------------------
    def line(self, text: str) -> None:
        if self.closed:
            return
        # sglang-router colours its log even without a terminal; and a server's line may hold any
        # escape sequence: it is matched, kept and shown as the terminal would show it, never raw
        text = printable(text)
        self.lines.append(text)
        self.moved()  # a line, and so a shard or a CUDA-graph batch, is progress
        self.reached(text)
        step = progress_of(text)
        if step is not None:
            self.on_phase(self.unit, self.phase, time.monotonic() - self.t0, step[0], step[1])
        self.traceback_open = _in_traceback(self.traceback_open, text)
        if fatal_rule(text, self.fmt) and self.fatal_at is None:
            self.fatal_at = time.monotonic()
            self._after(FATAL_GRACE_S)

    def _after(self, seconds: float) -> None:
        timer = threading.Timer(seconds, self._grace_over)
        timer.daemon = True  # never keeps the process alive after deploy has answered
        timer.start()

    def _grace_over(self) -> None:
        """The fatal line's grace is over: stop, unless the traceback it began is still coming."""
        assert self.fatal_at is not None
        if self.traceback_open and time.monotonic() - self.fatal_at < FATAL_TRACEBACK_S and not self.stop.is_set():
            self._after(0.05)
            return
        self.stop.set()

    def exited(self, words: str, *, from_log: bool) -> None:
        with self.lock:
            # The log's own words ("code=exited, status=1/FAILURE") beat the state poll's.
            if self.exit_words is None or (from_log and "Main process exited" in words):
                self.exit_words = words
                self.died_at = time.monotonic()
        if from_log:
            self.log_saw_exit.set()  # everything the process wrote came before this
        self.ended.set()
        self.stop.set()
        if self.links is not None:
            self.links.failed(self.unit)  # a rank that dies fails its whole group

    def lost(self, reason: str) -> None:
        self.lost_reason = reason
        self.stop.set()


def gate_runs(remote: Transport, supervisor: Supervisor, runs: list[tuple[Unit, Run]], *, on_phase: OnPhase,
              flag_name: Callable[[Unit], FlagName], timeout_s: float | None = None,
              cancel: Cancel | None = None, links: GroupLinks | None = None,
              on_done: OnDone | None = None, on_stall: OnStall | None = None,
              hardware: Hardware | None = None) -> dict[str, GateResult]:
    """Gate every run of ``runs`` (all on ``remote``'s host) at once; unit name -> result.

    ``links`` joins the gates of a multi-node group's ranks on other hosts to these; ``on_done`` hears
    each unit's result as soon as it is known (a death is said then, not when the slowest is ready);
    ``on_stall`` hears a stall that is waited on, and its end (default: said as a line of its own);
    ``hardware`` names the GPU faults behind a death, a stall or a timeout before the engine's words."""
    tell = on_stall or _say_stall
    watches = {u.name: _Watch(u, r, on_phase, links) for u, r in runs}
    for w in watches.values():
        if cancel is not None:
            cancel.watch(w.stop)
        if links is not None:
            links.watch(w.unit, w.stop)
    results: dict[str, GateResult] = {}

    def one(w: _Watch) -> None:
        w.on_resume = lambda quiet_s: tell(w.unit, f"moving again after {quiet_s:.0f} s stalled in {w.phase}")
        threading.Thread(target=_watch_for_stall, args=(remote, supervisor, w, tell, hardware), daemon=True).start()
        try:
            results[w.unit.name] = _gate_one(remote, supervisor, w, flag_name(w.unit), timeout_s, cancel)
        except Exception as exc:  # never lose the other units' results to one unit's surprise
            results[w.unit.name] = GateResult(False, w.phase, time.monotonic() - w.t0, Cause(
                "gate-error", f"the gate itself failed: {type(exc).__name__}: {exc}", tuple(w.lines[-5:]),
                "`invoke status` shows the unit's state; please report this error"), w.lines)
        _name_hardware(hardware, w, results[w.unit.name])
        if links is not None and not results[w.unit.name].ok:
            links.failed(w.unit)  # its gate gave up: the other ranks' gates need not wait
        if on_done is not None:
            on_done(w.unit, results[w.unit.name])

    with supervisor.watch(remote, [r for _, r in runs], dict(watches)):
        threads = [threading.Thread(target=one, args=(w,), daemon=True) for w in watches.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return results


def _gate_one(remote: Transport, supervisor: Supervisor, watch: _Watch, flag_name: FlagName, timeout_s: float | None,
              cancel: Cancel | None) -> GateResult:
    unit = watch.unit
    timeout = timeout_s if timeout_s is not None else unit.role.health.timeout_s
    ready_at = _poll_health(unit, watch, timeout, remote)
    if ready_at is not None and watch.links is not None and unit.group is not None:
        # A ready rank is ready when its whole group is: keep watching it until then.
        watch.links.ready(unit)
        watch.links.wait_group(unit, watch.stop)
        if watch.exit_words is not None or watch.fatal_at is not None or watch.links.failure_of(unit):
            ready_at = None
    watch.stop.set()
    if ready_at is None:
        _hear_own_death(watch, cancel)
    # Without a fatal line yet, or with its traceback not yet ended, the lines that explain the end
    # may still be coming. After a death the state poll saw first, read them at once: journald has
    # them, but tells its followers of new entries up to 250 ms late (it coalesces its change
    # notifications: POST_CHANGE_TIMER_INTERVAL_USEC). If they do not explain it yet either (a
    # loaded journald may not have read the server's last output), let the stream catch up first.
    if ready_at is None and (watch.fatal_at is None or watch.traceback_open):
        if watch.died_at is not None and not watch.log_saw_exit.is_set():
            _read_lines(remote, supervisor, watch)
            if not _explained(watch.lines, watch.fmt) and not watch.log_saw_exit.wait(JOURNAL_CATCH_UP_S):
                _read_lines(remote, supervisor, watch)
        elif watch.died_at is None and watch.traceback_open:  # a traceback that never ended in the stream
            _read_lines(remote, supervisor, watch)
    watch.closed = True
    elapsed = time.monotonic() - watch.t0
    if ready_at is not None:
        watch.set_phase("ready")
        return GateResult(True, "ready", elapsed, lines=watch.lines, ready_at=ready_at)
    cause: Cause | None
    if cancel is not None and cancel.is_set() and watch.exit_words is None and watch.fatal_at is None:
        cause = Cause("interrupted", f"interrupted (Ctrl-C) while waiting; last phase reached: {watch.phase}",
                      tuple(watch.lines[-3:]),
                      "the unit keeps starting there: `invoke status` shows it, `invoke teardown` stops it")
        return GateResult(False, watch.phase, elapsed, cause, watch.lines)
    if watch.lost_reason is not None and watch.exit_words is None:
        # The transport's own words (a timeout, a reset) tell a cut link from a refused session.
        why = watch.lost_reason.removeprefix(f"{unit.host.name}: ")
        cause = Cause("connection-lost", f"lost the connection to {unit.host.name} while waiting "
                      f"(last phase reached: {watch.phase}; {why})", tuple(watch.lines[-5:]),
                      "the unit may still be starting there: check the network, then `invoke status`; "
                      "`invoke deploy` again converges, `invoke teardown` stops it")
        return GateResult(False, watch.phase, elapsed, cause, watch.lines)
    if watch.exit_words is not None or watch.fatal_at is not None:
        cause = classify(watch.lines, dict(unit.role.settings), flag_name, exited=watch.exit_words is not None,
                         exit_status=_exit_words(watch.exit_words or ""), fmt=watch.fmt)
        return GateResult(False, watch.phase, elapsed, cause, watch.lines, died_at=watch.died_at)
    if watch.stalled and watch.stall is not None:
        return GateResult(False, watch.phase, elapsed, watch.stall.cause(), watch.lines)
    first = watch.links.failure_of(unit) if watch.links is not None else None
    if first is not None and first != unit.key:
        cause = Cause("group-failed", f"another rank of this {unit.group.nnodes if unit.group else '?'}-node group "
                      f"failed first ({first}); this {rank_words(unit)} was still {watch.phase}",
                      tuple(watch.lines[-3:]), "the group's cause is that rank's: see it in the report")
        return GateResult(False, watch.phase, elapsed, cause, watch.lines)
    tail = tuple(watch.lines[-8:])
    quiet = watch.clock.still_for()
    still = f" (nothing moved there for the last {quiet:.0f} s)" if watch.stall is not None else ""
    cause = Cause("timeout", f"not ready after {timeout:g} s; last phase reached: {watch.phase}{still}", tail,
                  "raise health.timeout_s in the role if the model is just slow to load; otherwise the "
                  "server hangs in that phase: `invoke logs` shows the whole run")
    return GateResult(False, watch.phase, elapsed, cause, watch.lines)


# A gate that ended for these reasons has no GPU to blame: nothing is asked of the host.
NOT_THE_GPU = ("interrupted", "connection-lost", "start-failed")


def _name_hardware(hardware: Hardware | None, watch: _Watch, result: GateResult) -> None:
    """A failed run's cause with its GPUs' hardware faults first (in the gate's own thread: each unit
    asks its host once, while the others still wait)."""
    if hardware is None or result.ok or (result.cause is not None and result.cause.kind in NOT_THE_GPU):
        return
    try:
        named = hardware(watch.unit, watch.run, result.cause)
    except Exception:  # the engine's own cause stands: a failed look at the kernel log changes nothing
        named = None
    if named is not None:
        result.cause = named


def _watch_for_stall(remote: Transport, supervisor: Supervisor, watch: _Watch, tell: OnStall,
                     hardware: Hardware | None = None) -> None:
    """Until the gate ends: when the run has not moved for its phase's ``health.stall_s``, read its
    stacks and report it, its GPUs' hardware faults first; with ``health.on_stall: stop`` the gate then
    gives up on it."""
    health = watch.unit.role.health
    while not watch.stop.wait(STALL_CHECK_S):
        quiet = watch.clock.stalled(health.stall_after(watch.phase))
        if quiet is None:
            continue
        stacks = python_stacks(remote, supervisor, watch.unit)  # bounded: stacks.DUMP_TIMEOUT_S, at once
        if watch.stop.is_set():
            return  # it died, got ready or Ctrl-C meanwhile: that is the news, not the stall
        stall = Stall(watch.phase, quiet, tuple(watch.lines[-LAST_LINES:]), stacks, health.on_stall)
        watch.stall = stall
        if health.on_stall == "stop":
            watch.stalled = True
            watch.stop.set()
            return
        named = None
        if hardware is not None:
            try:
                named = hardware(watch.unit, watch.run, None)  # the stall report says the rest
            except Exception:
                named = None
        faults = [f"{named.summary}; next step: {named.next_step}"] if named is not None else []
        tell(watch.unit, "\n".join([*faults, stall.report()]))


def _say_stall(unit: Unit, text: str) -> None:
    first, *rest = text.splitlines()
    say("\n".join([f"[{unit.key}] {first}", *(f"    {line}" for line in rest)]))


def _read_lines(remote: Transport, supervisor: Supervisor, watch: _Watch) -> None:
    """This run's lines read directly from its log, where they are more than the stream brought."""
    try:
        lines = [printable(text) for text in supervisor.run_lines(remote, watch.run)]
    except GpudeployError:
        return
    if len(lines) > len(watch.lines):
        watch.lines[:] = lines
        for text in lines:  # the phase the run reached is in them too (set_phase never goes back)
            watch.reached(text)


def _explained(lines: list[str], fmt: LogFormat) -> bool:
    """The lines hold a fatal line, and the traceback it may open has ended."""
    if not any(fatal_rule(line, fmt) for line in lines):
        return False
    opened = False
    for text in lines:
        opened = _in_traceback(opened, text)
    return not opened


def _in_traceback(opened: bool, text: str) -> bool:
    """Whether a traceback is still open after ``text``: a head opens one; its last line ("SomeError:
    why": not a frame, a chain line or another rank's record) ends it."""
    if TRACEBACK_HEAD in text:
        return True
    ends = (bool(text.strip()) and not text[0].isspace() and text.strip() not in TRACEBACK_CHAIN
            and not LOG_RECORD.match(text))
    return opened and not ends


def _hear_own_death(watch: _Watch, cancel: Cancel | None) -> None:
    """A rank whose gate was stopped by its group's failure waits a moment for its own death."""
    links, unit = watch.links, watch.unit
    first = links.failure_of(unit) if links is not None else None
    if first is None or first == unit.key or watch.exit_words is not None:
        return
    deadline = time.monotonic() + GROUP_GRACE_S
    while not watch.ended.wait(0.05):
        if cancel is not None and cancel.is_set():
            return
        now = time.monotonic()
        if now >= deadline or (watch.fatal_at is not None and now - watch.fatal_at >= FATAL_GRACE_S):
            return


def _exit_words(msg: str) -> str:
    # "Main process exited, code=exited, status=1/FAILURE" -> "code=exited, status=1/FAILURE"
    return msg.split("Main process exited, ", 1)[-1] if "Main process exited" in msg else msg


def _ask(stop: threading.Event, ask: Callable[[], int | None]) -> int | None:
    """``ask()`` in a thread of its own, given up (None) as soon as ``stop`` is set: a slow request
    never delays a death, a fatal line or Ctrl-C; the abandoned request ends by its own timeout."""
    box: list[int | None] = []
    done = threading.Event()

    def run() -> None:
        try:
            box.append(ask())
        finally:
            done.set()

    threading.Thread(target=run, daemon=True).start()
    while not done.wait(0.05):
        if stop.is_set():
            return None
    return box[0] if box else None


def _poll_health(unit: Unit, watch: _Watch, timeout: float, via: Transport) -> float | None:
    per_request = request_timeout(unit)

    def attempt() -> bool:
        if watch.stop.is_set():
            return False
        # through the host's ssh connection
        code = _ask(watch.stop, lambda: status_of(unit.health_url, timeout=per_request, via=via))
        watch.warming = code == 503
        WARMING.mark(watch, watch.warming)
        if code == 503:
            watch.set_phase("warmup")
        return code == 200

    retrying = tenacity.Retrying(
        stop=stop_after_delay(timeout) | _stopped(watch),
        wait=_health_wait(watch, unit.role.health.interval_s),
        retry=retry_if_result(lambda ok: not ok),
        sleep=lambda s: _sleep(watch, s),
        retry_error_callback=lambda state: False,
    )
    try:
        ok = retrying(attempt)
    finally:
        WARMING.mark(watch, False)
    return time.monotonic() if ok and not watch.stop.is_set() else None


def _sleep(watch: _Watch, seconds: float) -> None:
    # returns early when a watcher saw the server die, on Ctrl-C, or when the log shows a new phase
    watch.wake.wait(seconds)
    watch.wake.clear()


class _health_wait(tenacity.wait.wait_base):
    """The backoff, or the warmup poll while the server answers 503."""

    def __init__(self, watch: _Watch, interval_s: float) -> None:
        self.watch = watch
        self.interval_s = interval_s
        self.backoff = health_wait(interval_s)

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        if self.watch.warming:
            return WARMING.interval(self.interval_s)
        return float(self.backoff(retry_state))


class _stopped(tenacity.stop.stop_base):
    """Stop retrying as soon as a watcher saw the server die."""

    def __init__(self, watch: _Watch) -> None:
        self.watch = watch

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        return self.watch.stop.is_set()
