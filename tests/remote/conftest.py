"""Fixtures of the transport tests: fake sshds on 127.0.0.1 and a short control folder for OpenSSH."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sshd_servers import Servers

from gpudeploy.remote import openssh


@pytest.fixture
def servers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Servers]:
    """Fake sshds; HOME is the test's (no user known_hosts of this machine's), and both transports
    read the test's own ssh_config (empty unless the test writes it)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text("")
    monkeypatch.setenv("GPUDEPLOY_SSH_CONFIG", str(ssh_config))
    s = Servers(tmp_path)
    yield s
    s.stop()


@pytest.fixture
def control_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """OpenSSH's control sockets in a short folder (a socket's name is at most 104 bytes; pytest's
    tmp_path is longer); every master a test started is told to exit at its end."""
    d = Path(tempfile.mkdtemp(prefix="gdcm", dir="/tmp"))
    monkeypatch.setattr(openssh, "CONTROL_DIR", d)
    yield d
    for sock in d.iterdir():
        if sock.is_socket():
            subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x"], capture_output=True,
                           timeout=10, check=False)
    shutil.rmtree(d, ignore_errors=True)  # (a master that exits removes its socket itself)
