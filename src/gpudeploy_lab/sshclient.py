"""The lab's ssh identity and a plain ``ssh`` client that trusts exactly the lab's host keys."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable

from gpudeploy_lab import config
from gpudeploy_lab.config import Host
from gpudeploy_lab.system import run, write_file

SSH_FAILED = 255  # ssh's own exit status; any other comes from the remote command


def ensure_key() -> str:
    """Create the lab's client key once; return the public key line for authorized_keys."""
    if not config.SSH_KEY.exists():
        config.STATE_DIR.mkdir(parents=True, exist_ok=True)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpudeploy-lab", "-f", str(config.SSH_KEY)])
    return config.SSH_KEY.with_suffix(".pub").read_text()


def write_known_hosts(keys: Iterable[tuple[Host, str]]) -> None:
    """One line per host, valid for its name and its address: ``lab1,10.231.0.11 ssh-ed25519 AAAA``."""
    lines = [f"{h.name},{h.address} ssh-ed25519 {key}" for h, key in sorted(keys, key=lambda hk: hk[0].index)]
    write_file(config.KNOWN_HOSTS, "".join(line + "\n" for line in lines))


def ssh_argv(address: str, command: str, connect_timeout: float = 3) -> list[str]:
    return ["ssh", "-F", "/dev/null", "-i", str(config.SSH_KEY), "-o", "IdentitiesOnly=yes",
            "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={config.KNOWN_HOSTS}",
            "-o", "GlobalKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=yes",
            "-o", f"ConnectTimeout={connect_timeout:g}", "-o", "LogLevel=ERROR",
            f"root@{address}", command]


def ssh(address: str, command: str, timeout: float = 30,
        input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``command`` on a lab host; returncode 255 means ssh itself failed."""
    try:
        return subprocess.run(ssh_argv(address, command), input=input, capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(exc.cmd, SSH_FAILED, "", f"timed out after {timeout:.0f} s")
