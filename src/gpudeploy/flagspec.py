"""The real command-line flags of each engine release we support, as data.

Stdlib only: the stand-in engine imports this on lab hosts, where only Debian's python3 exists.
Comparing releases the PEP 440 way needs ``packaging`` (``versions.py``), so that import is made
inside the functions that compare, and without it (a lab host) a release matches only as written.

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
from typing import Any

DATA = Path(__file__).parent / "data"
# The --help of releases gpudeploy has not captured, read from a host, is kept by flagcache.py.

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


def _stem(program: str, version: str) -> str:
    return f"{program}-{version}-launch_server" if program == "sglang" else f"{program}-{version}"


def _files(program: str, version: str) -> tuple[Path, Path]:
    stem = _stem(program, version)
    return DATA / f"{stem}-flags.json", DATA / f"{stem}-help.txt"


def _suffixes(program: str) -> tuple[str, ...]:
    middle = "-launch_server" if program == "sglang" else ""
    return (f"{middle}-flags.json", f"{middle}-help.txt")


def _versions(folder: Path, program: str) -> set[str]:
    """The releases of ``program`` that ``folder`` has files of, as the file names spell them.

    The release is what lies between ``<program>-`` and the known suffix, whatever it holds
    (``0.5.24-cu128``, ``0.5.23+cu128``): a pattern of digits cut those short or missed them.
    """
    found = set()
    for path in folder.glob(f"{program}-*") if folder.is_dir() else []:
        for suffix in _suffixes(program):
            version = path.name[len(program) + 1:-len(suffix)]
            if path.name.endswith(suffix) and version:
                found.add(version)
    return found


def _sort_key(version: str) -> tuple[Any, ...]:
    try:
        from .versions import sort_key  # packaging: the product has it, a lab host's python3 may not
    except ImportError:
        return (tuple(int(x) for x in re.findall(r"\d+", version)), version)
    return sort_key(version)


def _same_release(a: str, b: str) -> bool:
    try:
        from .versions import same_release
    except ImportError:  # a lab host: only captured releases, named exactly
        return a == b
    return same_release(a, b)


def captured_versions(program: str) -> list[str]:
    """Releases whose real --help ships with gpudeploy."""
    return sorted(_versions(DATA, program), key=_sort_key)


supported_versions = captured_versions  # the releases learned from hosts: flagcache.releases


def resolve(program: str, version: str) -> str | None:
    """How the captured files spell the release ``version`` is (PEP 440: ``0.5.23.0`` is ``0.5.23``,
    ``0.5.23+cu128`` is not), or None when none is of it."""
    known = _versions(DATA, program)
    if version in known:
        return version
    same = sorted((v for v in known if _same_release(v, version)), key=_sort_key)
    return same[0] if same else None


@cache
def load_flags(program: str, version: str) -> dict[str, FlagSpec]:
    """Every option string of ``program`` at a captured ``version``; KeyError if we have no capture of it."""
    spelled = resolve(program, version)
    if spelled is None:
        raise KeyError(f"no captured flags for {program} {version}")
    version = spelled
    json_path, help_path = _files(program, version)
    if json_path.exists():
        raw = json.loads(json_path.read_text())["flags"]
        return {
            name: FlagSpec(name, bool(v["takes_value"]), v.get("nargs"),
                           tuple(str(c) for c in v["choices"]) if v.get("choices") else None)
            for name, v in raw.items()
        }
    return parse_help(help_path.read_text())


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
            name = words[0]  # "-h" too: argparse's short aliases are options of their own
            metavar = words[1] if len(words) > 1 else ""
            choices = None
            cm = re.match(r"\{([^}]*)\}", metavar)
            if cm:
                choices = tuple(cm.group(1).split(","))
            nargs: str | int | None = None
            if "..." in metavar:
                nargs = "*" if metavar.startswith("[") else "+"
            elif metavar.startswith("[") and metavar.endswith("]"):
                nargs = "?"  # "--model-checksum [MODEL_CHECKSUM]": the value may be left out
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
