"""Run one function per host in parallel and collect each host's result or error.

One host's failure never hides another's outcome (like fabric's GroupResult): the caller reports
every host, then decides the exit status. Any exception of a host's work becomes that host's
error, not a traceback that loses the others.

Ctrl-C (``interrupt``): every :class:`Cancel` of the process is set at once, which every waiter of
the run watches (each gate's sleep is an ``Event.wait``); the main thread gives the hosts a moment
to say where they stand and raises :class:`Interrupted` with what it has. Interrupted is a
KeyboardInterrupt, never a GpudeployError: code that takes a host's error for "this host did not
answer" cannot swallow it. A second Ctrl-C leaves at once.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar

from . import interrupt
from .controlchars import printable
from .errors import GpudeployError, RemoteError
from .model import Host
from .progress import Board

T = TypeVar("T")

_print_lock = threading.Lock()
WIND_DOWN_S = 1.0  # after Ctrl-C, how long the hosts may take to report where they stand (interrupt.GRACE_S bounds all)
FDS_PER_HOST = 3  # an ssh connection, a lock stream and a log stream per host at once
_forks: int | None = None  # --forks, for the whole command


def raise_open_files() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (64 hosts need a few hundred
    descriptors; "Too many open files" is what a fleet tool hits first). Returns the new limit."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16)
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return int(soft)


def default_forks(hosts: int, nofile: int | None = None) -> int:
    """How many hosts at once, sized like pyinfra's pool: min(20 x CPUs, hosts, (nofile - 10) / 3)."""
    import os
    import resource

    files = nofile if nofile is not None else resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return max(1, min(20 * (os.cpu_count() or 1), hosts, (files - 10) // FDS_PER_HOST))


def forks_for(hosts: int) -> int:
    """How many of ``hosts`` this command works on at once (--forks, else the default)."""
    return min(_forks or default_forks(hosts), hosts)


def set_forks(forks: int | None) -> None:
    """``--forks N`` for every fan-out of this command (None: the default for the host count)."""
    global _forks
    _forks = forks


_board: Board | None = None


def show_progress(board: Board | None) -> None:
    """While a board is shown, lines said go above it (deploy's per-unit progress lines)."""
    global _board
    _board = board


def progress(key: str, text: str, *, phase: str, fraction: float | None = None) -> None:
    if _board is not None:
        _board.update(key, text, phase=phase, fraction=fraction)
    else:
        say(f"[{key}] {text}")


def progress_done(key: str) -> None:
    if _board is not None:
        _board.done(key)


def say(line: str, *, err: bool = False) -> None:
    """Print one whole line; threads never interleave within a line. Hosts' words come in it (a
    cause, a smoke reply, a stall's stacks): made printable here, whoever forgot."""
    line = printable(line, lines=True)
    if _board is not None and not err:
        _board.message(line)
        return
    stream = sys.stderr if err else sys.stdout
    with _print_lock:
        stream.write(line + "\n")
        stream.flush()


class Cancel:
    """One cancel for a whole command: ``set()`` wakes every event registered with ``watch``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: list[threading.Event] = []
        self._set = False
        interrupt.on_interrupt(self.set)  # Ctrl-C sets it before anything can swallow the interruption

    def watch(self, event: threading.Event) -> None:
        with self._lock:
            if self._set:
                event.set()
            else:
                self._events.append(event)

    def set(self) -> None:
        with self._lock:
            self._set = True
            events, self._events = self._events, []
        for event in events:
            event.set()

    def is_set(self) -> bool:
        return self._set


class Interrupted(KeyboardInterrupt):
    """Ctrl-C. ``results`` holds each host's outcome as far as it got (an error for hosts that
    did not answer in time)."""

    def __init__(self, results: Any) -> None:
        self.results = results
        super().__init__("interrupted")

    def __str__(self) -> str:
        return "interrupted"


def for_each_host(hosts: list[Host], fn: Callable[[Host], T], cancel: Cancel | None = None
                  ) -> dict[str, T | GpudeployError]:
    results: dict[str, T | GpudeployError] = {}
    if not hosts:
        return results

    def one(host: Host) -> None:
        try:
            results[host.name] = fn(host)
        except GpudeployError as exc:
            results[host.name] = exc
        except Exception as exc:  # a bug or a library error: this host's failure, not everyone's
            results[host.name] = RemoteError(host.name, f"unexpected {type(exc).__name__}: {exc}")

    pool = ThreadPoolExecutor(max_workers=forks_for(len(hosts)))
    futures: list[Future[None]] = [pool.submit(one, h) for h in hosts]
    try:
        pending = set(futures)
        while pending:  # short waits, so Ctrl-C is seen at once
            _, pending = wait(pending, timeout=0.2, return_when=FIRST_EXCEPTION)
    except KeyboardInterrupt:
        if cancel is not None:
            cancel.set()
        say("interrupted: no longer waiting; asking each host where it stands (Ctrl-C again to leave now)",
            err=True)
        try:
            wait(futures, timeout=WIND_DOWN_S)
        except KeyboardInterrupt:
            os._exit(130)
        partial: dict[str, Any] = {
            h.name: results.get(h.name, RemoteError(h.name, "interrupted before this host answered; "
                                                    "`invoke status` shows what runs there"))
            for h in hosts}
        raise Interrupted(partial) from None
    finally:
        pool.shutdown(wait=False)
    return {h.name: results[h.name] for h in hosts}
