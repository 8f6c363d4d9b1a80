"""Our data and EOF on an ssh channel always reach the host before our CLOSE.

paramiko builds a channel's DATA or EOF message while it holds the channel's lock, lets go, and
only then sends it (paramiko/channel.py ``_send`` and ``shutdown``). When the host's CLOSE arrives
in that gap (the command has just exited, the server has just closed its port), paramiko's
transport thread answers with our CLOSE first; OpenSSH then frees the channel, and the DATA or
EOF that follows names a channel it no longer has, which it treats as a protocol violation: it
ends the whole connection, "ieof packet referred to nonexistent channel 2" (OpenSSH channels.c,
``channel_from_packet_id``). Every command and the host lock on that connection were gone with it:
the loaded test runs' "lost the connection" (issue 20), and any operator on a busy jump host.

Here the message is sent while the channel's lock is held, so the transport thread's answer to
a CLOSE (it takes the same lock) goes out after it. paramiko avoids holding the lock there
because a send waits while keys are re-exchanged; a CLOSE for this channel arriving during one
would then wait too, until paramiko's own key-exchange timeout ends the send with an error, not
forever. Keys are re-exchanged after 512 MiB on a connection, far beyond what gpudeploy sends.
"""

from __future__ import annotations

import functools
from typing import Any

import paramiko
from paramiko.common import cMSG_CHANNEL_DATA

_PARTS = ("lock", "closed", "remote_chanid", "transport", "_wait_for_send_window", "_send_eof")


def ordered(chan: paramiko.Channel) -> paramiko.Channel:
    """``chan`` with ``send``, ``sendall`` and ``shutdown_write`` that cannot follow our CLOSE
    (another paramiko whose channel lacks the parts used here keeps its own)."""
    if all(hasattr(chan, part) for part in _PARTS):
        chan.send = functools.partial(send, chan)  # type: ignore[method-assign]
        chan.sendall = functools.partial(send_all, chan)  # type: ignore[method-assign]
        chan.shutdown_write = functools.partial(send_eof, chan)  # type: ignore[method-assign]
    return chan


def send(chan: Any, data: bytes | memoryview) -> int:
    """Send what the channel's window allows of ``data`` now; how much was sent. OSError once the
    channel is closed or our EOF is sent, TimeoutError when the window stays shut past the
    channel's timeout (as ``Channel.send``)."""
    with chan.lock:
        if chan.closed:
            raise OSError("Socket is closed")
        size = chan._wait_for_send_window(len(data))  # (waits with the lock let go)
        if size == 0:  # closed, or our EOF went, while we waited
            raise OSError("Socket is closed")
        m = paramiko.Message()
        m.add_byte(cMSG_CHANNEL_DATA)
        m.add_int(chan.remote_chanid)
        m.add_string(bytes(data[:size]))
        chan.transport._send_user_message(m)
        return int(size)


def send_all(chan: Any, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[send(chan, view):]


def send_eof(chan: Any) -> None:
    """Our EOF, unless the channel is already closed (paramiko's answer to the host's CLOSE
    carried our EOF then)."""
    with chan.lock:
        if chan.closed:
            return
        m = chan._send_eof()  # None when our EOF went already
        if m is not None:
            chan.transport._send_user_message(m)
