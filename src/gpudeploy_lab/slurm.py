"""The lab's Slurm 22.05 cluster: ``slurm up`` / ``slurm down`` / ``slurm status``.

    slurmctl  10.232.0.10  slurmctld + slurmdbd + MariaDB; the login node (sbatch, squeue, sacct, scancel)
    slurmn1   10.232.0.11  slurmd, 8 GPUs as GRES gpu:8 (/dev/nvidia0..7), the machine's CPUs
    slurmn2   10.232.0.12  the same
    bridge gdslurm0 10.232.0.1/24; cluster gdlab, partition gpu (default); /shared on every host is
    /var/lib/gpudeploy-lab/slurm/shared on this machine (the cluster's "NFS": job output goes there)
    ssh root@10.232.0.10 with the lab's key and /var/lib/gpudeploy-lab/slurm_known_hosts

Hosts are built like the main lab's (host.py: netns + veth + overlay root + systemd-nspawn) but share
nothing with lab1..labN: their own bridge, names, cgroups (``gpudeploy-slurm/``), folders, known_hosts
and lock, so either can go up and down while the other runs. They get the same read-only binds as
the main lab's hosts (the repo's src/ and lab/shims/, the engines), so the stand-in SGLang, the real
sglang-router and the real SGLang CPU engine run there as job steps.

One image for all three hosts (``slurmfs-<key>``: the lab's packages + slurm, munge, slurmdbd and
MariaDB; each host enables only its own units): one build of ~25 s instead of two, and the main
lab's image stays as it is (its key, and its ``down``'s removal of other ``rootfs-*`` keys, never
touch this one).
"""

from __future__ import annotations

import fcntl
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gpudeploy_lab import config, control, host, rootfs, slurmfiles
from gpudeploy_lab.config import (
    CACHE_DIR,
    SLURM_BRIDGE,
    SLURM_BRIDGE_ADDRESS,
    SLURM_KNOWN_HOSTS,
    SLURM_NET_PREFIX,
    SLURM_NODES,
    SLURM_RUN_DIR,
    SLURM_SHARED_DIR,
    SLURM_STATE_DIR,
    SlurmHost,
    repo_root,
    slurm_hosts,
)
from gpudeploy_lab.sshclient import SSH_FAILED, ensure_key, ssh
from gpudeploy_lab.system import (
    LabError,
    cgroup_pids,
    link_exists,
    link_names,
    mounts_under,
    netns_names,
    remove_cgroup_tree,
    remove_other_keys,
    write_file,
)

IMAGE_REVISION = 1  # bump when _customize_image changes
IMAGE_PACKAGES = rootfs.PACKAGES + slurmfiles.PACKAGES
SSH_TIMEOUT = 15.0  # one command on the controller (sinfo, sacct); the hosts share 2 cores


# --- the image ------------------------------------------------------------------------------------

def image_dir() -> Path:
    key = rootfs.cache_key(IMAGE_PACKAGES, {"slurm": IMAGE_REVISION, "role_units": slurmfiles.ROLE_UNITS})
    return CACHE_DIR / f"slurmfs-{key}"


def _customize_image(root: Path) -> None:
    """No Slurm or database unit starts by itself (each host links its own), and no munge key is
    shared through the image (each cluster gets its own at ``up``)."""
    for wants in (root / "etc/systemd/system").glob("*.wants"):
        for unit in slurmfiles.ROLE_UNITS:
            (wants / unit).unlink(missing_ok=True)
    (root / "etc/munge/munge.key").unlink(missing_ok=True)


def ensure_image(log: bool = True) -> Path:
    return rootfs.ensure_image(image_dir(), IMAGE_PACKAGES, then=_customize_image, log=log)


# --- per-host files -------------------------------------------------------------------------------

