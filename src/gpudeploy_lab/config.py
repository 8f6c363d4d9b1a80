"""Fixed names, addresses and paths of the lab. Other parts of the project rely on these values."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol

STATE_DIR = Path("/var/lib/gpudeploy-lab")  # ssh key, known_hosts, per-host overlay upper dirs, logs
CACHE_DIR = Path("/var/cache/gpudeploy-lab")  # rootfs tarball + unpacked base, keyed by content
RUN_DIR = Path("/run/gpudeploy-lab")  # per-host mount points and pid files; gone after a reboot
SSH_KEY = STATE_DIR / "id_ed25519"
KNOWN_HOSTS = STATE_DIR / "known_hosts"

BRIDGE = "gdlab0"
BRIDGE_ADDRESS = "10.231.0.1"
PREFIX_LEN = 24
FIRST_HOST_OCTET = 11  # lab1 = 10.231.0.11
MAX_HOSTS = 64  # lab64 = 10.231.0.74; the issue-14 benchmark's fleet (an idle host is ~15 MiB)
# Every host stays in the bridge's /24 (.255 is its broadcast) and its MAC's last byte is the octet.
assert FIRST_HOST_OCTET - 1 + MAX_HOSTS <= 254, "lab host addresses must stay inside 10.231.0.0/24"
# Hosts at once that up() boots (the next starts when one is ready): 64 systemd boots at once on a
# 2-core machine only queue on the CPUs, and a bounded window keeps each boot inside its timeout.
BOOT_WINDOW = 8
# inotify instances per host: systemd (PID 1 and root's user manager), logind and dbus hold ~10 once
# booted, more while booting; the kernel's default limit (fs.inotify.max_user_instances = 128 per
# user, and every host's root is this machine's root) runs out at ~18 hosts booting at once, and
# systemd then fails user@0.service, the ask-password paths and, later, sshd's start.
INOTIFY_INSTANCES_PER_HOST = 32
NET_PREFIX = "gdlab-"  # network namespace and outer veth names: gdlab-lab1

CGROUP_NAME = "gpudeploy-lab"  # each host's nspawn and container live in <root>/gpudeploy-lab/<host>/
_CGROUP_FS = Path("/sys/fs/cgroup")
if (_CGROUP_FS / "cgroup.controllers").exists():  # pure cgroup v2 machine
    CGROUP_ROOTS: tuple[Path, ...] = (_CGROUP_FS / CGROUP_NAME,)
else:  # hybrid: v2 at unified/ (first: it has cgroup.kill), systemd's v1 hierarchy at systemd/
    CGROUP_ROOTS = (_CGROUP_FS / "unified" / CGROUP_NAME, _CGROUP_FS / "systemd" / CGROUP_NAME)

# The stand-in engine reaches the hosts through read-only bind mounts (no network inside).
GUEST_SRC = "/opt/gpudeploy/src"
GUEST_SHIMS = "/opt/gpudeploy/shims"

GPU_COUNT = 8
GPU_MEMORY_BYTES = 96 * 2**30
GPU_NAME = "NVIDIA RTX PRO 6000 Blackwell Server Edition (stand-in)"
DRIVER_VERSION = "580.159.04-standin"


class Machine(Protocol):
    """What host.py needs of a host to build, boot and remove it: a main-lab :class:`Host` or a
    :class:`SlurmHost` (each kind has its own bridge, names, cgroups and folders)."""

    @property
    def name(self) -> str: ...
    @property
    def address(self) -> str: ...
    @property
    def mac(self) -> str: ...
    @property
    def bridge(self) -> str: ...
    @property
    def netns(self) -> str: ...
    @property
    def veth(self) -> str: ...
    @property
    def run_dir(self) -> Path: ...
    @property
    def root(self) -> Path: ...
    @property
    def pid_file(self) -> Path: ...
    @property
    def state_dir(self) -> Path: ...
    @property
    def log_file(self) -> Path: ...
    @property
    def cgroups(self) -> tuple[Path, ...]: ...
    @property
    def cgroup_path(self) -> str: ...


class _HostKind:
    """The names, folders and cgroups of one kind of host, derived from a few values per kind; a
    subclass (``Host`` for lab1..labN, ``SlurmHost`` for the Slurm cluster) gives those values and
    its hosts' ``name`` and ``octet``, so the two kinds never share a name, folder or cgroup."""

    SUBNET: ClassVar[str]  # the bridge's /24 without its last byte: "10.231.0"
    BRIDGE: ClassVar[str]
    NET_PREFIX: ClassVar[str]  # of the netns and the outer veth (an interface name has at most 15 chars)
    RUN_DIR: ClassVar[Path]  # mount points and pid files
    STATE_DIR: ClassVar[Path]  # overlay upper dirs and logs
    CGROUP_NAME: ClassVar[str]  # the hosts' cgroups live in <hierarchy>/<CGROUP_NAME>/<host>/

    if TYPE_CHECKING:  # each subclass's own; a property here would be SlurmHost's dataclass field's default
        @property
        def name(self) -> str: ...
        @property
        def octet(self) -> int: ...  # the address's last byte

    @property
    def address(self) -> str:
        return f"{self.SUBNET}.{self.octet}"

    @property
    def mac(self) -> str:
        """The address's bytes after 02:00, fixed per host, so ARP caches stay right when a host is
        recreated at the same address."""
        return "02:00:" + ":".join(f"{int(byte):02x}" for byte in self.address.split("."))

    @property
    def bridge(self) -> str:
        return self.BRIDGE

    @property
    def netns(self) -> str:
        return self.NET_PREFIX + self.name

    @property
    def veth(self) -> str:
        return self.NET_PREFIX + self.name

    @property
    def run_dir(self) -> Path:
        return self.RUN_DIR / self.name

    @property
    def root(self) -> Path:
        """Where the host's overlay root is mounted on the main machine."""
        return self.run_dir / "root"

    @property
    def pid_file(self) -> Path:
        return self.run_dir / "nspawn.pid"

    @property
    def state_dir(self) -> Path:
        """Overlay upper and work dirs; removed by ``down``."""
        return self.STATE_DIR / "hosts" / self.name

    @property
    def log_file(self) -> Path:
        """nspawn's console output of the latest boot (truncated at each boot)."""
        return self.STATE_DIR / "logs" / f"{self.name}.log"

    @property
    def cgroups(self) -> tuple[Path, ...]:
        """The host's cgroup in each hierarchy; the first is the v2 one."""
        return tuple(root.with_name(self.CGROUP_NAME) / self.name for root in CGROUP_ROOTS)

    @property
    def cgroup_path(self) -> str:
        """The host's v2 cgroup as /proc/PID/cgroup names it: /gpudeploy-lab/lab1."""
        return f"/{self.CGROUP_NAME}/{self.name}"


