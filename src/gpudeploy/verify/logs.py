"""logs: the journal of the unit's current (or last recorded) invocation, never older runs."""

from __future__ import annotations

import sys

from ..errors import RemoteError
from ..model import Unit
from ..remote.ssh import Remote


def show_logs(unit: Unit, *, follow: bool, lines: int = 500) -> None:
    with Remote(unit.host) as remote:
        facts = remote.probe({"units": [unit.name]})
        uf = facts["units"][unit.name]
        invocation = uf["props"].get("InvocationID") or (uf.get("record") or {}).get("invocation")
        if not invocation:
            raise RemoteError(unit.host.name, f"{unit.name} has never run here")
        argv = ["journalctl", "--no-pager", "-o", "short-iso", "-n", str(lines),
                f"_SYSTEMD_INVOCATION_ID={invocation}"]
        if follow:
            argv.append("-f")
        chan = remote.stream(argv)
        try:
            while True:
                data = chan.recv(65536)
                if not data:
                    break
                sys.stdout.write(data.decode(errors="replace"))
                sys.stdout.flush()
        finally:
            chan.close()
