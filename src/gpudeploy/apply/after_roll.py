"""After a rolling update: the engines it started have printed no fatal line since their start.

A gate ends at ready, and the roll goes on for minutes after an engine's own step. A server can
break while it serves and stay up, answering /health: SGLang 0.5.23's PD prefill whose mooncake
transfer thread died ("Transfer thread failed because of ... is dead", a loaded lab run mid roll)
hangs every request whose KV that thread was to send, and the roll's one smoke generation may well
take another path. So before the roll says the deployment serves, each engine it started is read
once more, from its start to now, for the lines the gate would have stopped on.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import GpudeployError
from ..remote.base import Transport
from ..supervisor.base import Supervisor
from ..verify.causes import Cause, classify, fatal_rule, log_format
from .deploy import UnitOutcome


def broken_since_start(outcomes: list[UnitOutcome],
                       host_of: Callable[[str], tuple[Transport, Supervisor]]) -> list[tuple[UnitOutcome, Cause]]:
    """The started engines (ready at their gate) whose lines since their start hold a fatal line, with
    its cause. ``host_of``: a host's name -> its transport and supervisor. A host that cannot be read
    now is left out: the gate's verdict stands for it."""
    broken = []
    for o in outcomes:
        if not o.ok or o.run is None:
            continue
        remote, supervisor = host_of(o.unit.host.name)
        try:
            lines = supervisor.run_lines(remote, o.run)
        except GpudeployError:
            continue
        fmt = log_format(o.unit.role.log_format)
        if not any(fatal_rule(line, fmt) for line in lines):
            continue
        cause = classify(lines, dict(o.unit.role.settings), exited=False, fmt=fmt)
        if cause is not None:
            broken.append((o, cause))
    return broken
