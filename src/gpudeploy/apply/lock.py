"""A per-host lock for the commands that change a host (deploy, teardown) that cannot go stale.

The lock is an flock held by a tiny process on the host (``HOLDER``) whose stdin is our ssh
channel. It is released when that process exits, which it does when:
  * we are done (the channel closes), or we crash or lose the network and sshd notices; and
  * we stop sending the heartbeat for ``HEARTBEAT_TIMEOUT_S``: sshd may take hours to notice a
    client that vanished (no ClientAliveInterval by default), a heartbeat bounds that.
A waiter polls with LOCK_NB until its own deadline and then exits: it never takes the lock after
its client has given up on it.

A lock can be lost while we still work on the host: a network stall of over 10 s ends the holder
(its heartbeat stopped arriving) and another run may take the lock. ``HostLock.check`` says so once
it is known (the holder exited, a beat could not be sent, or none was sent for 10 s); the session's
transport asks it before each step (apply/held.py), so nothing more is changed on that host.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from ..errors import GpudeployError, LockLost, RemoteError
from ..fanout import Cancel
from ..remote.base import Stream, Transport

LOCK_PATH = "/run/gpudeploy/host.lock"
HEARTBEAT_S = 1.0
HEARTBEAT_TIMEOUT_S = 10.0
PROBE_S = 60.0  # what the host probe may take (facts.probe's default timeout)

# Runs on the host. argv: PATH HOLDER_JSON WAIT_S HEARTBEAT_TIMEOUT_S [PROBE_SOURCE PROBE_SPEC]. Prints
# "busy <holder>" once while it waits, then "locked" or "timeout"; holds the lock while bytes keep
# arriving on stdin. With a probe, it runs the host probe once it holds the lock and says
# "locked <facts JSON>": deploy's facts come in the lock's own round trip (issue 26), read under the lock.
# PROBE_SPEC "-": the spec comes on stdin once the client has planned (deploy's head start,
# apply/early_locks.py), one line of JSON after any heartbeat dots; "null" there: no probe. The
# probe's script is compiled and run while the spec is awaited. A spec's "later" (a spec itself) is
# probed only when the client asks, with a "+" among its heartbeat dots: "more <facts JSON>"
# (deploy's second stage, apply/probe_stages.py).
HOLDER = r"""
import fcntl, json, os, select, sys, time
path, holder, wait_s, beat_s = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
os.makedirs(os.path.dirname(path), exist_ok=True)
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
deadline = time.monotonic() + wait_s
told = False
got = b""  # what came on stdin so far (heartbeat dots, a spec sent on stdin)
while True:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        break
    except BlockingIOError:
        if not told:
            print("busy " + os.pread(fd, 4096, 0).decode(errors="replace").strip(), flush=True)
            told = True
        if time.monotonic() >= deadline:
            print("timeout", flush=True)
            sys.exit(3)
        ready, _, _ = select.select([0], [], [], 0.1)
        if ready:
            data = os.read(0, 4096)
            if not data:
                sys.exit(4)  # our client went away while we waited
            got += data
os.ftruncate(fd, 0)
os.pwrite(fd, holder.encode(), 0)
spec = sys.argv[6] if len(sys.argv) > 6 else None
probe = {"__name__": "gpudeploy_probe"}
loaded = None
if spec is not None:
    try:
        exec(compile(sys.argv[5], "gpudeploy_probe", "exec"), probe)
    except Exception as exc:
        loaded = exc
if spec == "-":
    while b"\n" not in got:
        ready, _, _ = select.select([0], [], [], beat_s)
        data = os.read(0, 4096) if ready else b""
        if not data:
            sys.exit(0)  # not needed after all (the plan failed), or the client is gone
        got += data
    spec = got.split(b"\n", 1)[0].lstrip(b".").decode()
    spec = None if spec == "null" else spec
def answer(word, spec):
    try:
        if loaded is not None:
            raise loaded
        facts = json.dumps(probe["main"](spec))
    except Exception as exc:  # the client probes again on its own and reports that one's error
        facts = json.dumps({"probe_error": type(exc).__name__ + ": " + str(exc)})
    print(word + " " + facts, flush=True)
later = None
if spec is not None:
    try:
        spec = json.loads(spec)
        later = spec.pop("later", None)
    except Exception:
        pass
    answer("locked", spec)
