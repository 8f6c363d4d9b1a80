"""Smoke tests of the lab itself: a hand-written unit running the stand-in engine on two hosts, and a
full down (nothing left behind) followed by up again.

Every wait is a condition polled against a deadline.
"""

from __future__ import annotations

import http.client
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import gpudeploy_lab as labctl
from gpudeploy_lab import config

if TYPE_CHECKING:
    from conftest import Lab, LabHost

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]

UNIT_NAME = "gd-lab-smoke.service"
PORT = 30000
# --host 0.0.0.0: like the real SGLang, the stand-in listens on 127.0.0.1 unless told otherwise,
# and this test polls /health from the main machine.
UNIT = f"""\
[Unit]
Description=gpudeploy lab smoke test: SGLang stand-in

[Service]
Type=exec
Environment=SGLANG_STANDIN_SPEED=0.2
ExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /models/tiny --host 0.0.0.0 \\
  --port {PORT} --tp-size 2
TimeoutStopSec=10
"""
SHIM = REPO / "lab" / "shims" / "sglang" / "launch_server.py"


def health(address: str) -> str:
    """'closed' (nothing listening), 'error' (connection broke) or the HTTP status of /health.

    http.client never consults *_proxy environment variables, so this goes straight to the host.
    """
    conn = http.client.HTTPConnection(address, PORT, timeout=2)
    try:
        conn.request("GET", "/health")
        return str(conn.getresponse().status)
    except ConnectionRefusedError:
        return "closed"
    except OSError as exc:
        return f"error: {exc}"
    finally:
        conn.close()


def watch_health(addresses: list[str], timeout: float) -> dict[str, list[str]]:
    """Poll each address until it answers 200 or the deadline passes; return the observed states,
    consecutive repeats collapsed (e.g. ['closed', '503', '200'])."""
    seen: dict[str, list[str]] = {a: [] for a in addresses}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(s[-1:] != ["200"] for s in seen.values()):
        for address, states in seen.items():
            if states[-1:] != ["200"]:
                state = health(address)
                if states[-1:] != [state]:
                    states.append(state)
        time.sleep(0.05)
    return seen


def show(lab: Lab, host: LabHost, *props: str) -> dict[str, str]:
    out = lab.ssh(host, f"systemctl show {' '.join('-p ' + p for p in props)} {UNIT_NAME}", check=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_standin_unit_starts_serves_and_stops_cleanly(lab: Lab) -> None:
    if not SHIM.exists():
        pytest.skip(f"the stand-in shim {SHIM.relative_to(REPO)} does not exist yet")
    hosts = lab.hosts[:2]
    assert len(hosts) == 2, f"need 2 lab hosts, have {lab.hosts}"
    for host in hosts:
        lab.ssh(host, f"cat > /etc/systemd/system/{UNIT_NAME} && systemctl daemon-reload",
                input=UNIT, check=True)
    try:
        for host in hosts:
            lab.ssh(host, f"systemctl start {UNIT_NAME}", check=True)
        seen = watch_health([h.address for h in hosts], timeout=60)
        for host in hosts:
            states = seen[host.address]
            journal = lab.ssh(host, f"journalctl -u {UNIT_NAME} --no-pager -n 30").stdout
            assert states[-1:] == ["200"], f"{host.name}: /health never answered 200: {states}\n{journal}"
            # Nothing but 'closed' (loading), 503 (warming up), 200 (ready), in that order;
            # 503 may be too brief to observe.
            assert states in (["closed", "503", "200"], ["closed", "200"], ["503", "200"], ["200"]), \
                f"{host.name}: unexpected /health sequence {states}\n{journal}"
            assert show(lab, host, "ActiveState")["ActiveState"] == "active"
    finally:
        for host in hosts:
            lab.ssh(host, f"systemctl stop {UNIT_NAME}")
    for host in hosts:
        props = show(lab, host, "MainPID", "ActiveState", "ControlGroup")
        assert props["MainPID"] == "0", f"{host.name}: {props}"
        assert props["ActiveState"] in ("inactive", "failed"), f"{host.name}: {props}"
        procs = lab.ssh(host, f"cat /sys/fs/cgroup/system.slice/{UNIT_NAME}/cgroup.procs 2>/dev/null").stdout
        assert procs.split() == [], f"{host.name}: processes left in the unit's cgroup: {procs.split()}"
        assert health(host.address) == "closed"
        lab.ssh(host, f"rm -f /etc/systemd/system/{UNIT_NAME} && systemctl daemon-reload", check=True)


# Runs last in this file; restores the lab it found, so tests in other files still have hosts.
def test_down_leaves_nothing_behind_then_up_again(lab: Lab) -> None:
    count = max(3, max((int(h.name.removeprefix("lab")) for h in lab.hosts), default=0))
    labctl.down()  # raises LabError naming what it could not remove
    try:
        assert labctl.leftovers() == []
        assert not Path("/run/netns").exists() or not [
            p for p in Path("/run/netns").iterdir() if p.name.startswith(config.NET_PREFIX)]
        assert not Path("/sys/class/net", config.BRIDGE).exists()
        mountinfo = Path("/proc/self/mountinfo").read_text()
        for lab_dir in (config.RUN_DIR, config.STATE_DIR, config.CACHE_DIR):
            assert f" {lab_dir}/" not in mountinfo and f" {lab_dir} " not in mountinfo
        for cgroup in config.CGROUP_ROOTS:
            assert not cgroup.exists(), f"{cgroup} is left"
        assert labctl.status() == []
    finally:
        labctl.up(count)
        lab.refresh()
    assert [h.name for h in lab.hosts][:count] == [f"lab{i}" for i in range(1, count + 1)], \
        "\n".join(st.line() for st in labctl.status())
