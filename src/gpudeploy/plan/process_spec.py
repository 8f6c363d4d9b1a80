"""The unit file of a unit run by the process supervisor (hosts without systemd): a JSON spec.

Pure, so ``invoke plan`` shows it and deploy diffs it like a systemd unit file. The host side
(``supervisor/process_host.py``) reads it at each start.
"""

from __future__ import annotations

import json
from typing import Any

from ..model import Unit

UNITS_DIR = "/etc/gpudeploy/units"


def spec_path(unit_name: str) -> str:
    return f"{UNITS_DIR}/{unit_name}.json"


def cpu_list(text: str) -> list[int]:
    """systemd's CPU list syntax ("0-3,8") -> [0, 1, 2, 3, 8]."""
    out: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b or a) + 1))
    return out


def numa_binding(unit: Unit) -> dict[str, Any] | None:
    """The memory policy systemd would set (NUMAPolicy=/NUMAMask=): the host's policy over the NUMA
    nodes of the unit's GPUs; None when the host binds nothing or the unit has no GPUs."""
    if not unit.gpus or unit.host.numa_policy == "none":
        return None
    return {"policy": unit.host.numa_policy, "nodes": sorted({unit.host.numa_of(g) for g in unit.gpus})}


def spec_text(unit: Unit, kind: str) -> str:
    spec = {"unit": unit.name, "deployment": unit.deployment, "role": unit.role.name, "kind": kind,
            "argv": list(unit.argv), "env_file": unit.env_path, "working_directory": unit.state_dir,
            "state_directory": unit.state_dir.split("/var/lib/", 1)[-1],
            "stop_timeout_s": unit.role.stop_timeout_s, "cpus": cpu_list(unit.cpus) if unit.cpus else None,
            "numa": numa_binding(unit),
            "limits": {"RLIMIT_MEMLOCK": "infinity", "RLIMIT_NOFILE": 1048576}}
    return json.dumps(spec, indent=1, sort_keys=True) + "\n"
