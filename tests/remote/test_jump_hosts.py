"""Every hop on the way to a host is checked by the one trust rule, in both transports (issue 20,
item 10): the real OpenSSH client (status) and the paramiko transport (deploy) against fake sshds on
127.0.0.1, with ssh_config's ProxyJump chains. Before: ssh gave its command-line options only to the
host it dialled, not to the jump hosts ssh_config made it dial; fabric dialled those with
AutoAddPolicy, and a chain ``a,b`` in reverse (b first)."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from sshd_servers import ADDRESS, Server, Servers

from gpudeploy.errors import HostUnreachable
from gpudeploy.model import Host, SshConfig, SshHop
from gpudeploy.remote import openssh
from gpudeploy.remote.ssh import Remote

pytestmark = pytest.mark.skipif(shutil.which("ssh") is None, reason="no OpenSSH client")


def _host(address: str, *, port: int | None, known_hosts: Path, key: str | None, hop: SshHop | None = None,
          user: str | None = "root") -> Host:
    return Host(name="gpu1", address=address,
                ssh=SshConfig(user=user, port=port, key=key, known_hosts=str(known_hosts), connect_timeout_s=5,
                              proxy_jump=hop),
                numa_nodes=(), gpu_memory_gib={}, engine_versions={}, python="/usr/bin/python3",
                bind_address="0.0.0.0", numa_policy="none", env={}, placements=())


def status_way(host: Host) -> str:
    return openssh.OpenSsh(host).run(["hostname"], timeout=30).stdout.strip()


def deploy_way(host: Host) -> str:
    with Remote(host) as remote:
        return remote.run(["hostname"], timeout=30).stdout.strip()


BOTH: dict[str, Callable[[Host], str]] = {"status (OpenSSH)": status_way, "deploy (paramiko)": deploy_way}


def _alias(name: str, server: Server, key: Path, extra: str = "") -> str:
    return (f"Host {name}\n  HostName {ADDRESS}\n  Port {server.port}\n  User root\n  IdentityFile {key}\n"
            f"  IdentitiesOnly yes\n{extra}")


@pytest.mark.parametrize("way", list(BOTH))
def test_a_bastions_own_jump_host_is_checked(way: str, servers: Servers, control_dir: Path, tmp_path: Path) -> None:
    target, bastion, outer = servers.start("gpu"), servers.start("bastion"), servers.start("outer")
    # The inventory reaches gpu through "bastion"; the user's ssh_config reaches bastion through
    # "outer", which it trusts loosely. gpudeploy's rule must hold for outer too.
    (tmp_path / "ssh_config").write_text(
        _alias("bastion", bastion, servers.client_key, "  ProxyJump outer\n")
        + _alias("outer", outer, servers.client_key,
                 "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n"))
    known = tmp_path / "known hosts 100%"  # a space and a %: through two levels of ProxyCommand
    known.write_text(target.known_line() + bastion.known_line())
    hop = SshHop("bastion", key=str(servers.client_key), known_hosts=str(known), connect_timeout_s=5)
    host = _host(ADDRESS, port=target.port, known_hosts=known, key=str(servers.client_key), hop=hop)

    with pytest.raises(HostUnreachable, match=rf"(?i)host key|{outer.port}"):
        BOTH[way](host)
    assert not outer.relays()  # refused at outer's key: nothing went through it

    known.write_text(target.known_line() + bastion.known_line() + outer.known_line())
    assert BOTH[way](host) == "gpu"
    assert outer.relays() == [bastion.port] and bastion.relays() == [target.port]


@pytest.mark.parametrize("way", list(BOTH))
def test_an_ssh_config_chain_is_dialled_in_openssh_order_every_hop_checked(way: str, servers: Servers,
                                                                           control_dir: Path, tmp_path: Path) -> None:
    target, a, b = servers.start("gpu"), servers.start("a"), servers.start("b")
    key = servers.client_key
    (tmp_path / "ssh_config").write_text(
        _alias("gpu", target, key, f"  ProxyJump root@{ADDRESS}:{a.port},root@{ADDRESS}:{b.port}\n")
        + f"Host {ADDRESS}\n  IdentityFile {key}\n  IdentitiesOnly yes\n")
    known = tmp_path / "known_hosts"
    known.write_text(target.known_line() + a.known_line() + b.known_line())
    host = _host("gpu", port=None, user=None, known_hosts=known, key=None)
    assert BOTH[way](host) == "gpu"
    # ssh -J a,b: a first, then b through a, then the host through b
    assert a.relays() == [b.port] and b.relays() == [target.port]

    known.write_text(target.known_line() + b.known_line())  # a is known nowhere now
    with pytest.raises(HostUnreachable):
        BOTH[way](host)
    assert a.relays() == [b.port]


@pytest.mark.parametrize("way", list(BOTH))
def test_a_proxycommand_that_runs_ssh_is_refused_saying_why(way: str, servers: Servers, control_dir: Path,
                                                            tmp_path: Path) -> None:
    target, bastion = servers.start("gpu"), servers.start("bastion")
    key = servers.client_key
    # ssh's own options in it, out of gpudeploy's reach: it would trust any key of the bastion
    loose = (f"ssh -F /dev/null -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -i {key} -l root "
             f"-p {bastion.port} -W %h:%p {ADDRESS}")
    (tmp_path / "ssh_config").write_text(_alias("gpu", target, key, f"  ProxyCommand {loose}\n"))
    known = tmp_path / "known_hosts"
    known.write_text(target.known_line())
    host = _host("gpu", port=None, user=None, known_hosts=known, key=None)
    with pytest.raises(HostUnreachable, match=r"ProxyCommand.*write it as ProxyJump"):
        BOTH[way](host)
    assert not bastion.relays()


RELAY = """import socket, sys, threading
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
def up():
    while data := sys.stdin.buffer.read1(65536):
        s.sendall(data)
    s.shutdown(socket.SHUT_WR)
