"""What gpudeploy needs of a way to reach a host: the transport interface.

Everything above (facts, supervisors, the gate, deploy, status, teardown) talks to a host only
through these calls, so a new way in (``connection: local`` on the GPU node itself, a bastion, a
container exec) is one new file that implements them:

  * ``run(argv, stdin=, timeout=, check=)``: run a command (an argv list: the transport quotes it
    if its way in needs a command line) and wait at most ``timeout`` in all; a :class:`Result`.
  * ``stream(argv)``: start a long-running command and return a :class:`Stream` of its output
    (a log follower, the host lock's holder); closing the stream ends the command.
  * ``put(path, data, mode)``: write a file atomically (temp file in the same folder, then
    rename) with ``mode``; a secret is never readable by others, not even for a moment.
  * ``open_tcp(address, port, timeout)``: a TCP connection made by the host itself (ssh -L does
    this), so gpudeploy's HTTP to a server needs only the way in, not the server's port, open.
  * ``open()`` / ``close()`` (and the context manager): one connection for the whole command.
  * ``host``: the inventory's :class:`~gpudeploy.model.Host` it reaches.

Errors: :class:`~gpudeploy.errors.HostUnreachable` when the host cannot be reached or the way in
broke; :class:`~gpudeploy.errors.RemoteError` when a command failed (and ``check``) or timed out.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any, Protocol

from ..model import Host


@dataclass(frozen=True)
class Result:
    rc: int
    stdout: str
    stderr: str


class Stream(Protocol):
    """The output of a running command, read in chunks (a paramiko Channel is one)."""

    def settimeout(self, timeout: float | None) -> None: ...

    def recv(self, nbytes: int) -> bytes:
        """Up to ``nbytes`` of stdout; b"" at its end; TimeoutError when none came in time."""

    def recv_stderr(self, nbytes: int) -> bytes: ...

    def sendall(self, data: bytes) -> None:
        """Write to the command's stdin."""

    def exit_status_ready(self) -> bool:
        """The command has ended (a look, no waiting): the host lock's holder is gone, and its lock with it."""

    def close(self) -> None: ...


class Socket(Protocol):
    """A byte stream to a port (``open_tcp``): what http.client needs of a socket."""

    def sendall(self, data: bytes) -> None: ...

    def recv(self, nbytes: int) -> bytes: ...

    def makefile(self, *args: Any, **kwargs: Any) -> Any: ...

    def settimeout(self, timeout: float | None) -> None: ...

    def close(self) -> None: ...


class Transport(Protocol):
    host: Host

    def open(self) -> None: ...

    def close(self) -> None: ...

    def __enter__(self) -> Transport: ...

    def __exit__(self, *exc: object) -> None: ...

    def run(self, argv: list[str], *, stdin: bytes | None = None, timeout: float = 60.0,
            check: bool = True) -> Result: ...

    def stream(self, argv: list[str]) -> Stream: ...

    def put(self, path: str, data: bytes, mode: int) -> None: ...

    def open_tcp(self, address: str, port: int, timeout: float) -> Socket: ...


class ForwardingRefused(ConnectionRefusedError):
    """The host's sshd refuses TCP channels altogether (``AllowTcpForwarding no``: "administratively
    prohibited"), as opposed to nothing listening on the port yet."""


def command_line(argv: list[str]) -> str:
    """argv as one remote shell command line, every word quoted."""
    return " ".join(shlex.quote(a) for a in argv)
