"""The SSH transport against real sshd: reads, timeouts, and one host-key rule for both clients."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from conftest import Lab
from deploytools import KEY, KNOWN_HOSTS

from gpudeploy.errors import HostUnreachable, RemoteError
from gpudeploy.facts.probe import probe
from gpudeploy.model import Host, SshConfig
from gpudeploy.remote import openssh
from gpudeploy.remote.ssh import Remote

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
