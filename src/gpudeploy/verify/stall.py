"""A start that stops moving is named: "stalled in <phase> for N s", with its last lines and stacks.

The gate hears every line a run writes; a line, a new phase, a checkpoint shard or a CUDA-graph batch
is progress (each comes as a line). :class:`Clock` keeps the time of the last one; when nothing has
moved for the role's ``health.stall_s`` of the phase the run is in, the gate reports it once (and again
only after the run moved and stalled anew), with the Python stacks of the server's processes where
py-spy is on the host (``stacks.py``), then waits on or stops, as ``health.on_stall`` says.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .causes import Cause

LAST_LINES = 8  # the lines shown with a stall: what the run said last


class Clock:
    """When the run last moved, and whether its current stall was reported already."""

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self.now = now
        self._lock = threading.Lock()
        self._moved_at = now()
        self._reported = False

    def moved(self) -> float | None:
        """The run made progress. Returns how long it had been stalled when that stall had been
        reported (the run moves again), else None."""
        with self._lock:
            t = self.now()
            was = t - self._moved_at if self._reported else None
            self._moved_at, self._reported = t, False
        return was

    def still_for(self) -> float:
        with self._lock:
            return self.now() - self._moved_at

    def stalled(self, after_s: float) -> float | None:
        """Seconds without progress, once, when they reach ``after_s`` (None otherwise and after)."""
        with self._lock:
            quiet = self.now() - self._moved_at
            if self._reported or quiet < after_s:
                return None
            self._reported = True
            return quiet


@dataclass(frozen=True)
class Stack:
    """One process's Python stacks (py-spy dump), or why there are none."""

    pid: int
    cmd: str
    text: str = ""  # py-spy's own output, bounded
    error: str = ""


@dataclass(frozen=True)
class Stacks:
    stacks: tuple[Stack, ...] = ()
    note: str = ""  # why there are no stacks (no py-spy on the host), or what was left out

    def lines(self) -> list[str]:
        out: list[str] = []
        for s in self.stacks:
            out.append(f"pid {s.pid} ({s.cmd[:80]}):" if s.cmd else f"pid {s.pid}:")
            body = s.text.rstrip("\n").splitlines() if s.text else [f"  (no stacks: {s.error})"]
            out += [f"  {line}" for line in body]
        if self.note:
            out.append(self.note)
        return out


@dataclass(frozen=True)
class Stall:
    phase: str
    seconds: float
    lines: tuple[str, ...]
    stacks: Stacks
    action: str  # what the gate does now: "stop" | "wait"

    @property
    def summary(self) -> str:
        return f"stalled in {self.phase} for {self.seconds:.0f} s: no log line, phase or progress step since"

    def cause(self) -> Cause:
        """The gate's cause when the role says ``on_stall: stop``."""
        return Cause("stalled", self.summary, (*self.lines, *self.stacks.lines()), next_step(self.phase))

    def report(self) -> str:
        """What deploy prints the moment the stall is noticed."""
        then = ("stopping it (health.on_stall: stop)" if self.action == "stop" else
                "still waiting, up to health.timeout_s (health.on_stall: wait; `stop` gives up here)")
        out = [f"STALLED: {self.summary}; {then}", "last lines:"]
        out += [f"    | {line}" for line in self.lines] or ["    (none yet)"]
        stack_lines = self.stacks.lines()
        if stack_lines:
            out.append("Python stacks of its processes (py-spy dump):" if self.stacks.stacks else "stacks:")
            out += [f"    {line}" for line in stack_lines]
        return "\n".join(out)


def next_step(phase: str) -> str:
    hint = {
        "starting": "a multi-node group whose ranks cannot all reach the leader's dist-init port waits here "
                    "(check the stacks and the network); so does an import that hangs",
        "loading weights": "a model directory on a slow or hung network mount loads here: check that "
                           "the checkpoint reads (`dd` one shard)",
        "capturing CUDA graphs": "an NCCL deadlock between TP ranks hangs here (NCCL_DEBUG=INFO in the role's env "
                                 "says more); if it is only slow, raise health.stall_s.capturing_cuda_graphs",
        "warmup": "the warmup generation hangs here: a PD engine's peer (bootstrap) that does not answer, "
                  "or a kernel that does not finish",
    }.get(phase, "the stacks above show where it waits")
    return (f"{hint}; a start that is only slow needs a larger health.stall_s in the role; "
            "`invoke logs` shows the whole run")
