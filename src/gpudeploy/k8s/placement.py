"""Where a role's pods may run: nodeSelector, tolerations and affinity from the inventory.

The inventory's hosts stand for nodes the scheduler chooses among, so their ``kubernetes:``
placement (``defaults``, per host; the role's own laid over it: node_selector keys added,
tolerations appended, affinity replaced) is what a pod spec says. Every host of a role must agree
(one template); an affinity's inner fields are checked against Kubernetes' schema with the rest of
the manifest. A pod that asks for GPUs also tolerates the ``nvidia.com/gpu`` taint.
"""

from __future__ import annotations

from typing import Any

from .roleset import RoleSet

# GPU nodes are often tainted so that only GPU pods land there (GKE: nvidia.com/gpu=present); OME's
# and llm-d's GPU pods tolerate it (sgl-project/ome config/runtimes/srt/*-rdma-pd-rt.yaml,
# llm-d guides/pd-disaggregation/modelserver/gpu/sglang/gke/patch-decode.yaml).
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def pod_placement(rs: RoleSet, gpus: bool) -> dict[str, Any]:
    """The pod spec fields that place the role's pods (none where nothing is said)."""
    s = rs.settings
    out: dict[str, Any] = {}
    if s.node_selector:
        out["nodeSelector"] = dict(s.node_selector)
    tolerations = [dict(t) for t in s.tolerations or ()]
    if gpus and GPU_TOLERATION not in tolerations:
        tolerations.append(dict(GPU_TOLERATION))
    if tolerations:
        out["tolerations"] = tolerations
    if s.affinity:
        out["affinity"] = s.affinity
    return out


def placement_note(sets: list[RoleSet]) -> str:
    hosts = sorted({u.host.name for rs in sets for u in rs.units})
    placed: list[str] = []
    free: list[str] = []
    for rs in sets:
        s = rs.settings
        how = []
        if s.node_selector:
            how.append("nodeSelector " + ", ".join(f"{k}={v}" for k, v in s.node_selector.items()))
        if s.affinity:
            how.append("its affinity")
        (placed if how else free).append(f"{rs.role.name} by {' and '.join(how)}" if how else rs.role.name)
    text = (f"Hosts are not expressed: the inventory places this deployment on {', '.join(hosts)}; the scheduler "
            "picks the nodes")
    if placed:
        text += f", {'; '.join(placed)}"
    if free:
        text += (f"{', and' if placed else ':'} {', '.join(free)} on any node with room (kubernetes.node_selector, "
                 "tolerations and affinity in the inventory or the role say where)")
    return text + "."
