"""Flags of releases gpudeploy has not captured: the ``--help`` read from a host, kept on this machine.

    $GPUDEPLOY_FLAGS_CACHE (default ~/.cache/gpudeploy/flags)/
        <program>/<digest>.txt             the help text as a host printed it; digest: its sha256
        <program>/<release>.<digest>.json  {"program", "release", "digest", "hosts": {host: when}}

An entry is keyed by release and the digest of its text, and says which host taught it and when
(``hosts``: the first taught it; others that printed the same text are added). So a host whose
engine prints another --help under the same release never replaces what another host taught, and
``plan`` can say where the flags it checks against came from. A help text is kept only with the
release the host's own engine reports (apply/learn.py refuses one whose release it cannot read).

Which entry a unit uses: the one its own host taught; else the release's only one; when hosts
taught different texts of one release, none (deploy then reads that host's own).

Files of the layout before this one (``<program>-<release>-launch_server-help.txt`` directly in the
cache folder, no host recorded) are still read, and shown as taught by an unrecorded host.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from pathlib import Path

from .flagspec import FlagSpec, parse_help
from .versions import same_release, sort_key

ROOT = Path(os.environ.get("GPUDEPLOY_FLAGS_CACHE", Path.home() / ".cache" / "gpudeploy" / "flags"))
MIN_OPTIONS = 5  # fewer: not argparse output (an error message, a stub)
SAFE_RELEASE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+_-]{0,63}")


@dataclass(frozen=True)
class Learned:
    """One help text of one release."""

    program: str
    release: str
    digest: str  # sha256 of the text
    hosts: tuple[tuple[str, str], ...]  # (host, when: ISO 8601 UTC); the first taught it; () = not recorded
    path: Path  # the help text

    def teacher(self, host: str | None = None) -> tuple[str, str] | None:
        """(host, when) this entry counts as learned from for ``host``: its own, else the first."""
        mine = [h for h in self.hosts if h[0] == host] or list(self.hosts[:1])
        return mine[0] if mine else None

    def describe(self, host: str | None = None) -> str:
        """``flags of sglang 0.5.24 learned from lab2 on 2026-12-01 10:43 UTC`` (this host's own first)."""
        mine = [t] if (t := self.teacher(host)) else []
        if not mine:
            return (f"flags of {self.program} {self.release} learned from a host that was not recorded "
                    f"(kept by an earlier gpudeploy in {self.path})")
        name, when = mine[0]
        others = [h for h, _ in self.hosts if h != name]
        return (f"flags of {self.program} {self.release} learned from {name} on {_shown(when)}"
                + (f" (the same --help on {', '.join(others)})" if others else "")
                + f"; help text sha256 {self.digest[:12]}")


def _shown(when: str) -> str:
    try:
        return datetime.fromisoformat(when).astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
    except ValueError:
        return when


def digest_of(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def entries(program: str) -> list[Learned]:
    """Every kept help text of ``program``, oldest release first. A text whose digest is not its
    name (edited or cut short since) is left out."""
    out: list[Learned] = []
    folder = ROOT / program
    for meta in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            doc = json.loads(meta.read_text())
            release, digest = str(doc["release"]), str(doc["digest"])
            text_path = folder / f"{digest}.txt"
            text = text_path.read_text()
            hosts = tuple((str(h), str(w)) for h, w in dict(doc.get("hosts") or {}).items())
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        if meta.name == _meta_name(release, digest) and digest == digest_of(text):
            out.append(Learned(program, release, digest, hosts, text_path))
    out += _legacy(program)
    return sorted(out, key=lambda e: sort_key(e.release))


def _legacy(program: str) -> list[Learned]:
    """The layout before: one file per release, its name holding the release, no host recorded."""
    suffix = "-launch_server-help.txt" if program == "sglang" else "-help.txt"
    out = []
    for path in ROOT.glob(f"{program}-*{suffix}") if ROOT.is_dir() else []:
        release = path.name[len(program) + 1:-len(suffix)]
        try:
            text = path.read_text()
        except OSError:
            continue
        if release:
            out.append(Learned(program, release, digest_of(text), (), path))
    return out


def releases(program: str) -> list[str]:
    return sorted({e.release for e in entries(program)}, key=sort_key)


def of_release(program: str, release: str) -> list[Learned]:
    return [e for e in entries(program) if same_release(e.release, release)]


def for_host(program: str, release: str, host: str | None) -> Learned | None:
    """The help text a unit of ``release`` on ``host`` is checked against (see the module doc)."""
    found = of_release(program, release)
    own = sorted(((when, e) for e in found for h, when in e.hosts if h == host), key=lambda p: p[0])
    if own:
        return own[-1][1]  # what this host printed last
    if len({e.digest for e in found}) == 1:
        return found[0]
    return None


def _meta_name(release: str, digest: str) -> str:
    # The release is in the name for people who look; one that is not a plain file name is hashed.
    safe = release if SAFE_RELEASE.fullmatch(release) else "r" + hashlib.sha256(release.encode()).hexdigest()[:16]
    return f"{safe}.{digest}.json"


def save(program: str, release: str, text: str, host: str) -> Learned:
    """Keep ``text``, the --help of ``release`` as ``host`` printed it; ValueError if it is no
    argparse help. The same text of the same release from another host adds that host."""
    flags = parse_help(text)
    if len(flags) < MIN_OPTIONS:
        raise ValueError(f"the --help of {program} {release} lists {len(flags)} options; it does not look like "
                         "argparse output")
    digest = digest_of(text)
    folder = ROOT / program
    folder.mkdir(parents=True, exist_ok=True)
    meta = folder / _meta_name(release, digest)
    hosts: dict[str, str] = {}
    try:
        hosts = {str(h): str(w) for h, w in dict(json.loads(meta.read_text()).get("hosts") or {}).items()}
    except (OSError, ValueError, AttributeError, TypeError):
        hosts = {}
    hosts[host] = datetime.now(UTC).isoformat(timespec="seconds")
    _write(folder / f"{digest}.txt", text)  # the text first: an entry is its .json
    _write(meta, json.dumps({"program": program, "release": release, "digest": digest, "hosts": hosts},
                            indent=1) + "\n")
    flags_of.cache_clear()
    return Learned(program, release, digest, tuple(hosts.items()), folder / f"{digest}.txt")


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


@cache
def flags_of(path: Path, digest: str) -> dict[str, FlagSpec]:
    return parse_help(path.read_text())
