"""What the user's ssh_config says, as OpenSSH reads it, for both transports.

Files: OpenSSH's own (``~/.ssh/config``, with ``~`` the password database's home as ssh takes it,
then ``/etc/ssh/ssh_config``), or the one file named by ``GPUDEPLOY_SSH_CONFIG`` (``ssh -F``: then
neither of those), each with the files its ``Include`` lines name.

Jump hosts (issue 20, item 10): ssh gives the options of its command line to the host it dials,
not to the jump hosts that ssh_config's ProxyJump makes it dial, so gpudeploy resolves the jump
chain itself and dials every hop with its own options (``jumps``). That needs each host's effective
ProxyJump/ProxyCommand, which only ``ssh -G`` knows for sure (Match, Include, first value wins):
~4 ms per host. So :func:`scan` first reads the files (no subprocess; cached while they are
unchanged) for the keywords at all; only where one names a proxy is ``ssh -G`` asked, once per
host and hop. No paramiko here (``invoke status`` imports this).
"""

from __future__ import annotations

import glob
import os
import pwd
import re
import shlex
import subprocess
import threading
from dataclasses import dataclass

ENV = "GPUDEPLOY_SSH_CONFIG"
SYSTEM_FILE = "/etc/ssh/ssh_config"
SYSTEM_DIR = "/etc/ssh"
MAX_DEPTH = 16  # readconf.c READCONF_MAX_DEPTH
KEYWORD = re.compile(r"\s*([^\s=#]+)\s*=?\s*(.*)")
G_TIMEOUT_S = 10.0


class SshConfigError(Exception):
    """ssh_config cannot be read for a host (ssh -G failed): the message says why."""


def override() -> str | None:
    """The one ssh_config file to read instead of the default ones, if set."""
    return os.environ.get(ENV) or None


def user_file() -> str:
    return os.path.join(pwd.getpwuid(os.getuid()).pw_dir, ".ssh", "config")


def top_files() -> list[str]:
    """The files ssh reads first, in its order (``Include`` adds more: :func:`scan`)."""
    one = override()
    return [one] if one else [user_file(), SYSTEM_FILE]


def openssh_args() -> list[str]:
    """What every ssh gpudeploy runs (each hop's too) is given to read the same files."""
    one = override()
    return ["-F", one] if one else []


@dataclass(frozen=True)
class Scan:
    """The ssh_config files as they are now: every file read, and the keywords any of them uses."""

    files: tuple[str, ...]  # top-level and included, existing or not (their state names a connection)
    keywords: frozenset[str]  # lowercased
    unsure: bool = False  # an Include we cannot follow ourselves (a %token or ${VAR}): assume any keyword
    states: tuple[tuple[int, int, int] | None, ...] = ()  # of ``files``, when read

    def uses(self, *keywords: str) -> bool:
        return self.unsure or any(k in self.keywords for k in keywords)

    @property
    def names_proxy(self) -> bool:
        """Can any host's ssh_config have a ProxyJump or ProxyCommand?"""
        return self.uses("proxyjump", "proxycommand")


def _state(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _read(path: str, user_conf: bool, depth: int, files: list[str], keywords: set[str]) -> bool:
    """Add ``path`` and what it includes; False where an Include cannot be followed here."""
    files.append(path)
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return True
    sure = True
    for line in text.splitlines():
        m = KEYWORD.match(line)
        if m is None:
            continue
        keyword = m.group(1).lower()
        keywords.add(keyword)
        if keyword != "include":
            continue
        try:
            args = shlex.split(m.group(2), comments=True)
        except ValueError:
            sure = False
            continue
        for arg in args:
            if "%" in arg or "$" in arg or depth >= MAX_DEPTH:
                sure = False
                continue
            if not os.path.isabs(arg) and not arg.startswith("~"):
                arg = os.path.join("~/.ssh" if user_conf else SYSTEM_DIR, arg)
            for included in sorted(glob.glob(os.path.expanduser(arg))):
                sure = _read(included, user_conf, depth + 1, files, keywords) and sure
    return sure


_scan_lock = threading.Lock()
_last: tuple[str | None, Scan] | None = None


def scan() -> Scan:
    """The files and their keywords; read again only when a file of the last scan changed."""
    global _last
    with _scan_lock:
        one = override()
        if _last is not None and _last[0] == one and tuple(_state(f) for f in _last[1].files) == _last[1].states:
            return _last[1]
        files: list[str] = []
        keywords: set[str] = set()
        sure = True
        for path in top_files():
            sure = _read(path, user_conf=bool(one) or path != SYSTEM_FILE, depth=0, files=files,
                         keywords=keywords) and sure
        result = Scan(tuple(files), frozenset(keywords), unsure=not sure, states=tuple(_state(f) for f in files))
        _last = (one, result)
        return result


def lines_setting(keyword: str, value: str) -> list[str]:
    """Where the ssh_config files set ``keyword`` to ``value``, as "file:line" (ssh -G tells what a
    host gets, not from where): for a message that points at the line to change."""
    out = []
    for path in scan().files:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            m = KEYWORD.match(line)
            if m is not None and m.group(1).lower() == keyword.lower() and m.group(2).strip() == value.strip():
                out.append(f"{path}:{number}")
    return out


_effective: dict[tuple[object, ...], dict[str, str]] = {}
_effective_lock = threading.Lock()


def effective(name: str, user: str | None = None, port: int | None = None) -> dict[str, str]:
    """``ssh -G``: the options ssh would use for ``name`` (lowercased keys, first value of each).
    Cached while the ssh_config files are unchanged: ssh -G runs once per host (and hop) per command."""
    read = scan()
    key = (override(), read.states, name, user, port)
    with _effective_lock:
        hit = _effective.get(key)
    if hit is not None:
        return hit
    argv = ["ssh", *openssh_args(), "-G"]
    if user is not None:
        argv += ["-l", user]
    if port is not None:
        argv += ["-p", str(port)]
    argv += ["--", name]
    try:
        res = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=G_TIMEOUT_S,
                             check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SshConfigError(f"`ssh -G {name}` (to read ssh_config) failed: {exc}") from None
    if res.returncode != 0:
        raise SshConfigError(f"ssh_config cannot be read for {name}: {res.stderr.strip()[-300:]}")
    out: dict[str, str] = {}
    for line in res.stdout.splitlines():
        k, _, v = line.partition(" ")
        out.setdefault(k.lower(), v)
    with _effective_lock:
        _effective[key] = out
    return out
