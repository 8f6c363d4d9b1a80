"""A lost connection says why it was lost: the host closed it, or the link's own error.

Loaded runs 8 and 11 of issue 20: a deploy's gate reported "lost the connection to lab1 ... the
ssh connection was lost" and nothing more, so whether the host ended the session or the link broke
could not be told afterwards. paramiko keeps the reason its transport ended; the words carry it.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from sshd_servers import ADDRESS, Server, Servers
from test_jump_hosts import _host

from gpudeploy.errors import HostUnreachable
from gpudeploy.model import Host
from gpudeploy.remote.ssh import Remote


def _gpu(servers: Servers, tmp_path: Path) -> tuple[Server, Host]:
    """A fake host "gpu" and the inventory host that reaches it, its key known."""
    server = servers.start("gpu")
    known = tmp_path / "known_hosts"
    known.write_text(server.known_line())
    return server, _host(ADDRESS, port=server.port, known_hosts=known, key=str(servers.client_key))


def test_a_connection_the_host_closed_says_so(servers: Servers, tmp_path: Path) -> None:
    server, host = _gpu(servers, tmp_path)
    with Remote(host) as remote:
        assert remote.run(["hostname"], timeout=10).stdout.strip() == "gpu"
        server.proc.kill()  # the host's end of the connection goes with it
        server.proc.wait(timeout=10)
        transport = remote.conn.transport
        assert transport is not None
        deadline = time.monotonic() + 30
        while transport.is_active():
            assert time.monotonic() < deadline, "the client never saw the host's end of the connection"
            time.sleep(0.02)
        with pytest.raises(HostUnreachable) as lost:
            remote.run(["hostname"], timeout=10)
    # The kill ends the host's socket with a FIN or, with data unread, a reset: either is said.
    assert re.search(r"the ssh connection was lost \((the host closed it|ConnectionResetError: .+)\)$",
                     str(lost.value)), lost.value


def test_a_connection_the_host_ended_says_the_hosts_words(servers: Servers, tmp_path: Path) -> None:
    # sshd ends a connection with SSH_MSG_DISCONNECT and a reason ("Timeout, client not responding",
    # "Connection corrupted"); paramiko only logs it. Each later command on the connection says it.
    _, host = _gpu(servers, tmp_path)
    with Remote(host) as remote:
        with pytest.raises(HostUnreachable) as first:
            remote.run(["disconnect"], timeout=10)
        with pytest.raises(HostUnreachable) as later:
            remote.run(["hostname"], timeout=10)
    for lost in (first, later):
        assert str(lost.value).endswith("the ssh connection was lost (the host ended it: Timeout, client not "
                                        "responding from user root 127.0.0.1 port 40000)"), lost.value
