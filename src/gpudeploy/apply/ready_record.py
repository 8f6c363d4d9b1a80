"""The record of a run that passed its gate, written with the processes it has now, in one round trip.

On a systemd host a shell does it: the unit's processes are its cgroup's (``systemctl show -P
ControlGroup``), each kept with its start time (``/proc/PID/stat`` field 22) so that a later stop or
status selects exactly them. The host probe's Python did the same for ~50 ms of the host's CPU (its
start and imports; the shell takes ~6 ms), and right after a fleet's gates every host runs it at
once: at 64 hosts on the lab's 2 cores that was most of the 2.8 s from the last ``/health`` 200 to
deploy's return (issue 26). The process supervisor's units are found by ancestry and session, which
only its host-side module knows: there the probe writes the record (``remote_probe.write_records``).
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import RemoteError
from ..facts.probe import probe
from ..model import Unit
from ..remote.base import Transport
from ..supervisor.base import Supervisor

# The record comes on stdin as JSON (indent 1) whose last top-level key is "pids": "@PIDS@"; the
# line of that key (one space of indent: no value of the record can start a line so) gets the list.
# Written to a temporary file and renamed, as the probe does: a reader sees the old record or the new.
SCRIPT = r"""set -euf
unit=$1 path=$2
cg=$(systemctl show -P ControlGroup -- "$unit")
procs=
for base in /sys/fs/cgroup /sys/fs/cgroup/unified /sys/fs/cgroup/systemd; do
  if [ -n "$cg" ] && [ -e "$base$cg/cgroup.procs" ]; then procs=$base$cg/cgroup.procs; break; fi
done
list=
if [ -n "$procs" ]; then
  for pid in $(cat -- "$procs"); do
    stat=$(cat -- "/proc/$pid/stat" 2>/dev/null) || continue
    set -- ${stat##*) }
    [ $# -ge 20 ] || continue
    shift 19
    list="$list${list:+, }{\"pid\": $pid, \"start_ticks\": $1}"
  done
fi
dir=${path%/*}
tmp="$dir/.${path##*/}.gpudeploy-tmp"
umask 022
mkdir -p -- "$dir"
sed "s/^ \"pids\": \"@PIDS@\"$/ \"pids\": [$list]/" > "$tmp"
mv -f -- "$tmp" "$path"
printf '[%s]\n' "$list"
"""
PLACEHOLDER = "@PIDS@"


def write_ready(remote: Transport, supervisor: Supervisor, unit: Unit, path: str,
                record: dict[str, Any]) -> list[dict[str, int]]:
    """Write ``record`` at ``path`` on the unit's host with the unit's processes as its "pids";
    return them. RemoteError when it could not be written."""
    if supervisor.name != "systemd":
        facts = probe(remote, {"units": [unit.name], "records": [
            {"unit": unit.name, "supervisor": supervisor.name, "path": path, "record": record}]})
        written = (facts.get("recorded") or {}).get(unit.name) or {"error": "the host probe wrote no record"}
        if "error" in written:
            raise RemoteError(remote.host.name, f"the run record of {unit.name} could not be written: "
                                                f"{written['error']}")
        pids: list[dict[str, int]] = written["pids"]
        return pids
    text = json.dumps({**{k: v for k, v in record.items() if k != "pids"}, "pids": PLACEHOLDER}, indent=1)
    res = remote.run(["sh", "-c", SCRIPT, "sh", unit.name, path], stdin=text.encode(), check=False)
    try:
        found = json.loads(res.stdout)
        assert isinstance(found, list)
        return [{"pid": int(p["pid"]), "start_ticks": int(p["start_ticks"])} for p in found]
    except (ValueError, AssertionError, KeyError, TypeError):
        why = (res.stderr or res.stdout or f"exit {res.rc}").strip().splitlines()
        raise RemoteError(remote.host.name, f"the run record of {unit.name} could not be written: "
                                            f"{why[-1] if why else 'no answer'}") from None
