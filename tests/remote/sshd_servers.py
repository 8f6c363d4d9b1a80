"""Fake SSH servers on 127.0.0.1 (tests/standin/fake_sshd.py: paramiko, no sshd needed) for the
real OpenSSH client and the paramiko transport: hosts and bastions whose host keys and relays a
test can see. Not the lab: no network namespace, nothing shared, every process stopped by its PID.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

FAKE_SSHD = Path(__file__).resolve().parents[1] / "standin" / "fake_sshd.py"
ADDRESS = "127.0.0.1"


def keygen(path: Path, kind: str = "ed25519") -> str:
    """A new key at ``path``; its public ``type base64``."""
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "", "-f", str(path)], check=True, timeout=30)
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


def free_port() -> int:
    with socket.socket() as s:
        s.bind((ADDRESS, 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    name: str
    port: int
    public_key: str  # "ssh-ed25519 AAAA..."
    proc: subprocess.Popen[str]
    output: list[str] = field(default_factory=list)

    @property
    def known_name(self) -> str:
        return f"[{ADDRESS}]:{self.port}"

    def known_line(self) -> str:
        return f"{self.known_name} {self.public_key}\n"

    def relays(self) -> list[int]:
        """The ports this server relayed to (direct-tcpip), in order."""
        return [int(line.split()[2]) for line in list(self.output) if line.startswith("direct-tcpip ")]


class Servers:
    """Start fake sshds; ``client_key`` is the one key every one of them accepts (user root)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.client_key = tmp / "id_client"
        keygen(self.client_key)
        self.servers: list[Server] = []

    def start(self, name: str, *, run: bool = False) -> Server:
        """``run``: other commands really run on this machine (fake_sshd.py's ``--run``)."""
        host_key = self.tmp / f"host_{name}"
        public = keygen(host_key)
        port = free_port()
        proc = subprocess.Popen([sys.executable, str(FAKE_SSHD), ADDRESS, str(port), str(host_key),
                                 str(self.client_key.with_suffix(".pub")), name, *(["--run"] if run else [])],
                                stdout=subprocess.PIPE, text=True)
        server = Server(name, port, public, proc)
        self.servers.append(server)
        assert proc.stdout is not None
        first = proc.stdout.readline().strip()
        assert first == "listening", first
        threading.Thread(target=self._read, args=(server,), daemon=True).start()
        return server

    @staticmethod
    def _read(server: Server) -> None:
        assert server.proc.stdout is not None
        for line in server.proc.stdout:
            server.output.append(line.strip())

    def wait_relays(self, server: Server, n: int, timeout: float = 10) -> list[int]:
        deadline = time.monotonic() + timeout
        while len(server.relays()) < n:
            if time.monotonic() > deadline:
                raise AssertionError(f"{server.name} relayed {server.relays()} within {timeout} s, wanted {n}")
            time.sleep(0.02)
        return server.relays()

    def stop(self) -> None:
        for s in self.servers:
            s.proc.kill()
            s.proc.wait(timeout=10)
