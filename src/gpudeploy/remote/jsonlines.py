"""JSON lines from a streaming channel (a host's journal or run-log reader), for the supervisors' watches.

A channel delivers bytes in arbitrary pieces; a line is complete at its newline. The reader polls
``done`` every 0.2 s so a watch ends promptly, and ends at EOF or when the channel breaks. A line
that is not JSON is skipped (a reader's stray output must not end the stream for every run).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any, Protocol

POLL_S = 0.2


class Channel(Protocol):
    def settimeout(self, timeout: float | None) -> None: ...

    def recv(self, nbytes: int) -> bytes: ...


def json_lines(chan: Channel, done: threading.Event) -> Iterator[Any]:
    """Each complete line's JSON value, until ``done`` is set, EOF or an OSError of the channel."""
    chan.settimeout(POLL_S)
    buf = b""
    try:
        while not done.is_set():
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
                    value = json.loads(raw)
                except ValueError:
                    continue
                yield value
    except OSError:
        return
