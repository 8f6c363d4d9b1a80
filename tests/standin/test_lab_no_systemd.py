"""The lab's host without systemd, in its pure parts (the boot itself is exercised on the real lab)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from standin_support import PYTHON, wait_for

from gpudeploy_lab import control, host
from gpudeploy_lab.config import Host
from gpudeploy_lab.control import NO_SYSTEMD, HostStatus


@pytest.fixture(autouse=True)
def no_engine_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(host.engine, "bind_mount", lambda: (tmp_path / "engines", "/opt/gpudeploy/engines"))


def test_a_host_without_systemd_differs_only_in_what_nspawn_runs(tmp_path: Path) -> None:
    h = Host(9)
    with_systemd = host.nspawn_argv(h, tmp_path)
    without = host.nspawn_argv(h, tmp_path, systemd=False)
    assert "--boot" in with_systemd and "--as-pid2" not in with_systemd and "--" not in with_systemd
    assert without[:len(with_systemd)] == [a if a != "--boot" else "--as-pid2" for a in with_systemd]
    assert without[len(with_systemd):] == ["--", "/bin/sh", "-c", host.NO_SYSTEMD_INIT]
    # what systemd's units would have done, then sshd in the foreground logging to the console
    assert host.NO_SYSTEMD_INIT.endswith("exec /usr/sbin/sshd -D -e")
    for step in ("mkdir -p /run/sshd /run/gpudeploy-lab/gpu-procs", "ssh-keygen -q -t ed25519"):
        assert step in host.NO_SYSTEMD_INIT


def test_boots_systemd_reads_nspawn_s_own_options_only(monkeypatch: pytest.MonkeyPatch) -> None:
    sleep = "import time; time.sleep(30)"
    procs = {name: subprocess.Popen([PYTHON, "-c", sleep, *args])
             for name, args in (("boot", ["--boot"]), ("pid2", ["--as-pid2", "--", "/bin/sh", "-c", "--boot"]))}
    try:
        for name, proc in procs.items():
            # until its exec: a child just forked still shows pytest's command line (a loaded suite
            # read that one and said "no --boot")
            wait_for(lambda pid=proc.pid: sleep.encode() in Path(f"/proc/{pid}/cmdline").read_bytes(), 60)
            monkeypatch.setattr(host, "nspawn_pid", lambda h, pid=proc.pid: pid)
            assert host.boots_systemd(Host(9)) is (name == "boot")
        monkeypatch.setattr(host, "nspawn_pid", lambda h: None)
        assert host.boots_systemd(Host(9)) is None
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()


def test_status_line_says_no_systemd() -> None:
    line = HostStatus(Host(9), up=True, ssh_ok=True, systemd=NO_SYSTEMD, pss_kib=15 * 1024).line()
    assert line == "lab9   up      10.231.0.19  ssh ok  no systemd        ram 15 MiB"
    other = HostStatus(Host(1), up=True, ssh_ok=True, systemd="running", pss_kib=15 * 1024).line()
    assert len(other) == len(line) and "systemd running" in other  # the columns stay where they were
    assert not HostStatus(Host(9), True, True, NO_SYSTEMD).has_systemd


def test_up_checks_its_hosts_before_touching_anything() -> None:
    with pytest.raises(ValueError, match="no hosts wanted"):
        control.up(0)
    with pytest.raises(ValueError, match="not a lab host name: 'gpu1'"):
        control.up(3, no_systemd=["gpu1"])
    with pytest.raises(ValueError, match="both must be among the hosts wanted"):
        control.up(0, no_systemd=["lab9"], private=[("lab2", "lab9")])
    assert control.parse_names(" lab3, lab9 ,") == ["lab3", "lab9"]
