"""Status's head start: each host's probe begins (its ssh connection made, the host's python
started) as soon as the inventory is read, and gets its spec once the plan is built.

An ssh handshake is most of a status of a few hosts (issue 26: ~0.23 s of 0.37 s at one host), and
gpudeploy spent its own start-up (the planner's imports, the plan) before it began. The probe
reads its spec from stdin (``remote_probe``'s ``-``), so the connection need not wait for it. A
probe that is not needed after all (the plan failed) gets no spec: its ssh is ended by its own PID
and the host's python sees stdin close and exits without doing anything.

Only where status would use OpenSSH anyway (ssh hosts, an ``ssh`` client here), and only for the
hosts that status looks at whatever the plan says (``--host H``, or every host): ``--role`` and
``--deployment`` pick their hosts from the plan, and a head start there could dial hosts status then
never asks.
"""

from __future__ import annotations

import contextlib
import json
from types import TracebackType
from typing import Any

from ..errors import GpudeployError
from ..facts import probe
from ..fanout import forks_for
from ..model import Host
from ..remote import openssh


class HeadStart:
    def __init__(self, hosts: list[Host]) -> None:
        """Starts the probes of the first of ``hosts`` that status works on at once (--forks): the
        others wait for their turn as before, so no more connections are open than without it."""
        self.running: dict[str, openssh.Running] = {}
        if not openssh.available():
            return
        for h in hosts[:forks_for(len(hosts))]:
            if h.connection != "ssh":
                continue
            # The normal path dials it again and reports whatever went wrong here.
            with contextlib.suppress(GpudeployError, OSError):
                self.running[h.name] = openssh.OpenSsh(h).start(probe.argv(h))

    def probe(self, host: Host, spec: dict[str, Any], timeout: float = 60.0) -> dict[str, Any] | None:
        """The host's facts through its early probe; None when it has none (then probe as usual)."""
        early = self.running.pop(host.name, None)
        if early is None:
            return None
        if early.host != host:  # planned differently from the inventory read (it never is; be sure)
            early.abandon()
            return None
        try:
            return probe.parse(host, early.finish(json.dumps(spec).encode(), timeout=timeout))
        finally:
            early.abandon()  # reaps it; a no-op once it has answered

    def close(self) -> None:
        for early in self.running.values():
            early.abandon()
        self.running.clear()

    def __enter__(self) -> HeadStart:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

