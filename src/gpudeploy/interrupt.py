"""Ctrl-C always ends a command, within a bound, wherever the main thread happens to be.

Python raises KeyboardInterrupt in the main thread at the next bytecode, wherever that is: inside a
library's ``except Exception``/``except GpudeployError`` (an interruption inside ``status()`` was
once taken for a host that did not answer, and an experiment ran on to its end with exit 0), between
a lock's acquire and its ``try`` (a worker then blocks forever on it), or while the interpreter's
exit joins worker threads that still wait on a host. Catching it in more places makes a lost Ctrl-C
rarer, never impossible. So the first SIGINT:

  1. reaches a listener thread through the interpreter's wakeup pipe, whatever the main thread is
     doing, and the listener sets every :class:`~gpudeploy.fanout.Cancel` of the process (each
     gate's sleep, each lock wait and each host loop watches one): nothing can swallow that;
  2. the same listener ends the process if the command has not left ``GRACE_S`` later, after saying
     what is left where (the :func:`note` ledger); os._exit: no join of worker threads; the host
     locks go with our ssh connections (their holders let go at EOF);
  3. KeyboardInterrupt is raised in the main thread, so the normal path can say exactly what it
     left, and leave with :func:`leave`, which never waits for threads either.

Python drops an exception raised inside a weakref callback or a ``__del__`` ("Exception ignored
in ...", through ``sys.unraisablehook``): a KeyboardInterrupt raised while the garbage collector ran
one was lost that way under load (an experiment ran on in its benchmark and only the grace's exit
ended it, without the store's "interrupted" or what still ran). So a KeyboardInterrupt the hook
hears is raised again in the main thread at its next bytecode (``_thread.interrupt_main``), and the
listener does not count that redelivery as a second Ctrl-C. The redelivery can itself land while
the main thread is still in the hook (the listener is quick), where it would be dropped again: the
handler then hands it back to the listener instead of raising, until the hook has returned.

A second Ctrl-C leaves at once. The host side never depends on us exiting cleanly: every lock
holder lets go when its channel closes, every benchmark client runs under ``timeout``.
"""

from __future__ import annotations

import _thread
import contextlib
import os
import select
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable
from types import FrameType
from typing import TypeVar

T = TypeVar("T")

GRACE_S = 1.5  # Ctrl-C -> the process is gone, at the latest (the bound is 2 s, on a busy machine)
EXIT_CODE = 130

_lock = threading.Lock()
_ledger: dict[str, str] = {}  # what this command has going on hosts, said if the watchdog must end it
_cancels: list[weakref.WeakMethod[Callable[[], None]]] = []
_pressed_at: float | None = None
_installed = False
_redelivered = 0  # SIGINTs this process raised itself (a swallowed KeyboardInterrupt, raised again)
_redelivered_lock = threading.Lock()
DROPPED = b"\xff"  # the unraisable hook's word to the listener (signal numbers are below 65)
_wakeup_w = -1  # the wakeup pipe's write end: where DROPPED goes
_in_hook: int | None = None  # the thread running the unraisable hook now, if any


def note(key: str, text: str) -> None:
    """Record what is going on at ``key`` (e.g. "lab2/srv"); ``text`` is what to say if Ctrl-C
    must end the command before it can report itself."""
    with _lock:
        _ledger[key] = text


def noted(key: str) -> str | None:
    """What the ledger says of ``key`` now (None: nothing)."""
    with _lock:
        return _ledger.get(key)


def clear(key: str) -> None:
    with _lock:
        _ledger.pop(key, None)


def on_interrupt(cancel: Callable[[], None]) -> None:
    """Call ``cancel`` (a bound method: a Cancel's ``set``, held weakly) at the first Ctrl-C, from
    the listener thread; at once if Ctrl-C was pressed already."""
    with _lock:
        _cancels[:] = [ref for ref in _cancels if ref() is not None]
        _cancels.append(weakref.WeakMethod(cancel))
        pressed = _pressed_at is not None
    if pressed:
        cancel()


def pressed() -> bool:
    return _pressed_at is not None


