"""The ``kubernetes:`` settings of inventories and roles: read as written, merged host under role,
and every bad value reported with its file and line (nothing else is read past a bad one)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from k8stools import PREFILL, pd_inventory, write_inventory

from gpudeploy.errors import InputError
from gpudeploy.inventory import load_inventory
from gpudeploy.model import K8sSettings


def test_settings_are_read_and_a_host_keeps_the_defaults_it_does_not_override(tmp_path: Path) -> None:
    inv = write_inventory(tmp_path, {
        "n1": {"address": "192.0.2.11", "roles": ["prefill"],
               "kubernetes": {"socket_ifname": "bond0", "node_selector": {"pool": "h200"}}},
        "n2": {"address": "192.0.2.12", "roles": []},
    }, {"prefill": {**PREFILL, "kubernetes": {"qos": "guaranteed", "shm_gib": 32, "tolerations": [
        {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}]}}},
        defaults={"kubernetes": {"rdma_resource": "rdma/ib", "socket_ifname": "eth0",
                                 "node_selector": {"nvidia.com/gpu.present": "true"}, "reserved_cpus": 4}})
    loaded = load_inventory(inv)
    n1, n2 = loaded.hosts["n1"].kubernetes, loaded.hosts["n2"].kubernetes
    assert (n1.rdma_resource, n1.socket_ifname, n1.reserved_cpus) == ("rdma/ib", "bond0", 4)
    assert n1.node_selector == {"nvidia.com/gpu.present": "true", "pool": "h200"}
    assert n2.socket_ifname == "eth0" and n2.node_selector == {"nvidia.com/gpu.present": "true"}
    role = loaded.roles["prefill"].kubernetes
    assert (role.qos, role.shm_gib) == ("guaranteed", 32.0)
    merged = n1.under(role)
    assert merged.tolerations == ({"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"},)
    assert merged.where["qos"].file.endswith("roles/prefill.yml") and merged.where["qos"].line
    assert merged.where["socket_ifname"].file == inv


def test_an_inventory_without_the_section_loads_as_before(tmp_path: Path) -> None:
    loaded = load_inventory(pd_inventory(tmp_path))
    assert loaded.hosts["n1"].kubernetes == K8sSettings()
    assert all(r.kubernetes == K8sSettings() for r in loaded.roles.values())
    assert [n.memory_gib for n in loaded.hosts["n1"].numa_nodes] == [None, None]


def test_numa_node_memory_is_read(tmp_path: Path) -> None:
    nodes = [{"id": 0, "gpus": [0, 1, 2, 3], "cpus": "0-15", "memory_gib": 512},
             {"id": 1, "gpus": [4, 5, 6, 7], "cpus": "16-31", "memory_gib": 512.5}]
    inv = write_inventory(tmp_path, {"n1": {"address": "192.0.2.11", "numa_nodes": nodes, "roles": []}}, {})
    assert [n.memory_gib for n in load_inventory(inv).hosts["n1"].numa_nodes] == [512.0, 512.5]


BAD_HOST = [
    ({"node_selector": {"bad key!": "x"}}, "kubernetes.node_selector", "is not a Kubernetes label key"),
    ({"node_selector": {"pool": True}}, "kubernetes.node_selector", "must be a string (quote it"),
    ({"tolerations": [{"key": "a", "operator": "Exists", "value": "b"}]}, "kubernetes.tolerations[0].value",
     "operator Exists takes no value"),
    ({"tolerations": [{"key": "a", "effect": "NoScheduel"}]}, "kubernetes.tolerations[0].effect",
     "one of NoSchedule, PreferNoSchedule, NoExecute"),
    ({"tolerations": [{"operator": "Equal"}]}, "kubernetes.tolerations[0].operator", "must have operator Exists"),
    ({"affinity": {"nodeAffinty": {}}}, "kubernetes.affinity", "unknown affinity nodeAffinty"),
    ({"rdma_resource": "nvidia.com/gpu"}, "kubernetes.rdma_resource", "is not an extended resource name"),
    ({"rdma_resource": "ib"}, "kubernetes.rdma_resource", "is not an extended resource name"),
    ({"socket_ifname": "eth0; rm -rf /"}, "kubernetes.socket_ifname", "a network interface name"),
    ({"reserved_cpus": -1}, "kubernetes.reserved_cpus", "must be >= 0"),
    ({"qos": "guaranteed"}, "kubernetes.qos", "unknown key"),  # a role's choice, not a node's
]


@pytest.mark.parametrize("settings,key,needle", BAD_HOST, ids=[b[1] + ":" + b[2][:20] for b in BAD_HOST])
def test_bad_inventory_values_are_reported_with_file_line_host_and_key(tmp_path: Path, settings: dict[str, object],
                                                                       key: str, needle: str) -> None:
    inv = write_inventory(tmp_path, {"n1": {"address": "192.0.2.11", "roles": [], "kubernetes": settings}}, {})
    with pytest.raises(InputError) as err:
        load_inventory(inv)
    [problem] = err.value.problems
    assert needle in problem.message and problem.key == key and problem.host == "n1"
    assert problem.file == inv
    leaf = key.split(".")[-1]
    assert problem.line is not None and f"{leaf}:" in Path(inv).read_text().splitlines()[problem.line - 1]


BAD_ROLE = [
    ({"qos": "besteffort"}, "kubernetes.qos", "one of burstable, guaranteed"),
    ({"cpus": 0}, "kubernetes.cpus", "must be >= 1"),
    ({"cpus": 2.5}, "kubernetes.cpus", "expected an integer"),
    ({"shm_gib": 0}, "kubernetes.shm_gib", "must be positive"),
    ({"privileged": "yes"}, "kubernetes.privileged", "expected true/false"),
    ({"service_discovery": True}, "kubernetes.service_discovery", "is for routers"),
    ({"reserved_cpus": 2}, "kubernetes.reserved_cpus", "unknown key"),  # a node's fact, not a role's
]


@pytest.mark.parametrize("settings,key,needle", BAD_ROLE, ids=[b[1] + ":" + b[2][:20] for b in BAD_ROLE])
def test_bad_role_values_are_reported_with_the_role_file_and_line(tmp_path: Path, settings: dict[str, object],
                                                                  key: str, needle: str) -> None:
    inv = pd_inventory(tmp_path, prefill={"kubernetes": settings})
    with pytest.raises(InputError) as err:
        load_inventory(inv)
    [problem] = err.value.problems
    assert needle in problem.message and problem.key == key and problem.role == "prefill"
    role_file = tmp_path / "roles" / "prefill.yml"
    assert problem.file == str(role_file)
    text = role_file.read_text().splitlines()
    assert problem.line is not None and key.split(".")[-1] in text[problem.line - 1]


def test_a_bad_numa_memory_size_is_reported(tmp_path: Path) -> None:
    nodes = [{"id": 0, "gpus": [0], "cpus": "0", "memory_gib": -5}]
    inv = write_inventory(tmp_path, {"n1": {"address": "192.0.2.11", "numa_nodes": nodes, "roles": []}}, {})
    with pytest.raises(InputError) as err:
        load_inventory(inv)
    [problem] = err.value.problems
    assert problem.key == "numa_nodes[0].memory_gib" and "must be positive" in problem.message


def test_yaml_of_the_roles_stays_plain(tmp_path: Path) -> None:
    """An affinity is dumped into manifests as written: plain mappings, no line-number wrappers."""
    aff = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]}]}}}
    inv = pd_inventory(tmp_path, prefill={"kubernetes": {"affinity": aff}})
    got = load_inventory(inv).roles["prefill"].kubernetes.affinity
    assert got == aff and type(got) is dict
    assert yaml.safe_dump(got)  # SafeDumper refuses subclasses of dict
