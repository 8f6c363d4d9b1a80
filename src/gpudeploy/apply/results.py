"""The last deploy's outcome per inventory, kept on this machine, so `deploy --only-failed` can
take up exactly the deployments that failed or were left untouched (like Ansible's retry file)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

STATE = Path(os.environ.get("GPUDEPLOY_STATE", Path.home() / ".local" / "state" / "gpudeploy")) / "deploys"


def path_for(inventory: str) -> Path:
    key = hashlib.sha256(str(Path(inventory).resolve()).encode()).hexdigest()[:16]
    return STATE / f"{key}.json"


def save(inventory: str, records: dict[str, Any]) -> Path:
    path = path_for(inventory)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"inventory": str(Path(inventory).resolve()), **records}, indent=1) + "\n")
    tmp.replace(path)
    return path


def not_ready(inventory: str) -> list[str] | None:
    """Deployments the last deploy of this inventory did not make ready (None: no deploy recorded)."""
    try:
        doc = json.loads(path_for(inventory).read_text())
    except (OSError, ValueError):
        return None
    return sorted(d["deployment"] for d in doc.get("deployments", []) if not d.get("ok"))
