"""Supervisors: what starts gpudeploy's servers on a host, names each run and reports on it.

``base.py`` is the interface; ``systemd.py`` runs units under systemd, ``process.py`` on hosts
without it (process groups, pidfiles with start times, a log file per run).
"""

from __future__ import annotations

from typing import Any

from ..model import Host
from .base import Supervisor
from .process import PROCESS
from .systemd import SYSTEMD


def for_host(host: Host, facts: dict[str, Any] | None = None) -> Supervisor:
    """The host's supervisor: the inventory's ``supervisor``, or with ``auto`` systemd when the
    host probe found it running (``facts``) and the process supervisor when it did not."""
    if host.supervisor == "process":
        return PROCESS
    if host.supervisor == "auto" and facts is not None and not facts.get("systemd"):
        return PROCESS
    return SYSTEMD
