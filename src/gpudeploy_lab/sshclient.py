"""The lab's ssh identity and a plain ``ssh`` client that trusts exactly the lab's host keys."""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

from gpudeploy_lab import config
from gpudeploy_lab.config import Host, PrivateLink
from gpudeploy_lab.system import run, write_file

SSH_FAILED = 255  # ssh's own exit status; any other comes from the remote command


def ensure_key() -> str:
    """Create the lab's client key once; return the public key line for authorized_keys."""
    if not config.SSH_KEY.exists():
        config.STATE_DIR.mkdir(parents=True, exist_ok=True)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpudeploy-lab", "-f", str(config.SSH_KEY)])
    return config.SSH_KEY.with_suffix(".pub").read_text()


def known_host_names(h: Host, links: Sequence[PrivateLink] = ()) -> list[str]:
    """The names a host's key is valid for: name, bridge address, and its private-link addresses."""
    names = [h.name, h.address]
    for lk in links:
        if lk.private == h:
            names += [lk.private_name, lk.private_address]
        if lk.bastion == h:
            names.append(lk.bastion_address)
    return names


def write_known_hosts(keys: Iterable[tuple[Host, str]], links: Sequence[PrivateLink] = ()) -> None:
    """One line per host, valid for its name and addresses: ``lab1,10.231.0.11 ssh-ed25519 AAAA``;
    a host behind a bastion also as ``lab3,10.231.0.13,lab3-private,10.232.3.2 ...``."""
    lines = [f"{','.join(known_host_names(h, links))} ssh-ed25519 {key}"
             for h, key in sorted(keys, key=lambda hk: hk[0].index)]
    write_file(config.KNOWN_HOSTS, "".join(line + "\n" for line in lines))


def _options(connect_timeout: float, known_hosts: Path | None = None) -> list[str]:
    known = known_hosts or config.KNOWN_HOSTS
    return ["-F", "/dev/null", "-i", str(config.SSH_KEY), "-o", "IdentitiesOnly=yes",
            "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={known}",
            "-o", "GlobalKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=yes",
            "-o", f"ConnectTimeout={connect_timeout:g}", "-o", "LogLevel=ERROR"]


def ssh_argv(address: str, command: str, connect_timeout: float = 3, jump: str | None = None,
             known_hosts: Path | None = None) -> list[str]:
    """``ssh`` to ``root@address``; with ``jump`` (a bastion's address) through it, ``ssh -W``, both
    hops with the lab's key and strict checking against the lab's known_hosts (or ``known_hosts``:
    the Slurm cluster's file)."""
    argv = ["ssh", *_options(connect_timeout, known_hosts)]
    if jump is not None:
        hop = ["ssh", *_options(connect_timeout, known_hosts), "-W", "%h:%p", f"root@{jump}"]
        argv += ["-o", "ProxyCommand=" + " ".join(shlex.quote(a) for a in hop)]
    return [*argv, f"root@{address}", command]


def ssh(address: str, command: str, timeout: float = 30, input: str | None = None,
        jump: str | None = None, connect_timeout: float = 3,
        known_hosts: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``command`` on a lab host (through ``jump`` if given); returncode 255: ssh itself failed."""
    try:
        return subprocess.run(ssh_argv(address, command, connect_timeout, jump=jump, known_hosts=known_hosts),
                              input=input, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(exc.cmd, SSH_FAILED, "", f"timed out after {timeout:.0f} s")
