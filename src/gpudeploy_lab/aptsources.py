"""Where the lab's rootfs comes from: this machine's own apt sources, not a baked-in mirror.

mmdebstrap pastes a MIRROR argument that is an existing file into the new tree's sources list, so
the lab builds from whatever apt-get here uses: a local mirror, a snapshot, an artifact registry.
Only entries for the lab's suite (``bookworm``, ``bookworm-updates``, ``bookworm-security``) are
taken; third-party repositories and disabled entries are left out. apt's proxy settings are
passed on as ``--aptopt``, since mmdebstrap's apt does not read this machine's apt.conf.
"""

from __future__ import annotations

import glob
import re
import subprocess
from collections.abc import Mapping

SOURCE_FILES = ("/etc/apt/sources.list", "/etc/apt/sources.list.d/*.list", "/etc/apt/sources.list.d/*.sources")


def _ours(suite: str, lab_suite: str) -> bool:
    return suite == lab_suite or suite.startswith(lab_suite + "-") or suite.startswith(lab_suite + "/")


_ONE_LINE = re.compile(r"deb\s+(?:\[(?P<opts>[^\]]*)\]\s+)?(?P<uri>\S+)\s+(?P<suite>\S+)(?P<comps>(?:\s+\S+)*)\s*")


def _one_line(text: str, lab_suite: str) -> list[str]:
    out = []
    for line in text.splitlines():
        m = _ONE_LINE.fullmatch(line.split("#", 1)[0].strip())
        if m is None or not _ours(m["suite"], lab_suite):
            continue
        stanza = [f"URIs: {m['uri']}", f"Suites: {m['suite']}", f"Components: {m['comps'].strip() or 'main'}"]
        for opt in (m["opts"] or "").split():
            key, _, value = opt.partition("=")
            if key == "signed-by":
                stanza.append(f"Signed-By: {value}")
        out.append("\n".join([*stanza, "Types: deb"]))
    return out


def _deb822(text: str, lab_suite: str) -> list[str]:
    out = []
    for stanza in re.split(r"\n\s*\n", text):
        lines = [ln for ln in stanza.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
        fields = {ln.split(":", 1)[0].strip().lower(): ln.split(":", 1)[1].strip() for ln in lines if ":" in ln}
        if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes").lower() == "no":
            continue
        suites = [s for s in fields.get("suites", "").split() if _ours(s, lab_suite)]
        if not suites:
            continue
        kept = [f"Suites: {' '.join(suites)}" if ln.lower().startswith("suites:") else ln for ln in lines]
        kept = [ln for ln in kept if not ln.lower().startswith("types:")] + ["Types: deb"]
        out.append("\n".join(kept))
    return out


def lab_sources(files: Mapping[str, str], lab_suite: str) -> str:
    """A deb822 sources text with this machine's entries for ``lab_suite`` ("" if it has none).

    ``files`` maps a sources file's path to its text (one-line ``.list`` or deb822 ``.sources``).
    One-line entries are rewritten as deb822 stanzas, so the result is one format.
    """
    stanzas: list[str] = []
    for path, text in files.items():
        stanzas += _deb822(text, lab_suite) if path.endswith(".sources") else _one_line(text, lab_suite)
    return "\n\n".join(stanzas) + ("\n" if stanzas else "")


def machine_sources(lab_suite: str) -> str:
    files: dict[str, str] = {}
    for pattern in SOURCE_FILES:
        for path in sorted(glob.glob(pattern)):
            try:
                with open(path) as f:
                    files[path] = f.read()
            except OSError:
                continue
    return lab_sources(files, lab_suite)


def proxy_options(apt_config_dump: str) -> list[str]:
    """``--aptopt`` arguments for the proxy settings in ``apt-config dump`` output."""
    out = []
    for line in apt_config_dump.splitlines():
        m = re.fullmatch(r'(Acquire::(?:https?|ftp)::Proxy(?:::[^ ]+)?) "(.*)";', line.strip())
        if m:
            out.append(f'--aptopt={m.group(1)} "{m.group(2)}"')
    return out


def machine_proxy_options() -> list[str]:
    try:
        dump = subprocess.run(["apt-config", "dump"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return proxy_options(dump)
