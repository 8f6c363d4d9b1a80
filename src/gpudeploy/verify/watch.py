"""``invoke status --watch``: every unit's state, its health and the routers' workers, live.

Cheap by design, per host: ONE connection; ONE log stream for every run there (the supervisor's own
``watch``, as the gate uses, started at each run's last lines: a death and its cause come through it
the moment the server exits); and a light poll every ``POLL_S`` (one host probe: states, ``/health``,
each router's ``/workers``; no GPU scan, no journal reads) for what no log says: a health that turns
503, a router that drops a worker, a unit restarted by someone else (its new run gets the stream).
The first look at each host is a whole ``invoke status`` one. Nothing is ever restarted: the watch
only reads.

A death's cause is classified from the run's own last lines with the same rules as the gate and
status (``causes.classify``), with what to change. On a terminal the view is redrawn in place (the
table of ``invoke status`` and the last changes); otherwise it prints the table once, then one line
per change (a failure adds the log lines that show its cause, indented).
"""

from __future__ import annotations

import contextlib
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import Any, TextIO

from .. import interrupt
from ..controlchars import printable
from ..errors import GpudeployError, RemoteError
from ..facts.gpu_health import map_xids
from ..facts.health import worst
from ..facts.probe import probe
from ..fanout import Cancel
from ..model import Host, Plan, Unit
from ..plan.build import deployments
from ..remote import connect
from ..remote.base import Transport
from ..supervisor import for_host
from ..supervisor.base import Run, Supervisor, UnitState
from . import xid
from .causes import Cause, classify, log_format
from .kernel_watch import KernelWatch
from .status import UnitStatus, across_hosts, gpu_words, probe_spec, read_facts

POLL_S = 2.0  # the light poll: states, /health (SGLang's takes >= 1 s: it generates), /workers
STREAM_STATE_POLL_S = 10.0  # the supervisor watch's own state poll, a backup: the stream says a death at once
PROBE_TIMEOUT_S = 30.0
RECONNECT_S = (1.0, 10.0)  # an unreachable host is tried again after 1 s, backing off to 10 s
CATCH_UP_S = 0.3  # after the state said a run ended, how long its log stream may lag behind
RECENT = 8  # changes shown under the table on a terminal

Results = dict[str, "list[UnitStatus] | GpudeployError | None"]  # host -> its units, its error, not yet known
Table = Callable[[dict[str, Any]], tuple[str, bool]]  # report.status_text


# -- what a change is (pure) ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Row:
    """What the watch compares of one unit between two looks (uptime ticks; it is no change)."""

    name: str  # host/role, as deploy names a unit
    state: str
    pid: int
    health: str
    router: str  # a router's workers, or how routers see this engine
    failure: str | None
    next_step: str | None = field(default=None, compare=False)
    lines: tuple[str, ...] = field(default=(), compare=False)  # the log lines that show the failure
    group_down: str | None = None
    gpus: str = "-"  # each GPU's health word (status.gpu_words)
    xid: str | None = None  # the last Xid its GPUs reported while it served, and what to do
    xid_line: tuple[str, ...] = field(default=(), compare=False)  # that Xid's kernel line


def row_of(s: UnitStatus) -> Row:
    if s.workers is not None:
        bad = [w["url"] for w in s.workers if not w["healthy"]]
        router = (f"{len(s.workers) - len(bad)}/{len(s.workers)} workers healthy"
                  + (f" ({', '.join(bad)} not)" if bad else ""))
    else:
        router = "; ".join(s.router_view)
    last = s.xids[-1] if s.xids else None
    return Row(f"{s.host}/{s.role}", s.state, s.main_pid, s.health, router, s.last_failure, s.next_step,
               tuple(s.failure_lines), s.group_down, gpu_words(s.gpu_health),
               f"{xid.sentence(last)}; next step: {xid.todo(last)}" if last else None,
               (xid.kernel_line(last),) if last else ())


Snapshot = dict[str, "Row | str"]  # unit key (host + unit name) -> its row; a host -> why it is unreachable, or ""


