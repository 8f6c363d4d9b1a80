"""The paramiko transport reads known_hosts as OpenSSH does (issue 20, item 11), checked against
the real OpenSSH tools: ``ssh-keygen -F`` for which lines name a host, and the real ssh client
against a fake sshd for what is trusted, case by case, with the paramiko transport beside it."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from sshd_servers import ADDRESS, Server, Servers, keygen

from gpudeploy.errors import HostUnreachable
from gpudeploy.model import Host, SshConfig
from gpudeploy.remote import hostfile, openssh
from gpudeploy.remote.ssh import Remote

pytestmark = pytest.mark.skipif(shutil.which("ssh-keygen") is None or shutil.which("ssh") is None,
                                reason="needs OpenSSH's ssh and ssh-keygen")


def keygen_f(name: str, path: Path) -> list[int]:
    """The line numbers ``ssh-keygen -F name -f path`` reports."""
    out = subprocess.run(["ssh-keygen", "-F", name, "-f", str(path)], capture_output=True, text=True, timeout=30,
                         check=False).stdout
    return [int(n) for n in re.findall(r"^# Host .* found: line (\d+)", out, re.M)]


def ours(name: str, path: Path) -> list[int]:
    found, _ = hostfile.lookup(name, [str(path)])
    return [e.lineno for e in found]


# {a}, {b}: keys ("type base64"); {a_b64}: a's base64 alone. Every kind of line a file may hold.
LINES = [
    "host1 {a}",
    "@revoked host1 {b}",
    "@cert-authority *.example.com {a}",
    "@bogus host1 {a}",
    "@revoked @revoked host1 {a}",
    "host1,!host2 {b}",
    "host* {b}",
    "bad line",
    "host1 ssh-ed25519 !!!notbase64",
    "[host1]:2222 {a}",
    "[host1]:* {b}",
    "HOST3 {a}",
    "host1 ssh-ed25519",
    "host1 ssh-rsa {a_b64}",
    "  host1 {a} a comment",
    "host1\t{a}",
    "# host1 {a}",
    "",
    "10.0.0.? {a}",
    "10.0.0.*,!10.0.0.5 {b}",
    "h?st4 {a}",
    "|1|notasalt|notahash {a}",
    "|1|AAAA|AAAA {a}",
    "1024 35 12345 host1",
    "host1 rsa-sha2-256 {a_b64}",
    "host1 ssh-ed25519-cert-v01@openssh.com {a_b64}",
    "@cert-authority\thost1 {a}",
    "host1 ED25519 {a_b64}",
    "host1 ED25519-CERT {a_b64}",
    "host1 nonsense-type {a_b64}",
]
NAMES = ["host1", "host2", "HOST1", "host3", "host4", "[host1]:2222", "[host1]:22", "a.example.com", "10.0.0.5",
         "10.0.0.7", "10.0.0.77", "nohost", "hashed-one", "[hashed-two]:2200", "Hashed-One"]


def test_the_lines_that_name_a_host_are_those_ssh_keygen_finds(tmp_path: Path) -> None:
    a, b = keygen(tmp_path / "a"), keygen(tmp_path / "b")
    lines = [line.format(a=a, b=b, a_b64=a.split()[1]) for line in LINES]
    # hashed names, as ssh-keygen -H writes them (HashKnownHosts)
    hashed = tmp_path / "hashed"
    hashed.write_text(f"hashed-one {a}\n[hashed-two]:2200 {b}\n")
    subprocess.run(["ssh-keygen", "-H", "-f", str(hashed)], capture_output=True, check=True, timeout=30)
    hashed_lines = hashed.read_text().splitlines()
    assert all(h.startswith("|1|") for h in hashed_lines)
    kh = tmp_path / "known_hosts"
    kh.write_text("\n".join(lines + hashed_lines) + "\n")
    for name in NAMES:
        assert ours(name, kh) == keygen_f(name, kh), name
    assert keygen_f("hashed-one", kh) == [len(lines) + 1]  # the hashed lines were found at all


def test_a_bad_line_is_skipped_and_named_not_fatal(tmp_path: Path) -> None:
    a = keygen(tmp_path / "a")
    kh = tmp_path / "kh"
    kh.write_text(f"bad line\nhost1 ssh-ed25519 !!!\n@bogus host1 {a}\nhost1 {a}\n")
    found, bad = hostfile.lookup("host1", [str(kh)])
    assert [e.lineno for e in found if e.blob is not None] == [4]
    assert [b.lineno for b in bad] == [1, 2, 3]
    assert all(str(b).startswith(f"{kh}:") for b in bad)


# --- what is trusted: the real ssh client and the paramiko transport, against one fake sshd ------------

@dataclass(frozen=True)
class Case:
    """Write the inventory's known_hosts, the user's ~/.ssh/known_hosts and the ssh_config for a
    server; both transports must then agree on ``trusted``."""

    inventory: Callable[[Server, dict[str, str]], str]  # (the server, other keys by type) -> the file
    user: Callable[[Server, dict[str, str]], str] = lambda s, other: ""
    ssh_config: str = ""
    trusted: bool = True
    paramiko_says: str = ""  # part of the paramiko side's reason when refused


def _hashed(tmp: Path, name: str, key: str) -> str:
    f = tmp / "to_hash"
    f.write_text(f"{name} {key}\n")
    subprocess.run(["ssh-keygen", "-H", "-f", str(f)], capture_output=True, check=True, timeout=30)
    return f.read_text()


CASES: dict[str, Case] = {
    "a plain line": Case(lambda s, o: s.known_line()),
    "revoked in another file than the one that trusts it": Case(
        lambda s, o: f"@revoked * {s.public_key}\n", user=lambda s, o: s.known_line(), trusted=False,
        paramiko_says="@revoked"),
    "revoked in the same file": Case(lambda s, o: s.known_line() + f"@revoked {s.known_name} {s.public_key}\n",
                                     trusted=False, paramiko_says="@revoked"),
    "a bad line before the good one": Case(lambda s, o: "garbage\nx ssh-ed25519 !!!\n" + s.known_line()),
    "a bad line in another file": Case(lambda s, o: "@bogus x y z\n|1|broken|hash ssh-ed25519 AAAA\n",
                                       user=lambda s, o: s.known_line()),
    "a pattern with a port": Case(lambda s, o: f"[{ADDRESS}]:* {s.public_key}\n"),
    "a pattern ruled out by a negation": Case(lambda s, o: f"[{ADDRESS}]:*,!{s.known_name} {s.public_key}\n",
                                              trusted=False, paramiko_says="not in known_hosts"),
    # sshconnect.c: a host on another port than 22 that no line names as [host]:port is looked up
    # "without port identifier" too
    "the address without its port": Case(lambda s, o: f"{ADDRESS} {s.public_key}\n"),
    "the address without its port, when [host]:port has another key": Case(
        lambda s, o: f"{s.known_name} {o['ed25519']}\n{ADDRESS} {s.public_key}\n", trusted=False,
        paramiko_says="does NOT match"),
    "a key of another type only (OpenSSH: changed, not unknown)": Case(
        lambda s, o: f"{s.known_name} {o['ecdsa']}\n{ADDRESS} {s.public_key}\n", trusted=False,
        paramiko_says="another type"),
    "another key of that type": Case(lambda s, o: f"{s.known_name} {o['ed25519']}\n", trusted=False,
                                     paramiko_says="does NOT match"),
    "another key first, then the right one in another file": Case(lambda s, o: f"{s.known_name} {o['ed25519']}\n",
                                                                  user=lambda s, o: s.known_line()),
    "a HostKeyAlias from ssh_config": Case(lambda s, o: f"gpu-alias {s.public_key}\n",
                                           ssh_config=f"Host {ADDRESS}\n  HostKeyAlias GPU-Alias\n"),
    "a HostKeyAlias hides the address's own line": Case(lambda s, o: s.known_line(),
                                                        ssh_config=f"Host {ADDRESS}\n  HostKeyAlias gpu-alias\n",
                                                        trusted=False, paramiko_says="gpu-alias is not in"),
    # ssh_config cannot widen what status trusts: the command line's options come first
    "ssh_config exempts localhost from host keys": Case(
        lambda s, o: f"{s.known_name} {o['ed25519']}\n", ssh_config="Host *\n  NoHostAuthenticationForLocalhost yes\n",
        trusted=False, paramiko_says="does NOT match"),
    "ssh_config adds keys by a KnownHostsCommand": Case(
        lambda s, o: "", ssh_config="Host *\n  KnownHostsCommand /bin/echo %H {known}\n", trusted=False,
        paramiko_says="not in known_hosts"),
    "only a @cert-authority line (the host has no certificate)": Case(
        lambda s, o: f"@cert-authority [{ADDRESS}]:* {o['ed25519']}\n", trusted=False, paramiko_says="@cert-authority"),
}


def _host(servers: Servers, server: Server, known_hosts: Path) -> Host:
    return Host(name="gpu1", address=ADDRESS,
                ssh=SshConfig(user="root", port=server.port, key=str(servers.client_key),
                              known_hosts=str(known_hosts), connect_timeout_s=5),
                numa_nodes=(), gpu_memory_gib={}, engine_versions={}, python="/usr/bin/python3",
                bind_address="0.0.0.0", numa_policy="none", env={}, placements=())


@pytest.mark.parametrize("what", list(CASES))
def test_status_and_deploy_trust_the_same_keys(what: str, servers: Servers, control_dir: Path, tmp_path: Path
                                               ) -> None:
    case = CASES[what]
    server = servers.start("gpu")
    other = {kind: keygen(tmp_path / f"other_{kind}", kind) for kind in ("ed25519", "ecdsa")}
    inventory = tmp_path / "inventory_known_hosts"
    inventory.write_text(case.inventory(server, other))
    (tmp_path / "home" / ".ssh" / "known_hosts").write_text(case.user(server, other))
    (tmp_path / "ssh_config").write_text(case.ssh_config.replace("{known}", f"{server.public_key}"))
    host = _host(servers, server, inventory)

    try:
        openssh_trusted = openssh.OpenSsh(host).run(["true"], timeout=30).rc == 0
    except HostUnreachable as exc:
        assert "host key" in str(exc).lower() or "identification" in str(exc).lower(), exc
        openssh_trusted = False
    try:
        with Remote(host) as remote:
            paramiko_trusted = remote.run(["true"], timeout=30).rc == 0
        reason = ""
    except HostUnreachable as exc:
        paramiko_trusted, reason = False, str(exc)
    assert (openssh_trusted, paramiko_trusted) == (case.trusted, case.trusted)
    assert case.paramiko_says in reason


def test_a_hashed_name_is_trusted_by_both(servers: Servers, control_dir: Path, tmp_path: Path) -> None:
    server = servers.start("gpu")
    inventory = tmp_path / "inventory_known_hosts"
    inventory.write_text(_hashed(tmp_path, server.known_name, server.public_key))
    assert inventory.read_text().startswith("|1|")
    host = _host(servers, server, inventory)
    assert openssh.OpenSsh(host).run(["true"], timeout=30).rc == 0
    with Remote(host) as remote:
        assert remote.run(["true"], timeout=30).rc == 0


def test_a_skipped_line_is_said_once(servers: Servers, control_dir: Path, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    server = servers.start("gpu")
    inventory = tmp_path / "inventory_known_hosts"
    inventory.write_text("garbage\n" + server.known_line())
    host = _host(servers, server, inventory)
    for _ in range(2):
        with Remote(host) as remote:
            assert remote.run(["true"], timeout=30).rc == 0
    err = capsys.readouterr().err
    assert err.count(f"known_hosts: {inventory}:1:") == 1, err
