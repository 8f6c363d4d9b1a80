"""``gpudeploy status --watch`` over a Slurm deployment: the recorded job's steps, live.

Cheap by design: ONE ssh connection to the login node, and every ``POLL_S`` ONE remote command
(look.py) that answers the job's state, its running steps (squeue -s), sacct's rows of it and the
new bytes of each step's output file since the last round (from its start the first time). A step
that leaves squeue -s is named at once with how it ended (sacct's words, waited for at most
``GRACE_S``) and the cause its own output shows (the cause table of the gate and status:
verify/causes.py). /health of the running steps is asked every ``HEALTH_POLL_S`` by a thread of its
own over the same connection (SGLang's /health generates: >= 1 s), so it never delays a death.

The first look is a whole ``status``; then one line per change (a death adds the output lines that
show its cause, indented). Nothing is ever changed: the watch only reads.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

from ..controlchars import printable
from ..errors import RemoteError
from ..model import Unit
from ..remote.base import Transport
from ..verify.causes import classify, log_format
from ..verify.http import status_of
from . import queue
from .job import HEALTH_TIMEOUT_S, hostnames, resolve
from .look import Look, Reader, look
from .plan import SlurmPlan
from .record import read_record
from .roll import live_steps
from .script import Step, output_file
from .status import router_view, status_text

POLL_S = 0.25  # a round: one exec over the open connection (~0.1 s on the lab's cluster)
HEALTH_POLL_S = 2.0
RECONNECT_S = (1.0, 10.0)
GRACE_S = 0.6  # a step gone from squeue -s before sacct calls it ended: how long to wait for sacct's words


@dataclass
class Followed:
    """One step as the watch last showed it."""

    step: Step
    reader: Reader
    lines: deque[str]
    unit: Unit | None = None  # its node filled in, once the nodes are known
    id: str = ""
    state: str = "-"  # "-" before it runs, RUNNING, or how it ended (queue.step_death)
    gone_since: float | None = None  # when it left squeue -s while sacct still called it running
    health: str = "-"
    router: str = ""  # a router's view of its workers ("": not known yet)
    failed: str = ""  # a fatal cause its output showed while it ran (said once)


@dataclass
class Watch:
    """What the rounds compare: the job's state and each step's (pure: a Look in, lines out)."""

    job: str
    steps: list[Followed]
    job_state: str = ""
    health: dict[str, str] = field(default_factory=dict)  # step name -> the health thread's last word
    routers: dict[str, str] = field(default_factory=dict)  # a router step's name -> its view of its workers
    lock: threading.Lock = field(default_factory=threading.Lock)

    def outputs(self) -> list[tuple[str, int]]:
        return [(f.reader.path, f.reader.offset) for f in self.steps]

    def update(self, seen: Look, now: float) -> list[str]:
        """The changes this look shows, one text per change (a death's with its cause's lines)."""
        out: list[str] = []
        job_row = seen.acct.get(self.job)
        job_state = seen.job.state if seen.job is not None else job_row.state if job_row else "GONE"
        if job_state != self.job_state:
            if self.job_state:
                out.append(f"job {self.job}: {self.job_state} -> {job_state}")
            self.job_state = job_state
        running, acct = seen.running, seen.ended()
        for f, data in zip(self.steps, seen.new, strict=True):
            fmt = log_format(f.step.unit.role.log_format)
            f.lines.extend(printable(x) for x in f.reader.take(data))
            row, ended = running.get(f.step.name), acct.get(f.step.name)
            if row is not None:
                if f.state == "RUNNING" and row.id != f.id:
                    out.append(f"step {f.step.name}: new step {row.id} (was {f.id})")
                elif f.state != "RUNNING":
                    out.append(f"step {row.id} {f.step.name}: {f.state} -> RUNNING on {row.node}")
                f.id, f.state, f.gone_since = row.id, "RUNNING", None
                cause = classify(list(f.lines), f.step.unit.role.settings, exited=False, fmt=fmt)
                if cause is not None and cause.fatal and cause.summary != f.failed:
                    f.failed = cause.summary
                    out.append(f"step {f.id} {f.step.name}: its output says it failed\n{cause.render()}")
                continue
            if ended is not None and queue.terminal(ended.state):
                death = queue.step_death(ended)
                f.id = f.id or ended.id
            elif f.state == "RUNNING":  # gone from squeue -s; sacct's words may lag a little
                f.gone_since = f.gone_since if f.gone_since is not None else now
                if now - f.gone_since < GRACE_S:
                    continue
                death = "ended (no longer in squeue -s; sacct has no end for it yet)"
            else:
                continue
            if death == f.state:
                continue
            was, f.state, f.health = f.state, death, "-"
            cause = classify(list(f.lines), f.step.unit.role.settings, exited=True, exit_status=death, fmt=fmt)
            text = f"step {f.id} {f.step.name}: {was} -> {death}; its output: {f.reader.path}"
            out.append(text + (f"\n{cause.render()}" if cause is not None else ""))
        with self.lock:
            for f in self.steps:
                word = self.health.get(f.step.name, "-") if f.state == "RUNNING" else "-"
                # a first "ok" is what the whole status already said
                if word != f.health and f.state == "RUNNING" and word != "-" and (f.health, word) != ("-", "ok"):
                    out.append(f"step {f.id} {f.step.name}: health {f.health} -> {word}")
                f.health = word if f.state == "RUNNING" else "-"
                view = self.routers.get(f.step.name, "")
                if view and f.state == "RUNNING" and view != f.router:
                    if f.router:  # the first view is what the whole status already said
                        out.append(f"step {f.id} {f.step.name}: router: {f.router} -> {view}")
                    f.router = view
        return out


def health_word(code: int | None) -> str:
    return "ok" if code == 200 else f"HTTP {code}" if code is not None else "no answer"


def follow_health(w: Watch, login: Transport, stop: threading.Event) -> None:
    """/health of each running step every HEALTH_POLL_S, into ``w.health`` (read by the rounds)."""
    while not stop.is_set():
        for f in w.steps:
            if f.state == "RUNNING" and f.unit is not None and not stop.is_set():
                try:
                    word = health_word(status_of(f.unit.health_url, HEALTH_TIMEOUT_S, via=login))
                    # a router that drops a worker (or takes one back) is said, as on the SSH path
                    view = router_view(f.unit, login) if word == "ok" and f.unit.role.engine == "sglang_router" else ""
                except Exception as exc:  # the connection broke: the rounds say so; the thread must not die
                    word, view = f"not asked ({type(exc).__name__})", ""
                with w.lock:
                    w.health[f.step.name] = word
                    if view:
                        w.routers[f.step.name] = view
        stop.wait(HEALTH_POLL_S)


def say(out: TextIO, change: str) -> None:
    out.write(f"{time.strftime('%H:%M:%S')} {printable(change, lines=True)}\n")
    out.flush()


def reopen(login: Transport, stop: threading.Event) -> bool:
    """The login node's connection opened again, tried after 1 s, backing off to 10 s; False: stopped."""
    wait = RECONNECT_S[0]
    while not stop.wait(wait):
        try:
            login.close()
            login.open()
            return True
        except RemoteError:
            wait = min(wait * 2, RECONNECT_S[1])
    return False


