"""The Python stacks of a unit's processes, read by py-spy on the host (``py-spy dump --pid P``).

py-spy (a PyPI package; SGLang depends on it, so an SGLang venv has it in its ``bin/``) reads a live
process's interpreter state from outside. It is run with ``--nonblocking``: it never pauses the server
(a stalled server may be a serving one that is only slow), and it works on a stopped one too. Each
process is named by PID and checked against its start time before py-spy is pointed at it; each dump
is bounded in time and size, and all run at once, in one round trip.

Where py-spy is: the role's ``health.py_spy`` (only there, when given), else beside the role's python
(its venv's ``bin/``), else on the host's PATH.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

from ..controlchars import printable
from ..errors import GpudeployError
from ..facts.probe import probe
from ..model import Unit
from ..remote.base import Transport
from ..supervisor.base import Supervisor
from .stall import Stack, Stacks

DUMP_TIMEOUT_S = 10.0  # py-spy per process; they run at once
MAX_PROCESSES = 16  # a TP8 server runs ~11 (a scheduler per rank, tokenizer, detokenizer, launcher)
MAX_CHARS = 6000  # of one process's dump
MAX_LINES = 60  # of one process's dump, as shown

# argv[1]: {"candidates": [path], "path": bool, "procs": [{"pid", "start_ticks"}], "timeout", "max_chars"}
# One JSON line out: {"py_spy": path | null, "looked": [...], "stacks": [{"pid", "text", "error"}]}.
SCRIPT = r"""
import json, os, shutil, subprocess, sys, threading
arg = json.loads(sys.argv[1])
spy = next((c for c in arg["candidates"] if os.path.isfile(c) and os.access(c, os.X_OK)), None)
if spy is None and arg["path"]:
    spy = shutil.which("py-spy")
if spy is None:
    print(json.dumps({"py_spy": None, "looked": arg["candidates"] + (["PATH"] if arg["path"] else [])}))
    sys.exit(0)
def start_ticks(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[19])
out = {}
def dump(p):
    if start_ticks(p["pid"]) != p["start_ticks"]:
        out[p["pid"]] = {"error": "it is gone"}
        return
    try:
        res = subprocess.run([spy, "dump", "--pid", str(p["pid"]), "--nonblocking"], capture_output=True,
                             timeout=arg["timeout"], stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        out[p["pid"]] = {"error": "py-spy gave no answer within %g s" % arg["timeout"]}
        return
    except OSError as exc:
        out[p["pid"]] = {"error": "py-spy could not run: %s" % exc}
        return
    text = res.stdout[:arg["max_chars"]].decode(errors="replace")
    err = "" if res.returncode == 0 else (res.stderr.decode(errors="replace").strip()[-300:]
                                          or "py-spy exited %d" % res.returncode)
    out[p["pid"]] = {"text": text, "error": err}
threads = [threading.Thread(target=dump, args=(p,), daemon=True) for p in arg["procs"]]
for t in threads:
    t.start()
for t in threads:
    t.join(arg["timeout"] + 2)
print(json.dumps({"py_spy": spy, "stacks": [dict(pid=p["pid"], **out.get(p["pid"], {"error": "no answer"}))
                                             for p in arg["procs"]]}))
"""


def candidates(unit: Unit) -> tuple[list[str], bool]:
    """Where to look for py-spy on the unit's host: paths in order, and whether PATH may be used."""
    if unit.role.health.py_spy:
        return [unit.role.health.py_spy], False
    python = unit.role.python or unit.host.python
    return ([posixpath.join(posixpath.dirname(python), "py-spy")] if python.startswith("/") else []), True


def python_stacks(remote: Transport, supervisor: Supervisor, unit: Unit) -> Stacks:
    """The stacks of every process of ``unit`` now; never raises (a note says what went wrong)."""
    try:
        procs = supervisor.states(probe(remote, {"units": [unit.name], "journal_lines": 1}))[unit.name].procs
    except (GpudeployError, KeyError) as exc:
        return Stacks(note=f"no stacks: the unit's processes could not be read ({exc})")
    return dump(remote, unit, procs)


def dump(remote: Transport, unit: Unit, procs: list[dict[str, Any]]) -> Stacks:
    if not procs:
        return Stacks(note="no stacks: the unit has no process left")
    shown = sorted(procs, key=lambda p: int(p["pid"]))[:MAX_PROCESSES]
    paths, use_path = candidates(unit)
    arg = {"candidates": paths, "path": use_path, "timeout": DUMP_TIMEOUT_S, "max_chars": MAX_CHARS,
           "procs": [{"pid": int(p["pid"]), "start_ticks": int(p["start_ticks"])} for p in shown]}
    try:
        res = remote.run([unit.host.python or "python3", "-c", SCRIPT, json.dumps(arg)],
                         timeout=DUMP_TIMEOUT_S + 20, check=False)
        doc = json.loads(res.stdout.strip().splitlines()[-1])
    except (GpudeployError, ValueError, IndexError) as exc:
        return Stacks(note=f"no stacks: py-spy could not be run there ({exc})")
    return parse(doc, shown, len(procs), unit.role.health.py_spy)


def parse(doc: dict[str, Any], shown: list[dict[str, Any]], total: int, named: str | None) -> Stacks:
    """The host script's answer -> Stacks (pure)."""
    if not doc.get("py_spy"):
        where = ", ".join(doc.get("looked") or []) or "nowhere"
        hint = ("the role's health.py_spy names it, but it is not there" if named else
                "install it (`pip install py-spy`) beside the engine, or name it in the role: health: {py_spy: PATH}")
        return Stacks(note=f"no Python stacks: no py-spy on the host (looked at {where}); {hint}")
    cmds = {int(p["pid"]): printable(str(p.get("cmd") or "")) for p in shown}
    stacks = []
    for item in doc.get("stacks") or []:
        pid = int(item["pid"])
        text = printable(str(item.get("text") or ""), lines=True)  # the process's own words: its escapes too
        lines = text.splitlines()
        if len(lines) > MAX_LINES:
            text = "\n".join([*lines[:MAX_LINES], f"... {len(lines) - MAX_LINES} more lines"])
        stacks.append(Stack(pid, cmds.get(pid, ""), text, printable(str(item.get("error") or ""))))
    note = f"({total - len(shown)} more processes not dumped)" if total > len(shown) else ""
    return Stacks(tuple(stacks), note)
