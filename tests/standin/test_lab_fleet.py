"""The lab's fleet size (64 hosts): addresses, names, bounded parallel boots, the inotify limit and
the lazy package (no root, no hosts: this only checks the code that boots them)."""

from __future__ import annotations

import ipaddress
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpudeploy_lab import config, control
from gpudeploy_lab.config import Host, PrivateLink, host_named, lab_hosts
from gpudeploy_lab.system import LabError, raise_sysctl

REPO = Path(__file__).resolve().parents[2]


def test_sixty_four_hosts_fit_in_the_bridges_subnet_and_never_in_the_private_links() -> None:
    hosts = lab_hosts(64)
    bridge = ipaddress.ip_network(f"{config.BRIDGE_ADDRESS}/{config.PREFIX_LEN}", strict=False)
    addresses = [ipaddress.ip_address(h.address) for h in hosts]
    assert config.MAX_HOSTS >= 64 and hosts[-1].address == "10.231.0.74"
    assert all(a in bridge for a in addresses) and len(set(addresses)) == 64
    assert ipaddress.ip_address(config.BRIDGE_ADDRESS) not in addresses and bridge.broadcast_address not in addresses
    assert len({h.mac for h in hosts}) == 64
    private = ipaddress.ip_network(config.PRIVATE_ROUTE)
    assert not private.overlaps(bridge)
    link = PrivateLink(Host(63), Host(64))
    assert ipaddress.ip_network(link.subnet).subnet_of(private)
    assert host_named("lab64") == Host(64) and host_named(f"lab{config.MAX_HOSTS + 1}") is None
    with pytest.raises(ValueError, match="between 1 and"):
        lab_hosts(config.MAX_HOSTS + 1)


def test_hosts_boot_at_most_a_window_at_once_and_all_get_a_result() -> None:
    running, peak, lock = [0], [0], threading.Lock()

    def boot(h: Host) -> str:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.02)
        with lock:
            running[0] -= 1
        return h.name

    hosts = lab_hosts(20)
    assert control._each(hosts, boot, workers=4) == {h: h.name for h in hosts}
    assert peak[0] == 4


def test_the_first_failed_boot_is_raised_and_hosts_not_begun_are_not_booted() -> None:
    begun: list[str] = []

    def boot(h: Host) -> None:
        begun.append(h.name)
        if h.index == 2:
            raise LabError("lab2: no ssh")
        time.sleep(0.05)

    with pytest.raises(LabError, match="lab2: no ssh"):
        control._each(lab_hosts(30), boot, workers=2)
    assert len(begun) < 30


def test_the_inotify_limit_is_raised_never_lowered(tmp_path: Path) -> None:
    knob = tmp_path / "fs" / "inotify" / "max_user_instances"
    knob.parent.mkdir(parents=True)
    knob.write_text("128\n")
    assert raise_sysctl("fs.inotify.max_user_instances", 2176, root=tmp_path) == 128
    assert knob.read_text() == "2176\n"
    assert raise_sysctl("fs.inotify.max_user_instances", 1000, root=tmp_path) is None
    assert knob.read_text() == "2176\n"
    with pytest.raises(LabError, match="cannot read"):
        raise_sysctl("fs.inotify.no_such_knob", 1, root=tmp_path)


def test_stand_in_processes_do_not_import_the_labs_control_code() -> None:
    # what every host probe (import pynvml) and every stand-in engine pays on the hosts' shared CPUs
    code = ("import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]; import pynvml, gpudeploy_lab.standin.common; "
            "print(sorted(m for m in sys.modules if m.startswith('gpudeploy_lab')))")
    out = subprocess.run([sys.executable, "-c", code, str(REPO / "lab" / "shims"), str(REPO / "src")],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    assert "gpudeploy_lab.control" not in out and "gpudeploy_lab.host" not in out, out
    import gpudeploy_lab

    assert gpudeploy_lab.up is control.up and gpudeploy_lab.config is config
    assert gpudeploy_lab.Host(3).address == "10.231.0.13"
    with pytest.raises(AttributeError):
        gpudeploy_lab.no_such_thing  # noqa: B018


def test_lab_status_gives_a_slow_handshake_another_chance(monkeypatch: pytest.MonkeyPatch) -> None:
    # Under load (the suite beside two busy loops) one handshake took longer than ssh's 3 s connect
    # timeout and `lab.status` called a booted host "ssh no"; the tests then saw too few hosts.
    calls: list[float] = []

    def slow_then_fine(address: str, command: str, timeout: float = 30, input: str | None = None,
                       jump: str | None = None, connect_timeout: float = 3) -> subprocess.CompletedProcess[str]:
        calls.append(connect_timeout)
        if len(calls) == 1:
            return subprocess.CompletedProcess([], 255, "", "Connection timed out during banner exchange")
        return subprocess.CompletedProcess([], 0, "running\n", "")

    monkeypatch.setattr(control, "ssh", slow_then_fine)
    monkeypatch.setattr(control.host, "is_running", lambda h: True)
    monkeypatch.setattr(control, "_host_pss", lambda h: 0)
    st = control.probe(Host(1))
    assert st.ssh_ok and st.systemd == "running"
    assert len(calls) == 2 and calls[0] >= 10  # a connect timeout that holds on a loaded machine
