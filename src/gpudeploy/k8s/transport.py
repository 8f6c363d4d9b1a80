"""How an engine's pods move KV cache and reach each other: TCP or RDMA, pod or host network.

SGLang's PD transfer backend defaults to ``mooncake`` (``--disaggregation-transfer-backend``),
whose engine starts RDMA unless ``MC_FORCE_TCP`` is set: a pod without RDMA access fails at
startup ("Mooncake Transfer Engine initialization failed"). SGLang 0.5.23's own ``mooncake_tcp``
backend is exactly mooncake with ``MC_FORCE_TCP=1`` (``srt/arg_groups/pd_disaggregation_hook.py``),
which 0.5.10 lacks but its mooncake honours. So a role gets RDMA only where something says the
pods can have it: InfiniBand devices named (``disaggregation_ib_device``) or an RDMA device
plugin's resource (``kubernetes.rdma_resource``, e.g. llm-d's ``rdma/ib: 1``); otherwise mooncake
is told to use TCP, and the notes say so.

RDMA needs the device cgroup to let the container open ``/dev/infiniband``'s uverbs: the RDMA
device plugin's resource does that and puts the pod's devices there (requested = limit = 1, as
llm-d's CoreWeave overlay), or ``kubernetes.privileged: true`` with the node's ``/dev/infiniband``
mounted (SGLang's LWS chart; a privileged container also sees every GPU of its node).
Neither is an error rather than a pod that crashes. The references put RDMA pods on the host
network (SGLang's ``lws_pd`` examples, OME's RDMA PD runtime), the default here;
``kubernetes.host_network`` chooses.

On a multi-NIC node's host network gloo, NCCL and SGLang's bootstrap would each pick an interface
of their own. The inventory's ``kubernetes.socket_ifname`` becomes ``GLOO_SOCKET_IFNAME`` and
``NCCL_SOCKET_IFNAME`` (OME's and Dynamo's examples set GLOO_SOCKET_IFNAME=eth0), and a host-network
pod advertises the pod's address, which is the node's, as ``SGLANG_HOST_IP`` (SGLang's
``get_local_ip_auto`` reads it first, ``srt/utils/common.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import Problem
from ..model import Role
from .roleset import RoleSet, problem

IB_SETTING = "disaggregation_ib_device"  # SGLang's --disaggregation-ib-device
BACKEND_SETTING = "disaggregation_transfer_backend"
DEFAULT_BACKEND = "mooncake"  # SGLang's default for --disaggregation-transfer-backend
RDMA_BACKENDS = ("mooncake", "nixl", "mori")  # those that take RDMA when the pod has it
HOST_IP_ENV = {"name": "SGLANG_HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}


@dataclass(frozen=True)
class Network:
    backend: str | None  # the PD transfer backend; None: the role moves no KV
    kv: str | None  # "tcp", "rdma", or None (no KV transfer, or a backend that picks its own transport)
    rdma: bool  # the pods get RDMA devices (for KV transfer and for NCCL between nodes)
    ib_devices: str | None
    rdma_resource: str | None = None  # requested = limit = 1 per pod
    privileged: bool = False
    host_network: bool = False
    env: dict[str, str] = field(default_factory=dict)  # public env the role's ConfigMap gets (the user's wins)
    pod_env: tuple[dict[str, Any], ...] = ()  # env the container takes from its pod (fieldRef)


def ib_devices(role: Role) -> str | None:
    """The InfiniBand devices the role names (SGLang's --disaggregation-ib-device), or None."""
    value = role.settings.get(IB_SETTING)
    if value is None or value is False or value == "":
        return None
    return ",".join(str(v) for v in value) if isinstance(value, list) else str(value)


def transfer_backend(role: Role) -> str | None:
    if role.settings.get("disaggregation_mode") not in ("prefill", "decode"):
        return None
    return str(role.settings.get(BACKEND_SETTING) or DEFAULT_BACKEND)


def network(rs: RoleSet, problems: list[Problem]) -> Network:
    role = rs.role
    backend = transfer_backend(role)
    ib = ib_devices(role) if backend != "mooncake_tcp" else None  # SGLang drops the devices for mooncake_tcp
    rdma = bool(ib) or (bool(rs.settings.rdma_resource) and (backend in RDMA_BACKENDS or rs.size > 1))
    env: dict[str, str] = {}
    if rdma and ib:
        env["NCCL_IB_HCA"] = ib  # NCCL across nodes on the same HCAs the KV transfer uses
    kv: str | None = None
    if backend in RDMA_BACKENDS and rdma:
        kv = "rdma"
    elif backend == "mooncake":
        kv = "tcp"
        env["MC_FORCE_TCP"] = "1"  # what SGLang's mooncake_tcp sets: mooncake's TCP transport
    elif backend == "mooncake_tcp":
        kv = "tcp"
    if rs.settings.socket_ifname:
        env["GLOO_SOCKET_IFNAME"] = env["NCCL_SOCKET_IFNAME"] = rs.settings.socket_ifname
    resource = rs.settings.rdma_resource if rdma else None
    privileged = bool(rs.settings.privileged)
    if rdma and not resource and not privileged:
        problems.append(problem(rs, f"settings.{IB_SETTING}", (
            f"this role names InfiniBand devices ({ib}), but its pods could not open them: the device cgroup "
            "blocks /dev/infiniband's uverbs unless the pod asks an RDMA device plugin for its resource "
            "(kubernetes.rdma_resource in the inventory, e.g. rdma/ib) or runs privileged (kubernetes.privileged: "
            "true in the role)")))
    host_network = rs.settings.host_network if rs.settings.host_network is not None else rdma
    pod_env = (HOST_IP_ENV,) if host_network else ()
    return Network(backend=backend, kv=kv, rdma=rdma, ib_devices=ib, rdma_resource=resource,
                   privileged=privileged, host_network=host_network, env=env, pod_env=pod_env)


def role_env(net: Network, env: dict[str, str]) -> dict[str, str]:
    """The role's public env with the transport's added where the user set nothing."""
    return {**env, **{k: v for k, v in net.env.items() if k not in env}}


def tcp_note(sets: list[tuple[RoleSet, Network]]) -> str | None:
    tcp = [rs.role.name for rs, net in sets if net.kv == "tcp" and net.backend == "mooncake"]
    if not tcp:
        return None
    return (f"KV cache moves over TCP for {', '.join(tcp)}: they use mooncake (SGLang's default transfer backend), "
            "which starts RDMA and fails without it, and they name no InfiniBand devices (settings."
            f"{IB_SETTING}) and the inventory names no RDMA device plugin resource (kubernetes.rdma_resource), so "
            "MC_FORCE_TCP=1 is set (what SGLang's own mooncake_tcp backend sets). Name either for RDMA.")


def rdma_note(sets: list[tuple[RoleSet, Network]]) -> str | None:
    rdma = [(rs, net) for rs, net in sets if net.rdma]
    if not rdma:
        return None
    ways: dict[str, list[str]] = {}
    for rs, net in rdma:
        how = [f"the RDMA device plugin's {net.rdma_resource} (1 per pod)"] if net.rdma_resource else []
        how += ["privileged: true (a privileged container sees every GPU of its node, not only the ones it "
                "requested, and mounts the node's /dev/infiniband)"] if net.privileged else []
        ways.setdefault(" and ".join(how), []).append(rs.role.name)
    parts = [f"{', '.join(roles)} through {how}" for how, roles in ways.items()]
    return (f"RDMA: {'; '.join(parts)}, with IPC_LOCK and, where devices are named, NCCL_IB_HCA. GID index, traffic "
            "class and service level are your fabric's: set NCCL_IB_* in the role's env.")


def host_network_note(sets: list[tuple[RoleSet, Network]]) -> str | None:
    hosted = [rs.role.name for rs, net in sets if net.host_network]
    if not hosted:
        return None
    text = (f"{', '.join(hosted)} run on the host network (dnsPolicy ClusterFirstWithHostNet): their ports are the "
            "node's, and the scheduler keeps two pods that use one port off the same node (on the host network a "
            "containerPort is also a hostPort).")
    unpinned = [rs.role.name for rs, net in sets if net.host_network and not rs.settings.socket_ifname]
    if unpinned:
        text += (f" {', '.join(unpinned)} name no interface: gloo and NCCL pick one of the node's themselves, which "
                 "on a node with several NICs may not be the one the other pods reach; name it with "
                 "kubernetes.socket_ifname in the inventory (GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME).")
    return text + " SGLANG_HOST_IP is the pod's address, which there is the node's."
