"""Deploy's head start: each host's connection made and its lock's holder started while the rest
of deploy is still imported and planned; the holder gets the probe's spec once the plan has it.

A redeploy where nothing changed is little more than that: at one host, traced (issue 26), the
imports and the plan took ~0.22 s before the connection (0.065 s) and the lock's round trip with the
probe (0.15-0.19 s) even began. Here the connection, the session's start on the host and the
holder's python overlap the imports; only the probe itself waits for the plan. The holder reads its
spec from stdin (lock.HOLDER's ``-``), so it can start before the spec exists.

It only ever starts what deploy then does anyway, on the same hosts, in the same way: a plain
deploy of the whole inventory (no --host, --role, --deployment, --serial or --only-failed, which
pick hosts from the plan), for the hosts the inventory places something on, as many at once as
deploy would dial (--forks). Every lock is taken without waiting, as deploy's first pass takes
them: where one is busy, sessions.open_sessions lets go of all and takes them in order, as always.
A dial that failed here is that host's error (it is not dialled twice). When deploy does not need
what was started (the plan failed, Ctrl-C), ``close`` ends it: each holder sees its stdin close
and exits without probing, and its lock goes with it.

So the locks are taken before the plan is built, and held while it is (with the heartbeat): through
a release's ``--help`` being read from a host (apply/learn.py) too, and for a plan that then fails.
Another gpudeploy run that wants one of these hosts meanwhile waits, as it would a moment later.
"""

from __future__ import annotations

import contextlib
import threading

from ..errors import GpudeployError
from ..fanout import forks_for
from ..model import Host
from ..remote import connect
from ..remote.base import Transport
from .lock import HostLock

Started = tuple[Transport, HostLock | None]


class _Early:
    def __init__(self, host: Host) -> None:
        self.host = host
        self.done = threading.Event()
        self.result: Started | GpudeployError | None = None
        self.unwanted = False  # close() came first: what is started from now on is ended at once

    def run(self, lock: threading.Lock) -> None:
        result: Started | GpudeployError | None = None
        try:
            result = self._dial()
        finally:  # whatever happened, take() must not wait for ever
            with lock:  # done and unwanted change under the lock: either close() or this thread ends it
                self.result = result
                self.done.set()
                unwanted = self.unwanted
            if unwanted:
                _end(result)

    def _dial(self) -> Started | GpudeployError | None:
        try:
            remote = connect(self.host)
            remote.open()
        except GpudeployError as exc:
            return exc
        except Exception:  # anything else: deploy dials the host itself, as without a head start
            return None
        try:
            return remote, HostLock(remote, 0).start(probe_later=True)
        except Exception:  # deploy starts the holder itself, and says what goes wrong then
            return remote, None


class EarlyLocks:
    def __init__(self, hosts: list[Host]) -> None:
        placed = [h for h in hosts if h.placements]
        if any(h.connection == "ssh" for h in placed):
            # paramiko's import here, before the threads: imported by a thread, it shared the GIL with
            # the main thread's imports and the handshake began only once both were done.
            from ..remote import ssh  # noqa: F401
        self.lock = threading.Lock()
        self.early: dict[str, _Early] = {}
        for h in placed[:forks_for(len(placed))]:
            e = _Early(h)
            try:
                threading.Thread(target=e.run, args=(self.lock,), daemon=True, name=f"early-{h.name}").start()
            except RuntimeError:  # no thread to be had: the rest are dialled by deploy, as without this
                break
            self.early[h.name] = e

    def take(self, host: Host) -> Started | GpudeployError | None:
        """The host's connection and started holder, or its dial's error; None where nothing was
        started for it (deploy dials it as usual). Waits for a dial still under way."""
        with self.lock:
            e = self.early.pop(host.name, None)
        if e is None:
            return None
        e.done.wait()
        if e.host != host:  # planned differently from the inventory read (it never is; be sure)
            _end(e.result)
            return None
        return e.result

    def close(self) -> None:
        """End whatever was started and not taken (at once, or as its dial ends)."""
        with self.lock:
            left = list(self.early.values())
            self.early.clear()
            for e in left:
                e.unwanted = True
            finished = [e for e in left if e.done.is_set()]
        for e in finished:
            _end(e.result)


def _end(result: Started | GpudeployError | None) -> None:
    if isinstance(result, tuple):
        remote, held = result
        # Let go of what deploy did not need; a connection that is already broken has nothing to say
        # that matters more than the error the command ends with.
        with contextlib.suppress(Exception):
            if held is not None:
                held.__exit__()
        with contextlib.suppress(Exception):
            remote.close()
