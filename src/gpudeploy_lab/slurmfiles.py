"""The Slurm cluster's files, as text: slurm.conf, gres.conf, cgroup.conf, slurmdbd.conf and the units.

Pure (no I/O): slurm.py writes them into each host's root before it boots. The settings are the ones
/work/shared/reference/slurm-lab.md measured on this kind of machine (hybrid cgroups, nspawn):

- ``CgroupPlugin=cgroup/v1`` with ``proctrack/linuxproc``, ``task/affinity``, ``jobacct_gather/linux``:
  slurmd 22.05 always initialises a cgroup plugin; autodetect picks v2 and dies on the hybrid mounts,
  and every cgroup-based plugin (proctrack/cgroup, jobacct_gather/cgroup) fails inside the containers.
  So nothing confines a step: no memory or CPU limits, no device isolation.
- GRES ``gpu`` from character devices ``/dev/nvidia0..7`` (made at every boot: /dev is nspawn's tmpfs);
  Slurm only stat()s them, and without a char device it sets no ``CUDA_VISIBLE_DEVICES``.
- slurmdbd + MariaDB on the controller for ``sacct`` (steps, CANCELLED/FAILED); slurmctld must wait
  until slurmdbd listens, or its first start with no state files dies.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpudeploy_lab.config import SLURM_CLUSTER, SLURM_CONTROLLER, SLURM_NODES, SLURM_PARTITION

# The image: the lab's packages plus these (one image for all three hosts; see slurm.py).
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge", "slurmdbd", "mariadb-server")
# Units the packages enable; each host enables its own (enable_links) and nothing else starts.
ROLE_UNITS = ("slurmctld.service", "slurmd.service", "slurmdbd.service", "mariadb.service")
CONTROLLER_UNITS = ("munge.service", "mariadb.service", "slurmdbd.service", "slurmctld.service")
NODE_UNITS = ("munge.service", "fake-nvidia-devs.service", "slurmd.service")

GPU_FILES = "/dev/nvidia[0-7]"
GPUS_PER_NODE = 8
SLURM_UID_NAME = "slurm"
MUNGE_UID_NAME = "munge"


@dataclass(frozen=True)
class NodeShape:
    """What a compute node declares: the machine's own CPUs and memory (nothing is virtualised; every
    node shares them), the CPUs split over two sockets like the stand-in GPUs' two NUMA nodes."""

    cpus: int
    real_memory_mb: int

    @property
    def sockets(self) -> int:
        return 2 if self.cpus >= 2 and self.cpus % 2 == 0 else 1

    @property
    def cores_per_socket(self) -> int:
        return self.cpus // self.sockets


def node_range() -> str:
    """slurmn[1-2]"""
    prefix = SLURM_NODES[0].rstrip("0123456789")
    numbers = [n.removeprefix(prefix) for n in SLURM_NODES]
    return f"{prefix}[{numbers[0]}-{numbers[-1]}]" if len(numbers) > 1 else SLURM_NODES[0]


def slurm_conf(shape: NodeShape) -> str:
    # SlurmdParameters=config_overrides: the declared sockets differ from what slurmd sees (one
    # socket), and without it the nodes go `inval`.
    return f"""\
# gpudeploy lab Slurm cluster (written by gpudeploy_lab/slurm.py at every `slurm up`)
ClusterName={SLURM_CLUSTER}
SlurmctldHost={SLURM_CONTROLLER}
AuthType=auth/munge
CredType=cred/munge
SlurmUser=slurm
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
MpiDefault=none
SwitchType=switch/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
JobAcctGatherType=jobacct_gather/linux
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SchedulerType=sched/backfill
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=300
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost={SLURM_CONTROLLER}
AccountingStorageTRES=gres/gpu
JobCompType=jobcomp/none
MailProg=/bin/true
SlurmdParameters=config_overrides
NodeName={node_range()} CPUs={shape.cpus} Boards=1 SocketsPerBoard={shape.sockets} \
CoresPerSocket={shape.cores_per_socket} ThreadsPerCore=1 RealMemory={shape.real_memory_mb} \
Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN
PartitionName={SLURM_PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


CGROUP_CONF = """\
# cgroup/v1 with no constraint: the only setting under which slurmd starts in these containers
CgroupPlugin=cgroup/v1
ConstrainCores=no
ConstrainDevices=no
ConstrainRAMSpace=no
"""

GRES_CONF = f"""\
AutoDetect=off
Name=gpu File={GPU_FILES}
"""

FAKE_NVIDIA_DEVS = f"""\
[Unit]
Description=gpudeploy lab: /dev/nvidia0..{GPUS_PER_NODE - 1} for Slurm's GRES (char devices, major 195)
Before=slurmd.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'for i in $(seq 0 {GPUS_PER_NODE - 1}); do \\
  [ -e /dev/nvidia$i ] || mknod -m 666 /dev/nvidia$i c 195 $i; done'