def watch(sp: SlurmPlan, login: Transport, out: TextIO, stop: threading.Event | None = None,
          now: Callable[[], float] = time.monotonic) -> None:
    """Until Ctrl-C (KeyboardInterrupt, raised on) or ``stop``: the whole status once, then each change."""
    stop = stop or threading.Event()
    record = read_record(login, sp.inv.target, sp.deployment)
    if record is None:
        out.write(f"deployment {sp.deployment}: no job recorded in {sp.inv.target.output_dir} (not deployed)\n")
        return
    text, _ = status_text(sp, login)
    out.write(printable(text, lines=True) + f"\n\nwatching job {record.job}: a step's death at once (every "
              f"{POLL_S:g} s), its health every {HEALTH_POLL_S:g} s; Ctrl-C ends\n")
    out.flush()
    w = Watch(record.job, [Followed(s, Reader(output_file(sp.inv.target, s.unit, record.job)),
                                    deque(maxlen=log_format(s.unit.role.log_format).journal_lines))
                           for s in live_steps(sp, record)])
    nodes = list(record.nodes)
    health = threading.Thread(target=follow_health, args=(w, login, stop), name="watch-health", daemon=True)
    try:
        first = True
        while not stop.is_set():
            due = now() + POLL_S
            try:
                seen = look(login, record.job, w.outputs())
            except RemoteError as exc:  # the connection broke: said, then opened again (the job is Slurm's)
                say(out, f"login node {sp.inv.target.login.address}: {exc}; trying again")
                if reopen(login, stop):
                    say(out, f"login node {sp.inv.target.login.address}: reachable again")
                continue
            if not nodes and seen.job is not None and seen.job.nodelist:
                nodes = hostnames(login, seen.job.nodelist)
            for f in w.steps:
                if f.unit is None and len(nodes) > f.step.slot:
                    f.unit = resolve(f.step.unit, nodes)
            changes = w.update(seen, now())
            if not first:  # the first round repeats what the whole status just said
                for c in changes:
                    say(out, c)
            elif not health.is_alive():
                health.start()
            first = False
            stop.wait(max(0.0, due - now()))
    except KeyboardInterrupt:
        out.write("stopped watching (Ctrl-C); the watch changed nothing\n")
        out.flush()
        raise
    finally:
        stop.set()
