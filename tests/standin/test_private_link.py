"""Private links (a bastion topology) in network namespaces of this test's own (``gdt-`` names), never the lab's.

The test's thread runs in a namespace of its own too, standing in for the main machine, so the
"unreachable" route it adds never touches the real one.
"""

from __future__ import annotations

import errno
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from standin_support import NoNetns, own_netns, wait_for

from gpudeploy_lab import config, host, sshclient
from gpudeploy_lab.config import Host, PrivateLink
from gpudeploy_lab.sshclient import known_host_names, ssh_argv

FAKE_SSHD = Path(__file__).with_name("fake_sshd.py")

PREFIX = "gdt-"  # cannot collide with the lab's gdlab-* names
BASTION, PRIVATE, OTHER = Host(38), Host(39), Host(37)

CONNECT = ("import socket, sys\n"
           "try:\n"
           "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close(); print(0)\n"
           "except OSError as e:\n"
           "    print(e.errno)\n")
LISTEN = ("import socket, sys\n"
          "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
          "s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(); print('listening', flush=True)\n"
          "while True:\n"
          "    s.accept()[0].close()\n")


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10, check=check)


def connect_errno(netns: str | None, address: str, port: int) -> int:
    argv = ["/usr/bin/python3", "-c", CONNECT, address, str(port)]
    if netns:
        argv = ["ip", "netns", "exec", netns, *argv]
    return int(subprocess.run(argv, capture_output=True, text=True, timeout=10, check=True).stdout)


