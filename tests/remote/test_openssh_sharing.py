"""The real OpenSSH client (what ``invoke status`` uses) against fake sshds on 127.0.0.1: a shared
master is never reused by another way of reaching the same address (issue 20, item 6)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from sshd_servers import ADDRESS, Servers

from gpudeploy.errors import HostUnreachable
from gpudeploy.model import Host, SshConfig, SshHop
from gpudeploy.remote import openssh

pytestmark = pytest.mark.skipif(shutil.which("ssh") is None, reason="no OpenSSH client")


def host_behind(servers: Servers, port: int, bastion_port: int, known_hosts: Path) -> Host:
    key = str(servers.client_key)
    hop = SshHop(ADDRESS, user="root", port=bastion_port, key=key, known_hosts=str(known_hosts), connect_timeout_s=5)
    return Host(name="gpu1", address=ADDRESS, ssh=SshConfig(user="root", port=port, key=key,
                                                            known_hosts=str(known_hosts), connect_timeout_s=5,
                                                            proxy_jump=hop),
                numa_nodes=(), gpu_memory_gib={}, engine_versions={}, python="/usr/bin/python3",
                bind_address="0.0.0.0", numa_policy="none", env={}, placements=())


def test_the_same_address_behind_another_bastion_has_its_host_key_checked(servers: Servers, control_dir: Path,
                                                                          tmp_path: Path) -> None:
    target, bastion_a, bastion_b = servers.start("gpu"), servers.start("bastion-a"), servers.start("bastion-b")
    # Cluster A knows its bastion and the host; cluster B knows its own bastion, and its host at that
    # address is someone else (another key).
    a_known = tmp_path / "a_known_hosts"
    a_known.write_text(bastion_a.known_line() + target.known_line())
    b_known = tmp_path / "b_known_hosts"
    other = servers.start("other")
    b_known.write_text(bastion_b.known_line() + f"{target.known_name} {other.public_key}\n")

    a = host_behind(servers, target.port, bastion_a.port, a_known)
    assert openssh.OpenSsh(a).run(["true"], timeout=30).rc == 0
    assert servers.wait_relays(bastion_a, 1) == [target.port]
    # Within A's ControlPersist, B's host key must still be checked: refused, never A's master.
    b = host_behind(servers, target.port, bastion_b.port, b_known)
    with pytest.raises(HostUnreachable, match=r"(?i)host key"):
        openssh.OpenSsh(b).run(["true"], timeout=30)
    # A again: its master is still there and shared (no new relay through its bastion).
    assert openssh.OpenSsh(a).run(["true"], timeout=30).rc == 0
    assert bastion_a.relays() == [target.port]
