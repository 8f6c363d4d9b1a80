"""One host-key rule for paramiko and OpenSSH: known_hosts files, in order, any match trusts."""

from __future__ import annotations

import socket
from pathlib import Path

import paramiko
import pytest

from gpudeploy.model import SshConfig
from gpudeploy.remote import trust


def _key() -> paramiko.PKey:
    return paramiko.ECDSAKey.generate()


def _write(path: Path, name: str, key: paramiko.PKey) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(f"{name} {key.get_name()} {key.get_base64()}\n")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_inventory_then_user_files_are_searched(tmp_path: Path, home: Path) -> None:
    k = _key()
    inv = tmp_path / "inv_known_hosts"
    inv.write_text("")
    ssh = SshConfig(known_hosts=str(inv))
    assert not trust.check("10.0.0.1", k, trust.all_files(ssh)).trusted
    _write(home / ".ssh" / "known_hosts", "10.0.0.1", k)  # the user's own file counts too
    assert trust.check("10.0.0.1", k, trust.all_files(ssh)).trusted
    assert trust.all_files(ssh)[0] == str(inv)


def test_a_changed_key_is_refused_and_said_so(tmp_path: Path, home: Path) -> None:
    known, presented = _key(), _key()
    inv = tmp_path / "kh"
    _write(inv, "[10.0.0.1]:2222", known)
    files = trust.all_files(SshConfig(known_hosts=str(inv)))
    verdict = trust.check(trust.key_name("10.0.0.1", 2222), presented, files)
    assert not verdict.trusted and "does NOT match" in verdict.reason
    unknown = trust.check("10.0.0.2", presented, files)
    assert not unknown.trusted and "not in known_hosts" in unknown.reason
    assert trust.check("[10.0.0.1]:2222", known, files).trusted


def test_openssh_is_given_exactly_the_same_files(tmp_path: Path, home: Path) -> None:
    ssh = SshConfig(known_hosts=str(tmp_path / "my hosts"))
    opts = trust.openssh_options(ssh)
    user = opts[opts.index("-o", opts.index("CheckHostIP=no")) + 1]
    assert user == f'UserKnownHostsFile="{tmp_path / "my hosts"}" {home}/.ssh/known_hosts {home}/.ssh/known_hosts2'
    assert "StrictHostKeyChecking=yes" in opts
    assert "GlobalKnownHostsFile=" + " ".join(trust.SYSTEM_FILES) in opts


def test_a_known_rsa_key_is_asked_for_under_the_names_paramiko_offers(tmp_path: Path) -> None:
    # known_hosts says ssh-rsa; paramiko (like OpenSSH) offers rsa-sha2-512/256 for it, never ssh-rsa,
    # so asking for "ssh-rsa" first asked for nothing and an RSA-only host was refused as unknown.
    rsa = paramiko.RSAKey.generate(2048)
    kh = tmp_path / "kh"
    _write(kh, "10.0.0.1", rsa)
    preferred = trust.preferred_key_types("10.0.0.1", [str(kh)])
    assert preferred == ["rsa-sha2-512", "rsa-sha2-256"]
    a, b = socket.socketpair()
    with a, b:
        t = trust.transport_factory(preferred)(a)
        assert t.get_security_options().key_types[:2] == ("rsa-sha2-512", "rsa-sha2-256")