@dataclass(frozen=True)
class Host(_HostKind):
    """One lab host: ``lab<index>`` at ``10.231.0.<10 + index>``."""

    SUBNET: ClassVar[str] = BRIDGE_ADDRESS.rpartition(".")[0]
    BRIDGE: ClassVar[str] = BRIDGE
    NET_PREFIX: ClassVar[str] = NET_PREFIX
    RUN_DIR: ClassVar[Path] = RUN_DIR
    STATE_DIR: ClassVar[Path] = STATE_DIR
    CGROUP_NAME: ClassVar[str] = CGROUP_NAME

    index: int

    @property
    def name(self) -> str:
        return f"lab{self.index}"

    @property
    def octet(self) -> int:
        return FIRST_HOST_OCTET - 1 + self.index


# Private links (a bastion topology): a veth pair between two hosts' network namespaces, nothing of it
# in the main machine's namespace, on 10.232.<private host's index>.0/24; the main machine routes
# all of 10.232.0.0/16 nowhere ("unreachable"), so a private address answers only from its bastion.
PRIVATE_ROUTE = "10.232.0.0/16"
PRIVATE_BASTION_PREFIX = "gdpb-"  # in the bastion's netns: gdpb-<private host>
PRIVATE_HOST_PREFIX = "gdpp-"  # in the private host's netns: gdpp-<bastion>


@dataclass(frozen=True)
class PrivateLink:
    """``private`` reachable at ``private_address`` only through ``bastion`` (from ``bastion_address``)."""

    bastion: Host
    private: Host

    @property
    def subnet(self) -> str:
        return f"10.232.{self.private.index}.0/24"

    @property
    def bastion_address(self) -> str:
        return f"10.232.{self.private.index}.1"

    @property
    def private_address(self) -> str:
        """e.g. 10.232.3.2 for lab3."""
        return f"10.232.{self.private.index}.2"

    @property
    def private_name(self) -> str:
        """The private address's name in every host's /etc/hosts and in known_hosts: ``lab3-private``."""
        return f"{self.private.name}-private"

    @property
    def bastion_ifname(self) -> str:
        return PRIVATE_BASTION_PREFIX + self.private.name

    @property
    def private_ifname(self) -> str:
        return PRIVATE_HOST_PREFIX + self.bastion.name


