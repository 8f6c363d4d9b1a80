"""logs: the lines of the unit's current (or last recorded) run, never those of older runs, each made
printable."""

from __future__ import annotations

import codecs
import sys
from collections.abc import Callable
from typing import TextIO

from ..controlchars import printable
from ..errors import RemoteError
from ..facts.probe import probe
from ..model import Unit
from ..remote import connect
from ..supervisor import for_host

LONGEST_LINE = 65536  # characters of a line without its newline yet that are held back, at most


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
            copy_lines(stream.recv, sys.stdout)
        finally:
            stream.close()


def copy_lines(recv: Callable[[int], bytes], out: TextIO) -> None:
    """The server's lines, each made printable (``controlchars.printable``: its escape sequences
    would drive the terminal), whole: a line or a UTF-8 character cut between two reads waits for
    its rest, so no sequence is split where half of it would pass for text."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending = ""
    while data := recv(65536):
        pending += decoder.decode(data)
        *whole, pending = pending.split("\n")
        if len(pending) > LONGEST_LINE:  # a bar redrawn with \r only, never ended: shown in pieces
            whole, pending = [*whole, pending], ""
        if whole:
            out.write("".join(printable(line) + "\n" for line in whole))
            out.flush()
    pending += decoder.decode(b"", final=True)
    if pending:
        out.write(printable(pending) + "\n")
        out.flush()
