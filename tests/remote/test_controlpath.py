"""``invoke status`` shares one OpenSSH master per way of reaching a host, never across two ways.

A command that finds a master at its ControlPath uses it without connecting, so without checking
a host key. ``%C`` (local host, remote host, port, user) let two inventories with the same address
behind different bastions, or with different known_hosts files, share one (issue 20, item 6).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from gpudeploy.model import Host, SshConfig, SshHop
from gpudeploy.remote import controlpath, openssh


@pytest.fixture(autouse=True)
def control_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    # short, like ~/.cache/gpudeploy/ssh: pytest's own tmp_path is too long for a socket's name
    d = Path(tempfile.mkdtemp(prefix="gdcp", dir="/tmp"))
    monkeypatch.setattr(openssh, "CONTROL_DIR", d)
    yield d
    shutil.rmtree(d)


def _host(**ssh: object) -> Host:
    base = SshConfig(user="root", known_hosts="/inv/a_known_hosts")
    return Host(name="n1", address="10.0.0.7", ssh=replace(base, **ssh), numa_nodes=(), gpu_memory_gib={},
                engine_versions={}, python="/usr/bin/python3", bind_address="0.0.0.0", numa_policy="none", env={},
                placements=())


def _control_path(host: Host) -> str:
    argv = openssh.ssh_argv(host, ["true"])
    paths = [a.split("=", 1)[1] for a in argv if a.startswith("ControlPath=")]
    assert len(paths) == 1, argv
    return paths[0]


BASTION_A = SshHop("bastion-a.example", user="root", known_hosts="/inv/a_known_hosts")

# Each case differs from the first host in one thing that changes whom we talk to or what we trust.
DIFFERENT = {
    "another bastion": _host(proxy_jump=BASTION_A, known_hosts="/inv/a_known_hosts"),
    "another known_hosts file": _host(known_hosts="/inv/b_known_hosts"),
    "the bastion's own known_hosts": _host(proxy_jump=replace(BASTION_A, known_hosts="/inv/b_known_hosts")),
    "another bastion login": _host(proxy_jump=replace(BASTION_A, user="ops")),
    "another key": _host(key="/keys/other"),
    "another user": _host(user="ubuntu"),
    "another port": _host(port=2222),
}


@pytest.mark.parametrize("what", sorted(DIFFERENT))
def test_a_different_way_in_never_shares_the_master(what: str) -> None:
    via_b = _host(proxy_jump=SshHop("bastion-b.example", user="root", known_hosts="/inv/a_known_hosts"))
    assert _control_path(DIFFERENT[what]) != _control_path(via_b)


def test_the_same_way_in_shares_one_master_and_its_name_fits_a_unix_socket(control_dir: Path) -> None:
    host = _host(proxy_jump=BASTION_A)
    path = _control_path(host)
    assert path == _control_path(host) and path == _control_path(replace(host, name="other-name"))
    assert Path(path).parent == control_dir
    assert len(path) + controlpath.MUX_TEMP_SUFFIX < controlpath.SUN_PATH_MAX


def test_a_changed_known_hosts_file_gets_a_new_master(tmp_path: Path) -> None:
    # The master skips host-key checks: a key edited out of known_hosts must be checked again now.
    kh = tmp_path / "kh"
    kh.write_text("10.0.0.7 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n")
    host = _host(known_hosts=str(kh))
    before = _control_path(host)
    kh.write_text("")
    assert _control_path(host) != before


def test_a_control_folder_too_long_for_a_socket_shares_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    monkeypatch.setattr(openssh, "CONTROL_DIR", tmp_path / ("d" * 90))
    argv = openssh.ssh_argv(_host(), ["true"])
    assert "ControlMaster=no" in argv and "ControlPath=none" in argv
    assert not any(a.startswith("ControlPersist") for a in argv)


def test_a_percent_in_the_folder_is_not_an_ssh_token(control_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(openssh, "CONTROL_DIR", control_dir / "50%h")
    assert "/50%%h/" in _control_path(_host())
