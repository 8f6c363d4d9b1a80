"""HTTP to the servers gpudeploy deployed: /health, /readiness, /workers, the smoke generation.

With ``via`` (the host's transport), each request travels inside the host's SSH connection to the
server's port on the host itself, as ``ssh -L`` does: GPU nodes behind a bastion often have only
SSH open. Without it, requests go straight to the host's address. Either way no ``http_proxy`` is
used: a proxy for the operator's browser or pip that cannot reach the GPU network would keep the
gate from ever seeing 200.
"""

from __future__ import annotations

import http.client
import io
import json
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ..errors import GpudeployError, LockLost
from ..fanout import say
from ..remote.base import ForwardingRefused, Socket, Transport
from . import onhost
from .liveness import local_url

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class _Raw(io.RawIOBase):
    """A byte stream over anything with ``recv`` (an ssh channel), for a BufferedReader: http.client
    reads a chunked answer with ``peek``, which paramiko's own file object lacks."""

    def __init__(self, sock: Socket) -> None:
        self.sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.sock.recv(len(buffer))
        buffer[:len(data)] = data
        return len(data)


class _Channel:
    """What http.client needs of a socket, over a TCP channel opened by the host itself."""

    def __init__(self, sock: Socket) -> None:
        self.sock = sock

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(data)

    def makefile(self, mode: str = "rb", *args: Any, **kwargs: Any) -> io.BufferedReader:
        return io.BufferedReader(_Raw(self.sock))

    def settimeout(self, timeout: float | None) -> None:
        self.sock.settimeout(timeout)

    def close(self) -> None:
        self.sock.close()


class _Through(http.client.HTTPConnection):
    """An HTTP connection whose socket is a TCP channel opened by the host itself."""

    def __init__(self, host: str, port: int, timeout: float, via: Transport) -> None:
        super().__init__(host, port, timeout=timeout)
        self.via = via

    def connect(self) -> None:
        timeout = self.timeout if isinstance(self.timeout, (int, float)) else 10.0
        self.sock = _Channel(self.via.open_tcp(self.host, self.port or 80, timeout))


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def _connection(url: str, timeout: float, via: Transport | None) -> tuple[http.client.HTTPConnection, str]:
    parts = urlsplit(url)
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    host, port = parts.hostname or "", parts.port or 80
    conn = _Through(host, port, timeout, via) if via is not None else http.client.HTTPConnection(
        host, port, timeout=timeout)
    return conn, path or "/"


# Hosts whose sshd refused a TCP channel: from then on their HTTP is made on the host itself.
_REFUSED: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
_REFUSED_LOCK = threading.Lock()


def path_of(via: Transport) -> str:
    """How HTTP reaches the servers on ``via``'s host, in words."""
    why = _REFUSED.get(via)
    return f"made on the host itself ({why})" if why else "through the host's ssh connection (port forwarding)"


def _refused(via: Transport, exc: ForwardingRefused) -> None:
    with _REFUSED_LOCK:
        first = via not in _REFUSED
        _REFUSED[via] = str(exc)
    if first:
        say(f"[{via.host.name}] {exc}: gpudeploy makes its HTTP requests on the host itself, "
            f"with {via.host.python or 'python3'}")


def request(url: str, *, timeout: float, via: Transport | None = None, body: Any = None,
            method: str | None = None) -> Response | None:
    """GET (or POST ``body`` as JSON, or ``method``) ``url``; None when nothing answers, or not in HTTP."""
    verb = method or ("POST" if body is not None else "GET")
    if via is not None:
        url = local_url(url, via.host)
        if via in _REFUSED:
            got = onhost.request(via, verb.lower(), url, body, timeout)
            return Response(got.status, got.body.encode()) if got.status is not None else None
    conn, path = _connection(url, timeout, via)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(verb, path, body=data, headers={"Content-Type": "application/json"} if data is not None else {})
        resp = conn.getresponse()
        return Response(resp.status, resp.read())
    except ForwardingRefused as exc:
        assert via is not None
        _refused(via, exc)
        return request(url, timeout=timeout, via=via, body=body, method=method)
    except LockLost:
        raise  # nothing was sent: the host is lost to this run (its deploy fails it), not silent
    except (OSError, http.client.HTTPException, ValueError, GpudeployError):
        # refused, reset, timed out, a port that speaks something else (BadStatusLine), a lost host
        return None
    finally:
        conn.close()


