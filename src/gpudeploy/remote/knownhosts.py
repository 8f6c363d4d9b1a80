"""Which known_hosts files gpudeploy trusts, and the OpenSSH options that make ``ssh`` trust exactly
those (the rule itself, and its paramiko side, are in ``trust``). No paramiko here: ``invoke status``
reads hosts through OpenSSH and need not import it (~40 ms of every status).
"""

from __future__ import annotations

import os

from ..model import SshConfig
from . import sshconfig

USER_FILES = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
SYSTEM_FILES = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")


def user_files(ssh: SshConfig) -> list[str]:
    """The per-user files, the inventory's first, with ``~`` expanded."""
    files = [ssh.known_hosts] if ssh.known_hosts else []
    return files + [os.path.expanduser(f) for f in USER_FILES]


def all_files(ssh: SshConfig) -> list[str]:
    return user_files(ssh) + list(SYSTEM_FILES)


def key_name(hostname: str, port: int | None) -> str:
    """How known_hosts names a host: ``[host]:port`` unless the port is 22 (as OpenSSH and paramiko do)."""
    return hostname if port in (None, 22) else f"[{hostname}]:{port}"


def openssh_options(ssh: SshConfig) -> list[str]:
    """The same trust for the OpenSSH client: these files only, unknown and changed keys refused.

    On the command line, so ssh_config cannot widen it (the first value wins): no keys from DNS
    (VerifyHostKeyDNS) or from a KnownHostsCommand (OpenSSH >= 8.5; given only where ssh_config
    uses one, so that older clients still run), localhost not exempt, nothing written back."""
    opts = ["-o", "StrictHostKeyChecking=yes", "-o", "CheckHostIP=no",
            "-o", "UserKnownHostsFile=" + " ".join(_quote(f).replace("%", "%%") for f in user_files(ssh)),
            "-o", "GlobalKnownHostsFile=" + " ".join(_quote(f) for f in SYSTEM_FILES),
            "-o", "VerifyHostKeyDNS=no", "-o", "NoHostAuthenticationForLocalhost=no", "-o", "UpdateHostKeys=no"]
    if sshconfig.scan().uses("knownhostscommand"):
        opts += ["-o", "KnownHostsCommand=none"]
    return opts


def _quote(path: str) -> str:
    # ssh_config values are split on whitespace; double quotes keep a path with spaces whole.
    # (UserKnownHostsFile also expands %-tokens: the caller doubles a literal %.)
    return f'"{path}"' if any(c.isspace() for c in path) else path
