"""Helpers for deploy tests on the lab: throwaway inventories and running gpudeploy as a user does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

if TYPE_CHECKING:
    from conftest import Lab

REPO = Path(__file__).resolve().parents[2]
KEY = "/var/lib/gpudeploy-lab/id_ed25519"
KNOWN_HOSTS = "/var/lib/gpudeploy-lab/known_hosts"
T = TypeVar("T")
NUMA = [{"id": 0, "gpus": [0, 1, 2, 3], "cpus": "0"}, {"id": 1, "gpus": [4, 5, 6, 7], "cpus": "1"}]


def standin_role(fault: str | None = None, *, tp: int = 2, speed: float = 0.3, timeout_s: float = 30,
                 settings: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    env = {"SGLANG_STANDIN_SPEED": str(speed)}
    if fault:
        env["SGLANG_STANDIN_FAULT"] = fault
    role = {"engine": "sglang", "tp_size": tp, "model": {"path": "/models/tiny"},
            "settings": settings or {}, "env": env, "health": {"timeout_s": timeout_s}, "stop_timeout_s": 3}
    role.update(extra)
    return role


def write_inventory(root: Path, *, deployment: str, hosts: dict[str, tuple[str, list[Any]]],
                    roles: dict[str, dict[str, Any]], connect_timeout_s: float = 5,
                    host_settings: dict[str, dict[str, Any]] | None = None) -> Path:
    """hosts: name -> (address, roles placed); host_settings: name -> more keys of that host."""
    (root / "roles").mkdir(parents=True, exist_ok=True)
    for name, role in roles.items():
        (root / "roles" / f"{name}.yml").write_text(yaml.safe_dump(role, sort_keys=False))
    inv = {
        "deployment": deployment, "roles_dir": "roles",
        "defaults": {"ssh": {"user": "root", "key": KEY, "known_hosts": KNOWN_HOSTS,
                             "connect_timeout_s": connect_timeout_s},
                     "gpu_memory_gib": 96, "engine_versions": {"sglang": "0.5.23", "sglang_router": "0.3.2"},
                     "python": "/usr/bin/python3", "numa_policy": "none"},
        "hosts": {name: {"address": addr, "numa_nodes": NUMA, "roles": placed, **(host_settings or {}).get(name, {})}
                  for name, (addr, placed) in hosts.items()},
    }
    path = root / "hosts.yml"
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path


# Tests keep their measured memory figures away from the user's own calibration store.
CALIBRATION = Path(tempfile.gettempdir()) / f"gpudeploy-test-calibration-{os.getpid()}.json"
# ... and the --help of releases they teach gpudeploy away from the user's own cache of them.
FLAGS_CACHE = Path(tempfile.gettempdir()) / f"gpudeploy-test-flags-{os.getpid()}"
# ... and what hosts answered (or could not) when asked for their release's memory defaults.
DEFAULTS_CACHE = Path(tempfile.gettempdir()) / f"gpudeploy-test-defaults-{os.getpid()}"
# The environment of every gpudeploy command a test starts: these three stores, this run's own.
STORES = {"GPUDEPLOY_CALIBRATION": str(CALIBRATION), "GPUDEPLOY_FLAGS_CACHE": str(FLAGS_CACHE),
          "GPUDEPLOY_DEFAULTS_CACHE": str(DEFAULTS_CACHE)}


def gd(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """Run `invoke ARGS` from the repo, as a user would."""
    return subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **STORES})


def status_json(inventory: Path, *extra: str) -> dict[str, Any]:
    res = gd("status", "--inventory", str(inventory), "--json", *extra)
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


def http(url: str, body: dict[str, Any] | None = None, timeout: float = 5) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(exc)


def poll(what: str, probe: Callable[[], T | None], timeout: float, interval: float = 0.05) -> T:
    """``probe()`` until it returns something other than None (a falsy value counts, unlike
    :func:`wait_for`); fail naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(interval)  # the poll's pause; the deadline bounds the wait


def wait_for(cond: Callable[[], Any], timeout: float, what: str, every: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class Deployments:
    """Makes throwaway inventories and tears every one of them down (with --purge) afterwards."""

    def __init__(self, lab: Lab, root: Path) -> None:
        self.lab = lab
        self.root = root
        self.made: list[Path] = []

    def inventory(self, name: str, roles: dict[str, dict[str, Any]], host: str = "lab2",
                  placed: list[Any] | None = None, extra_hosts: dict[str, tuple[str, list[Any]]] | None = None,
                  connect_timeout_s: float = 5, host_settings: dict[str, dict[str, Any]] | None = None) -> Path:
        hosts = {host: (self.lab.address_of(host), placed if placed is not None else list(roles))}
        hosts.update(extra_hosts or {})
        path = write_inventory(self.root / name, deployment=name, hosts=hosts, roles=roles,
                               connect_timeout_s=connect_timeout_s, host_settings=host_settings)
        self.made.append(path)
        return path

    def cleanup(self) -> None:
        for path in self.made:
            for host in yaml.safe_load(path.read_text())["hosts"]:
                gd("teardown", "--inventory", str(path), "--host", host, "--purge")


def unit_pids(lab: Lab, host: str, unit: str) -> list[int]:
    """The PIDs in the unit's cgroup, as systemd names it. An inactive unit has none (systemd clears
    ControlGroup); an active one whose cgroup file cannot be read fails the test, never reads as []."""
    cgroup = lab.ssh(host, f"systemctl show -p ControlGroup --value {unit}", check=True).stdout.strip()
    if not cgroup:
        return []
    res = lab.ssh(host, f"cat /sys/fs/cgroup{cgroup}/cgroup.procs", check=True)
    return [int(x) for x in res.stdout.split()]


def main_pid(lab: Lab, host: str, unit: str) -> int:
    return int(lab.ssh(host, f"systemctl show -p MainPID --value {unit}", check=True).stdout.strip())


def alive(lab: Lab, host: str, pid: int) -> bool:
    return lab.ssh(host, f"test -e /proc/{pid}").returncode == 0


def interrupt_at(proc: subprocess.Popen[str], marker: str) -> tuple[str, float]:
    """Read until ``marker``, send SIGINT, read to the end: (output, seconds from SIGINT to exit)."""
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if marker in line:
            break
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        out = "".join(seen) + proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return out, time.monotonic() - sent