def status_of(url: str, timeout: float, via: Transport | None = None) -> int | None:
    """The HTTP status ``url`` answers with, or None when nothing answers."""
    if via is not None:
        resp = request(url, timeout=timeout, via=via)
        return resp.status if resp is not None else None
    try:
        with _OPENER.open(url, timeout=timeout) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError):
        return None


# A smoke answer is a few dozen events; a server that streams on and on (or a port that is not an
# engine) must not grow gpudeploy's memory or keep the gate forever: bounded by count, bytes and time.
MAX_EVENTS = 4096
MAX_EVENT_BYTES = 1 << 20  # all ``data:`` payloads together


@dataclass(frozen=True)
class Streamed:
    """A streamed (SSE) POST: its status, the ``data:`` events, and when the first one came.
    ``cut`` says why reading stopped early ("" when the stream ended by itself)."""

    status: int
    events: list[Any]
    error_body: str
    first_event_s: float | None
    total_s: float
    cut: str = ""


def stream_events(url: str, body: Any, *, timeout: float, via: Transport | None = None,
                  max_events: int = MAX_EVENTS, max_bytes: int = MAX_EVENT_BYTES) -> Streamed:
    """POST ``body`` and read a server-sent-event answer to its end (``data: [DONE]`` or close),
    for at most ``timeout`` seconds in all, ``max_events`` events and ``max_bytes`` of data."""
    if via is not None:
        url = local_url(url, via.host)
        if via in _REFUSED:
            return _stream_on_host(url, body, timeout, via, max_events, max_bytes)
    t0 = time.monotonic()
    deadline = t0 + timeout
    conn, path = _connection(url, timeout, via)
    try:
        try:
            conn.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        except ForwardingRefused as exc:
            assert via is not None
            _refused(via, exc)
            return _stream_on_host(url, body, timeout, via, max_events, max_bytes)
        resp = conn.getresponse()
        if resp.status != 200:
            return Streamed(resp.status, [], resp.read(2000).decode(errors="replace"), None,
                            time.monotonic() - t0)
        events: list[Any] = []
        first: float | None = None
        size = 0
        cut = ""
        for data in _sse_data(resp):
            if data == "[DONE]":
                break
            if first is None:
                first = time.monotonic() - t0
            size += len(data)
            if len(events) >= max_events or size > max_bytes:
                cut = f"the stream went on past {max_events} events or {max_bytes} bytes"
                break
            events.append(_event(data))
            if time.monotonic() > deadline:
                cut = f"the stream went on past {timeout:g} s"
                break
        return Streamed(200, events, "", first, time.monotonic() - t0, cut)
    finally:
        conn.close()


def _event(data: str) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return data


def _stream_on_host(url: str, body: Any, timeout: float, via: Transport, max_events: int,
                    max_bytes: int) -> Streamed:
    got = onhost.request(via, "sse", url, body, timeout, max_events=max_events, max_bytes=max_bytes)
    if got.status is None:
        raise ConnectionError(got.error or "no answer")
    if got.status != 200:
        return Streamed(got.status, [], got.body, None, got.total_s)
    return Streamed(200, [_event(e) for e in got.events], "", got.first_event_s, got.total_s, got.cut)


def _sse_data(resp: http.client.HTTPResponse) -> Iterator[str]:
    while True:
        line = resp.readline(1 << 20)  # one event line; longer ones are cut (bounded memory)
        if not line:
            return
        text = line.decode(errors="replace").strip()
        if text.startswith("data:"):
            yield text[5:].strip()
