"""Run one function per host in parallel and collect each host's result or error.

One host's failure never hides another's outcome (like fabric's GroupResult): the caller reports
every host, then decides the exit status.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from ..errors import GpudeployError
from ..model import Host

T = TypeVar("T")

_print_lock = threading.Lock()


def say(line: str, *, err: bool = False) -> None:
    """Print one whole line; threads never interleave within a line."""
    stream = sys.stderr if err else sys.stdout
    with _print_lock:
        stream.write(line + "\n")
        stream.flush()


def for_each_host(hosts: list[Host], fn: Callable[[Host], T]) -> dict[str, T | GpudeployError]:
    results: dict[str, T | GpudeployError] = {}
    if not hosts:
        return results

    def one(host: Host) -> None:
        try:
            results[host.name] = fn(host)
        except GpudeployError as exc:
            results[host.name] = exc

    with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
        list(pool.map(one, hosts))
    return {h.name: results[h.name] for h in hosts}
