"""The test lab: real hosts (systemd as PID 1, sshd) in systemd-nspawn containers on this machine.

    lab1, lab2, ... at 10.231.0.11, .12, ... on bridge gdlab0 (10.231.0.1/24), one netns each
    ssh root@<address> with /var/lib/gpudeploy-lab/id_ed25519 and .../known_hosts (strict checking)
    each host: /etc/gpudeploy-lab/gpus.json (8 fake GPUs), the repo's src/ and lab/shims/ read-only
    at /opt/gpudeploy/, so ``python3 -m sglang.launch_server`` runs the stand-in engine

    up(3, no_systemd=["lab3"]): lab3 without systemd (sshd under nspawn's stub init, like a rented GPU box)
    set_sglang_release("lab2", "0.5.99", "0.5.10"): a stand-in release gpudeploy has not captured
    remove_nvml("lab2") / restore_nvml("lab2"): a host without an NVIDIA driver, and back

Use ``invoke lab.up|lab.down|lab.status`` or ``python -m gpudeploy_lab up|down|status``. Needs root.
The Slurm cluster beside it (slurm.py: slurmctl 10.232.0.10, slurmn1/slurmn2): ``invoke lab.slurm-up|
lab.slurm-down`` or ``python -m gpudeploy_lab slurm up|down|status``.
This package imports only the standard library (tasks.py adds invoke).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpudeploy_lab.config import KNOWN_HOSTS, SSH_KEY, Host, lab_hosts
    from gpudeploy_lab.control import (
        NO_SYSTEMD,
        HostStatus,
        clear_sglang_release,
        down,
        leftovers,
        precondition_problem,
        remove_nvml,
        restore_nvml,
        set_sglang_release,
        status,
        up,
    )
    from gpudeploy_lab.sshclient import ssh, ssh_argv
    from gpudeploy_lab.system import LabError

__all__ = ["KNOWN_HOSTS", "NO_SYSTEMD", "SSH_KEY", "Host", "HostStatus", "LabError", "clear_sglang_release", "down",
           "lab_hosts", "leftovers", "precondition_problem", "remove_nvml", "restore_nvml", "set_sglang_release",
           "ssh", "ssh_argv", "status", "up"]

# Imported when first used: every stand-in process on a lab host (engine, worker, router, the fake
# NVML that each host probe imports) runs ``gpudeploy_lab.standin``, and importing the lab's own
# control code there cost each of them ~20 ms of the hosts' shared CPU.
_HOME = {"KNOWN_HOSTS": "config", "SSH_KEY": "config", "Host": "config", "lab_hosts": "config",
         "ssh": "sshclient", "ssh_argv": "sshclient", "LabError": "system",
         **{name: "control" for name in ("NO_SYSTEMD", "HostStatus", "clear_sglang_release", "down", "leftovers",
                                         "precondition_problem", "remove_nvml", "restore_nvml", "set_sglang_release",
                                         "status", "up")}}
_MODULES = ("aptsources", "config", "control", "engine", "gpu_standin", "host", "rootfs", "slurm", "slurmfiles",
            "sshclient", "standin", "system", "tasks")


def __getattr__(name: str) -> Any:
    if name in _HOME:
        value = getattr(importlib.import_module(f"gpudeploy_lab.{_HOME[name]}"), name)
    elif name in _MODULES:
        value = importlib.import_module(f"gpudeploy_lab.{name}")
    else:
        raise AttributeError(f"module 'gpudeploy_lab' has no attribute {name!r}")
    globals()[name] = value
    return value