threading.Thread(target=up, daemon=True).start()
while data := s.recv(65536):
    sys.stdout.buffer.write(data); sys.stdout.buffer.flush()
"""


@pytest.mark.parametrize("way", list(BOTH))
def test_a_relay_proxycommand_still_works_and_the_host_key_is_checked_through_it(
        way: str, servers: Servers, control_dir: Path, tmp_path: Path) -> None:
    target = servers.start("gpu")
    relay = tmp_path / "relay.py"
    relay.write_text(RELAY)
    (tmp_path / "ssh_config").write_text(_alias("gpu", target, servers.client_key,
                                                f"  ProxyCommand {sys.executable} {relay} %h %p\n"))
    known = tmp_path / "known_hosts"
    known.write_text(target.known_line())
    host = _host("gpu", port=None, user=None, known_hosts=known, key=None)
    assert BOTH[way](host) == "gpu"
    other = servers.start("other")
    known.write_text(f"{target.known_name} {other.public_key}\n")
    with pytest.raises(HostUnreachable, match=r"(?i)host key"):
        BOTH[way](host)


@pytest.mark.parametrize("way", list(BOTH))
def test_a_jump_loop_in_ssh_config_is_refused_at_once(way: str, servers: Servers, control_dir: Path,
                                                     tmp_path: Path) -> None:
    target = servers.start("gpu")
    (tmp_path / "ssh_config").write_text("Host gpu\n  ProxyJump hop1\nHost hop1\n  ProxyJump hop2\n"
                                         "Host hop2\n  ProxyJump hop1\n")
    known = tmp_path / "known_hosts"
    known.write_text(target.known_line())
    with pytest.raises(HostUnreachable, match="loop: gpu -> hop1 -> hop2 -> hop1"):
        BOTH[way](_host("gpu", port=None, user=None, known_hosts=known, key=None))


def test_deploy_closes_every_hop_it_opened(servers: Servers, tmp_path: Path) -> None:
    # fabric's close() leaves a gateway connection open: each bastion's connection (its socket and
    # paramiko thread) outlived the host's, and one refused host key left the opened hops behind
    target, bastion = servers.start("gpu"), servers.start("bastion")
    known = tmp_path / "known_hosts"
    known.write_text(target.known_line() + bastion.known_line())
    key = str(servers.client_key)
    hop = SshHop(ADDRESS, user="root", port=bastion.port, key=key, known_hosts=str(known), connect_timeout_s=5)
    host = _host(ADDRESS, port=target.port, known_hosts=known, key=key, hop=hop)
    with Remote(host) as remote:
        assert remote.run(["hostname"], timeout=30).stdout.strip() == "gpu"
        assert remote.chain[0].is_connected
    assert not any(c.is_connected for c in remote.chain)
    known.write_text(bastion.known_line())  # the host itself is unknown now
    refused = Remote(host)
    with pytest.raises(HostUnreachable, match="not in known_hosts"):
        refused.open()
    assert not any(c.is_connected for c in refused.chain)
