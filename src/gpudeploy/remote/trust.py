"""One host-key policy for every SSH connection gpudeploy makes, through paramiko or OpenSSH.

A host is trusted when one of its known keys matches the key it presents. Known keys come from,
in this order: the inventory's ``ssh.known_hosts`` file, the user's files (``~/.ssh/known_hosts``,
``~/.ssh/known_hosts2``) and the system's (``/etc/ssh/ssh_known_hosts``, ``..._known_hosts2``),
the files OpenSSH reads by default. An unknown host is refused (never added), a host whose known
keys all differ from the one it presents is refused as a changed key, and a key marked
``@revoked`` in any of the files is refused even where another line trusts it.

``openssh_options`` gives OpenSSH exactly these files (on the command line, so a
``UserKnownHostsFile``/``StrictHostKeyChecking`` in ``~/.ssh/config`` cannot widen it), and
:class:`KnownHostsPolicy` applies the same rule inside paramiko, reading the files as OpenSSH does
(``hostfile``: hashed names, ``[host]:port``, patterns, ``@revoked``, a bad line skipped and said
once, never fatal), so ``status`` (OpenSSH) and ``deploy`` (paramiko) trust exactly the same keys.
The one difference: a host known only through ``@cert-authority`` is refused here, saying so
(paramiko does not check host certificates); OpenSSH checks the certificate.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import paramiko

from ..fanout import say
from . import hostfile
from .knownhosts import SYSTEM_FILES, USER_FILES, all_files, key_name, openssh_options, user_files

__all__ = ["SYSTEM_FILES", "USER_FILES", "KnownHostsPolicy", "UntrustedHostKey", "Verdict", "all_files", "check",
           "key_name", "openssh_options", "preferred_key_types", "transport_factory", "user_files"]


@dataclass(frozen=True)
class Verdict:
    trusted: bool
    reason: str  # "" when trusted, else why not, for the user


_said: set[tuple[str, int]] = set()
_said_lock = threading.Lock()


def _say_skipped(bad: Sequence[hostfile.Bad]) -> None:
    """Each unreadable line once per run, on stderr: it is skipped (as OpenSSH does), not fatal."""
    for b in bad:
        with _said_lock:
            if (b.path, b.lineno) in _said:
                continue
            _said.add((b.path, b.lineno))
        say(f"known_hosts: {b}; that line is skipped (as OpenSSH skips it)", err=True)


def check(name: str, key: paramiko.PKey, files: Sequence[str], *, without_port: str | None = None) -> Verdict:
    """Is ``key`` a known key of host ``name`` (as written in known_hosts) in any of ``files``?

    ``without_port``: the host's name without its port, consulted (as OpenSSH does) only when no
    line names ``name`` at all."""
    keytype = key.get_name()
    if keytype.endswith(hostfile.CERT_SUFFIX):
        return Verdict(False, f"{name} presented a host certificate ({keytype}), which gpudeploy's deploy "
                              "transport does not check; add the host's own key to known_hosts")
    entries, bad = hostfile.lookup(name, files)
    _say_skipped(bad)
    decision = hostfile.decide(entries, keytype, key.asbytes())
    if decision.why == "unknown" and without_port:
        retry, bad = hostfile.lookup(without_port, files)
        _say_skipped(bad)
        if hostfile.decide(retry, keytype, key.asbytes()).trusted:
            return Verdict(True, "")
    if decision.trusted:
        return Verdict(True, "")
    searched = ", ".join(files)
    entry = decision.entry
    where = entry.where if entry is not None else ""
    if decision.why == "revoked":
        return Verdict(False, f"the {keytype} host key of {name} is marked @revoked ({where}); refusing to connect")
    if decision.why == "changed" and entry is not None and entry.keytype == keytype:
        return Verdict(False, f"the {keytype} host key of {name} does NOT match the known one ({searched}); "
                              "refusing to connect")
    if decision.why == "changed":
        return Verdict(False, f"{name} presented a {keytype} host key, but known_hosts holds a key of another type "
                              f"for it ({where}); OpenSSH takes that as a changed key: refusing to connect")
    if decision.why == "cert-authority":
        return Verdict(False, f"{name} is known only through a @cert-authority line ({where}); gpudeploy's "
                              "deploy transport (paramiko) does not check host certificates: add the host's "
                              "own key to known_hosts")
    return Verdict(False, f"{name} is not in known_hosts ({searched}); add its host key first "
                          "(host keys are always checked)")


class UntrustedHostKey(paramiko.SSHException):
    """Raised inside paramiko's handshake; the transport turns it into a HostUnreachable."""


class KnownHostsPolicy(paramiko.MissingHostKeyPolicy):
    """paramiko's hook for keys it has not got loaded: apply :func:`check` over the same files.

    ``name`` is how known_hosts names the host (its HostKeyAlias, or ``[host]:port``); paramiko's
    own guess from the address it dialled is used only when there is none."""

    def __init__(self, files: Sequence[str], name: str | None = None, without_port: str | None = None) -> None:
        self.files = list(files)
        self.name = name
        self.without_port = without_port

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        verdict = check(self.name or hostname, key, self.files, without_port=self.without_port)
        if not verdict.trusted:
            raise UntrustedHostKey(verdict.reason)


# OpenSSH asks for rsa-sha2-512/256 signatures of a known ssh-rsa key (and paramiko never offers SHA-1
# ssh-rsa host keys), so a known RSA key is asked for under those names.
_ALGORITHMS = {"ssh-rsa": ("rsa-sha2-512", "rsa-sha2-256")}


def preferred_key_types(name: str, files: Sequence[str]) -> list[str]:
    """Host-key algorithms for the key types the files know for ``name``, so the handshake asks for
    one we can check (as OpenSSH orders them from known_hosts)."""
    entries, _ = hostfile.lookup(name, files)
    out: list[str] = []
    for keytype in hostfile.known_types(entries):
        for alg in _ALGORITHMS.get(keytype, (keytype,)):
            if alg not in out:
                out.append(alg)
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
