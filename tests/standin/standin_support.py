"""Helpers for the stand-in tests: run engine/router as lab hosts do (/usr/bin/python3, stdlib)."""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PYTHON = "/usr/bin/python3"
GPU_BYTES = 150_754_820_096  # an H200 as NVML reports it


def wait_for(cond: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Poll ``cond`` until it returns something truthy; fail with a message at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s: {cond}")
        time.sleep(interval)


CLONE_NEWNET = 0x40000000


class NoNetns(Exception):
    """No network namespace can be made here (not root)."""


@contextlib.contextmanager
def own_netns() -> Iterator[None]:
    """Run the calling thread (and every process it starts) in a new network namespace that has only
    ``lo``, up; back to the original one afterwards. The namespace dies with its last process."""
    libc = ctypes.CDLL(None, use_errno=True)
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        if libc.unshare(CLONE_NEWNET) != 0:
            raise NoNetns(os.strerror(ctypes.get_errno()))
        try:
            subprocess.run(["ip", "link", "set", "lo", "up"], check=True, timeout=10)
            yield
        finally:
            if libc.setns(home, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back to the original network namespace failed")
    finally:
        os.close(home)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(port: int, path: str, timeout: float = 2.0) -> tuple[int, bytes] | None:
    """(status, body), or None if nothing listens."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    except (ConnectionRefusedError, ConnectionResetError):
        return None
    finally:
        conn.close()


def http_post(port: int, path: str, obj: Any, timeout: float = 5.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, body=json.dumps(obj), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def children_of(pid: int) -> list[int]:
    """PIDs whose parent is ``pid``, from /proc (no psutil)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            for line in (d / "status").read_text().splitlines():
                if line.startswith("PPid:"):
                    if int(line.split()[1]) == pid:
                        out.append(int(d.name))
                    break
        except OSError:
            continue
    return sorted(out)


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def session_of(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    return int(fields[3])  # state ppid pgrp session ...


class Proc:
    """A stand-in process with its output collected line by line."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.popen = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, cwd=REPO)
        self.pid = self.popen.pid
        self.lines: list[str] = []
        self.known_children: set[int] = set()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for raw in self.popen.stdout:
            self.lines.append(raw.decode(errors="replace").rstrip("\n"))

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def children(self) -> list[int]:
        kids = children_of(self.pid)
        self.known_children.update(kids)
        return kids

    def wait_line(self, needle: str, timeout: float = 10.0) -> str:
        def found() -> str | None:
            return next((ln for ln in self.lines if needle in ln), None)
        try:
            return str(wait_for(found, timeout))
        except AssertionError:
            raise AssertionError(f"{needle!r} not logged; output so far:\n{self.text}") from None

    def wait_exit(self, timeout: float = 10.0) -> int:
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout} s; output:\n{self.text}") from None

    def stop(self) -> None:
        """End this process and the children we saw, each by its exact PID."""
        if self.popen.poll() is None:
            self.children()
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(timeout=5)
        for pid in self.known_children:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


class Lab:
    """Starts stand-ins with their env pointed at ``tmp_path``; stops everything it started."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.procs_dir = tmp_path / "gpu-procs"
        self.gpus_json = tmp_path / "gpus.json"
        self.sglang_json = tmp_path / "sglang.json"
        self.gpus_json.write_text(json.dumps({"driver_version": "580.159.04", "gpus": [
            {"index": i, "name": "NVIDIA H200", "uuid": f"GPU-0000000{i}-f5db-2c0f-70df-fc4595ae00fc",
             "memory_total_bytes": GPU_BYTES, "numa_node": i // 2, "pci_bus_id": f"00000000:00:0{6 + i}.0"}
            for i in range(4)]}))
        self.started: list[Proc] = []
        self.extra_pids: list[int] = []

    def env(self, **extra: str) -> dict[str, str]:
        env = {
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": f"{REPO / 'src'}:{REPO / 'lab' / 'shims'}",
            "SGLANG_STANDIN_SPEED": "0.15",
            "SGLANG_STANDIN_GPU_PROCS_DIR": str(self.procs_dir),
            "GPUDEPLOY_LAB_GPUS": str(self.gpus_json),
            # the host's stand-in release file (absent unless a test writes it): never this machine's
            "GPUDEPLOY_LAB_SGLANG": str(self.sglang_json),
            "SGLANG_STANDIN_WEIGHTS_GIB": "16",
        }
        env.update(extra)
        return env

    def engine(self, *args: str, port: int | None = None, **env: str) -> tuple[Proc, int]:
        port = port or free_port()
        argv = [PYTHON, "-m", "sglang.launch_server", "--model-path", "/models/test-model",
                "--host", "127.0.0.1", "--port", str(port), *args]
        p = Proc(argv, self.env(**env))
        self.started.append(p)
        return p, port

    def router(self, *args: str, **env: str) -> tuple[Proc, int]:
        port = free_port()
        argv = [PYTHON, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
                *args]
        p = Proc(argv, self.env(**env))
        self.started.append(p)
        return p, port

    def records(self) -> list[dict[str, int]]:
        out = []
        for f in sorted(self.procs_dir.glob("*.json")) if self.procs_dir.exists() else []:
            try:
                out.append(json.loads(f.read_text()))
            except (OSError, ValueError):
                continue
        return out

    def close(self) -> None:
        for p in self.started:
            p.stop()
        for pid in self.extra_pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
