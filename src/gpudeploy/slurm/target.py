"""The ``slurm:`` mapping of an inventory -> ``SlurmTarget``, every problem with file and line::

    slurm:
      login: {address: 10.232.0.10, ssh: {user: root, key: ..., known_hosts: ...}}
      partition: gpu
      account: proj42          # optional
      qos: normal              # optional
      time: "04:00:00"         # the job's time limit: [D-]HH:MM:SS, MM:SS or minutes
      gpus_per_node: 8         # GRES gpu:N on every node of the allocation
      nodes: 2                 # or nodelist: [slurmn1, slurmn2], or constraint: h200
      container_image: ...     # optional: Pyxis/Enroot, --container-image on each step
      output_dir: /shared/gpudeploy   # seen by the login node and every compute node
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from ..inventory import SSH_KEYS, ssh_config
from ..model import Host, Where
from ..yamlsrc import Checker

SLURM_KEYS = {"login", "partition", "account", "qos", "time", "gpus_per_node", "nodes", "nodelist",
              "constraint", "container_image", "output_dir"}
LOGIN_KEYS = {"address", "ssh"}
# Slurm's own words for partitions, accounts, QOS and node names; nothing a shell or sbatch's option
# parser would read as more than one word.
WORD_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
ADDRESS_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,252}")
# sbatch -t: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
TIME_RE = re.compile(r"\d+|\d+:\d{2}|\d+:\d{2}:\d{2}|\d+-\d+|\d+-\d+:\d{2}|\d+-\d+:\d{2}:\d{2}")
# a constraint is Slurm's feature expression: features joined by & | , and brackets
CONSTRAINT_RE = re.compile(r"[A-Za-z0-9_.&|,\[\]()*-]{1,200}")
IMAGE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/#@+-]{0,255}")
DIR_RE = re.compile(r"/[A-Za-z0-9_.+/-]{0,200}")


@dataclass(frozen=True)
class SlurmTarget:
    login: Host  # reached like any host: the same SSH transport and host-key rule
    partition: str
    time: str
    gpus_per_node: int
    output_dir: str
    nodes: int  # the allocation's node count (= len(nodelist) when a list is given); 0: one per slot
    nodelist: tuple[str, ...] = ()
    constraint: str | None = None
    account: str | None = None
    qos: str | None = None
    container_image: str | None = None
    where: dict[str, Where] = field(default_factory=dict)


def _time_check(v: str) -> str | None:
    if not TIME_RE.fullmatch(v):
        return f"time limit {v!r} is not one of sbatch's forms: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM:SS"
    parts = re.split(r"[-:]", v)
    clock = parts[1:] if "-" in v else parts
    if any(int(p) >= 60 for p in clock[-2:] if len(clock) >= 2) or ("-" in v and int(parts[1]) >= 24):
        return f"time limit {v!r}: minutes and seconds are below 60, hours of a D-HH form below 24"
    return None


def _word(what: str) -> Callable[[str], str | None]:
    return lambda v: None if WORD_RE.fullmatch(v) else \
        f"{what} {v!r}: letters, digits, '_', '.' or '-' (at most 64), as Slurm names them"


def slurm_target(top: Checker) -> SlurmTarget:
    """Read ``slurm:`` of the inventory's top mapping ``top``. Its problems are recorded and a bad
    value is left at its default, so the slots can still be checked against the rest."""
    s = top.child("slurm", required=True)
    s.unknown_keys(SLURM_KEYS)
    login_c = s.child("login", required=True)
    login_c.unknown_keys(LOGIN_KEYS)
    address = login_c.get("address", str, required=True, default="",
                          check=lambda v: None if ADDRESS_RE.fullmatch(v) else
                          f"{v!r} is not a host name or address")
    ssh_c = login_c.child("ssh")
    ssh_c.unknown_keys(SSH_KEYS)
    ssh = ssh_config(ssh_c, s.file)
    partition = s.get("partition", str, required=True, default="", check=_word("partition"))
    account = s.get("account", str, check=_word("account"))
    qos = s.get("qos", str, check=_word("qos"))
    time = s.get("time", str, required=True, default="", check=_time_check)
    gpus = s.get("gpus_per_node", int, required=True, default=0,
                 check=lambda v: None if 1 <= v <= 64 else "must be 1-64 (GRES gpu:N per node)")
    nodes = s.get("nodes", int, check=lambda v: None if 1 <= v <= 4096 else "must be >= 1")
    raw_list = s.get("nodelist", list)
    nodelist: list[str] = []
    for name in raw_list or []:
        if not isinstance(name, str) or not WORD_RE.fullmatch(name):
            s.fail(f"node name {name!r}: letters, digits, '_', '.' or '-', as Slurm names nodes", "nodelist")
        elif name in nodelist:
            s.fail(f"node {name} is listed twice", "nodelist")
        else:
            nodelist.append(name)
    constraint = s.get("constraint", str, check=lambda v: None if CONSTRAINT_RE.fullmatch(v) else
                       f"constraint {v!r}: features joined by &, |, commas and brackets, as sbatch -C takes them")
    given = [k for k in ("nodes", "nodelist", "constraint") if s.data.get(k) is not None]
    if not given:
        s.fail("say which nodes: nodes: N, nodelist: [NAME, ...] or constraint: FEATURE", None,
               line=top.where("slurm"))
    if nodes is not None and raw_list is not None and nodes != len(nodelist):
        s.fail(f"nodes: {nodes} but nodelist names {len(nodelist)}; give one of them", "nodes")
    image = s.get("container_image", str, check=lambda v: None if IMAGE_RE.fullmatch(v) else
                  f"container image {v!r}: an image reference or a .sqsh path, no spaces")
    output_dir = s.get("output_dir", str, required=True, default="",
                       check=lambda v: None if DIR_RE.fullmatch(v) and ".." not in v.split("/") else
                       "an absolute folder path (letters, digits, '_', '.', '+', '-', '/') seen by the login "
                       "node and every compute node")
    where = {k: Where(s.file, s.where(k)) for k in s.data}
    login = Host(name="login", address=address, ssh=ssh, numa_nodes=(), gpu_memory_gib={}, engine_versions={},
                 python="/usr/bin/python3", bind_address="0.0.0.0", numa_policy="none", env={},  # noqa: S104
                 placements=(), where=Where(s.file, login_c.line))
    count = nodes if nodes is not None else len(nodelist)
    return SlurmTarget(login=login, partition=partition, time=time, gpus_per_node=gpus,
                       output_dir=output_dir.rstrip("/") or "/", nodes=count, nodelist=tuple(nodelist),
                       constraint=constraint, account=account, qos=qos, container_image=image, where=where)
