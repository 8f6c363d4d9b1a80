"""A rolling update that failed after it replaced engines puts back what served before.

Each engine's own step fails safe: the old engine keeps serving until its new copy is ready, and a
step that fails leaves the deployment serving (rolling.py). Three failures come later, when the
engines already run their new files: the new router fails its gate, the smoke generation through
the router fails, or an engine started by the roll printed a fatal line since (after_roll.py). The
deployment then does not serve as it did, and no old engine is left to fall back on. As the plain
path does for a failed redeploy (deployment.py ``_restore_previous``), every unit the roll replaced
gets the files it ran from before (read from the host just before the roll overwrote them), then
starts again and is gated: engines first, then the router, which is restarted in any case (its view
of the restarted engines is stale). This costs a restart's downtime; it is said as such.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..fanout import Cancel, say
from ..model import Unit
from .deploy import Options, start_and_gate

if TYPE_CHECKING:
    from .rolling import Roll, Session


def restore(out: Roll, units: list[Unit], sessions: dict[str, Session],
            files: dict[str, dict[str, tuple[bytes, int]]], opts: Options, cancel: Cancel) -> None:
    """Put the roll's replaced units back on their previous files and start them; ``out.restored`` says how."""
    back = [u for u in units if out.previous.get(u.key)]
    if not back:
        return
    routers = [u for u in units if u.role.engine == "sglang_router"]
    say(f"-- {out.deployment}: the roll failed after it replaced {', '.join(u.key for u in back)}; putting back the "
        "files they ran from before (a restart: the deployment is down until they are ready)")
    for wave in ([u for u in back if u not in routers], routers):
        for u in wave:
            if cancel.is_set():
                return
            s = sessions[u.host.name]
            want = out.previous.get(u.key) or files[u.name]  # a router the roll did not change: as it is
            for path, (data, mode) in want.items():
                s.remote.put(path, data, mode)
            s.supervisor.installed(s.remote)
            [o] = start_and_gate(s.remote, s.supervisor, [u], {u.name: want}, s.states, opts, cancel)
            words = "healthy again" if o.ok else \
                f"FAILED again: {o.gate.cause.summary if o.gate and o.gate.cause else o.action}"
            out.restored.append(f"{u.key} ({words})")
