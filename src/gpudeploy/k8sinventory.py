"""The ``kubernetes:`` mapping of an inventory (``defaults``, a host) and of a role -> ``K8sSettings``.

Only ``invoke render --target k8s`` reads these; deploy over SSH ignores them. Every value is
checked here, with file and line, as far as it can be without Kubernetes' schemas (an affinity's
inner fields are checked against them when the manifest is validated)::

    defaults:                           # or per host; the host's keys win
      kubernetes:
        node_selector: {nvidia.com/gpu.product: NVIDIA-H200}
        tolerations: [{key: dedicated, operator: Equal, value: llm, effect: NoSchedule}]
        affinity: {nodeAffinity: ...}   # a pod spec's affinity, as Kubernetes writes it
        rdma_resource: rdma/ib          # the RDMA device plugin's resource (one per pod)
        socket_ifname: eth0             # GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME
        reserved_cpus: 2                # per NUMA node, kept for the kubelet, system and daemonsets
        reserved_memory_gib: 16
    # a role file: the placement and RDMA keys above, and
    kubernetes: {privileged: false, host_network: true, qos: guaranteed, cpus: 32, memory_gib: 256,
                 shm_gib: 16, service_discovery: true}
"""

from __future__ import annotations

import re
from typing import Any

from .controlchars import control_problem
from .model import K8sSettings, Where
from .yamlsrc import Checker

PLACEMENT_KEYS = {"node_selector", "tolerations", "affinity", "rdma_resource", "socket_ifname"}
HOST_KEYS = PLACEMENT_KEYS | {"reserved_cpus", "reserved_memory_gib"}
ROLE_KEYS = PLACEMENT_KEYS | {"privileged", "host_network", "qos", "cpus", "memory_gib", "shm_gib",
                              "service_discovery"}
QOS = ("burstable", "guaranteed")

# Kubernetes' qualified names (label keys, extended resource names): [prefix/]name, the name at
# most 63 characters of alphanumerics, '-', '_', '.', starting and ending alphanumeric; the
# prefix a DNS subdomain.
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_PREFIX = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
LABEL_KEY = re.compile(rf"({_PREFIX}/)?{_NAME}")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
RESOURCE = re.compile(rf"{_PREFIX}/{_NAME}")  # an extended resource always has a domain
IFNAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,14}(,[A-Za-z0-9][A-Za-z0-9_.:@-]{0,14})*")
TOLERATION_KEYS = {"key", "operator", "value", "effect", "tolerationSeconds"}
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
AFFINITY_KEYS = {"nodeAffinity", "podAffinity", "podAntiAffinity"}
CORE_RESOURCES = ("cpu", "memory", "ephemeral-storage", "nvidia.com/gpu")


def k8s_settings(c: Checker, allowed: set[str]) -> K8sSettings:
    """The ``kubernetes`` child of ``c`` (a host's, the defaults' or a role's mapping)."""
    k = c.child("kubernetes")
    k.unknown_keys(allowed)
    given = {key for key in k.data if key in allowed}
    out = K8sSettings(
        node_selector=_node_selector(k) if "node_selector" in given else None,
        tolerations=_tolerations(k) if "tolerations" in given else None,
        affinity=_affinity(k) if "affinity" in given else None,
        rdma_resource=k.get("rdma_resource", str, check=_resource_check),
        socket_ifname=k.get("socket_ifname", str, check=_ifname_check),
        reserved_cpus=k.get("reserved_cpus", int, check=lambda v: None if v >= 0 else "must be >= 0"),
        reserved_memory_gib=k.get("reserved_memory_gib", float, check=lambda v: None if v >= 0 else "must be >= 0"),
        privileged=k.get("privileged", bool),
        host_network=k.get("host_network", bool),
        qos=k.get("qos", str, check=lambda v: None if v in QOS else f"one of {', '.join(QOS)}"),
        cpus=k.get("cpus", int, check=lambda v: None if v >= 1 else "must be >= 1 (whole CPUs)"),
        memory_gib=k.get("memory_gib", float, check=_positive),
        shm_gib=k.get("shm_gib", float, check=_positive),
        service_discovery=k.get("service_discovery", bool),
    )
    where = {key: Where(c.file, k.where(key)) for key in given}
    return K8sSettings(**{f: getattr(out, f) for f in out.__dataclass_fields__ if f != "where"}, where=where)


