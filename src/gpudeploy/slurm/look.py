"""One look at a running job: ONE remote command on the login node answers the job's state
(squeue), its running steps (squeue -s), sacct's rows of it (ended steps with their exit) and the
new bytes of each step's output file since the last look. The gate and ``status --watch`` poll
with it: a round is one exec over the connection already open (no new ssh, no command per step),
so a step that died is seen, with its output's last lines, at the next round.

The answer is framed by lines the commands cannot print (``@job``, ``@steps``, ``@sacct``,
``@out N SIZE``); an output's new bytes come base64-encoded on one line, so a server's own output
(any bytes, any line) cannot be taken for a frame.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field

from ..remote.base import Transport
from . import queue

# The most new bytes of one output file per look: a server that writes fast is read over several
# rounds instead of in one huge answer.
CAP = 256 * 1024
TIMEOUT_S = 30.0

# $1 the job id, $2 the cap, then pairs (output file, bytes already read). Every value is an
# argument, never part of the script: nothing of a path reaches the shell as code.
SCRIPT = r"""job=$1; cap=$2; shift 2
echo @job; squeue -h -j "$job" -o '%T|%r|%S|%N' 2>/dev/null
echo @steps; squeue -h -s -j "$job" -o '%i|%j|%N' 2>/dev/null
echo @sacct; sacct -n -P -j "$job" --format=JobID,JobName,State,ExitCode,NodeList 2>/dev/null
i=0
while [ $# -ge 2 ]; do
  size=$(stat -c %s -- "$1" 2>/dev/null || echo -1)
  echo "@out $i $size"
  if [ "$size" -gt "$2" ]; then tail -c "+$(($2 + 1))" -- "$1" | head -c "$cap" | base64 -w0; fi
  echo
  i=$((i + 1)); shift 2
done
"""


def look_argv(job: str, outputs: list[tuple[str, int]], cap: int = CAP) -> list[str]:
    argv = ["bash", "-c", SCRIPT, "gpudeploy-look", job, str(cap)]
    for path, offset in outputs:
        argv += [path, str(offset)]
    return argv


@dataclass(frozen=True)
class Look:
    job: queue.JobState | None  # squeue's line; None once the job left squeue
    running: dict[str, queue.StepRow]  # squeue -s: the running steps by name
    acct: dict[str, queue.StepRow]  # sacct's rows by id (the job's own, J.batch, J.N)
    new: list[bytes | None] = field(default_factory=list)  # per output asked: its new bytes; None: no file

    def ended(self) -> dict[str, queue.StepRow]:
        """sacct's step rows by name (ended ones carry their state and exit code)."""
        return {row.name: row for row in self.acct.values() if "." in row.id}


def parse_look(stdout: str, count: int) -> Look:
    sections: dict[str, list[str]] = {"@job": [], "@steps": [], "@sacct": []}
    new: list[bytes | None] = [None] * count
    current: list[str] | None = None
    pending: tuple[int, int] | None = None  # an @out header: its index and size, its data line next
    for line in stdout.splitlines():
        if pending is not None:
            index, size = pending
            pending = None
            if 0 <= index < count and size >= 0:
                try:
                    new[index] = base64.b64decode(line.strip(), validate=True)
                except (binascii.Error, ValueError):
                    new[index] = b""
            continue
        if line in sections:
            current = sections[line]
        elif line.startswith("@out "):
            parts = line.split()
            current = None
            if len(parts) == 3 and parts[1].isdigit() and parts[2].lstrip("-").isdigit():
                pending = (int(parts[1]), int(parts[2]))
        elif current is not None:
            current.append(line)
    return Look(job=queue.parse_job("\n".join(sections["@job"])),
                running=queue.parse_steps("\n".join(sections["@steps"])),
                acct=queue.parse_sacct("\n".join(sections["@sacct"])), new=new)


def look(login: Transport, job: str, outputs: list[tuple[str, int]], cap: int = CAP) -> Look:
    got = login.run(look_argv(job, outputs, cap), check=False, timeout=TIMEOUT_S)
    return parse_look(got.stdout, len(outputs))


@dataclass
class Reader:
    """An output file read by rounds: its complete lines, the bytes taken so far."""

    path: str
    offset: int = 0
    partial_cap: int = CAP

    def take(self, data: bytes | None) -> list[str]:
        """The complete lines of ``data`` (what came after ``offset``); a line still being written is
        read whole at a later round, unless it alone fills a round's cap (then it is taken as is)."""
        if not data:
            return []
        end = data.rfind(b"\n") + 1
        if end == 0 and len(data) >= self.partial_cap:
            end = len(data)
        self.offset += end
        return data[:end].decode("utf-8", "replace").splitlines()
