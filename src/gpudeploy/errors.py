"""One exception tree for gpudeploy.

    GpudeployError                  root: tasks turn it into a message and a non-zero exit
    +-- InputError                  bad inventory/role/template input; carries every Problem found
    +-- RemoteError                 something on a host went wrong (ssh, systemctl, upload)
    |   +-- HostUnreachable         no ssh connection could be made
    |   +-- LockLost                the host lock this run held is gone: nothing more is done there
    +-- GateFailed                  the health gate saw the server die, hang or time out

Nothing a user can cause should escape as a bare traceback; see ``tasks.py``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the user's input, located as precisely as we can."""

    message: str
    file: str | None = None
    line: int | None = None
    host: str | None = None
    role: str | None = None
    key: str | None = None

    def __str__(self) -> str:
        where = ""
        if self.file:
            where = self.file + (f":{self.line}" if self.line else "")
        ctx = [f"{name} {value}" for name, value in
               (("host", self.host), ("role", self.role), ("key", self.key)) if value]
        parts = [p for p in (where, ", ".join(ctx)) if p]
        return (": ".join(parts) + ": " if parts else "") + self.message


class GpudeployError(Exception):
    """Root of every error gpudeploy raises on purpose."""


class InputError(GpudeployError):
    """The inventory, a role or a template is wrong. Nothing has been touched."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = list(problems)
        super().__init__(self.render())

    def render(self) -> str:
        n = len(self.problems)
        head = f"{n} problem{'s' if n != 1 else ''} in the input (nothing was changed):"
        return "\n".join([head, *(f"  - {p}" for p in self.problems)])


class RemoteError(GpudeployError):
    """A command or transfer on a host failed."""

    def __init__(self, host: str, message: str) -> None:
        self.host = host
        super().__init__(f"{host}: {message}")


class HostUnreachable(RemoteError):
    """The host could not be reached over ssh."""


class LockLost(RemoteError):
    """The host lock this run held is gone (apply/lock.py): another gpudeploy run may hold it now, so
    this run changes nothing more on the host, which fails as a whole with this reason. Code that
    takes a host's error for "no answer" (an HTTP ask, the smoke) lets this one through."""

    def __init__(self, host: str, why: str) -> None:
        super().__init__(host, f"lost the host lock ({why}): another gpudeploy run may hold it now; "
                         "nothing more was changed there")


class GateFailed(GpudeployError):
    """The health gate decided the server will not become ready."""
