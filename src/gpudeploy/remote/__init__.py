"""The transport: how gpudeploy runs commands on a host, streams their output and writes files.

``ssh.Remote`` (fabric/paramiko) carries deploy, teardown, logs and the gate; ``openssh`` reads
status facts through the system's OpenSSH client with connection sharing. Both trust exactly the
same host keys (``trust``).
"""

from __future__ import annotations

from ..model import Host
from .base import Transport


def connect(host: Host) -> Transport:
    """The way into ``host``: SSH, or the machine gpudeploy runs on (``connection: local``)."""
    if host.connection == "local":
        from .local import LocalTransport

        return LocalTransport(host)
    from .ssh import Remote

    return Remote(host)
