"""The transport of a host whose lock this command holds (deploy, teardown): once the lock is known
lost, nothing more is changed there.

Why at the transport, and why for every call: each change deploy or teardown makes on a host (an
upload, a record, a start, a stop, an ``rm``, a router's worker list over HTTP) goes through the
session's transport, by way of the supervisors, the roll, the surges' clean-up and the records;
a check in each of those places would be missed by the next one added, and telling a change from a
read by its argv is guesswork. So the session's transport asks the lock before every command,
write, stream and TCP connection, locally and with no round trip (``HostLock.check``), and the
LockLost it raises fails the host as a whole, as any remote error of a phase does (code that takes
a host's error for one unit's, or for "no answer", lets this one through: the start and the record
in apply/deploy.py, an HTTP ask, the smoke).
A read refused with it costs nothing: the host is lost to this run anyway. What cannot be refused
is a step sent before the loss is known (during the stall itself): that needs the host to check;
the holder's end comes back on the same connection before that step's answer, so the step after
it is refused.

The one exception is the health gate (``reading``): it only reads (logs, unit states, health), and
a gate under way when the lock goes finishes its watch rather than report a lost connection; the
step after it (the run's record, a stop) is refused. A transport that never took a lock (status,
logs, an experiment's client) is never wrapped: nothing changes for it.
"""

from __future__ import annotations

from ..model import Host
from ..remote.base import Result, Socket, Stream, Transport
from .lock import HostLock


class HeldTransport:
    """``remote`` while ``lock`` is held: each call first asks the lock (LockLost once it is lost)."""

    def __init__(self, remote: Transport, lock: HostLock) -> None:
        self.remote = remote
        self.lock = lock
        self.host: Host = remote.host

    # The same connection as ``remote``: what is known of a connection, kept by transport (a host whose
    # sshd refuses port forwarding, verify/http.py), holds for both, the gate's and the others'.
    def __hash__(self) -> int:
        return hash(self.remote)

    def __eq__(self, other: object) -> bool:
        return other is self.remote or (isinstance(other, HeldTransport) and other.remote is self.remote)

    def open(self) -> None:
        self.remote.open()

    def close(self) -> None:
        self.remote.close()

    def __enter__(self) -> HeldTransport:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, argv: list[str], *, stdin: bytes | None = None, timeout: float = 60.0,
            check: bool = True) -> Result:
        self.lock.check()
        return self.remote.run(argv, stdin=stdin, timeout=timeout, check=check)

    def stream(self, argv: list[str]) -> Stream:
        self.lock.check()
        return self.remote.stream(argv)

    def put(self, path: str, data: bytes, mode: int) -> None:
        self.lock.check()
        self.remote.put(path, data, mode)

    def open_tcp(self, address: str, port: int, timeout: float) -> Socket:
        self.lock.check()
        return self.remote.open_tcp(address, port, timeout)


def reading(remote: Transport) -> Transport:
    """The transport under a held one, for the health gate's reads only (see above); any other as it is."""
    return remote.remote if isinstance(remote, HeldTransport) else remote
