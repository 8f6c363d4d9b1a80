"""deploy --check: what deploy would do to each unit, with a unified diff of each file it would
change. Nothing is written. An env file on the host may hold secrets (today's, renamed ones, or
values somebody put there by hand): its diff shows only the values of the plan's public keys."""

from __future__ import annotations

import difflib
import hashlib
from typing import Any

from ..fanout import say
from ..model import Unit
from ..plan import envfile
from ..remote.base import Transport
from ..supervisor.base import UnitState


def changed_files(files: dict[str, tuple[bytes, int]], facts: dict[str, Any]) -> list[str]:
    return [p for p, (data, _) in files.items() if facts["files"].get(p) != hashlib.sha256(data).hexdigest()]


def file_diff(u: Unit, path: str, old: str, new: str | None = None) -> str:
    """A unified diff of the host's ``old`` text against what deploy would write (for the env file:
    the planned text, secrets masked)."""
    new = u.files[path] if path == u.env_path or new is None else new
    if path == u.env_path:
        old = envfile.mask(old, set(u.env))
        new = envfile.mask(new, set(u.env))
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                        fromfile=f"{u.host.name}:{path}", tofile=f"planned:{path}"))


def check_unit(remote: Transport, u: Unit, files: dict[str, tuple[bytes, int]], facts: dict[str, Any],
               state: UnitState, healthy: bool) -> str:
    """Print what deploy would do to ``u``; return the action ("unchanged", "would restart", ...)."""
    tag = f"[{u.host.name}/{u.role.name}]"
    changed = changed_files(files, facts)
    for path in changed:
        old = remote.run(["cat", "--", path], check=False).stdout if facts["files"].get(path) else ""
        diff = file_diff(u, path, old, files[path][0].decode())
        say(f"{tag} {'would change' if old else 'would create'} {path}" + (f"\n{diff.rstrip()}" if diff else
                                                                             " (only a secret value differs)"))
    active = state.active
    if not changed and active and healthy:
        action = "unchanged"
    elif active:
        action = "would restart"
    else:
        action = "would start"
    say(f"{tag} {action}")
    return action
