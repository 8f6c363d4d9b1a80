"""``connection: local``: gpudeploy runs on the GPU node itself and drives it without SSH.

The same interface as the SSH transport (``remote.base``), so deploy, the gate, status, teardown and
their proofs are the same: commands are argv lists run here (no shell), streams are pipes of a
child process, files are written atomically with their mode, and ``open_tcp`` is a plain socket.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import subprocess
import time
from typing import Any

from ..errors import RemoteError
from ..model import Host
from .base import Result


class LocalStream:
    """A running command's pipes, read like a paramiko channel (recv with a timeout)."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True)
        self.timeout: float | None = None

    def settimeout(self, timeout: float | None) -> None:
        self.timeout = timeout

    def _read(self, pipe: Any, nbytes: int) -> bytes:
        sel = selectors.DefaultSelector()
        sel.register(pipe, selectors.EVENT_READ)
        try:
            if not sel.select(self.timeout):
                raise TimeoutError
        finally:
            sel.close()
        return bytes(os.read(pipe.fileno(), nbytes))

    def recv(self, nbytes: int) -> bytes:
        return self._read(self.proc.stdout, nbytes)

    def recv_stderr(self, nbytes: int) -> bytes:
        try:
            saved, self.timeout = self.timeout, 0
            return self._read(self.proc.stderr, nbytes)
        except TimeoutError:
            return b""
        finally:
            self.timeout = saved

    def sendall(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def exit_status_ready(self) -> bool:
        return self.proc.poll() is not None

    def close(self) -> None:
        """End the command (its stdin closes first, as an ssh channel's would), by its own PID."""
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class LocalTransport:
    def __init__(self, host: Host) -> None:
        self.host = host

    def __enter__(self) -> LocalTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        return None

    def close(self) -> None:
        return None

    def run(self, argv: list[str], *, stdin: bytes | None = None, timeout: float = 60.0,
            check: bool = True) -> Result:
        try:
            res = subprocess.run(argv, input=stdin if stdin is not None else b"", capture_output=True,
                                 timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise RemoteError(self.host.name, f"`{' '.join(argv)[:120]}` did not finish within {timeout:g} s") from None
        except OSError as exc:
            raise RemoteError(self.host.name, f"cannot run {argv[0]}: {exc.strerror or exc}") from None
        result = Result(res.returncode, res.stdout.decode(errors="replace"), res.stderr.decode(errors="replace"))
        if check and res.returncode != 0:
            raise RemoteError(self.host.name, f"`{' '.join(argv)[:200]}` failed (exit {res.returncode}): "
                              f"{(result.stderr or result.stdout).strip()[-500:]}")
        return result

    def stream(self, argv: list[str]) -> LocalStream:
        return LocalStream(argv)

    def put(self, path: str, data: bytes, mode: int) -> None:
        """Atomically: a temp file in the same folder, created 0600, mode set, renamed over."""
        folder, name = os.path.split(path)
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, f".{name}.gpudeploy-tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        os.replace(tmp, path)

    def open_tcp(self, address: str, port: int, timeout: float) -> socket.socket:
        deadline = time.monotonic() + timeout
        sock = socket.create_connection((address, port), timeout=max(0.1, deadline - time.monotonic()))
        return sock
