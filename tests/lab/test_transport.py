"""The SSH transport against real sshd: reads, timeouts, and one host-key rule for both clients."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import paramiko
import pytest
from conftest import Lab
from deploytools import KEY, KNOWN_HOSTS
from paramiko.common import MSG_CHANNEL_DATA, MSG_CHANNEL_EOF

from gpudeploy.errors import HostUnreachable, RemoteError
from gpudeploy.facts.probe import probe
from gpudeploy.model import Host, SshConfig, SshHop
from gpudeploy.remote import openssh
from gpudeploy.remote.ssh import Remote
from gpudeploy_lab import control

pytestmark = pytest.mark.lab


def _host(lab: Lab, name: str, known_hosts: str | None = KNOWN_HOSTS) -> Host:
    return Host(name=name, address=lab.address_of(name),
                ssh=SshConfig(user="root", key=KEY, known_hosts=known_hosts, connect_timeout_s=3),
                numa_nodes=(), gpu_memory_gib={}, engine_versions={}, python="/usr/bin/python3",
                bind_address="0.0.0.0", numa_policy="none", env={}, placements=())


def test_much_stderr_does_not_block_the_read_of_stdout(lab: Lab) -> None:
    # stdout was read to its end before stderr: a command that filled the channel window with
    # stderr (2 MiB) before closing stdout waited forever for us to read it.
    with Remote(_host(lab, "lab1")) as remote:
        res = remote.run(["python3", "-c", "import sys; sys.stderr.write('e' * 5_000_000); sys.stderr.flush(); "
                          "print('done')"], timeout=30)
    assert res.rc == 0 and res.stdout == "done\n" and len(res.stderr) == 5_000_000


def test_the_timeout_is_for_the_whole_command(lab: Lab) -> None:
    # It was per read: a command that prints a line every 0.1 s never timed out.
    with Remote(_host(lab, "lab1")) as remote:
        t0 = time.monotonic()
        with pytest.raises(RemoteError, match="did not finish within 1 s"):
            remote.run(["sh", "-c", "while true; do echo tick; sleep 0.1; done"], timeout=1)
        took = time.monotonic() - t0
    assert took < 10, took


def test_a_command_that_exits_at_once_never_costs_the_connection(lab: Lab) -> None:
    # paramiko sent our EOF (and stdin) after letting go of the channel's lock: when the command's
    # exit (sshd's CLOSE) came in between, paramiko's answering CLOSE went first and sshd ended the
    # whole connection, "ieof packet referred to nonexistent channel 2" (a loaded run's deploy lost
    # lab2 that way). Here that gap is held open: each DATA or EOF waits until its channel is closed.
    with Remote(_host(lab, "lab1")) as remote:
        transport = remote.conn.transport
        assert transport is not None
        send = transport._send_user_message

        def late(m: paramiko.Message) -> None:
            raw = m.asbytes()
            if raw[0] in (MSG_CHANNEL_DATA, MSG_CHANNEL_EOF):
                rid = int.from_bytes(raw[1:5], "big")
                chans = [c for c in list(transport._channels.values()) if c.remote_chanid == rid]
                deadline = time.monotonic() + 2
                while chans and not chans[0].closed and time.monotonic() < deadline:
                    time.sleep(0.01)
            send(m)

        transport._send_user_message = late  # type: ignore[method-assign]
        remote.run(["true"], timeout=30)
        res = remote.run(["echo", "still here"], timeout=30)
    assert res.stdout == "still here\n"


def test_status_and_deploy_trust_exactly_the_same_keys(lab: Lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    steps = iter(range(10))

    def status_probe(h: Host) -> dict[str, object]:
        # A fresh control socket each time: a shared connection is not checked again.
        # (short: a unix socket path holds at most 107 bytes)
        monkeypatch.setattr(openssh, "CONTROL_DIR", Path(tempfile.mkdtemp(prefix=f"gd{next(steps)}", dir="/tmp")))
        return probe(openssh.OpenSsh(h), {"units": []})

    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    host = _host(lab, "lab1", known_hosts=str(empty))
    # Known nowhere: both refuse.
    with pytest.raises(HostUnreachable, match="not in known_hosts"):
        Remote(host).open()
    with pytest.raises(HostUnreachable):
        status_probe(host)
    # Known only in the user's own ~/.ssh/known_hosts: both accept.
    (home / ".ssh").mkdir(parents=True)
    shutil.copy(KNOWN_HOSTS, home / ".ssh" / "known_hosts")
    with Remote(host) as remote:
        assert remote.run(["true"]).rc == 0
    assert "units" in status_probe(host)
    # A wrong key in the inventory's file, the right one in the user's: OpenSSH accepts a key
    # that matches in any file, and so does the paramiko transport.
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    kind, b64 = (tmp_path / "other.pub").read_text().split()[:2]
    empty.write_text(f"{lab.address_of('lab1')} {kind} {b64}\n")
    with Remote(host) as remote:
        assert remote.run(["true"]).rc == 0
    assert "units" in status_probe(host)
    # Only the wrong key anywhere: both refuse, paramiko saying the key changed.
    (home / ".ssh" / "known_hosts").unlink()
    with pytest.raises(HostUnreachable, match="does NOT match"):
        Remote(host).open()
    with pytest.raises(HostUnreachable):
        status_probe(host)


# --- every hop checked, one master per way in, OpenSSH's known_hosts rules: against real sshd ------
# (issue 20, items 6, 10, 11; the fake-sshd versions of these are in tests/remote/)

@pytest.fixture
def ssh_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """HOME and ssh_config of the test's own (GPUDEPLOY_SSH_CONFIG: both transports read it), and
    OpenSSH's control sockets in a short folder whose masters are told to exit at the end."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    (tmp_path / "ssh_config").write_text("")
    monkeypatch.setenv("GPUDEPLOY_SSH_CONFIG", str(tmp_path / "ssh_config"))
    control = Path(tempfile.mkdtemp(prefix="gdlt", dir="/tmp"))
    monkeypatch.setattr(openssh, "CONTROL_DIR", control)
    yield tmp_path
    for sock in control.iterdir():
        if sock.is_socket():
            subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x"], capture_output=True,
                           timeout=10, check=False)
    shutil.rmtree(control, ignore_errors=True)  # (a master that exits removes its socket itself)


