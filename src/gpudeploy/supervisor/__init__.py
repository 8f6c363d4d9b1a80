"""Supervisors: what starts gpudeploy's servers on a host, names each run and reports on it.

``base.py`` is the interface; ``systemd.py`` the implementation for hosts with systemd.
"""

from __future__ import annotations

from ..model import Host
from .base import Supervisor
from .systemd import SYSTEMD


def for_host(host: Host) -> Supervisor:
    """The supervisor of ``host``'s units (systemd: the only one so far)."""
    return SYSTEMD
