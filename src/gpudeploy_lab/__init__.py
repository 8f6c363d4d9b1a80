"""The test lab: real hosts (systemd as PID 1, sshd) in systemd-nspawn containers on this machine.

    lab1, lab2, ... at 10.231.0.11, .12, ... on bridge gdlab0 (10.231.0.1/24), one netns each
    ssh root@<address> with /var/lib/gpudeploy-lab/id_ed25519 and .../known_hosts (strict checking)
    each host: /etc/gpudeploy-lab/gpus.json (8 fake GPUs), the repo's src/ and lab/shims/ read-only
    at /opt/gpudeploy/, so ``python3 -m sglang.launch_server`` runs the stand-in engine

Use ``invoke lab.up|lab.down|lab.status`` or ``python -m gpudeploy_lab up|down|status``. Needs root.
This package imports only the standard library (tasks.py adds invoke).
"""

from gpudeploy_lab.config import KNOWN_HOSTS, SSH_KEY, Host, lab_hosts
from gpudeploy_lab.control import HostStatus, down, leftovers, precondition_problem, status, up
from gpudeploy_lab.sshclient import ssh, ssh_argv
from gpudeploy_lab.system import LabError

__all__ = ["KNOWN_HOSTS", "SSH_KEY", "Host", "HostStatus", "LabError", "down", "lab_hosts", "leftovers",
           "precondition_problem", "ssh", "ssh_argv", "status", "up"]
