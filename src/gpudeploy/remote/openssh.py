"""Read-only facts through the system's OpenSSH client, with connection sharing.

`invoke status` is run often and must be quick. A fresh paramiko connection per host costs about
0.1-0.15 s plus paramiko's import; OpenSSH's ControlMaster/ControlPersist (what Ansible uses too)
lets the second and later runs reuse one connection per host for a while, so a probe costs one
round trip. A shared connection is never checked again, so it is shared only by commands that
reach the host the same way with the same trust (``controlpath``: a digest of the options, the jump
chain and the known_hosts and ssh_config files; not ``%C``). Host keys are checked by the same rule
and the same files as the paramiko transport (``remote.knownhosts``, the files of
``remote.trust``'s rule), on every hop: ssh gives its command-line options only to the host it
dials, so each jump host (``jumps``) is dialled by an ssh of our own, nested as ProxyCommands.
``~/.ssh/config`` is honoured by OpenSSH itself.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import HostUnreachable, RemoteError
from ..model import Host, SshConfig, SshHop
from . import controlpath, jumps, knownhosts, sshconfig
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
        opts += ["-i", ssh.key.replace("%", "%%"), "-o", "IdentitiesOnly=yes"]  # -i expands %-tokens
    return opts


# -W's target in a ProxyCommand, which the ssh that runs the command expands to the host it dials
# (quoted for the shell, as ssh.c writes it for ProxyJump: [...] is a glob pattern).
FORWARD = "'[%h]:%p'"


def _through(hop: SshHop, via: str | None) -> str:
    """The ProxyCommand that reaches the next host through ``hop``, ``hop`` itself reached by the
    ProxyCommand ``via`` (None: dialled directly). ssh expands %-tokens in a ProxyCommand before its
    shell runs it, so every literal % of it is doubled: one level of nesting per hop."""
    words = ["ssh", *_hop_options(SshConfig(user=hop.user, port=hop.port, key=hop.key, known_hosts=hop.known_hosts,
                                            connect_timeout_s=hop.connect_timeout_s)),
             # not the user's own shared connections: a master skips the host-key check
             "-o", "ControlMaster=no", "-o", "ControlPath=none",
             # on the command line, so ssh_config's ProxyJump for this hop is not dialled behind our back
             "-o", "ProxyCommand=" + (via if via is not None else "none")]
    return " ".join([*(shlex.quote(w.replace("%", "%%")) for w in words), "-W", FORWARD, "--",
                     shlex.quote(hop.address.replace("%", "%%"))])


@dataclass(frozen=True)
class Command:
    argv: list[str]
    hops_log: Path | None  # where the jump hosts' ssh write their errors (ControlPersist hides them)


def ssh_argv(host: Host, command: list[str]) -> list[str]:
    """The ssh command line that runs ``command`` on ``host``: every hop on the way dialled with the
    same trust options (``jumps``), and a master shared only with the same way in (``controlpath``).
    Raises HostUnreachable where the way cannot be dialled so (an ssh ProxyCommand, a loop)."""
    return ssh_command(host, command).argv


def ssh_command(host: Host, command: list[str]) -> Command:
    opts = [*_hop_options(host.ssh), "-o", "ServerAliveInterval=2", "-o", "ServerAliveCountMax=3"]
    try:
        way = jumps.route(host, jumps.lookup())
    except jumps.JumpError as exc:
        raise HostUnreachable(host.name, str(exc)) from None
    via = way.relay
    for hop in way.hops:
        via = _through(hop, via)
    files = knownhosts.all_files(host.ssh)
    for hop in way.hops:
        files += [f for f in knownhosts.all_files(SshConfig(known_hosts=hop.known_hosts)) if f not in files]
    proxy = ["-o", f"ProxyCommand={via}"] if way.hops else []
    name = controlpath.name_for([*opts, *proxy, "--", host.address], [*files, *sshconfig.scan().files])
    CONTROL_DIR.mkdir(parents=True, exist_ok=True)
    CONTROL_DIR.chmod(0o700)  # the control sockets grant shell access to the hosts
    hops_log = None
    if way.hops:
        # ssh sends a ProxyCommand's stderr to /dev/null under ControlPersist, so a jump host's
        # refused key would read "Connection closed": its errors go to a file we can quote.
        hops_log = CONTROL_DIR / f"{name}.hops"
        opts += ["-o", f"ProxyCommand={via} 2>" + shlex.quote(str(hops_log).replace("%", "%%"))]
    path = CONTROL_DIR / name
    if controlpath.fits(path):
        # ssh expands %-tokens in ControlPath: a literal % in the folder's name is written %%.
        opts += ["-o", "ControlMaster=auto", "-o", f"ControlPersist={PERSIST_S}",
                 "-o", "ControlPath=" + str(path).replace("%", "%%")]
    else:
        opts += ["-o", "ControlMaster=no", "-o", "ControlPath=none"]
    # ssh joins its arguments into one remote shell command line: quote every word.
    return Command(["ssh", *opts, "--", host.address, command_line(command)], hops_log)


class OpenSsh:
    """Commands through the system's ssh client with a shared connection: ``run`` only, for
    read-only facts. Writes, streams and the gate use the paramiko transport."""

    def __init__(self, host: Host) -> None:
        self.host = host

    def run(self, argv: list[str], *, stdin: bytes | None = None, timeout: float = 30.0,
            check: bool = True) -> Result:
        return self.start(argv).finish(stdin or b"", timeout=timeout, check=check)

    def start(self, argv: list[str]) -> Running:
        """Start ``argv`` on the host now and give it its stdin later (``Running.finish``): the
        connection's handshake goes on while the caller works out what to send (status's head start)."""
        cmd = ssh_command(self.host, argv)
        started = time.time()
        proc = subprocess.Popen(cmd.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        return Running(self.host, argv, cmd, proc, started)


class Running:
    """A command started through ssh that waits for its stdin (``OpenSsh.start``)."""

    def __init__(self, host: Host, argv: list[str], cmd: Command, proc: subprocess.Popen[bytes],
                 started: float) -> None:
        self.host, self.argv, self.cmd, self.proc, self.started = host, argv, cmd, proc, started

    def finish(self, stdin: bytes, *, timeout: float = 30.0, check: bool = True) -> Result:
        """Send ``stdin``, close it, and wait for the command's answer (at most ``timeout`` s)."""
        host = self.host
        try:
            out, err = self.proc.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            self.abandon()
            raise HostUnreachable(host.name, f"ssh to {host.address} did not answer within {timeout:g} s") from None
        stderr = err.decode(errors="replace")
        if self.proc.returncode == 255:
            on_the_way = _tail(self.cmd.hops_log, self.started)
            raise HostUnreachable(host.name, f"ssh to {host.address} failed: {stderr.strip()[-300:]}"
                                  + (f" (on the way, through its jump hosts: {on_the_way})" if on_the_way else ""))
        result = Result(self.proc.returncode, out.decode(errors="replace"), stderr)
        if check and self.proc.returncode != 0:
            raise RemoteError(host.name, f"`{command_line(self.argv)[:200]}` failed (exit {self.proc.returncode}): "
                              f"{stderr.strip()[-300:]}")
        return result

    def abandon(self) -> None:
        """Not needed after all (or it took too long): end our ssh, by its own PID, and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            self.proc.communicate(timeout=5)


def _tail(path: Path | None, since: float) -> str:
    """The last lines a jump host's ssh wrote in this run (not an older one's), as one line."""
    if path is None:
        return ""
    try:
        if path.stat().st_mtime < since - 1:
            return ""
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return " ".join(line.strip() for line in text.strip().splitlines()[-4:])[-400:]