def install(grace_s: float = GRACE_S) -> None:
    """Take over SIGINT for this process (main thread only; a no-op elsewhere or when done already).

    The interpreter's C-level handler writes each signal's number to a wakeup pipe the moment it
    arrives (``signal.set_wakeup_fd``), whatever the main thread is doing, even blocked in C or on a
    lock it will never get; a listener thread reads that pipe, sets every Cancel and, ``grace_s``
    later, ends the process. The main thread only raises KeyboardInterrupt, so nothing that runs
    in it (a handler interrupting a lock's owner) can block the listener.
    """
    global _installed, _wakeup_w
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    _wakeup_w = w
    signal.signal(signal.SIGINT, _raise)
    sys.unraisablehook = _unraisable(sys.unraisablehook)
    threading.Thread(target=_listen, args=(r, grace_s), name="ctrl-c", daemon=True).start()
    _installed = True


def _raise(signum: int, frame: FrameType | None) -> None:
    if _in_hook == threading.get_ident():  # raised here, it would be dropped like the one the hook heard
        _hand_to_listener()  # which raises it again, a moment later
        return
    raise KeyboardInterrupt


def _hand_to_listener() -> None:
    with contextlib.suppress(OSError):
        os.write(_wakeup_w, DROPPED)


def _unraisable(previous: Callable[[sys.UnraisableHookArgs], object]) -> Callable[[sys.UnraisableHookArgs], None]:
    """A hook that hands a dropped KeyboardInterrupt to the listener, which raises it again: not here,
    where the main thread is still inside the context that drops it."""
    def hook(args: sys.UnraisableHookArgs) -> None:
        global _in_hook
        _in_hook = threading.get_ident()
        try:
            if args.exc_type is not None and issubclass(args.exc_type, KeyboardInterrupt):
                _hand_to_listener()
                return
            previous(args)
        finally:
            _in_hook = None
    return hook


def _redeliver() -> None:
    global _redelivered
    with _redelivered_lock:  # before the byte interrupt_main writes to the wakeup pipe can reach us
        _redelivered += 1
    _thread.interrupt_main(signal.SIGINT)


def _listen(r: int, grace_s: float) -> None:
    global _pressed_at
    deadline: float | None = None
    while True:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _, _ = select.select([r], [], [], timeout)
        if not ready:  # the grace is over and the command is still here
            _write(2, f"gpudeploy: interrupted; still not done {grace_s:g} s after Ctrl-C, so leaving now.\n"
                   + _left_text())
            os._exit(EXIT_CODE)
        got = os.read(r, 64)
        presses = got.count(signal.SIGINT) - _own(got.count(signal.SIGINT))
        if presses > 0 and (deadline is not None or presses > 1):
            _write(2, "interrupted again: leaving now.\n" + _left_text())
            os._exit(EXIT_CODE)
        if presses > 0:
            _pressed_at = time.monotonic()
            deadline = _pressed_at + grace_s
            _cancel_all()
        if DROPPED[0] in got and deadline is not None:  # after the press it came with, if any
            _redeliver()


def _cancel_all() -> None:
    empty: list[Callable[[], None] | None] = []
    for cancel in _snapshot(lambda: [ref() for ref in _cancels], empty):
        if cancel is None:
            continue
        with contextlib.suppress(Exception):  # a cancel that fails must not keep the others from running
            cancel()


def _own(count: int) -> int:
    """How many of ``count`` SIGINTs read from the pipe were this process's redeliveries."""
    global _redelivered
    with _redelivered_lock:
        own = min(count, _redelivered)
        _redelivered -= own
    return own


def _snapshot(read: Callable[[], T], default: T) -> T:
    """``read()`` under the lock, unless the lock cannot be had at once: the listener must never wait
    on a lock the interrupted main thread may have left held."""
    if not _lock.acquire(timeout=0.2):
        return default
    try:
        return read()
    finally:
        _lock.release()


def _left_text() -> str:
    items = _snapshot(lambda: sorted(_ledger.items()), [("?", "not known (the ledger was busy)")])
    if not items:
        return "nothing this run started is known to be left running.\n"
    return "left on the hosts (`invoke status` shows what runs there):\n" + "".join(
        f"  {key}: {text}\n" for key, text in items)


def _write(fd: int, text: str) -> None:
    # Not through sys.stdout/stderr: another thread may hold their locks (a write blocked on a full pipe).
    with contextlib.suppress(OSError):
        os.write(fd, text.encode(errors="replace"))


def leave(code: int = EXIT_CODE) -> None:
    """End the process now, after what was printed is out: the interpreter's exit would join every
    worker thread first, and one still waiting on a host would hold the command (and its host
    locks) for as long as that wait lasts."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
