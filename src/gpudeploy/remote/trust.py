"""One host-key policy for every SSH connection gpudeploy makes, through paramiko or OpenSSH.

A host is trusted when one of its known keys matches the key it presents. Known keys come from,
in this order: the inventory's ``ssh.known_hosts`` file, the user's files (``~/.ssh/known_hosts``,
``~/.ssh/known_hosts2``) and the system's (``/etc/ssh/ssh_known_hosts``, ``..._known_hosts2``),
the files OpenSSH reads by default. An unknown host is refused (never added), and a host whose
known keys of that type all differ from the one it presents is refused as a changed key.

``openssh_options`` gives OpenSSH exactly these files (on the command line, so a
``UserKnownHostsFile``/``StrictHostKeyChecking`` in ``~/.ssh/config`` cannot widen it), and
:class:`KnownHostsPolicy` applies the same rule inside paramiko, so ``status`` (OpenSSH) and
``deploy`` (paramiko) trust exactly the same keys.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko

from .knownhosts import SYSTEM_FILES, USER_FILES, all_files, key_name, openssh_options, user_files

__all__ = ["SYSTEM_FILES", "USER_FILES", "KnownHostsPolicy", "UntrustedHostKey", "Verdict", "all_files", "check",
           "key_name", "openssh_options", "preferred_key_types", "transport_factory", "user_files"]

@dataclass(frozen=True)
class Verdict:
    trusted: bool
    reason: str  # "" when trusted, else why not, for the user


def check(name: str, key: paramiko.PKey, files: Sequence[str]) -> Verdict:
    """Is ``key`` a known key of host ``name`` (as written in known_hosts) in any of ``files``?"""
    same_type = False
    for path in files:
        try:
            known = paramiko.HostKeys(path) if Path(path).is_file() else None
        except (OSError, paramiko.SSHException, ValueError):
            known = None
        entry = known.lookup(name) if known is not None else None
        if not entry:
            continue
        for keytype, candidate in entry.items():
            if candidate == key:
                return Verdict(True, "")
            if keytype == key.get_name():
                same_type = True
    searched = ", ".join(files)
    if same_type:
        return Verdict(False, f"the {key.get_name()} host key of {name} does NOT match the known one ({searched}); "
                              "refusing to connect")
    return Verdict(False, f"{name} is not in known_hosts ({searched}); add its host key first "
                          "(host keys are always checked)")


class UntrustedHostKey(paramiko.SSHException):
    """Raised inside paramiko's handshake; the transport turns it into a HostUnreachable."""


class KnownHostsPolicy(paramiko.MissingHostKeyPolicy):
    """paramiko's hook for keys it has not got loaded: apply :func:`check` over the same files."""

    def __init__(self, files: Sequence[str]) -> None:
        self.files = list(files)

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        verdict = check(hostname, key, self.files)
        if not verdict.trusted:
            raise UntrustedHostKey(verdict.reason)


def preferred_key_types(name: str, files: Sequence[str]) -> list[str]:
    """Key types the files know for ``name``, so the handshake asks for one we can check."""
    out: list[str] = []
    for path in files:
        try:
            entry = paramiko.HostKeys(path).lookup(name) if Path(path).is_file() else None
        except (OSError, paramiko.SSHException, ValueError):
            entry = None
        for keytype in entry or {}:
            if keytype not in out:
                out.append(keytype)
    return out


def transport_factory(preferred: Sequence[str]) -> Callable[..., paramiko.Transport]:
    """paramiko's Transport, asking first for the host-key types the known_hosts files hold.

    paramiko orders key types this way only for keys loaded into the client; gpudeploy loads none
    (the policy checks every file), so it orders them here, as OpenSSH does from known_hosts.
    """

    def make(sock: Any, disabled_algorithms: dict[str, list[str]] | None = None) -> paramiko.Transport:
        t = paramiko.Transport(sock, disabled_algorithms=disabled_algorithms)
        opts = t.get_security_options()
        known = [k for k in preferred if k in opts.key_types]
        opts.key_types = tuple(known + [k for k in opts.key_types if k not in known])
        return t

    return make
