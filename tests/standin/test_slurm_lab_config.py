"""The lab's Slurm cluster without booting it: its names never collide with the main lab's (so the
two run side by side and neither's up/down touches the other), the Slurm files carry the settings that
work in these containers, readiness is read right, and ``python -m gpudeploy_lab down`` (CI's
cleanup) takes both down while ``down --only`` and ``slurm down`` take only what they name."""

from __future__ import annotations

import ipaddress

import pytest

from gpudeploy_lab import __main__ as lab_main
from gpudeploy_lab import config, rootfs, slurm, slurmfiles
from gpudeploy_lab.config import SlurmHost, lab_hosts, slurm_hosts
from gpudeploy_lab.system import LabError


def test_the_cluster_shares_no_name_address_folder_or_cgroup_with_the_main_lab() -> None:
    ours, theirs = slurm_hosts(), lab_hosts(config.MAX_HOSTS)
    assert [h.name for h in ours] == ["slurmctl", "slurmn1", "slurmn2"]
    assert [h.address for h in ours] == ["10.232.0.10", "10.232.0.11", "10.232.0.12"]
    bridge = ipaddress.ip_network(f"{config.SLURM_BRIDGE_ADDRESS}/24", strict=False)
    assert all(ipaddress.ip_address(h.address) in bridge for h in ours)
    assert not bridge.overlaps(ipaddress.ip_network(f"{config.BRIDGE_ADDRESS}/24", strict=False))
    for h in ours:
        assert len(h.veth) <= 15  # IFNAMSIZ
        assert not h.netns.startswith(config.NET_PREFIX) and h.bridge != config.BRIDGE
        assert config.RUN_DIR not in h.root.parents and (config.STATE_DIR / "hosts") not in h.state_dir.parents
        assert all(cg.parent not in config.CGROUP_ROOTS for cg in h.cgroups)
        assert h.cgroup_path.startswith(f"/{config.SLURM_CGROUP_NAME}/")
    assert {h.mac for h in ours}.isdisjoint(h.mac for h in theirs)
    assert all(config.host_named(h.name) is None for h in ours)  # the main lab's sweep never picks them up
    # the main lab's down removes other keys of rootfs-*; the cluster's image is not one of them
    assert not slurm.image_dir().match("rootfs-*") and slurm.image_dir().parent == rootfs.base_dir().parent
    # a private link of the main lab (10.232.<lab index>.0/24) never lands on the cluster's bridge
    assert all(ipaddress.ip_network(config.PrivateLink(lab_hosts(2)[0], h).subnet) != bridge for h in theirs)


def test_slurm_conf_declares_the_machines_cpus_and_the_settings_that_run_in_nspawn() -> None:
    conf = slurmfiles.slurm_conf(slurmfiles.NodeShape(cpus=2, real_memory_mb=24105))
    node = next(line for line in conf.splitlines() if line.startswith("NodeName="))
    assert node == ("NodeName=slurmn[1-2] CPUs=2 Boards=1 SocketsPerBoard=2 CoresPerSocket=1 ThreadsPerCore=1 "
                    "RealMemory=24105 Gres=gpu:8 State=UNKNOWN")
    settings = dict(line.split("=", 1) for line in conf.splitlines() if "=" in line and not line.startswith("#"))
    assert settings["ProctrackType"] == "proctrack/linuxproc" and settings["TaskPlugin"] == "task/affinity"
    assert settings["JobAcctGatherType"] == "jobacct_gather/linux"
    assert settings["AccountingStorageType"] == "accounting_storage/slurmdbd"
    assert settings["SlurmdParameters"] == "config_overrides" and settings["ClusterName"] == "gdlab"
    assert "PartitionName=gpu Nodes=ALL Default=YES" in conf
    assert "CgroupPlugin=cgroup/v1" in slurmfiles.CGROUP_CONF
    assert "Name=gpu File=/dev/nvidia[0-7]" in slurmfiles.GRES_CONF
    assert slurmfiles.NodeShape(cpus=3, real_memory_mb=1).sockets == 1


def test_each_host_enables_only_its_roles_units_and_the_db_password_stays_out_of_any_shell() -> None:
    ctl = {f.path for f in slurmfiles.host_files(True, slurmfiles.NodeShape(2, 1000), "ab12")}
    node = {f.path for f in slurmfiles.host_files(False, slurmfiles.NodeShape(2, 1000), "ab12")}
    assert "etc/slurm/slurmdbd.conf" in ctl and "etc/slurm/slurmdbd.conf" not in node
    assert "etc/systemd/system/fake-nvidia-devs.service" in node - ctl
    assert "slurmd.service" not in slurmfiles.enabled_units(True)
    assert {"slurmctld.service", "slurmdbd.service", "mariadb.service"}.isdisjoint(slurmfiles.enabled_units(False))
    with pytest.raises(ValueError):
        slurmfiles.acct_db_sql("x'; DROP DATABASE mysql; --")


def test_the_cluster_is_ready_only_with_both_nodes_idle_and_sacct_answering() -> None:
    assert slurm.parse_readiness("slurmn1 idle\nslurmn2 idle\nsacct-ok\n").ready
    starting = slurm.parse_readiness("slurmn1 idle\nslurmn2 unk*\nsacct-ok\n")
    assert not starting.ready and "slurmn2 unk*" in starting.describe()
    no_db = slurm.parse_readiness("slurmn1 idle\nslurmn2 idle\n")
    assert not no_db.ready and "sacct does not answer" in no_db.describe()


def test_lab_down_takes_the_cluster_down_too_and_down_only_or_slurm_down_only_theirs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(lab_main.control, "down", lambda only=(): calls.append(f"lab {list(only)}"))
    monkeypatch.setattr(lab_main.slurm, "down", lambda: calls.append("slurm"))
    assert lab_main.main(["down"]) == 0 and calls == ["lab []", "slurm"]
    calls.clear()
    assert lab_main.main(["down", "--only", "lab3"]) == 0 and calls == ["lab ['lab3']"]
    calls.clear()
    assert lab_main.main(["slurm", "down"]) == 0 and calls == ["slurm"]


def test_lab_down_still_takes_the_cluster_down_when_the_main_lab_fails_to(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[str] = []

    def lab_down(only: object = ()) -> None:
        raise LabError("lab down left behind: mount /run/gpudeploy-lab/lab1/root")

    monkeypatch.setattr(lab_main.control, "down", lab_down)
    monkeypatch.setattr(lab_main.slurm, "down", lambda: calls.append("slurm"))
    assert lab_main.main(["down"]) == 1 and calls == ["slurm"]
    assert "mount /run/gpudeploy-lab/lab1/root" in capsys.readouterr().err


def test_a_slurm_host_is_named_by_what_it_runs() -> None:
    assert SlurmHost("slurmctl").is_controller and not SlurmHost("slurmn2").is_controller
    assert slurmfiles.node_range() == "slurmn[1-2]"