[Install]
WantedBy=multi-user.target
"""

SLURMD_AFTER_DEVS = """\
[Unit]
Wants=fake-nvidia-devs.service
After=fake-nvidia-devs.service
"""

ACCT_DB_UNIT = """\
[Unit]
Description=gpudeploy lab: the accounting database's user for slurmdbd
Requires=mariadb.service
After=mariadb.service
Before=slurmdbd.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'exec mysql -u root < /etc/slurm/acct-db.sql'
"""

SLURMDBD_AFTER_DB = """\
[Unit]
Wants=slurm-acct-db.service
After=slurm-acct-db.service
"""

# slurmdbd is Type=simple: it counts as started before port 6819 listens, and slurmctld's first
# start (no state files) with the database not answering dies ("we have no TRES from it").
SLURMCTLD_AFTER_DBD = """\
[Unit]
Wants=slurmdbd.service
After=slurmdbd.service

[Service]
ExecStartPre=/usr/bin/timeout 60 /bin/bash -c 'until (exec 3<>/dev/tcp/localhost/6819) 2>/dev/null; do sleep 0.2; done'
Restart=on-failure
RestartSec=2
"""


def slurmdbd_conf(password: str) -> str:
    return f"""\
AuthType=auth/munge
DbdHost=localhost
SlurmUser=slurm
LogFile=/var/log/slurm/slurmdbd.log
PidFile=/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass={password}
StorageLoc=slurm_acct_db
"""


def acct_db_sql(password: str) -> str:
    """``password`` is hex (slurm.py makes it): nothing in it needs quoting in SQL."""
    if not password.isalnum():
        raise ValueError("the accounting database's password must be alphanumeric")
    return (f"CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '{password}';\n"
            "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';\n")


@dataclass(frozen=True)
class File:
    """A file to write into a host's root: path inside it, text, mode, owner (a user of the image)."""

    path: str
    text: str
    mode: int = 0o644
    owner: str = "root"


def host_files(controller: bool, shape: NodeShape, db_password: str) -> list[File]:
    """Every file the host gets (besides the lab's own: hostname, keys, /etc/hosts, munge.key)."""
    common = [File("etc/slurm/slurm.conf", slurm_conf(shape)), File("etc/slurm/cgroup.conf", CGROUP_CONF),
              File("etc/slurm/gres.conf", GRES_CONF)]
    if controller:
        return [*common,
                File("etc/slurm/slurmdbd.conf", slurmdbd_conf(db_password), 0o600, SLURM_UID_NAME),
                File("etc/slurm/acct-db.sql", acct_db_sql(db_password), 0o600),
                File("etc/systemd/system/slurm-acct-db.service", ACCT_DB_UNIT),
                File("etc/systemd/system/slurmdbd.service.d/gpudeploy-lab.conf", SLURMDBD_AFTER_DB),
                File("etc/systemd/system/slurmctld.service.d/gpudeploy-lab.conf", SLURMCTLD_AFTER_DBD)]
    return [*common,
            File("etc/systemd/system/fake-nvidia-devs.service", FAKE_NVIDIA_DEVS),
            File("etc/systemd/system/slurmd.service.d/gpudeploy-lab.conf", SLURMD_AFTER_DEVS)]


def enabled_units(controller: bool) -> tuple[str, ...]:
    """Units linked into multi-user.target.wants on this host (the image has none of ROLE_UNITS)."""
    return CONTROLLER_UNITS if controller else NODE_UNITS
