"""Gate the ranks of a multi-node group as one engine.

Each rank is gated on its own host (its own ``/health``: the leader's API, a follower's dummy health
server once its schedulers are ready), but the group's result is one: a rank that dies, or whose gate
gives up, stops every other rank's gate at once; a rank that is ready keeps being watched until all
ranks are, so a rank that dies later still fails the group with its own cause.

Which rank's cause is the group's: the others' deaths follow from the first one (their gloo/NCCL
connections to it break: ``peer-lost``), so the earliest death whose cause is not ``peer-lost`` is
the root, else the earliest death.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..model import Unit

if TYPE_CHECKING:
    from .causes import Cause

FOLLOWING = ("peer-lost", "group-failed", "interrupted")  # a consequence, not a root cause

Key = tuple[str, str]  # (deployment, role)


def group_key(unit: Unit) -> Key | None:
    return (unit.deployment, unit.role.name) if unit.group is not None else None


class GroupLinks:
    """Shared by every host's gate of one wave."""

    def __init__(self, units: Iterable[Unit]) -> None:
        self._lock = threading.Lock()
        self._members: dict[Key, set[str]] = {}
        for u in units:
            k = group_key(u)
            if k is not None:
                self._members.setdefault(k, set()).add(u.key)
        self._ready: dict[Key, set[str]] = {k: set() for k in self._members}
        self._failed: dict[Key, str] = {}  # the first rank (host/role) that failed
        self._events: dict[Key, list[threading.Event]] = {k: [] for k in self._members}
        self._done: dict[Key, threading.Event] = {k: threading.Event() for k in self._members}

    def watch(self, unit: Unit, event: threading.Event) -> None:
        """``event`` is set when ``unit``'s group fails."""
        k = group_key(unit)
        if k is None or k not in self._members:
            return
        with self._lock:
            if k in self._failed:
                event.set()
            else:
                self._events[k].append(event)

    def failed(self, unit: Unit) -> None:
        """``unit`` died or its gate gave up: the group has failed."""
        k = group_key(unit)
        if k is None or k not in self._members:
            return
        with self._lock:
            if k in self._failed:
                return
            self._failed[k] = unit.key
            events = list(self._events[k])
        for e in events:
            e.set()
        self._done[k].set()

    def ready(self, unit: Unit) -> None:
        k = group_key(unit)
        if k is None or k not in self._members:
            return
        with self._lock:
            self._ready[k].add(unit.key)
            complete = self._ready[k] >= self._members[k]
        if complete:
            self._done[k].set()

    def wait_group(self, unit: Unit, stop: threading.Event) -> None:
        """Until every rank of ``unit``'s group is ready, the group failed, or ``stop`` is set
        (this rank died, or Ctrl-C)."""
        k = group_key(unit)
        if k is None or k not in self._members:
            return
        while not self._done[k].is_set() and not stop.wait(0.05):
            pass

    def failure_of(self, unit: Unit) -> str | None:
        """The rank that failed first in ``unit``'s group (host/role), if it failed."""
        k = group_key(unit)
        return self._failed.get(k) if k is not None else None


def root_cause(ranks: list[tuple[Unit, Cause | None, float | None]]) -> tuple[Unit, Cause] | None:
    """The group's cause among its failed ranks: (unit, cause, when it died or None)."""
    failed = [(u, c, t) for u, c, t in ranks if c is not None]
    if not failed:
        return None
    late = float("inf")
    roots = [r for r in failed if r[1] is not None and r[1].kind not in FOLLOWING]
    pick = min(roots or failed, key=lambda r: (r[2] if r[2] is not None else late))
    assert pick[1] is not None
    return pick[0], pick[1]


def rank_words(unit: Unit) -> str:
    g = unit.group
    return f"rank {g.rank} of {g.nnodes} ({unit.key})" if g is not None else unit.key
