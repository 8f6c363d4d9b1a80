"""One connection and one host lock per host for a whole command (deploy, teardown).

All locks are taken at once when none is busy; when one is, every lock taken is let go and they
are taken again one after another in host-name order, waiting where needed: two runs that share
hosts then never wait for each other in a ring. A session's transport refuses every step once its
lock is known lost (held.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from ..errors import GpudeployError
from ..fanout import Cancel, for_each_host, say
from ..model import Host
from ..remote import closing, connect
from ..remote.base import Transport
from ..supervisor import for_host
from ..supervisor.base import Supervisor
from .early_locks import EarlyLocks
from .held import HeldTransport
from .lock import HostLock, LockBusy


@dataclass
class Session:
    host: Host
    remote: Transport
    supervisor: Supervisor
    facts: dict[str, Any] | None = None  # the host probe's, read with the lock (when asked for)
    lock: HostLock | None = None  # its holder answers a probe's second stage (HostLock.more)


def _waiting(host: str) -> Callable[[str], None]:
    return lambda who: say(f"[{host}] waiting for another gpudeploy run ({who})")


def open_sessions(hosts: list[Host], lock_wait_s: float, cancel: Cancel | None, stack: ExitStack,
                  probes: Mapping[str, dict[str, Any]] | None = None, early: EarlyLocks | None = None
                  ) -> tuple[dict[str, Session], dict[str, GpudeployError]]:
    """(sessions, errors) by host name; ``stack`` closes the connections and locks. ``probes``: host
    name -> the host probe's spec, run by the lock's holder as soon as it holds the lock (one round
    trip for both; ``Session.facts``). ``early``: connections and holders already started
    (early_locks.py), used where they are there."""
    specs = probes or {}
    errors: dict[str, GpudeployError] = {}
    started: dict[str, HostLock] = {}  # holders started early, waiting for their probe's spec

    def open_one(host: Host) -> Transport:
        got = early.take(host) if early is not None else None
        if isinstance(got, GpudeployError):
            raise got
        if got is not None:
            remote, held = got
            if held is not None:
                started[host.name] = held
            return remote
        remote = connect(host)
        remote.open()
        return remote

    def lock_one(host: Host) -> HostLock:
        held = started.pop(host.name, None)
        if held is not None:
            return held.finish(specs.get(host.name), cancel)
        return HostLock(remotes[host.name], 0, None, cancel, specs.get(host.name)).__enter__()

    remotes: dict[str, Transport] = {}
    for name, res in for_each_host(hosts, open_one, cancel).items():
        if isinstance(res, GpudeployError):
            errors[name] = res
        else:
            remotes[name] = res
            stack.callback(closing.later, res.close)  # after the report, in a command
    reachable = [h for h in hosts if h.name in remotes]
    locks: dict[str, HostLock | GpudeployError] = dict(for_each_host(reachable, lock_one, cancel))
    if any(isinstance(r, LockBusy) for r in locks.values()):
        for r in locks.values():
            if isinstance(r, HostLock):
                r.__exit__()
        locks = {}
        for h in sorted(reachable, key=lambda h: h.name):
            try:
                locks[h.name] = HostLock(remotes[h.name], lock_wait_s, _waiting(h.name), cancel,
                                         specs.get(h.name)).__enter__()
            except GpudeployError as exc:
                locks[h.name] = exc
    sessions: dict[str, Session] = {}
    for h in reachable:
        lock = locks[h.name]
        if isinstance(lock, HostLock):
            stack.callback(lock.__exit__)
            # every step on the host asks the lock first: none once it is lost (held.py says why there)
            sessions[h.name] = Session(h, HeldTransport(remotes[h.name], lock), for_host(h), lock.facts, lock)
        else:
            errors[h.name] = lock
    return sessions, errors
