"""The name of a shared OpenSSH connection (``ControlPath``): one per way of reaching a host.

``invoke status`` shares one ssh connection per host for ``PERSIST_S`` seconds. A command that
finds a master listening at its ControlPath uses it without connecting, so without checking any
host key: two commands may share a master only when they would have made the same connection
with the same trust. OpenSSH's ``%C`` hashes only the local host, the remote host, port and user,
so two inventories with one address behind different bastions, or with different known_hosts
files, shared a master and the second one's host key was never checked (issue 20, item 6).

The name here is a digest of everything that decides whom we talk to and what we trust: every
option gpudeploy gives ssh (login, port, key, the known_hosts files and the whole jump chain with
each hop's own options, all in the argv), the local host name (a home shared over NFS), the state
of the known_hosts files (a key edited out is checked again at once, not after ``PERSIST_S``) and
of the ssh_config files (ssh reads those for Hostname, User, Port, ProxyJump, HostKeyAlias...).

A Unix socket path holds at most 104 bytes on macOS and the BSDs (108 on Linux), and ssh first
binds a temporary name 17 bytes longer (``mux.c``: ``<path>.<16 random chars>``). A control
directory too long for that gets no sharing at all (each command connects and checks keys), never
a name that ssh cannot bind.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from collections.abc import Sequence
from pathlib import Path

DIGEST_CHARS = 24  # 96 bits of SHA-256: no accidental collision among one user's hosts
SUN_PATH_MAX = 104  # sizeof(sun_path) on macOS/BSD (108 on Linux): the smaller one, to be safe
MUX_TEMP_SUFFIX = 17  # ".XXXXXXXXXXXXXXXX" that ssh appends while it sets the master up


def file_state(path: str) -> list[object]:
    """What a file is now: changed content or a replaced file gives another value (no read)."""
    try:
        st = os.stat(path)
    except OSError:
        return [path, None]
    return [path, st.st_ino, st.st_size, st.st_mtime_ns]


def name_for(argv: Sequence[str], files: Sequence[str]) -> str:
    """The name of a connection made with ``argv`` (all but the remote command), trusting ``files``
    (known_hosts and ssh_config files)."""
    material = json.dumps([socket.gethostname(), list(argv), [file_state(f) for f in files]])
    return hashlib.sha256(material.encode()).hexdigest()[:DIGEST_CHARS]


def fits(path: Path) -> bool:
    """Can ssh bind a control socket at ``path``?"""
    return len(os.fsencode(path)) + MUX_TEMP_SUFFIX < SUN_PATH_MAX  # <: the C string's NUL
