"""The unit file of a unit run by the process supervisor (hosts without systemd): a JSON spec.

Pure, so ``invoke plan`` shows it and deploy diffs it like a systemd unit file. The host side
(``supervisor/process_host.py``) reads it at each start.
"""

from __future__ import annotations

import json

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


def spec_text(unit: Unit, kind: str) -> str:
    spec = {"unit": unit.name, "deployment": unit.deployment, "role": unit.role.name, "kind": kind,
            "argv": list(unit.argv), "env_file": unit.env_path, "working_directory": unit.state_dir,
            "state_directory": unit.state_dir.split("/var/lib/", 1)[-1],
            "stop_timeout_s": unit.role.stop_timeout_s, "cpus": cpu_list(unit.cpus) if unit.cpus else None,
            "limits": {"RLIMIT_MEMLOCK": "infinity", "RLIMIT_NOFILE": 1048576}}
    return json.dumps(spec, indent=1, sort_keys=True) + "\n"