def snapshot(results: Results, before: Snapshot | None = None) -> Snapshot:
    """The rows to compare; a host that does not answer keeps its units' last rows (not "gone")."""
    out: Snapshot = {}
    for host, res in results.items():
        if isinstance(res, GpudeployError):
            out[host] = str(res)
            out.update({k: v for k, v in (before or {}).items() if k.startswith(f"{host} ")})
        elif res is not None:
            out[host] = ""
            out.update({f"{s.host} {s.unit}": row_of(s) for s in res})
    return out


@dataclass(frozen=True)
class Change:
    at: float  # time.time()
    name: str
    text: str
    lines: tuple[str, ...] = ()

    def render(self) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(self.at))
        return "\n".join([f"{stamp} {self.name}: {self.text}", *(f"    | {line}" for line in self.lines)])


def changes(before: Snapshot, after: Snapshot, at: float) -> list[Change]:
    """What differs between two looks, one Change per unit or host, in a stable order."""
    out = []
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key), after.get(key)
        if old == new:
            continue
        if isinstance(new, str) or isinstance(old, str):  # a host: "" when it answers
            if new:
                out.append(Change(at, key, f"UNREACHABLE: {new}"))
            elif new is None:
                out.append(Change(at, key, "no longer looked at"))
            elif old:
                out.append(Change(at, key, "reachable again"))
            continue
        if new is None:
            assert old is not None
            out.append(Change(at, old.name, f"gone (was {old.state})"))
            continue
        if old is None:
            out.append(Change(at, new.name, f"appeared: {new.state}, health {new.health}"
                              + (f"; last failure: {new.failure}" if new.failure else "")))
            continue
        out.append(_unit_change(old, new, at))
    return out


def _unit_change(old: Row, new: Row, at: float) -> Change:
    parts = []
    if old.state != new.state:
        parts.append(f"{old.state} -> {new.state}")
    if old.pid != new.pid and new.pid and old.pid:
        parts.append(f"new run: MainPID {old.pid} -> {new.pid}")
    elif old.pid != new.pid and new.pid:
        parts.append(f"MainPID {new.pid}")
    if old.health != new.health:
        parts.append(f"health {old.health} -> {new.health}")
    if old.router != new.router:
        parts.append(f"router: {old.router or '-'} -> {new.router or '-'}")
    if old.group_down != new.group_down:
        parts.append(f"its group is down: {new.group_down}" if new.group_down else "its group is whole again")
    lines: tuple[str, ...] = ()
    if new.xid and new.xid != old.xid:  # a GPU fault while it serves: first, with the kernel's own line
        parts.insert(0, f"GPU FAULT: {new.xid}")
        lines = new.xid_line
    if old.gpus != new.gpus and old.gpus != "-" and new.gpus != "-":
        parts.append(f"GPUs {old.gpus} -> {new.gpus}")
    if new.failure and new.failure != old.failure:
        parts.append(f"FAILED: {new.failure}" + (f"; next step: {new.next_step}" if new.next_step else ""))
        lines = (*lines, *new.lines)
    return Change(at, new.name, "; ".join(parts) or "changed", lines)


# -- one host ------------------------------------------------------------------------------------------

class _RunSink:
    """One followed run's last lines and its end (a Sink of the supervisor's watch)."""

    def __init__(self, follower: HostFollower, unit: Unit | None, run: Run, keep: int) -> None:
        self.follower, self.unit, self.run = follower, unit, run
        self.lines: deque[str] = deque(maxlen=keep)
        self.words: str | None = None
        self.log_saw_exit = threading.Event()
        self.reported = False
        self.lock = threading.Lock()

    def line(self, text: str) -> None:
        self.lines.append(printable(text))  # never a server's escape sequences on the view

    def exited(self, words: str, *, from_log: bool) -> None:
        with self.lock:
            if self.words is None or (from_log and "Main process exited" in words):
                self.words = words  # the log's own words beat the state poll's
            if from_log:
                self.log_saw_exit.set()
            first, self.reported = not self.reported, True
        if first:
            threading.Thread(target=self.follower.ended, args=(self,), daemon=True).start()

    def lost(self, reason: str) -> None:
        return None  # the follower's own poll notices, and reconnects


