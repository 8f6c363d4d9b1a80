"""Every name, address, MAC, folder and cgroup of a lab host and of a Slurm cluster host, written out.

host.py builds, boots and removes a machine from these values, and a host left by an earlier run is
found again only if they stay the same; so they are literals here, not computed like the code does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudeploy_lab import config
from gpudeploy_lab.config import Host, Machine, SlurmHost

# Which cgroup hierarchies a host has depends on this machine: pure v2, or hybrid (v2 at unified/ first).
PURE_V2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()


def cgroups(top: str, name: str) -> tuple[Path, ...]:
    if PURE_V2:
        return (Path(f"/sys/fs/cgroup/{top}/{name}"),)
    return (Path(f"/sys/fs/cgroup/unified/{top}/{name}"), Path(f"/sys/fs/cgroup/systemd/{top}/{name}"))


def lab(n: int, octet: int, mac: str) -> tuple[Machine, dict[str, object]]:
    name = f"lab{n}"
    return Host(n), {
        "name": name, "address": f"10.231.0.{octet}", "mac": mac, "bridge": "gdlab0",
        "netns": f"gdlab-{name}", "veth": f"gdlab-{name}",
        "run_dir": Path(f"/run/gpudeploy-lab/{name}"), "root": Path(f"/run/gpudeploy-lab/{name}/root"),
        "pid_file": Path(f"/run/gpudeploy-lab/{name}/nspawn.pid"),
        "state_dir": Path(f"/var/lib/gpudeploy-lab/hosts/{name}"),
        "log_file": Path(f"/var/lib/gpudeploy-lab/logs/{name}.log"),
        "cgroups": cgroups("gpudeploy-lab", name), "cgroup_path": f"/gpudeploy-lab/{name}",
    }


def slurm(name: str, octet: int, mac: str) -> tuple[Machine, dict[str, object]]:
    return SlurmHost(name), {
        "name": name, "address": f"10.232.0.{octet}", "mac": mac, "bridge": "gdslurm0",
        "netns": f"gds-{name}", "veth": f"gds-{name}",
        "run_dir": Path(f"/run/gpudeploy-slurm/{name}"), "root": Path(f"/run/gpudeploy-slurm/{name}/root"),
        "pid_file": Path(f"/run/gpudeploy-slurm/{name}/nspawn.pid"),
        "state_dir": Path(f"/var/lib/gpudeploy-lab/slurm/hosts/{name}"),
        "log_file": Path(f"/var/lib/gpudeploy-lab/slurm/logs/{name}.log"),
        "cgroups": cgroups("gpudeploy-slurm", name), "cgroup_path": f"/gpudeploy-slurm/{name}",
    }


CASES = [
    lab(1, 11, "02:00:0a:e7:00:0b"),
    lab(2, 12, "02:00:0a:e7:00:0c"),
    lab(64, 74, "02:00:0a:e7:00:4a"),
    slurm("slurmctl", 10, "02:00:0a:e8:00:0a"),
    slurm("slurmn1", 11, "02:00:0a:e8:00:0b"),
    slurm("slurmn2", 12, "02:00:0a:e8:00:0c"),
]


@pytest.mark.parametrize(("machine", "expected"), CASES, ids=[m.name for m, _ in CASES])
def test_every_name_address_folder_and_cgroup_of_a_host_stays_what_it_was(
        machine: Machine, expected: dict[str, object]) -> None:
    assert {key: getattr(machine, key) for key in expected} == expected


def test_the_cluster_knows_its_controller_and_the_lab_its_hosts_by_name() -> None:
    assert [(h.name, h.is_controller) for h in config.slurm_hosts()] == [
        ("slurmctl", True), ("slurmn1", False), ("slurmn2", False)]
    assert config.lab_hosts(2) == [Host(1), Host(2)] and config.host_named("lab64") == Host(64)
    assert config.host_named("slurmn1") is None and config.host_named("lab65") is None
    assert len({Host(1), Host(1), SlurmHost("slurmn1"), SlurmHost("slurmn1")}) == 2  # dict keys in control._each