def node_shape() -> slurmfiles.NodeShape:
    """This machine's CPUs and memory, as ``slurmd -C`` would report them inside a host."""
    mem_kib = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal:"))
    return slurmfiles.NodeShape(cpus=os.cpu_count() or 1, real_memory_mb=mem_kib // 1024)


def etc_hosts() -> str:
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += [f"{h.address}\t{h.name}" for h in slurm_hosts()]
    return "\n".join(lines) + "\n"


def _ids(root: Path, user: str) -> tuple[int, int]:
    """uid and gid of ``user`` in the image (not on this machine: the names differ)."""
    for line in (root / "etc/passwd").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == user:
            return int(fields[2]), int(fields[3])
    raise LabError(f"the Slurm image has no user {user!r} in /etc/passwd")


def _unit_source(root: Path, unit: str) -> str:
    for folder in ("etc/systemd/system", "lib/systemd/system"):
        if (root / folder / unit).is_file():
            return f"/{folder}/{unit}"
    raise LabError(f"the Slurm image has no unit {unit}")


def write_slurm_files(h: SlurmHost, shape: slurmfiles.NodeShape, db_password: str, munge_key: bytes) -> None:
    root = h.root
    write_file(root / "etc/hosts", etc_hosts())
    for f in slurmfiles.host_files(h.is_controller, shape, db_password):
        path = root / f.path
        write_file(path, f.text, mode=f.mode)
        os.chown(path, *_ids(root, f.owner))
    key_file = root / "etc/munge/munge.key"
    key_file.parent.mkdir(parents=True, exist_ok=True)
    key_file.unlink(missing_ok=True)
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    with os.fdopen(fd, "wb") as out:
        out.write(munge_key)
    os.chown(key_file, *_ids(root, slurmfiles.MUNGE_UID_NAME))
    wants = root / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    for unit in slurmfiles.enabled_units(h.is_controller):
        link = wants / unit
        link.unlink(missing_ok=True)
        link.symlink_to(_unit_source(root, unit))


def write_known_hosts(hosts: Sequence[SlurmHost]) -> None:
    write_file(SLURM_KNOWN_HOSTS, "".join(f"{h.name},{h.address} ssh-ed25519 {host.host_public_key(h)}\n"
                                          for h in hosts))


# --- discovery, lock ------------------------------------------------------------------------------

def _cgroup_roots() -> tuple[Path, ...]:
    return tuple(root.with_name(config.SLURM_CGROUP_NAME) for root in config.CGROUP_ROOTS)


def traced_hosts() -> list[SlurmHost]:
    """Every cluster host that left a trace here: running, crashed or half torn down."""
    names = {n.removeprefix(SLURM_NET_PREFIX) for n in netns_names(SLURM_NET_PREFIX)}
    names |= {n.removeprefix(SLURM_NET_PREFIX) for n in link_names(SLURM_NET_PREFIX, "veth")}
    for parent in (SLURM_RUN_DIR, SLURM_STATE_DIR / "hosts", *_cgroup_roots()):
        if parent.is_dir():
            names |= {p.name for p in parent.iterdir() if p.is_dir()}
    return [h for h in slurm_hosts() if h.name in names]


def leftovers() -> list[str]:
    """What the cluster (or a crashed one) left on this machine; empty after a complete ``down``."""
    found = [f"network namespace {n}" for n in netns_names(SLURM_NET_PREFIX)]
    found += [f"link {n}" for n in link_names(SLURM_NET_PREFIX)]
    if link_exists(SLURM_BRIDGE):
        found.append(f"bridge {SLURM_BRIDGE}")
    for path in (SLURM_RUN_DIR, SLURM_STATE_DIR):
        found += [f"mount {m}" for m in mounts_under(path)]
    for cgroup in _cgroup_roots():
        if cgroup.exists():
            found.append(f"cgroup {cgroup} (pids: {cgroup_pids(cgroup) or 'none'})")
    for folder in (SLURM_RUN_DIR, SLURM_STATE_DIR / "hosts", SLURM_SHARED_DIR):
        if folder.exists():
            found.append(f"directory {folder}")
    return found


@contextmanager
def _locked() -> Iterator[None]:
    """One cluster command at a time; its own lock, so the main lab's up/down never waits on it."""
    SLURM_STATE_DIR.mkdir(parents=True, exist_ok=True)
    with (SLURM_STATE_DIR / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ctl_ssh(command: str, timeout: float = SSH_TIMEOUT,
            on: SlurmHost | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``command`` as root on the controller (or ``on``), host key checked against the cluster's file."""
    target = on or SlurmHost(config.SLURM_CONTROLLER)
    return ssh(target.address, command, timeout=timeout, known_hosts=SLURM_KNOWN_HOSTS,
               connect_timeout=min(10.0, timeout))


# --- up -------------------------------------------------------------------------------------------

# One poll of the cluster's readiness on the controller: each node's state, and whether sacct answers
# (slurmdbd up, the cluster registered in its database).
READY_PROBE = ("sinfo -h -N -p " + config.SLURM_PARTITION + " -o '%N %t'; "
               "sacct -n -X -P --format=JobID >/dev/null 2>&1 && echo sacct-ok")


SINFO = f"sinfo -N -p {config.SLURM_PARTITION} -o '%N %t %c %G'"  # node, state, CPUs, GRES


@dataclass(frozen=True)
class Readiness:
    nodes: dict[str, str]  # node -> sinfo's compact state (idle, down*, unk*, inval, ...)
    sacct: bool

    @property
    def ready(self) -> bool:
        return self.sacct and all(self.nodes.get(n) == "idle" for n in SLURM_NODES)

    def describe(self) -> str:
        nodes = ", ".join(f"{n} {self.nodes.get(n, 'unknown to sinfo')}" for n in SLURM_NODES)
        return f"{nodes}; sacct {'answers' if self.sacct else 'does not answer'}"


def parse_readiness(stdout: str) -> Readiness:
    nodes: dict[str, str] = {}
    sacct = False
    for line in stdout.splitlines():
        parts = line.split()
        if parts == ["sacct-ok"]:
            sacct = True
        elif len(parts) == 2:
            nodes[parts[0]] = parts[1]
    return Readiness(nodes, sacct)


def up(repo: Path | None = None, timeout: float = 120) -> list[str]:
    """Boot the cluster (replacing one left up) and return once both nodes are ``idle`` in sinfo and
    ``sacct`` answers (within ``timeout`` of the boot); returns sinfo's lines."""
    control.ensure_tools()
    with _locked():
        started = time.monotonic()
        base = ensure_image()
        authorized_key = ensure_key()
        hosts = slurm_hosts()
        left = traced_hosts()
        if left:
            print(f"slurm: replacing the cluster left up ({', '.join(h.name for h in left)})", flush=True)
        control._sweep(left)
        if SLURM_SHARED_DIR.exists():
            shutil.rmtree(SLURM_SHARED_DIR)
        SLURM_SHARED_DIR.mkdir(parents=True)
        SLURM_SHARED_DIR.chmod(0o1777)  # like a scratch NFS: any job user may write there
        control._raise_kernel_limits(len(hosts) + len(control.running_hosts()))
        host.ensure_bridge(SLURM_BRIDGE, SLURM_BRIDGE_ADDRESS)
        shape, password, munge_key = node_shape(), secrets.token_hex(16), secrets.token_bytes(1024)

        def prepare(h: SlurmHost) -> None:
            host.prepare(h, base, authorized_key)
            write_slurm_files(h, shape, password, munge_key)

        control._each(hosts, prepare, workers=len(hosts))
        write_known_hosts(hosts)
        source = repo or repo_root()
        binds = [(SLURM_SHARED_DIR, config.SLURM_GUEST_SHARED)]
        booted = time.monotonic()  # the boot's own deadline: a first image build (minutes) is not part of it
        control._each(hosts, lambda h: host.start(h, source, binds=binds), workers=len(hosts))
        lines = _wait_ready(hosts, booted + timeout)
        print(f"slurm: cluster {config.SLURM_CLUSTER} up in {time.monotonic() - started:.1f} s: "
              f"login node {hosts[0].name} {hosts[0].address}, nodes "
              f"{', '.join(f'{h.name} {h.address}' for h in hosts[1:])}, partition {config.SLURM_PARTITION}, "
              f"gpu:{slurmfiles.GPUS_PER_NODE} and {shape.cpus} CPUs each", flush=True)
        return lines


def _wait_ready(hosts: list[SlurmHost], deadline: float) -> list[str]:
    """Poll the controller until the cluster is ready, then check ssh to every host."""
    ctl = hosts[0]
    seen = "no ssh to the controller yet"
    while True:
        for h in hosts:
            if host.nspawn_pid(h) is None:
                raise LabError(f"{h.name}: systemd-nspawn exited during boot; see {h.log_file}:\n"
                               f"{control._tail(h.log_file)}")
        if control._sshd_answers(ctl.address):
            res = ctl_ssh(READY_PROBE, timeout=max(1.0, min(SSH_TIMEOUT, deadline - time.monotonic())))
            if res.returncode != SSH_FAILED:
                state = parse_readiness(res.stdout)
                if state.ready:
                    break
                seen = state.describe()
        if time.monotonic() > deadline:
            raise LabError(f"the Slurm cluster was not ready before the deadline: {seen}\n{_diagnostics(hosts)}")
        time.sleep(0.2)  # the poll's pause; the deadline bounds the whole
    for h in hosts[1:]:
        res = ctl_ssh("true", timeout=max(1.0, deadline - time.monotonic()), on=h)
        if res.returncode != 0:
            raise LabError(f"{h.name}: no ssh at {h.address}: {res.stderr.strip()}")
    return ctl_ssh(SINFO).stdout.splitlines()


def _diagnostics(hosts: list[SlurmHost]) -> str:
    """The end of each host's Slurm logs (read through its mounted root: no ssh needed)."""
    parts = []
    for h in hosts:
        for log in sorted((h.root / "var/log/slurm").glob("*.log")):
            parts.append(f"--- {h.name}: /var/log/slurm/{log.name}\n{control._tail(log, 8)}")
        parts.append(f"--- {h.name}: console {h.log_file}\n{control._tail(h.log_file, 8)}")
    return "\n".join(parts)


# --- status, down ---------------------------------------------------------------------------------

def status() -> list[str]:
    """One line per host, then sinfo's view from the controller when it answers."""
    lines = []
    ctl_up = False
    for h in slurm_hosts():
        running = host.is_running(h)
        state = "up" if running else "crashed" if cgroup_pids(h.cgroups[0]) else "down"
        ssh_ok = running and ctl_ssh("true", timeout=10, on=h).returncode == 0
        ctl_up = ctl_up or (h.is_controller and ssh_ok)
        role = "controller, slurmdbd, login" if h.is_controller else "compute"
        lines.append(f"{h.name:<9} {state:<7} {h.address:<12} ssh {'ok' if ssh_ok else 'no':<3} {role}")
    if ctl_up:
        res = ctl_ssh(SINFO)
        lines += ["  " + line for line in (res.stdout or res.stderr).splitlines()]
    return lines


def down() -> None:
    """Stop the cluster's hosts and remove everything it left (never the main lab's hosts)."""
    if os.geteuid() != 0:
        raise LabError(control.precondition_problem() or "the lab needs root")
    with _locked():
        started = time.monotonic()
        hosts = traced_hosts()
        control._sweep(hosts)
        host.remove_bridge(SLURM_BRIDGE)
        for cgroup in _cgroup_roots():
            remove_cgroup_tree(cgroup)
        for folder in (SLURM_RUN_DIR, SLURM_STATE_DIR / "hosts", SLURM_SHARED_DIR):
            if folder.exists():
                shutil.rmtree(folder)
        remove_other_keys(CACHE_DIR, "slurmfs-*", image_dir())
        left = leftovers()
        if left:
            raise LabError("slurm down left behind:\n  " + "\n  ".join(left))
        print(f"slurm: {len(hosts)} host(s) down in {time.monotonic() - started:.1f} s", flush=True)