def exit_ok(words: str) -> bool:
    """A run that ended cleanly (inactive, not failed): its main process exited with status 0, or it
    was stopped. systemd logs "Main process exited" only for an unclean end (at debug level else), so a
    `systemctl stop` (a deploy's restart, a teardown) ends a run with "Deactivated successfully"; the
    process supervisor's host side adds ", stopped" when its stop ended the run."""
    return ("Deactivated successfully" in words or words.endswith(", stopped")
            or ("code=exited" in words and bool(re.search(r"status=0(?:/SUCCESS)?(?:\D|$)", words))))


class HostFollower:
    """Follows one host's units until ``stop``: its results are published for the view."""

    def __init__(self, host: Host, units: list[Unit], deployment_names: list[str], default: str,
                 notify: Callable[[], None], stop: threading.Event) -> None:
        self.host, self.units, self.names, self.default = host, units, deployment_names, default
        self.notify, self.stop = notify, stop
        self.planned = {u.name: u for u in units}
        self.keep = max([log_format(u.role.log_format).journal_lines for u in units] + [60])
        self.lock = threading.Lock()
        self.result: list[UnitStatus] | GpudeployError | None = None
        self.causes: dict[tuple[str, str], Cause] = {}  # (unit, run) -> the cause its own lines showed
        self.dead: dict[tuple[str, str], str] = {}  # (unit, run) -> how it ended, as its stream said
        self.remote: Transport | None = None
        self.supervisor: Supervisor | None = None
        self.stream: AbstractContextManager[object] | None = None
        self.streamed: dict[str, str] = {}  # unit -> run followed now
        # The GPUs' side (verify/kernel_watch.py): NVML's words of the last whole look, each unit's
        # Xids since its run started (that look's, then each new one the kernel log says at once)
        self.kernel: KernelWatch | None = None
        self.buses: dict[int, str] = {}  # GPU index -> its bus id, for a new Xid's GPU
        self.nvml_health: dict[str, dict[int, dict[str, Any]]] = {}  # unit -> GPU -> {"word", "why"}
        self.gpu_health: dict[str, dict[int, dict[str, Any]]] = {}  # the same, with the Xids since
        self.xids: dict[str, list[dict[str, Any]]] = {}  # unit -> its GPUs' Xids since its run started
        self.runs: dict[str, str] = {}  # unit -> its run at the last look
        self.looked_at = 0.0  # the host's clock at the last whole look

    def publish(self, result: list[UnitStatus] | GpudeployError) -> None:
        with self.lock:
            self.result = result
        self.notify()

    # -- the loop ---------------------------------------------------------------------------------
    def follow(self) -> None:
        wait = RECONNECT_S[0]
        while not self.stop.is_set():
            try:
                with connect(self.host) as remote:
                    self.remote = remote
                    self.poll(remote, light=False)  # the first look is a whole `invoke status` one
                    self.follow_kernel(remote)
                    wait = RECONNECT_S[0]
                    due = time.monotonic() + POLL_S
                    while not self.stop.wait(max(0.0, due - time.monotonic())):
                        due = time.monotonic() + POLL_S
                        self.poll(remote, light=True)
            except GpudeployError as exc:
                self.publish(exc)
            except Exception as exc:  # a bug must not end the watch of the other hosts
                self.publish(RemoteError(self.host.name, f"the watch failed: {type(exc).__name__}: {exc}"))
            finally:
                self.close_stream()
                self.close_kernel()
            self.stop.wait(wait)
            wait = min(wait * 2, RECONNECT_S[1])

    def poll(self, remote: Transport, *, light: bool) -> None:
        facts = probe(remote, probe_spec(self.host, self.units, self.names, light=light), timeout=PROBE_TIMEOUT_S)
        self.supervisor = for_host(self.host, facts)
        pairs = read_facts(self.host, self.units, facts, self.default)
        for s, st in pairs:
            if st.failed and st.run_id:
                self.explain(remote, s, st, from_tail=not light)
        self.follow_runs(remote, [st for _, st in pairs], facts)
        with self.lock:  # a death the stream said while this probe was on its way is not undone by it
            if not light:
                self.looked_at = float(facts.get("now") or 0.0)
                self.buses = {int(d["index"]): str(d.get("bus_id") or "")
                              for d in (facts.get("gpus") or {}).get("devices") or [] if "index" in d}
                self.nvml_health = {s.unit: s.gpu_health for s, _ in pairs}
            for s, st in pairs:
                if not light:
                    self.xids[st.name], self.gpu_health[st.name] = list(s.xids), s.gpu_health
                elif self.runs.get(st.name) != st.run_id:  # a new run: its own Xids, from now on
                    self.xids[st.name], self.gpu_health[st.name] = [], self.nvml_health.get(st.name, {})
                self.runs[st.name] = st.run_id
            found = [self._gpus(s) for s, _ in pairs]
            found = [self._dead(s, self.dead[(st.name, st.run_id)], self.causes.get((st.name, st.run_id)))
                     if (st.name, st.run_id) in self.dead and st.active else s
                     for s, (_, st) in zip(found, pairs, strict=True)]
        self.publish(found)

    def _gpus(self, s: UnitStatus) -> UnitStatus:
        """A light poll's status with what the last whole look and the kernel log said of its GPUs."""
        return replace(s, gpu_health=self.gpu_health.get(s.unit, s.gpu_health), xids=self.xids.get(s.unit, s.xids))

    # -- the kernel log -------------------------------------------------------------------------------
    def follow_kernel(self, remote: Transport) -> None:
        """One follower of the host's kernel log while its units have GPUs: a new Xid is shown at once."""
        if not any(u.gpus for u in self.units):
            return
        try:
            # from the whole look's moment (the host's clock) on: an Xid written meanwhile is not missed
            self.kernel = KernelWatch(remote, self.looked_at, self.new_xid, lambda why: None)
        except Exception:  # no such channel, a transport that cannot stream: the GPUs' words still come by poll
            self.kernel = None

    def close_kernel(self) -> None:
        kernel, self.kernel = self.kernel, None
        if kernel is not None:
            with contextlib.suppress(Exception):
                kernel.close()

    def new_xid(self, raw: dict[str, Any]) -> None:
        """The kernel log said an Xid now: every running unit on that GPU shows it, its GPU's word with it."""
        with self.lock:
            [x] = map_xids([raw], self.buses)
            current = self.result
            if not isinstance(current, list):
                return
            updated = []
            for s in current:
                unit = self.planned.get(s.unit)
                if unit is None or not unit.gpus or s.main_pid == 0 or \
                        (x.get("gpu") is not None and x["gpu"] not in unit.gpus) or \
                        any((o["at"], o["bus"], o["xid"]) == (x["at"], x["bus"], x["xid"])
                            for o in self.xids.get(s.unit, [])):  # the whole look had it already
                    updated.append(s)
                    continue
                self.xids[s.unit] = [*self.xids.get(s.unit, []), x]
                health = {g: dict(h) for g, h in self.gpu_health.get(s.unit, s.gpu_health).items()}
                for g in unit.gpus if x.get("gpu") is None else [x["gpu"]]:
                    h = health.setdefault(g, {"word": "-", "why": []})
                    word = xid.xid_word(int(x["xid"]))
                    if word != "ok":
                        h["word"] = word if h["word"] == "-" else worst([h["word"], word])
                        h["why"] = [*h.get("why", []), xid.sentence(x)]
                self.gpu_health[s.unit] = health
                updated.append(replace(s, xids=self.xids[s.unit], gpu_health=health))
        self.publish(updated)

    def explain(self, remote: Transport, s: UnitStatus, st: UnitState, *, from_tail: bool) -> None:
        """A failed run's cause: what its stream showed, else what its last lines show (read once)."""
        cause = self.causes.get((st.name, st.run_id))
        if cause is None and from_tail:
            cause = Cause("", s.last_failure or "", tuple(s.failure_lines), s.next_step or "")
        if cause is None:  # it ended while no stream followed it: read its last lines, once
            facts = probe(remote, {"units": [st.name], "journal_lines": self.keep}, timeout=PROBE_TIMEOUT_S)
            tail = for_host(self.host, facts).states(facts).get(st.name)
            unit = self.planned.get(st.name)
            cause = classify([printable(t) for t in tail.log_tail] if tail else [],
                             dict(unit.role.settings) if unit else {}, exited=True,
                             exit_status=st.exit_words, fmt=log_format(unit.role.log_format if unit else None))
        if cause is not None:
            self.causes[(st.name, st.run_id)] = cause
            s.last_failure, s.next_step, s.failure_lines = cause.summary or None, cause.next_step, list(cause.evidence)

    def follow_runs(self, remote: Transport, states: list[UnitState], facts: dict[str, Any]) -> None:
        """One stream for the runs that live now; started again only when that set changes."""
        live = {st.name: st for st in states if st.state in ("active", "activating", "reloading") and st.run_id}
        if {n: st.run_id for n, st in live.items()} == self.streamed:
            return
        self.close_stream()
        if not live or self.supervisor is None:
            return
        now_us = int(float(facts.get("now") or time.time()) * 1e6)
        # start_us: systemd messages of a unit that carry no INVOCATION_ID count from this look on
        runs = [Run(st.name, st.run_id, st.main_pid, now_us, False) for st in live.values()]
        sinks = {r.unit: _RunSink(self, self.planned.get(r.unit), r, self.keep) for r in runs}
        stream = self.supervisor.watch(remote, runs, dict(sinks), tail=self.keep, poll_s=STREAM_STATE_POLL_S)
        stream.__enter__()
        self.stream = stream
        self.streamed = {n: st.run_id for n, st in live.items()}

    def close_stream(self) -> None:
        stream, self.stream, self.streamed = self.stream, None, {}
        if stream is not None:
            with contextlib.suppress(Exception):  # closing a broken channel: nothing to say, the poll will
                stream.__exit__(None, None, None)

    # -- a run ended ------------------------------------------------------------------------------
    def ended(self, sink: _RunSink) -> None:
        """The stream (or its state poll) says a followed run ended: its cause, now."""
        if not sink.log_saw_exit.wait(CATCH_UP_S) and self.remote is not None and self.supervisor is not None:
            try:  # the state said it first and the stream lags: read the run's own lines directly
                lines = [printable(t) for t in self.supervisor.run_lines(self.remote, sink.run)[-self.keep:]]
            except GpudeployError:
                lines = []
            if len(lines) > len(sink.lines):
                sink.lines.clear()
                sink.lines.extend(lines)
        words = sink.words or ""
        unit = sink.unit
        cause = None if exit_ok(words) else classify(
            list(sink.lines), dict(unit.role.settings) if unit else {}, exited=True,
            exit_status=words.split("Main process exited, ", 1)[-1],
            fmt=log_format(unit.role.log_format if unit else None))
        with self.lock:
            self.dead[(sink.run.unit, sink.run.invocation)] = words
            faults = self.xids.get(sink.run.unit) or []
            if cause is not None and faults:  # its GPUs' faults while it served come first
                cause = xid.cause(faults, cause) or cause
            if cause is not None:
                self.causes[(sink.run.unit, sink.run.invocation)] = cause
            current = self.result
            if not isinstance(current, list):
                return
            updated = [self._dead(s, words, cause) if s.unit == sink.run.unit and s.main_pid in (sink.run.main_pid, 0)
                       else s for s in current]
        self.publish(updated)

    @staticmethod
    def _dead(s: UnitStatus, words: str, cause: Cause | None) -> UnitStatus:
        return replace(s, state="inactive/dead" if exit_ok(words) else "failed/failed", main_pid=0, uptime_s=None,
                       health="down" if s.health != "-" else "-", healthy=False,
                       last_failure=cause.summary if cause else s.last_failure,
                       next_step=cause.next_step if cause else s.next_step,
                       failure_lines=list(cause.evidence) if cause else s.failure_lines)


