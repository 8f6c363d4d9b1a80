"""The ``lab`` fixture: real hosts (systemd + sshd) on this machine, for tests marked ``lab``.

Needs root, systemd-nspawn and mmdebstrap; otherwise every lab test is skipped with the reason.
The session always starts on a fresh lab and takes it down at the end. A lab that is already up
cannot be trusted: it may hold units someone deployed (the README's first command leaves prefill,
decode and router running on lab1), and its hosts run the stand-in from whichever checkout booted
them, which need not be this one.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from deploytools import CALIBRATION, DEFAULTS_CACHE, FLAGS_CACHE, Deployments

import gpudeploy_lab as labctl
from gpudeploy_lab import config as labconfig
from gpudeploy_lab import slurm as slurmctl

REPO = Path(__file__).resolve().parents[2]
MIN_HOSTS = 3


@dataclass(frozen=True)
class LabHost:
    name: str
    address: str


@dataclass
class Lab:
    hosts: list[LabHost]
    ssh_key: Path
    known_hosts: Path
    inventory: Path

    def ssh(self, host: LabHost | str, cmd: str, *, input: str | None = None,
            timeout: float = 60, check: bool = False) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` as root on ``host`` (object, name or address) with the system ssh client."""
        address = host.address if isinstance(host, LabHost) else self.address_of(host)
        proc = subprocess.run(labctl.ssh_argv(address, cmd), input=input, capture_output=True,
                              text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise AssertionError(f"ssh {address} {cmd!r} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def address_of(self, name_or_address: str) -> str:
        for h in self.hosts:
            if name_or_address in (h.name, h.address):
                return h.address
        raise KeyError(f"no lab host {name_or_address!r}")

    def sshd_drop_in(self, host: str, name: str, text: str | None, *, files: dict[str, str] | None = None) -> None:
        """Write (or with ``text`` None remove) ``/etc/ssh/sshd_config.d/<name>`` and the extra
        ``files``, reload sshd, and wait until it listens again with them: sshd re-executes itself
        on SIGHUP after `systemctl reload` has returned, and a connection in between is refused."""
        cursor = self.ssh(host, "journalctl -u ssh -n 0 --show-cursor --no-pager", check=True).stdout
        cursor = cursor.strip().rsplit("cursor: ", 1)[-1]
        path = f"/etc/ssh/sshd_config.d/{name}"
        if text is None:
            script = "rm -f " + " ".join(shlex.quote(p) for p in [path, *(files or {})])
        else:
            script = " && ".join(f"printf %s {shlex.quote(body)} > {shlex.quote(p)}"
                                 for p, body in [*(files or {}).items(), (path, text)])
        self.ssh(host, f"{script} && systemctl reload ssh", check=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            res = self.ssh(host, f"journalctl -u ssh --after-cursor {shlex.quote(cursor)} --no-pager "
                                 "| grep -c 'Server listening on 0.0.0.0 port 22'", timeout=10)
            if res.returncode == 0 and res.stdout.strip() not in ("", "0"):
                return
            time.sleep(0.2)  # the poll's pause; the deadline bounds the wait
        raise AssertionError(f"sshd on {host} did not listen again within 30 s of its reload")

    def refresh(self) -> None:
        """Re-read which hosts are up (after a test took the lab down and up again)."""
        self.hosts = up_hosts()


def up_hosts() -> list[LabHost]:
    return [LabHost(st.host.name, st.host.address) for st in labctl.status() if st.up and st.ssh_ok]


def skip_reason() -> str | None:
    problem = labctl.precondition_problem()
    return f"lab tests skipped: {problem}" if problem else None


@pytest.fixture(scope="session")
def lab() -> Iterator[Lab]:
    reason = skip_reason()
    if reason:
        print(reason, file=sys.stderr)
        pytest.skip(reason)
    if labctl.status():
        print("lab: taking down the lab that was up, so tests start on fresh hosts", file=sys.stderr)
    labctl.down()
    try:
        labctl.up(MIN_HOSTS)
    except labctl.LabError:
        labctl.down()
        raise
    the_lab = Lab(hosts=up_hosts(), ssh_key=labctl.SSH_KEY, known_hosts=labctl.KNOWN_HOSTS,
                  inventory=REPO / "lab" / "inventory" / "lab.yml")
    yield the_lab
    labctl.down()


@pytest.fixture(scope="session", autouse=True)
def _test_stores() -> Iterator[None]:
    """The calibration store and the flags cache this run's commands wrote (deploytools: one per run,
    away from the user's own) are removed when the run ends, not left in /tmp run after run."""
    yield
    CALIBRATION.unlink(missing_ok=True)
    shutil.rmtree(FLAGS_CACHE, ignore_errors=True)
    shutil.rmtree(DEFAULTS_CACHE, ignore_errors=True)


@pytest.fixture
def deployments(lab: Lab, tmp_path: Path) -> Iterator[Deployments]:
    """Throwaway inventories, each torn down (with --purge) after the test."""
    d = Deployments(lab, tmp_path)
    yield d
    d.cleanup()


@dataclass(frozen=True)
class SlurmLab:
    """The lab's Slurm cluster (gpudeploy_lab/slurm.py): submit on ``controller``, read job output
    from ``shared`` (this machine's side of every host's ``/shared``)."""

    controller: LabHost
    nodes: list[LabHost]
    shared: Path
    guest_shared: str
    partition: str

    def ssh(self, cmd: str, *, host: str | None = None, input: str | None = None, timeout: float = 30,
            check: bool = False) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` as root on the controller (or the node ``host``), host keys checked against the
        cluster's own known_hosts."""
        address = next(h.address for h in [self.controller, *self.nodes] if h.name == (host or self.controller.name))
        argv = labctl.ssh_argv(address, cmd, known_hosts=labconfig.SLURM_KNOWN_HOSTS)
        proc = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise AssertionError(f"ssh {address} {cmd!r} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc


@pytest.fixture(scope="session")
def slurm_lab() -> Iterator[SlurmLab]:
    """The Slurm cluster, brought up once (replacing one left up) for every Slurm lab test, down at the end."""
    reason = skip_reason()
    if reason:
        print(reason, file=sys.stderr)
        pytest.skip(reason)
    try:
        slurmctl.up()
    except labctl.LabError:
        slurmctl.down()
        raise
    hosts = [LabHost(h.name, h.address) for h in labconfig.slurm_hosts()]
    yield SlurmLab(controller=hosts[0], nodes=hosts[1:], shared=labconfig.SLURM_SHARED_DIR,
                   guest_shared=labconfig.SLURM_GUEST_SHARED, partition=labconfig.SLURM_PARTITION)
    slurmctl.down()


def no_systemd_host(lab: Lab, name: str) -> Iterator[str]:
    """A module fixture's body: host ``name`` booted without systemd (the process supervisor's
    host), taken down after the module."""
    labctl.up(0, no_systemd=[name])
    lab.refresh()
    assert lab.ssh(name, "test -d /run/systemd/system").returncode != 0, f"{name} must have no systemd"
    yield name
    labctl.down([name])
    lab.refresh()
