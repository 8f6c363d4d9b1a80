"""Connections a command closes after it has said what it did.

Closing a paramiko connection wakes its reader thread, which then winds down in Python (its channels,
its socket, its logs). Closing 64 of them at once left the main thread waiting for the GIL behind 64
such threads: the report of a 64-host deploy came 0.3-0.8 s after the last lock was released, all of
it after the last server was ready (bench/tail.py, issue 26). Inside ``after_report()`` a close asked
for with ``later`` waits until the command's report is out. Outside it (tests, the library), a close
happens at once, as before.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

_lock = threading.Lock()
_pending: list[Callable[[], None]] | None = None


def later(close: Callable[[], None]) -> None:
    """Close now, or, inside ``after_report()``, when it ends."""
    with _lock:
        if _pending is not None:
            _pending.append(close)
            return
    close()


@contextmanager
def after_report() -> Iterator[None]:
    """The closes asked for inside run when it ends, in the order asked, whatever happened inside."""
    global _pending
    with _lock:
        outer, _pending = _pending, []
    try:
        yield
    finally:
        with _lock:
            pending, _pending = _pending, outer
        with ExitStack() as stack:  # every one is closed, even after one that raised
            for close in reversed(pending):
                stack.callback(close)
