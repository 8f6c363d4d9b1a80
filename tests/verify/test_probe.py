"""The host probe's parsers, on recorded `systemctl show` output and on this machine's own /proc."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from typing import Any

import pytest

from gpudeploy.facts import remote_probe

RECORDED = """Id=gpudeploy-lab-decode.service
LoadState=loaded
ActiveState=failed
SubState=failed
MainPID=0
ExecMainStatus=1
Result=exit-code
InvocationID=6f652cc6bbad4b1c9d8e7f6a5b4c3d2e
ControlGroup=

Id=gpudeploy-lab-router.service
LoadState=loaded
ActiveState=active
SubState=running
MainPID=192
ExecMainStatus=0
Result=success
InvocationID=e5cab89ef4d64a0b8c7d6e5f4a3b2c1d
ControlGroup=/system.slice/gpudeploy-lab-router.service
"""


def test_systemctl_show_blocks_become_one_dict_per_unit(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        assert argv[:2] == ["systemctl", "show"] and argv[-2:] == ["gpudeploy-lab-decode.service",
                                                                    "gpudeploy-lab-router.service"]
        return subprocess.CompletedProcess(argv, 0, RECORDED, "")

    monkeypatch.setattr(remote_probe.subprocess, "run", fake_run)
    shown = remote_probe.systemctl_show(["gpudeploy-lab-decode.service", "gpudeploy-lab-router.service"])
    assert shown["gpudeploy-lab-decode.service"]["ActiveState"] == "failed"
    assert shown["gpudeploy-lab-decode.service"]["Result"] == "exit-code"
    assert shown["gpudeploy-lab-router.service"]["MainPID"] == "192"
    assert shown["gpudeploy-lab-router.service"]["ControlGroup"].endswith("gpudeploy-lab-router.service")


def _cmdline(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()


def test_proc_info_reads_session_and_start_time_of_a_real_process() -> None:
    child = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        # Popen returns once the exec has closed our CLOEXEC pipe, which the kernel does before
        # it maps the new argv: for a moment /proc/PID/cmdline is empty. Wait for the exec to end.
        deadline = time.monotonic() + 5
        while not _cmdline(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        info = remote_probe.proc_info(child.pid)
        assert info is not None
        assert info["pid"] == child.pid and info["ppid"] == os.getpid()
        assert info["sid"] == child.pid  # a new session, like a detached TP worker
        assert info["start_ticks"] > 0 and info["cmd"] == "sleep 30"
    finally:
        child.kill()
        child.wait()
    assert remote_probe.proc_info(child.pid) is None


def test_listening_ports_names_the_owner_pid() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert os.getpid() in remote_probe.listening_ports()[port]


def test_a_process_without_cmdline_is_named_by_its_kernel_name() -> None:
    # A zombie has an empty cmdline; an orphan report must still say what the process was.
    child = subprocess.Popen(["sleep", "0"])
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        info = remote_probe.proc_info(child.pid)
        if info and info["state"] == "Z":
            break
        time.sleep(0.01)
    try:
        assert info is not None and info["state"] == "Z"
        assert info["cmd"] == "[sleep]"
    finally:
        child.wait()


def test_an_fd_closed_during_the_scan_does_not_hide_the_process_that_owns_the_port(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy process opens and closes fds while the probe reads /proc/PID/fd: one that is gone by
    the time it is read must not hide the rest, among them the listening socket (its owner was [])."""
    real = os.readlink
    mine = f"/proc/{os.getpid()}/fd/"
    failed: list[str] = []

    def readlink(path: str) -> str:
        if path.startswith(mine) and not failed:
            failed.append(path)
            raise FileNotFoundError(path)
        return real(path)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        monkeypatch.setattr(remote_probe.os, "readlink", readlink)
        assert os.getpid() in remote_probe.listening_ports()[port]
    assert failed  # the scan did meet a vanished fd of this process
