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
device plugin's resource does that (requested = limit = 1), or ``kubernetes.privileged: true``
(SGLang's LWS chart runs privileged; a privileged container also sees every GPU of its node).
Neither is an error rather than a pod that crashes. The references put RDMA pods on the host
network (SGLang's ``lws_pd`` examples, OME's RDMA PD runtime), the default here;
``kubernetes.host_network`` chooses.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import Problem
from ..model import Role
from .roleset import RoleSet

IB_SETTING = "disaggregation_ib_device"  # SGLang's --disaggregation-ib-device
BACKEND_SETTING = "disaggregation_transfer_backend"
DEFAULT_BACKEND = "mooncake"  # SGLang's default for --disaggregation-transfer-backend
RDMA_BACKENDS = ("mooncake", "nixl", "mori")  # those that take RDMA when the pod has it


@dataclass(frozen=True)
class Network:
    backend: str | None  # the PD transfer backend; None: the role moves no KV
    kv: str | None  # "tcp", "rdma", or None (no KV transfer, or a backend that picks its own transport)
    rdma: bool  # the pods get RDMA devices (for KV transfer and for NCCL between nodes)
    ib_devices: str | None
    env: dict[str, str] = field(default_factory=dict)  # public env the role's ConfigMap gets (the user's wins)


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
    return Network(backend=backend, kv=kv, rdma=rdma, ib_devices=ib, env=env)


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
