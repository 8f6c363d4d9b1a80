"""Read-only facts through the system's OpenSSH client, with connection sharing.

`invoke status` is run often and must be quick. A fresh paramiko connection per host costs about
0.1-0.15 s plus paramiko's import; OpenSSH's ControlMaster/ControlPersist (what Ansible uses too)
lets the second and later runs reuse one connection per host for a while, so a probe costs one
round trip. A shared connection is never checked again, so it is shared only by commands that
reach the host the same way with the same trust (``controlpath``: a digest of the options, the jump
chain and the known_hosts and ssh_config files; not ``%C``). Host keys are checked by the same rule
and the same files as the paramiko transport (``remote.knownhosts``, the files of
``remote.trust``'s rule); ``~/.ssh/config`` is honoured by OpenSSH itself.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

from ..errors import HostUnreachable, RemoteError
from ..model import Host, SshConfig
from . import controlpath, knownhosts, sshconfig
from .base import Result, command_line

PERSIST_S = 120
CONTROL_DIR = Path(os.environ.get("GPUDEPLOY_SSH_CONTROL_DIR", Path.home() / ".cache" / "gpudeploy" / "ssh"))


def available() -> bool:
    return shutil.which("ssh") is not None


def _hop_options(ssh: SshConfig) -> list[str]:
    """How to reach one hop: login, port, key, timeout and the one trust rule."""
    opts = [*sshconfig.openssh_args(), "-o", "BatchMode=yes", *knownhosts.openssh_options(ssh),
            "-o", f"ConnectTimeout={max(1, round(ssh.connect_timeout_s))}"]
    if ssh.port is not None:
        opts += ["-p", str(ssh.port)]
    if ssh.user is not None:
        opts += ["-l", ssh.user]
    if ssh.key:
        opts += ["-i", ssh.key, "-o", "IdentitiesOnly=yes"]
    return opts


def ssh_argv(host: Host, command: list[str]) -> list[str]:
    opts = [*_hop_options(host.ssh), "-o", "ServerAliveInterval=2", "-o", "ServerAliveCountMax=3"]
    hop = host.ssh.proxy_jump
    if hop is not None:
        # Not -J: options given on the command line would not apply to the jump host (ssh(1)),
        # so its key would be checked against other files. A ProxyCommand ssh gets the same rule.
        jump = SshConfig(user=hop.user, port=hop.port, key=hop.key, known_hosts=hop.known_hosts,
                         connect_timeout_s=hop.connect_timeout_s)
        inner = ["ssh", *_hop_options(jump), "-W", "%h:%p", "--", hop.address]
        opts += ["-o", "ProxyCommand=" + " ".join(shlex.quote(a) for a in inner)]
    opts += _sharing(opts, host)
    # ssh joins its arguments into one remote shell command line: quote every word.
    return ["ssh", *opts, "--", host.address, command_line(command)]


def _sharing(opts: list[str], host: Host) -> list[str]:
    """Share one master per way of reaching the host (``controlpath``), or none where no name fits."""
    files = knownhosts.all_files(host.ssh)
    if host.ssh.proxy_jump is not None:
        files += knownhosts.all_files(SshConfig(known_hosts=host.ssh.proxy_jump.known_hosts))
    path = controlpath.path_for(CONTROL_DIR, [*opts, "--", host.address], [*files, *sshconfig.files()])
    if path is None:
        return ["-o", "ControlMaster=no", "-o", "ControlPath=none"]
    CONTROL_DIR.mkdir(parents=True, exist_ok=True)
    CONTROL_DIR.chmod(0o700)  # the control sockets grant shell access to the hosts
    # ssh expands %-tokens in ControlPath: a literal % in the folder's name is written %%.
    return ["-o", "ControlMaster=auto", "-o", f"ControlPersist={PERSIST_S}",
            "-o", "ControlPath=" + str(path).replace("%", "%%")]


class OpenSsh:
    """Commands through the system's ssh client with a shared connection: ``run`` only, for
    read-only facts. Writes, streams and the gate use the paramiko transport."""

    def __init__(self, host: Host) -> None:
        self.host = host

    def run(self, argv: list[str], *, stdin: bytes | None = None, timeout: float = 30.0,
            check: bool = True) -> Result:
        host = self.host
        try:
            res = subprocess.run(ssh_argv(host, argv), capture_output=True, timeout=timeout,
                                 input=stdin if stdin is not None else b"")
        except subprocess.TimeoutExpired:
            raise HostUnreachable(host.name, f"ssh to {host.address} did not answer within {timeout:g} s") from None
        stderr = res.stderr.decode(errors="replace")
        if res.returncode == 255:
            raise HostUnreachable(host.name, f"ssh to {host.address} failed: {stderr.strip()[-300:]}")
        result = Result(res.returncode, res.stdout.decode(errors="replace"), stderr)
        if check and res.returncode != 0:
            raise RemoteError(host.name, f"`{command_line(argv)[:200]}` failed (exit {res.returncode}): "
                              f"{stderr.strip()[-300:]}")
        return result
