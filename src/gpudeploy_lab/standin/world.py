"""A stand-in engine that spans hosts: the rendezvous on ``--dist-init-addr`` and the links between nodes.

Real SGLang with ``--nnodes N --node-rank R --dist-init-addr HOST:PORT``: node 0's rank 0 serves
torch.distributed's TCPStore on PORT (all interfaces); every rank of every node blocks in "Init torch
distributed" until all ``tp_size`` ranks joined; then the ranks talk over gloo (the schedulers'
``broadcast_pyobj`` of every batch) and NCCL. A node that goes away breaks those connections: the
other nodes' schedulers raise gloo's ``Connection closed by peer [ADDR]:PORT`` (sglang#27944 shows
the read-error variant of that traceback, from ``broadcast_pyobj``) and their launchers shut down.

Here one TCP connection per follower stands for all of that: a follower connects (retrying, like
TCPStore's client, until ``SGLANG_STANDIN_DIST_TIMEOUT`` s, default 600), says which node it is, and
the leader answers ``go`` once all nodes are there. Whoever sees its link close calls ``on_lost``.
Nothing is sent over the links after ``go``; closing them is the signal.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import threading
import time
from collections.abc import Callable

from gpudeploy_lab.standin.common import env_float


def split_addr(addr: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT`` (SGLang's --dist-init-addr)."""
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


def listen_error(port: int, e: OSError) -> str:
    """torch's TCPStore server when its port is taken."""
    name = errno.errorcode.get(e.errno or 0, "EUNKNOWN")
    return ("torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
            f"address. port: {port}, useIpv6: false, code: -{e.errno}, name: {name}, message: "
            f"{(e.strerror or str(e)).lower()}")


def connect_timeout_text(host: str, port: int, ms: int) -> str:
    """torch's TCPStore client when the leader never answers."""
    return (f"torch.distributed.DistNetworkError: The client socket has timed out after {ms}ms while trying "
            f"to connect to ({host}, {port}).")


class World:
    def __init__(self, addr: str, nnodes: int, node_rank: int, on_lost: Callable[[str], None],
                 on_timeout: Callable[[str], None]) -> None:
        self.host, self.port = split_addr(addr)
        self.nnodes = nnodes
        self.node_rank = node_rank
        self.on_lost = on_lost
        self.on_timeout = on_timeout
        self.joined = threading.Event()
        self.closed = threading.Event()
        self.links: list[socket.socket] = []
        self.listener: socket.socket | None = None
        self.timeout_s = env_float("SGLANG_STANDIN_DIST_TIMEOUT", 600.0)

    # ------------------------------------------------------------------------------- start

    def start(self) -> OSError | None:
        """The leader binds its port (the error, if taken); a follower starts connecting."""
        if self.node_rank == 0:
            try:
                sock = socket.create_server(("", self.port), reuse_port=False, backlog=self.nnodes)
            except OSError as e:
                return e
            self.listener = sock
            threading.Thread(target=self._accept, daemon=True).start()
        else:
            threading.Thread(target=self._connect, daemon=True).start()
        return None

    def _accept(self) -> None:
        assert self.listener is not None
        waiting: list[socket.socket] = []
        deadline = time.monotonic() + self.timeout_s
        self.listener.settimeout(0.2)
        while len(waiting) < self.nnodes - 1 and not self.closed.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                if time.monotonic() > deadline:
                    self.on_timeout(f"torch.distributed.DistStoreError: Timed out after {self.timeout_s + 1:.0f} "
                                    f"seconds waiting for clients. {len(waiting) + 1}/{self.nnodes} clients joined.")
                    return
                continue
            except OSError:
                return
            conn.settimeout(5.0)
            try:
                hello = conn.recv(64)
            except OSError:
                conn.close()
                continue
            if not hello.startswith(b"hello "):
                conn.close()  # not one of ours (a port probe): the store ignores it too
                continue
            conn.settimeout(None)
            waiting.append(conn)
        for conn in waiting:
            with contextlib.suppress(OSError):
                conn.sendall(b"go\n")
        self.links = waiting
        self.joined.set()
        for conn in waiting:
            peer = conn.getpeername()
            threading.Thread(target=self._watch, args=(conn, f"[{peer[0]}]:{peer[1]}"), daemon=True).start()

    def _connect(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not self.closed.is_set():
            try:
                conn = socket.create_connection((self.host, self.port), timeout=2.0)
                conn.sendall(f"hello {self.node_rank}\n".encode())
                conn.settimeout(None)
                answer = conn.recv(16)
                if answer.startswith(b"go"):
                    self.links = [conn]
                    self.joined.set()
                    self._watch(conn, f"[{self.host}]:{self.port}")
                    return
                conn.close()
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.on_timeout(connect_timeout_text(self.host, self.port, int(self.timeout_s * 1000)))
                return
            self.closed.wait(0.1)

    def _watch(self, conn: socket.socket, peer: str) -> None:
        try:
            while conn.recv(4096):
                pass
        except OSError:
            pass
        if not self.closed.is_set():
            self.on_lost(peer)

    # ------------------------------------------------------------------------------- stop

    def close(self) -> None:
        """This node leaves: its peers see their links close."""
        self.closed.set()
        for conn in [*self.links, *([self.listener] if self.listener else [])]:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                conn.close()
