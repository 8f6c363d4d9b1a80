"""The real command-line flags of each engine release we support, as data.

Stdlib only: the stand-in engine imports this on lab hosts, where only Debian's python3 exists.

Sources, per program and release, in ``gpudeploy/data/``:
  ``<program>-<version>-flags.json``  {"flags": {"--x": {"takes_value", "nargs", "choices"}}}
  ``<program>-<version>-help.txt``    the captured ``--help`` text, parsed when no JSON exists
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

DATA = Path(__file__).parent / "data"

# (program name as used in data file names) -> releases we ship captures of
PROGRAMS = {
    "sglang": "launch_server",
    "sglang_router": "",
}


@dataclass(frozen=True)
class FlagSpec:
    name: str
    takes_value: bool
    nargs: str | int | None
    choices: tuple[str, ...] | None


def _files(program: str, version: str) -> tuple[Path, Path]:
    stem = f"{program}-{version}-launch_server" if program == "sglang" else f"{program}-{version}"
    return DATA / f"{stem}-flags.json", DATA / f"{stem}-help.txt"


def supported_versions(program: str) -> list[str]:
    """Releases of ``program`` that have a captured flag list in the package data."""
    found = set()
    for path in DATA.glob(f"{program}-*"):
        m = re.match(rf"{re.escape(program)}-(\d+(?:\.\d+)+)", path.name)
        if m:
            found.add(m.group(1))
    return sorted(found, key=lambda v: tuple(int(x) for x in v.split(".")))


@cache
def load_flags(program: str, version: str) -> dict[str, FlagSpec]:
    """Every option string of ``program`` at ``version``; KeyError if we have no capture of it."""
    json_path, help_path = _files(program, version)
    if json_path.exists():
        raw = json.loads(json_path.read_text())["flags"]
        return {
            name: FlagSpec(name, bool(v["takes_value"]), v.get("nargs"),
                           tuple(str(c) for c in v["choices"]) if v.get("choices") else None)
            for name, v in raw.items()
        }
    if help_path.exists():
        return parse_help(help_path.read_text())
    raise KeyError(f"no captured flags for {program} {version}")


_OPT_LINE = re.compile(r"^  (-[^ ].*?)(?:  +|$)")


def parse_help(text: str) -> dict[str, FlagSpec]:
    """Parse argparse ``--help`` output: the option lines of the "options:" sections."""
    flags: dict[str, FlagSpec] = {}
    for line in text.splitlines():
        m = _OPT_LINE.match(line)
        if not m:
            continue
        # e.g. "--policy {random,round_robin}, -p {random,round_robin}" or "--prefill PREFILL [PREFILL ...]"
        for part in _split_aliases(m.group(1)):
            words = part.split(" ", 1)
            name = words[0]
            if not name.startswith("--"):
                continue
            metavar = words[1] if len(words) > 1 else ""
            choices = None
            cm = re.match(r"\{([^}]*)\}", metavar)
            if cm:
                choices = tuple(cm.group(1).split(","))
            nargs: str | int | None = None
            if "..." in metavar:
                nargs = "*" if metavar.startswith("[") else "+"
            elif metavar == "":
                nargs = 0
            flags[name] = FlagSpec(name, metavar != "", nargs, choices)
    return flags


def _split_aliases(spec: str) -> list[str]:
    # Split on ", -" but not inside {...} choice lists, which also contain commas.
    out, depth, cur = [], 0, ""
    i = 0
    while i < len(spec):
        ch = spec[i]
        depth += ch == "{"
        depth -= ch == "}"
        if depth == 0 and spec.startswith(", -", i):
            out.append(cur)
            cur = ""
            i += 2
            continue
        cur += ch
        i += 1
    out.append(cur)
    return [p.strip() for p in out if p.strip()]
