"""``status --watch``'s follower of one host's kernel log: each Xid line the driver writes, as it comes.

One more channel on the host's connection runs facts/gpu_health.py's ``follow`` (the journal's
``journalctl -k -f``, else /dev/kmsg, else the file an NVML stand-in names): it writes a JSON line per
Xid within ~0.05 s of the kernel's line (the lab's file is read every 0.05 s; journald tells its
followers within 0.25 s), and a keepalive every 2 s so it ends soon after this side closes. Nothing
here restarts anything: the watch only reads.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable
from typing import Any

from ..facts.probe import GPU_HEALTH_SOURCE
from ..model import Host
from ..remote.base import Stream, Transport
from ..remote.jsonlines import json_lines


def follow_argv(host: Host, since: float) -> list[str]:
    return [host.python or "python3", "-c", GPU_HEALTH_SOURCE, "follow", json.dumps({"since": since})]


class KernelWatch:
    """Started on ``remote``: ``on_xid(xid)`` for each Xid line ({"at", "bus", "xid", "pid", "name",
    "text"}, the GPU not yet known), ``on_error(why)`` if the host has no kernel log this user can follow."""

    def __init__(self, remote: Transport, since: float, on_xid: Callable[[dict[str, Any]], None],
                 on_error: Callable[[str], None]) -> None:
        self.done = threading.Event()
        self.stream: Stream = remote.stream(follow_argv(remote.host, since))
        self.on_xid, self.on_error = on_xid, on_error
        self.source: str | None = None
        threading.Thread(target=self._read, name=f"kernel-{remote.host.name}", daemon=True).start()

    def _read(self) -> None:
        for event in json_lines(self.stream, self.done):
            if not isinstance(event, dict):
                continue
            if isinstance(event.get("xid"), dict):
                self.on_xid(event["xid"])
            elif event.get("source"):
                self.source = str(event["source"])
            elif event.get("error"):
                self.on_error(str(event["error"]))

    def close(self) -> None:
        self.done.set()
        with contextlib.suppress(OSError):
            self.stream.close()
