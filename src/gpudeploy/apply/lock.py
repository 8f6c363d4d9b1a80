"""A per-host deploy lock that cannot go stale.

The lock is an flock held by a tiny process on the host whose stdin is our ssh channel: when we
finish, crash or lose the network, the channel closes, the process exits and the kernel drops the
lock. Nothing to clean up, no PID files to trust.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import time

from ..errors import RemoteError
from .ssh import Remote

LOCK_PATH = "/run/gpudeploy/host.lock"
HOLDER = r"""
import fcntl, os, sys
os.makedirs(os.path.dirname(sys.argv[1]), exist_ok=True)
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except BlockingIOError:
    print("busy " + os.pread(fd, 4096, 0).decode(errors="replace").strip(), flush=True)
    fcntl.flock(fd, fcntl.LOCK_EX)
os.ftruncate(fd, 0)
os.pwrite(fd, sys.argv[2].encode(), 0)
print("locked", flush=True)
sys.stdin.read()
"""


class HostLock:
    def __init__(self, remote: Remote, wait_s: float = 600.0, on_wait: object = None) -> None:
        self.remote = remote
        self.wait_s = wait_s
        self.on_wait = on_wait
        self.chan: object = None

    def __enter__(self) -> HostLock:
        holder = json.dumps({"by": f"{getpass.getuser()}@{socket.gethostname()}", "pid": os.getpid(),
                             "since": time.strftime("%Y-%m-%d %H:%M:%S")})
        chan = self.remote.stream(["python3", "-c", HOLDER, LOCK_PATH, holder])
        chan.settimeout(self.wait_s)
        self.chan = chan
        buf = b""
        deadline = time.monotonic() + self.wait_s
        while time.monotonic() < deadline:
            try:
                data = chan.recv(4096)
            except TimeoutError:
                break
            if not data:
                raise RemoteError(self.remote.host.name, "the lock helper exited: "
                                  + chan.recv_stderr(4096).decode(errors="replace")[-300:])
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                text = line.decode(errors="replace")
                if text == "locked":
                    return self
                if text.startswith("busy") and callable(self.on_wait):
                    self.on_wait(text[5:])
        chan.close()
        raise RemoteError(self.remote.host.name, f"another gpudeploy run held the host lock for over {self.wait_s:g} s")

    def __exit__(self, *exc: object) -> None:
        chan = self.chan
        if chan is not None:
            chan.close()  # type: ignore[attr-defined]