# --- the Slurm cluster (slurm.py): hosts of its own beside lab1..labN, on a bridge of its own -----
# Nothing of it shares a name, folder, cgroup or link with the main lab, so either can go up and down
# while the other runs; only ``python -m gpudeploy_lab down`` (CI's cleanup) takes both.
SLURM_BRIDGE = "gdslurm0"
SLURM_BRIDGE_ADDRESS = "10.232.0.1"
# 10.232.0.0/24 lies inside PRIVATE_ROUTE, whose private links use 10.232.<lab index >= 1>.0/24: never .0,
# and the bridge's connected /24 route is more specific than the /16 "unreachable" one.
SLURM_STATE_DIR = STATE_DIR / "slurm"  # per-host overlay upper dirs, logs, the shared folder, the lock
SLURM_RUN_DIR = Path("/run/gpudeploy-slurm")  # per-host mount points and pid files
# the cluster's host keys: a file of its own, since the main lab's up rewrites known_hosts with its hosts only
SLURM_KNOWN_HOSTS = STATE_DIR / "slurm_known_hosts"
SLURM_SHARED_DIR = SLURM_STATE_DIR / "shared"  # every host's /shared (the cluster's "NFS")
SLURM_GUEST_SHARED = "/shared"
SLURM_NET_PREFIX = "gds-"  # netns and outer veth: gds-slurmn1 (an interface name has at most 15 chars)
SLURM_CGROUP_NAME = "gpudeploy-slurm"
SLURM_CLUSTER = "gdlab"
SLURM_PARTITION = "gpu"
SLURM_CONTROLLER = "slurmctl"
SLURM_NODES = ("slurmn1", "slurmn2")
_SLURM_OCTETS = {SLURM_CONTROLLER: 10, **{n: 11 + i for i, n in enumerate(SLURM_NODES)}}


@dataclass(frozen=True)
class SlurmHost(_HostKind):
    """One host of the Slurm cluster: ``slurmctl`` (10.232.0.10) or ``slurmnN`` (10.232.0.1N)."""

    SUBNET: ClassVar[str] = SLURM_BRIDGE_ADDRESS.rpartition(".")[0]
    BRIDGE: ClassVar[str] = SLURM_BRIDGE
    NET_PREFIX: ClassVar[str] = SLURM_NET_PREFIX
    RUN_DIR: ClassVar[Path] = SLURM_RUN_DIR
    STATE_DIR: ClassVar[Path] = SLURM_STATE_DIR
    CGROUP_NAME: ClassVar[str] = SLURM_CGROUP_NAME

    name: str

    @property
    def octet(self) -> int:
        return _SLURM_OCTETS[self.name]

    @property
    def is_controller(self) -> bool:
        return self.name == SLURM_CONTROLLER


def slurm_hosts() -> list[SlurmHost]:
    """slurmctl, slurmn1, slurmn2."""
    return [SlurmHost(n) for n in (SLURM_CONTROLLER, *SLURM_NODES)]


def lab_hosts(count: int) -> list[Host]:
    """lab1 .. lab<count>."""
    if not 1 <= count <= MAX_HOSTS:
        raise ValueError(f"--hosts must be between 1 and {MAX_HOSTS}, not {count}")
    return [Host(i) for i in range(1, count + 1)]


def host_named(name: str) -> Host | None:
    """The Host for ``lab<N>``, or None if ``name`` is not a lab host name."""
    digits = name.removeprefix("lab")
    if name.startswith("lab") and digits.isdigit() and 1 <= int(digits) <= MAX_HOSTS:
        return Host(int(digits))
    return None


def repo_root() -> Path:
    """The checkout whose ``src/`` and ``lab/shims/`` are bind-mounted into the hosts.

    ``GPUDEPLOY_LAB_REPO`` overrides; otherwise the repo this module lives in (src/gpudeploy_lab/).
    """
    override = os.environ.get("GPUDEPLOY_LAB_REPO")
    if override:
        return Path(override).resolve()
    return Path(__file__).resolve().parents[2]