def _known_hosts_without(tmp_path: Path, *addresses: str) -> Path:
    """The lab's known_hosts without the lines of hosts known by any of ``addresses``."""
    out = tmp_path / f"known_hosts_without_{'_'.join(addresses) or 'none'}"
    lines = Path(KNOWN_HOSTS).read_text().splitlines(keepends=True)
    out.write_text("".join(line for line in lines if not set(line.split()[0].split(",")) & set(addresses)))
    return out


def _behind(lab: Lab, address: str, known_hosts: Path, hop: SshHop | None) -> Host:
    return Host(name="lab3", address=address,
                ssh=SshConfig(user="root", key=KEY, known_hosts=str(known_hosts), connect_timeout_s=5, proxy_jump=hop),
                numa_nodes=(), gpu_memory_gib={}, engine_versions={}, python="/usr/bin/python3",
                bind_address="0.0.0.0", numa_policy="none", env={}, placements=())


def _both(host: Host) -> tuple[str, str]:
    """``hostname`` through status's transport and through deploy's; "refused: ..." where refused."""
    out = []
    for run in (lambda: openssh.OpenSsh(host).run(["hostname"], timeout=30).stdout,
                lambda: _paramiko_hostname(host)):
        try:
            out.append(run().strip())
        except HostUnreachable as exc:
            out.append(f"refused: {exc}")
    return out[0], out[1]


def _paramiko_hostname(host: Host) -> str:
    with Remote(host) as remote:
        return remote.run(["hostname"], timeout=30).stdout


def test_a_bastions_own_jump_host_from_ssh_config_is_checked_by_both(lab: Lab, ssh_env: Path) -> None:
    link = control.add_private_link("lab2", "lab3")
    lab1, lab2 = lab.address_of("lab1"), lab.address_of("lab2")
    # the user's ssh_config reaches the bastion lab2 through lab1, trusting both loosely
    (ssh_env / "ssh_config").write_text(
        f"Host {lab2}\n  ProxyJump root@{lab1}\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n"
        f"Host {lab1}\n  IdentityFile {KEY}\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n")
    without_lab1 = _known_hosts_without(ssh_env, lab1)
    hop = SshHop(lab2, user="root", key=KEY, known_hosts=str(without_lab1), connect_timeout_s=5)
    status, deploy = _both(_behind(lab, link.private_address, without_lab1, hop))
    assert status.startswith("refused") and deploy.startswith("refused"), (status, deploy)
    assert lab1 in deploy and "not in known_hosts" in deploy
    hop = SshHop(lab2, user="root", key=KEY, known_hosts=KNOWN_HOSTS, connect_timeout_s=5)
    assert _both(_behind(lab, link.private_address, Path(KNOWN_HOSTS), hop)) == ("lab3", "lab3")