@pytest.fixture
def namespaces(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """gdt-lab37/38/39, each with lo and an eth0 at its bridge address; removed by exact name."""
    monkeypatch.setattr(config.Host, "NET_PREFIX", PREFIX)  # the lab hosts' names derive from their kind's
    names = [h.netns for h in (OTHER, BASTION, PRIVATE)]
    assert all(n.startswith(PREFIX) for n in names)
    try:
        with own_netns():
            try:
                for h in (OTHER, BASTION, PRIVATE):
                    ip("netns", "add", h.netns)
                    ip("-n", h.netns, "link", "set", "lo", "up")
                    # the bridge side as in the lab: an eth0 with the host's 10.231.0.x (a veth whose
                    # peer stays in the same namespace: this kernel has no dummy links)
                    ip("-n", h.netns, "link", "add", "eth0", "type", "veth", "peer", "name", "br-end")
                    ip("-n", h.netns, "link", "set", "br-end", "up")
                    ip("-n", h.netns, "addr", "add", f"{h.address}/24", "dev", "eth0")
                    ip("-n", h.netns, "link", "set", "eth0", "up")
                yield
            finally:
                for n in names:
                    ip("netns", "del", n, check=False)
    except NoNetns as exc:
        pytest.skip(f"cannot make network namespaces here ({exc})")


def addresses(h: Host) -> str:
    return ip("-n", h.netns, "-o", "-4", "addr", "show").stdout


def test_private_link_reaches_the_host_only_from_its_bastion(namespaces: None) -> None:
    link = PrivateLink(BASTION, PRIVATE)
    assert (link.bastion_address, link.private_address, link.subnet) == ("10.232.39.1", "10.232.39.2",
                                                                          "10.232.39.0/24")
    main_links_before = ip("-o", "link", "show").stdout
    assert host.connect_private(link) is True
    assert host.connect_private(link) is False  # idempotent: intact, kept
    assert host.private_link_ok(link)
    assert host.private_links([OTHER, BASTION, PRIVATE]) == [link]
    assert ip("-o", "link", "show").stdout == main_links_before  # nothing in the "main" namespace
    for h in (BASTION, PRIVATE):  # the bridge addresses are still there, untouched
        assert f" {h.address}/24 " in addresses(h)
    assert f" {link.private_address}/24 " in addresses(PRIVATE)
    assert f" {link.bastion_address}/24 " in addresses(BASTION)

    server = subprocess.Popen(["ip", "netns", "exec", PRIVATE.netns, "/usr/bin/python3", "-c", LISTEN,
                               link.private_address, "2222"], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "listening"
        assert connect_errno(BASTION.netns, link.private_address, 2222) == 0
        assert connect_errno(OTHER.netns, link.private_address, 2222) == errno.ENETUNREACH  # no route there
        host.ensure_private_route()
        host.ensure_private_route()  # replace: idempotent
        assert host.private_route_present()
        assert connect_errno(None, link.private_address, 2222) == errno.EHOSTUNREACH  # the main machine
    finally:
        server.kill()
        server.wait(timeout=5)
    host.remove_private_route()
    assert not host.private_route_present()


def test_a_partial_link_is_rebuilt_and_removal_is_exact(namespaces: None) -> None:
    link = PrivateLink(BASTION, PRIVATE)
    host.connect_private(link)
    ip("-n", PRIVATE.netns, "addr", "flush", "dev", link.private_ifname)
    assert not host.private_link_ok(link)
    assert host.connect_private(link) is True
    assert host.private_link_ok(link)
    host.disconnect_private(link)
    host.disconnect_private(link)  # nothing left: no error
    assert host.private_links([BASTION, PRIVATE]) == []
    assert "gdp" not in ip("-n", PRIVATE.netns, "-o", "link").stdout


def test_deleting_either_namespace_takes_the_link_away(namespaces: None) -> None:
    """What ``lab down`` (and its sweep of a crashed run) relies on: release() deletes the netns."""
    link = PrivateLink(BASTION, PRIVATE)
    host.connect_private(link)
    ip("netns", "del", BASTION.netns)
    wait_for(lambda: link.private_ifname not in ip("-n", PRIVATE.netns, "-o", "link").stdout, timeout=5)
    assert host.private_links([BASTION, PRIVATE]) == []


def test_names_for_hosts_and_known_hosts() -> None:
    link = PrivateLink(Host(2), Host(3))
    text = host.etc_hosts([Host(1), Host(2), Host(3)], [link])
    assert text.splitlines()[2:] == ["10.231.0.11\tlab1", "10.231.0.12\tlab2", "10.231.0.13\tlab3",
                                     "10.232.3.2\tlab3-private"]
    assert known_host_names(Host(3), [link]) == ["lab3", "10.231.0.13", "lab3-private", "10.232.3.2"]
    assert known_host_names(Host(2), [link]) == ["lab2", "10.231.0.12", "10.232.3.1"]
    assert known_host_names(Host(1), [link]) == ["lab1", "10.231.0.11"]
    argv = ssh_argv("10.232.3.2", "true", jump="10.231.0.12")
    proxy = next(a for a in argv if a.startswith("ProxyCommand="))
    assert proxy.endswith("-W %h:%p root@10.231.0.12") and "StrictHostKeyChecking=yes" in proxy
    assert f"UserKnownHostsFile={config.KNOWN_HOSTS}" in proxy and argv[-2:] == ["root@10.232.3.2", "true"]


def test_pairs_parse() -> None:
    from gpudeploy_lab.control import _private_link, parse_pairs
    assert parse_pairs("lab2:lab3, lab2:lab4") == [("lab2", "lab3"), ("lab2", "lab4")]
    assert parse_pairs("") == []
    with pytest.raises(ValueError):
        parse_pairs("lab2")
    with pytest.raises(ValueError):
        _private_link("lab2", "lab2")
    with pytest.raises(ValueError):
        _private_link("lab2", "bastion")


def test_lab_ssh_reaches_the_private_address_through_the_bastion_checking_both_keys(
        namespaces: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sshclient.ssh(..., jump=bastion) as add_private_link uses it, against fake sshds in the namespaces;
    the known_hosts file is the one write_known_hosts makes for the link."""
    link = PrivateLink(BASTION, PRIVATE)
    host.connect_private(link)
    host.ensure_private_route()
    # the "main machine" (this test's namespace) reaches the bastion's bridge address, as in the lab
    ip("link", "add", "gdt-br", "type", "veth", "peer", "name", "eth1", "netns", BASTION.netns)
    ip("addr", "add", "10.231.1.1/24", "dev", "gdt-br")  # not 10.231.0.0/24: eth0 has that
    ip("link", "set", "gdt-br", "up")
    ip("-n", BASTION.netns, "addr", "add", "10.231.1.48/24", "dev", "eth1")
    ip("-n", BASTION.netns, "link", "set", "eth1", "up")
    monkeypatch.setattr(config, "SSH_KEY", tmp_path / "id_ed25519")
    monkeypatch.setattr(config, "KNOWN_HOSTS", tmp_path / "known_hosts")
    keys = {}
    for name in ("id_ed25519", "bastion_key", "private_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / name)], check=True)
        keys[name] = (tmp_path / f"{name}.pub").read_text().split()[1]
    servers = []
    try:
        for h, address, key in ((BASTION, "10.231.1.48", "bastion_key"), (PRIVATE, link.private_address,
                                                                             "private_key")):
            proc = subprocess.Popen(["ip", "netns", "exec", h.netns, sys.executable, str(FAKE_SSHD), address, "22",
                                     str(tmp_path / key), str(tmp_path / "id_ed25519.pub"), h.name],
                                    stdout=subprocess.PIPE, text=True)
            servers.append(proc)
            assert proc.stdout is not None and proc.stdout.readline().strip() == "listening"
        sshclient.write_known_hosts([(BASTION, keys["bastion_key"]), (PRIVATE, keys["private_key"])], [link])
        text = (tmp_path / "known_hosts").read_text()
        assert f"lab39,10.231.0.49,lab39-private,10.232.39.2 ssh-ed25519 {keys['private_key']}\n" in text
        # this test reaches the bastion at 10.231.1.48 (its known_hosts line says 10.231.0.48): add that
        (tmp_path / "known_hosts").write_text(text + f"10.231.1.48 ssh-ed25519 {keys['bastion_key']}\n")

        res = sshclient.ssh(link.private_address, "hostname", timeout=20, jump="10.231.1.48")
        assert (res.returncode, res.stdout.strip()) == (0, "lab39"), res.stderr
        assert sshclient.ssh(link.private_address, "true", timeout=5).returncode == sshclient.SSH_FAILED  # direct

        # a wrong key for the private address is refused, although the bastion's is right
        (tmp_path / "known_hosts").write_text(text.replace(keys["private_key"], keys["bastion_key"], 1)
                                              + f"10.231.1.48 ssh-ed25519 {keys['bastion_key']}\n")
        res = sshclient.ssh(link.private_address, "true", timeout=20, jump="10.231.1.48")
        assert res.returncode == sshclient.SSH_FAILED and "host key" in res.stderr.lower(), res.stderr
    finally:
        for proc in servers:
            proc.kill()
            proc.wait(timeout=5)
        host.remove_private_route()