def _node_selector(k: Checker) -> dict[str, str] | None:
    raw = k.get("node_selector", dict, default=None)
    if raw is None:
        return None
    out: dict[str, str] = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not LABEL_KEY.fullmatch(key) or len(key) > 316:
            k.fail(f"{key!r} is not a Kubernetes label key ([prefix/]name)", "node_selector")
        elif not isinstance(value, str):
            k.fail(f"the value of {key} must be a string (quote it: {key}: \"{value}\")", "node_selector")
        elif len(value) > 63 or not LABEL_VALUE.fullmatch(value):
            k.fail(f"{value!r} is not a Kubernetes label value (letters, digits, '-', '_', '.', at most 63)",
                   "node_selector")
        else:
            out[key] = value
    return out


def _tolerations(k: Checker) -> tuple[dict[str, Any], ...] | None:
    raw = k.get("tolerations", list, default=None)
    if raw is None:
        return None
    out: list[dict[str, Any]] = []
    for i, item in enumerate(raw):
        t = Checker(item, k.problems, k.file, host=k.host, role=k.role, prefix=f"{k.prefix}tolerations[{i}].",
                    line=k.where("tolerations"))
        t.unknown_keys(TOLERATION_KEYS)
        key = t.get("key", str, check=lambda v: None if LABEL_KEY.fullmatch(v) else "not a label key")
        operator = t.get("operator", str, default="Equal",
                         check=lambda v: None if v in ("Equal", "Exists") else "Equal or Exists")
        value = t.get("value", str, check=lambda v: None if LABEL_VALUE.fullmatch(v) else "not a label value")
        effect = t.get("effect", str, check=lambda v: None if v in EFFECTS else f"one of {', '.join(EFFECTS)}")
        seconds = t.get("tolerationSeconds", int)
        if operator == "Exists" and value:
            t.fail("a toleration with operator Exists takes no value (Kubernetes refuses it)", "value")
        if key is None and operator != "Exists":
            t.fail("a toleration without a key must have operator Exists (it then tolerates every taint)",
                   "operator")
        if seconds is not None and effect != "NoExecute":
            t.fail("tolerationSeconds only applies to effect NoExecute", "tolerationSeconds")
        if not isinstance(item, dict):
            continue
        made: dict[str, Any] = {"key": key, "operator": operator, "value": value, "effect": effect,
                                "tolerationSeconds": seconds}
        out.append({name: v for name, v in made.items() if v is not None})
    return tuple(out)


def _affinity(k: Checker) -> dict[str, Any] | None:
    raw = k.get("affinity", dict, default=None)
    if raw is None:
        return None
    bad = sorted(str(key) for key in raw if key not in AFFINITY_KEYS)
    if bad:
        k.fail(f"unknown affinity {', '.join(bad)} (a pod spec's affinity has {', '.join(sorted(AFFINITY_KEYS))})",
               "affinity")
        return None
    plain: dict[str, Any] = _plain(raw)
    return plain


def _plain(value: Any) -> Any:
    """YAML's line-remembering mappings and lists as plain ones (they are dumped into manifests)."""
    if isinstance(value, dict):
        return {str(key): _plain(v) for key, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _resource_check(v: str) -> str | None:
    if v in CORE_RESOURCES or not RESOURCE.fullmatch(v) or len(v) > 316:
        return (f"{v!r} is not an extended resource name like rdma/ib or rdma/hca_shared_devices_a (what your "
                "RDMA device plugin advertises: kubectl describe node, Allocatable)")
    return None


def _ifname_check(v: str) -> str | None:
    if control_problem(v) or not IFNAME.fullmatch(v):
        return "a network interface name like eth0 or bond0 (or several, comma-separated), at most 15 characters each"
    return None


def _positive(v: float) -> str | None:
    return None if v > 0 else "must be positive"