def test_an_ssh_config_jump_to_a_private_host_is_checked_by_both(lab: Lab, ssh_env: Path) -> None:
    link = control.add_private_link("lab2", "lab3")
    lab2 = lab.address_of("lab2")
    (ssh_env / "ssh_config").write_text(
        f"Host lab3-behind\n  HostName {link.private_address}\n  User root\n  ProxyJump root@{lab2}\n"
        f"Host {lab2}\n  IdentityFile {KEY}\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n")
    without_lab2 = _known_hosts_without(ssh_env, lab2)
    status, deploy = _both(_behind(lab, "lab3-behind", without_lab2, None))
    assert status.startswith("refused") and deploy.startswith("refused"), (status, deploy)
    assert _both(_behind(lab, "lab3-behind", Path(KNOWN_HOSTS), None)) == ("lab3", "lab3")


def test_status_shares_a_master_only_with_the_same_trust(lab: Lab, ssh_env: Path) -> None:
    link = control.add_private_link("lab2", "lab3")
    lab2 = lab.address_of("lab2")
    hop = SshHop(lab2, user="root", key=KEY, known_hosts=KNOWN_HOSTS, connect_timeout_s=5)
    a = _behind(lab, link.private_address, Path(KNOWN_HOSTS), hop)
    assert openssh.OpenSsh(a).run(["hostname"], timeout=30).stdout.strip() == "lab3"
    # B: the same address and bastion, but its own file says another key for that address
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ssh_env / "other")], check=True)
    wrong = ssh_env / "b_known_hosts"
    wrong.write_text(_known_hosts_without(ssh_env, link.private_address).read_text()
                     + f"{link.private_address} {' '.join((ssh_env / 'other.pub').read_text().split()[:2])}\n")
    b = _behind(lab, link.private_address, wrong, replace(hop, known_hosts=str(wrong)))
    with pytest.raises(HostUnreachable):
        openssh.OpenSsh(b).run(["hostname"], timeout=30)  # within A's ControlPersist: checked, not shared


@pytest.mark.parametrize("case", ["revoked in another file", "a bad line first", "a HostKeyAlias"])
def test_status_and_deploy_read_known_hosts_by_the_same_rules(case: str, lab: Lab, ssh_env: Path) -> None:
    lab1 = lab.address_of("lab1")
    key = next(line.split()[1:3] for line in Path(KNOWN_HOSTS).read_text().splitlines()
               if lab1 in line.split()[0].split(","))
    inventory = ssh_env / "inventory_known_hosts"
    user_file = ssh_env / "home" / ".ssh" / "known_hosts"
    if case == "revoked in another file":
        inventory.write_text(f"@revoked * {' '.join(key)}\n")
        shutil.copy(KNOWN_HOSTS, user_file)
        expected = False
    elif case == "a bad line first":
        inventory.write_text("this is not a known_hosts line\n" + Path(KNOWN_HOSTS).read_text())
        expected = True
    else:
        (ssh_env / "ssh_config").write_text(f"Host {lab1}\n  HostKeyAlias lab1-by-alias\n")
        inventory.write_text(f"lab1-by-alias {' '.join(key)}\n")
        expected = True
    status, deploy = _both(_host(lab, "lab1", known_hosts=str(inventory)))
    assert (status == "lab1", deploy == "lab1") == (expected, expected), (status, deploy)
    if case == "revoked in another file":
        assert "@revoked" in deploy


def test_a_host_certificate_works_for_status_and_deploy_refuses_it_saying_why(lab: Lab, ssh_env: Path) -> None:
    """sshd presents a host certificate signed by our CA; known_hosts has only the @cert-authority
    line. OpenSSH checks the certificate; paramiko cannot, so deploy refuses and says so."""
    lab1 = lab.address_of("lab1")
    ca = ssh_env / "ca"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ca)], check=True)
    host_pub = ssh_env / "lab1_host.pub"
    host_pub.write_text(lab.ssh("lab1", "cat /etc/ssh/ssh_host_ed25519_key.pub", check=True).stdout)
    subprocess.run(["ssh-keygen", "-q", "-s", str(ca), "-I", "lab1", "-h", "-n", lab1, str(host_pub)], check=True)
    cert = (ssh_env / "lab1_host-cert.pub").read_text()
    certfile = "/etc/ssh/ssh_host_ed25519_key-cert.pub"
    lab.sshd_drop_in("lab1", "gpudeploy-test-hostcert.conf", f"HostCertificate {certfile}\n",
                     files={certfile: cert})
    try:
        inventory = ssh_env / "inventory_known_hosts"
        inventory.write_text(f"@cert-authority {lab1} {' '.join(ca.with_suffix('.pub').read_text().split()[:2])}\n")
        status, deploy = _both(_host(lab, "lab1", known_hosts=str(inventory)))
        assert status == "lab1", status
        assert deploy.startswith("refused") and "@cert-authority" in deploy and "host certificates" in deploy, deploy
    finally:
        lab.sshd_drop_in("lab1", "gpudeploy-test-hostcert.conf", None, files={certfile: ""})