# -- the view ------------------------------------------------------------------------------------------

class View:
    """Prints what the followers see: redrawn in place on a terminal, else a line per change."""

    def __init__(self, out: TextIO, table: Table, keep: Callable[[UnitStatus], bool]) -> None:
        self.out, self.table, self.keep = out, table, keep
        self.tty = bool(getattr(out, "isatty", lambda: False)())
        self.before: Snapshot | None = None
        self.recent: deque[Change] = deque(maxlen=RECENT)

    def show(self, results: Results, units: tuple[Unit, ...]) -> list[Change]:
        # the cross-host views are written into the statuses: into copies, never the followers' own
        results = {h: [replace(s, router_view=[]) for s in r] if isinstance(r, list) else r for h, r in results.items()}
        known: dict[str, list[UnitStatus] | GpudeployError] = {h: r for h, r in results.items() if r is not None}
        across_hosts(known, units)
        shown: Results = {h: (r if not isinstance(r, list) else [s for s in r if self.keep(s)])
                          for h, r in results.items()}
        now = snapshot(shown, self.before)
        found = [] if self.before is None else changes(self.before, now, time.time())
        first = self.before is None
        self.before = now
        self.recent.extend(found)
        table, _ = self.table({h: (r if r is not None else GpudeployError("not answered yet"))
                               for h, r in shown.items()})
        table = printable(table, lines=True)  # hosts' words in it: only the view's own escapes reach the terminal
        if self.tty:
            head = (f"gpudeploy status --watch  {time.strftime('%H:%M:%S')}  (a death at once, the rest every "
                    f"{POLL_S:g} s; Ctrl-C ends)")
            recent = ["", "changes:", *(printable(c.render(), lines=True) for c in self.recent)] if self.recent else []
            self.out.write("\x1b[H\x1b[2J" + "\n".join([head, "", table, *recent]) + "\n")
        elif first:
            self.out.write(table + f"\n\nwatching: a death is shown at once, the rest every {POLL_S:g} s; "
                           "Ctrl-C ends\n")
        else:
            self.out.write("".join(printable(c.render(), lines=True) + "\n" for c in found))
        self.out.flush()
        return found


