"""logs: the lines of the unit's current (or last recorded) run, never those of older runs."""

from __future__ import annotations

import sys

from ..errors import RemoteError
from ..facts.probe import probe
from ..model import Unit
from ..remote import connect
from ..supervisor import for_host


def show_logs(unit: Unit, *, follow: bool, lines: int = 500) -> None:
    with connect(unit.host) as remote:
        facts = probe(remote, {"units": [unit.name]})
        supervisor = for_host(unit.host, facts)
        state = supervisor.states(facts)[unit.name]
        run_id = state.run_id or (state.record or {}).get("invocation")
        if not run_id:
            raise RemoteError(unit.host.name, f"{unit.name} has never run here")
        stream = supervisor.logs(remote, unit.name, run_id, lines=lines, follow=follow)
        try:
            while True:
                data = stream.recv(65536)
                if not data:
                    break
                sys.stdout.write(data.decode(errors="replace"))
                sys.stdout.flush()
        finally:
            stream.close()