else:
    print("locked", flush=True)
last = time.monotonic()
while True:
    ready, _, _ = select.select([0], [], [], beat_s)
    if ready:
        data = os.read(0, 4096)
        if not data:
            break  # the channel closed: we are done
        last = time.monotonic()
        if b"+" in data and later is not None:
            answer("more", later)
            later = None
    elif time.monotonic() - last >= beat_s:
        break  # no heartbeat: the client crashed or was cut off
"""


LATER = "-"  # the probe's spec, sent on stdin once it is known (HostLock.finish)


def holder_argv(python: str, wait_s: float, holder: str, probe: dict[str, Any] | str | None = None) -> list[str]:
    """The holder's command line; ``python`` is the host's interpreter (the inventory's ``python``:
    PATH's python3 on a host may be another one, or none). ``probe``: the host probe's spec, run
    once the lock is held, or LATER."""
    argv = [python, "-c", HOLDER, LOCK_PATH, holder, f"{wait_s:g}", f"{HEARTBEAT_TIMEOUT_S:g}"]
    if probe is not None:
        from ..facts.probe import SOURCE

        argv += [SOURCE, probe if probe == LATER else json.dumps(probe)]
    return argv


class LockBusy(RemoteError):
    """Another gpudeploy run holds the host lock (and we waited as long as we were asked to)."""


class HostLock:
    def __init__(self, remote: Transport, wait_s: float = 600.0, on_wait: Callable[[str], None] | None = None,
                 cancel: Cancel | None = None, probe: dict[str, Any] | None = None) -> None:
        self.remote = remote
        self.probe = probe
        self.facts: dict[str, Any] | None = None  # the probe's, read under the lock (None: probe on your own)
        self.wait_s = wait_s
        self.on_wait = on_wait
        self.cancel = cancel
        self.chan: Stream | None = None
        self.stopped = threading.Event()
        self.beat: threading.Thread | None = None
        self.sending = threading.Lock()  # a heartbeat dot never lands inside the spec's line
        self.buf = b""  # what the holder wrote after its last whole line
        self.beaten = time.monotonic()  # when the last heartbeat was sent
        self.lost: str | None = None  # why the lock is known lost (the heartbeat's thread says so too)

    def __enter__(self) -> HostLock:
        self.start()
        return self.wait()

    def start(self, probe_later: bool = False) -> HostLock:
        """Start the holder (and its heartbeat) without waiting for its answer. ``probe_later``: the
        probe's spec is not known yet; ``finish`` sends it."""
        holder = json.dumps({"by": f"{getpass.getuser()}@{socket.gethostname()}", "pid": os.getpid(),
                             "since": time.strftime("%Y-%m-%d %H:%M:%S")})
        probe = LATER if probe_later else self.probe
        chan = self.remote.stream(holder_argv(self.remote.host.python or "python3", self.wait_s, holder, probe))
        self.chan = chan
        self.beaten = time.monotonic()
        self.beat = threading.Thread(target=self._heartbeat, args=(chan,), daemon=True)
        self.beat.start()
        return self

    def finish(self, probe: dict[str, Any] | None, cancel: Cancel | None = None) -> HostLock:
        """A holder started with ``probe_later``: send the probe's spec (None: no probe), then wait."""
        self.probe, self.cancel = probe, cancel
        # The holder may have exited (busy, timed out) or the connection broken meanwhile (paramiko
        # raises OSError or EOFError): wait() reads and says why.
        with contextlib.suppress(Exception), self.sending:
            self._chan().sendall(json.dumps(probe).encode() + b"\n")
        return self.wait()

    def wait(self) -> HostLock:
        """Read the holder's answer: locked (with the probe's facts), or why not."""
        # the holder gives up first, by itself; a probe it runs may take the probe's own time
        extra = PROBE_S + float(self.probe.get("http_timeout", 0.0)) if self.probe is not None else 0.0
        deadline = time.monotonic() + self.wait_s + 5.0 + extra
        try:
            while (text := self._line(deadline)) is not None:
                if text == "locked":
                    return self
                if text.startswith("locked "):
                    self.facts = _facts(text[7:])
                    return self
                if text == "timeout":
                    raise LockBusy(self.remote.host.name, "another gpudeploy run held the host lock "
                                   f"for over {self.wait_s:g} s")
                if text.startswith("busy") and self.on_wait is not None:
                    self.on_wait(text[5:])
            raise RemoteError(self.remote.host.name, f"no answer from the lock helper within {self.wait_s:g} s")
        except (GpudeployError, OSError):
            self.__exit__()
            raise

    def more(self) -> dict[str, Any] | None:
        """The probe's second stage (its spec's ``later``), read by the holder under the lock: its
        facts, or None where the holder answered without them (the caller probes on its own and says
        why). LockLost where the holder is gone: the lock went with it."""
        later = (self.probe or {}).get("later")
        if later is None:
            return None
        # The holder answers it once: asked again, this says None at once instead of waiting.
        self.probe = {k: v for k, v in (self.probe or {}).items() if k != "later"}
        deadline = time.monotonic() + PROBE_S + 5.0 + float(later.get("http_timeout", 0.0))
        try:
            with self.sending:
                self._chan().sendall(b"+")
            while (text := self._line(deadline, "the host probe read the rest of the facts")) is not None:
                if text.startswith("more "):
                    return _facts(text[5:])
            return None
        except (GpudeployError, OSError, EOFError) as exc:
            if self.cancel is not None and self.cancel.is_set():
                raise
            detail = exc.args[-1] if isinstance(exc, RemoteError) else f"{type(exc).__name__}: {exc}"
            self.lost = self.lost or str(detail).removeprefix(self.remote.host.name + ": ")
            raise LockLost(self.remote.host.name, self.lost) from None

    def check(self) -> None:
        """LockLost once the lock is known lost: its holder on the host exited (it lets go of the lock
        as it does), a heartbeat could not be sent, or none was sent for the time after which the
        holder lets go. Asked before each step on the host (apply/held.py): a local look, no round trip.
        What is not known yet cannot be said: a step sent during a stall goes out; the one after the
        holder's end has come back (on the same connection, so before that step's answer) is refused."""
        if self.lost is None and self.chan is not None and self.chan.exit_status_ready():
            self.lost = (f"its holder on the host exited: no heartbeat reached it for {HEARTBEAT_TIMEOUT_S:g} s "
                         "(a network stall?) or it was killed")
        if self.lost is None and time.monotonic() - self.beaten >= HEARTBEAT_TIMEOUT_S:
            self.lost = f"no heartbeat could be sent to its holder for {HEARTBEAT_TIMEOUT_S:g} s"
        if self.lost is not None:
            raise LockLost(self.remote.host.name, self.lost)

    def _line(self, deadline: float, doing: str = "waiting for the host lock") -> str | None:
        """The holder's next line; None at the deadline. RemoteError where the holder exited."""
        chan = self._chan()
        chan.settimeout(0.2)
        while b"\n" not in self.buf:
            if time.monotonic() >= deadline:
                return None
            if self.cancel is not None and self.cancel.is_set():
                raise RemoteError(self.remote.host.name, f"interrupted while {doing}")
            try:
                data = chan.recv(4096)
            except TimeoutError:
                continue
            if not data:
                raise RemoteError(self.remote.host.name, "the lock helper exited: "
                                  + chan.recv_stderr(4096).decode(errors="replace")[-300:])
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode(errors="replace")

    def _chan(self) -> Stream:
        if self.chan is None:
            raise RuntimeError("HostLock: start() first")
        return self.chan

    def _heartbeat(self, chan: Stream) -> None:
        while not self.stopped.wait(HEARTBEAT_S):
            try:
                with self.sending:
                    chan.sendall(b".")
                self.beaten = time.monotonic()
            except TimeoutError:
                continue  # a slow moment: the holder allows HEARTBEAT_TIMEOUT_S (check() counts it)
            except Exception as exc:  # the channel or the connection is gone (paramiko: OSError, EOFError)
                if not self.stopped.is_set():  # (not our own close, in __exit__)
                    why = f"{type(exc).__name__}: {exc}".rstrip(": ")
                    self.lost = self.lost or f"its heartbeat could not be sent: {why}"
                return

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        if self.chan is not None:
            self.chan.close()


def _facts(text: str) -> dict[str, Any] | None:
    """The holder's probe answer; None where it failed (the caller probes on its own and says why)."""
    try:
        facts = json.loads(text)
    except ValueError:
        return None
    return facts if isinstance(facts, dict) and "probe_error" not in facts else None