def watch_status(plan: Plan, hosts: list[Host], group_hosts: tuple[str, ...], table: Table, *,
                 keep: Callable[[UnitStatus], bool] = lambda s: True, out: TextIO | None = None,
                 stop: threading.Event | None = None) -> None:
    """Until Ctrl-C (KeyboardInterrupt, raised on) or ``stop``: follow every host, show each change."""
    stop = stop or threading.Event()
    cancel = Cancel()  # held here: Ctrl-C reaches it by a weak reference, and stops every follower at once
    cancel.watch(stop)
    wake = threading.Event()
    names = sorted(deployments(plan.inventory))
    followers = [HostFollower(h, [u for u in plan.units if u.host.name == h.name],
                              [] if h.name in group_hosts else names, plan.inventory.deployment, wake.set, stop)
                 for h in hosts]
    for f in followers:
        threading.Thread(target=f.follow, name=f"watch-{f.host.name}", daemon=True).start()
    view = View(out or sys.stdout, table, keep)
    while not stop.is_set() and any(f.result is None for f in followers):
        wake.wait(0.2)  # the first look at every host, so the first table is whole
        wake.clear()
    try:
        while not stop.is_set():
            view.show({f.host.name: f.result for f in followers}, plan.units)
            due = time.monotonic() + POLL_S  # a terminal's view is redrawn at least this often (its uptimes)
            while not (stop.is_set() or wake.wait(min(0.2, max(0.0, due - time.monotonic())))
                       or time.monotonic() >= due):
                pass
            wake.clear()
    except KeyboardInterrupt:
        _said_stopped(view)
        raise  # tasks.py's user_errors: exit 130, as every gpudeploy command interrupted
    finally:
        stop.set()
    if interrupt.pressed():
        # Ctrl-C's listener set the Cancel (so ``stop``) before the main thread's KeyboardInterrupt
        # came: the loop ended on its own, and the interruption is still this command's end.
        _said_stopped(view)
        raise KeyboardInterrupt


def _said_stopped(view: View) -> None:
    view.out.write("stopped watching (Ctrl-C); the watch changed nothing on the hosts\n")
    view.out.flush()
