"""A router that finds its workers itself: sglang-router's Kubernetes service discovery.

With ``kubernetes.service_discovery: true`` in a router's role, the router gets no worker URLs.
It lists and watches the pods of its namespace (``--service-discovery-namespace``, from its own
pod) and adds a pod whose labels match ``--prefill-selector``/``--decode-selector`` (PD) or
``--selector`` once it is Running and Ready, as ``http://<pod IP>:<--service-discovery-port>``; a
prefill pod's bootstrap port comes from its ``sglang.ai/bootstrap-port`` annotation (sglang-router
0.3.2's ``--help``; ``sgl-model-gateway/src/service_discovery.rs``; OME's PD runtimes select
``leaderworkerset.sigs.k8s.io/worker-index=0`` the same way). So scaling a role's replicas needs
no router change. The selectors pick the group leaders only (``role: leader``): a worker rank has
no API.

What it needs: a ServiceAccount with a Role to get, list and watch pods (OME's router RBAC), and
one port for every worker: each upstream of such a router listens on the first upstream's http
port here (a pod has its own address, so the port packing the plan did around the host's other
roles does not apply; on the host network the scheduler keeps two pods of one port apart).
"""

from __future__ import annotations

from typing import Any

from ..errors import Problem
from . import names
from .roleset import RoleSet, problem

BOOTSTRAP_ANNOTATION = "sglang.ai/bootstrap-port"
NAMESPACE_ENV = {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}
UPSTREAM_FLAGS = ("--prefill", "--decode", "--worker-urls")
SELECTOR_FLAGS = {"prefill": "--prefill-selector", "decode": "--decode-selector", "workers": "--selector"}
KINDS = ("prefill", "decode", "workers")


def discovering(rs: RoleSet) -> bool:
    return rs.role.engine == "sglang_router" and bool(rs.settings.service_discovery)


def upstream_roles(rs: RoleSet) -> list[tuple[str, str]]:
    """(kind, engine role) of a router, in prefill, decode, workers order."""
    return [(kind, r) for kind in KINDS for r in rs.role.upstreams.get(kind, ())]


def discovery_ports(sets: list[RoleSet], problems: list[Problem]) -> dict[str, int]:
    """engine role -> the port it listens on so that a discovering router reaches it (its first
    upstream's http port); every engine of such a router, one per kind."""
    engines = {rs.role.name: rs for rs in sets if rs.role.engine == "sglang"}
    out: dict[str, int] = {}
    for rs in sets:
        if not discovering(rs):
            continue
        ups = upstream_roles(rs)
        for kind in KINDS:
            several = rs.role.upstreams.get(kind, ())
            if len(several) > 1:
                problems.append(problem(rs, "upstreams", (
                    f"service discovery selects one role per kind, by its labels; upstreams.{kind} names "
                    f"{', '.join(several)}: front each with its own router, or leave kubernetes.service_discovery "
                    "off")))
        found = [engines[r] for _, r in ups if r in engines]
        if not found:
            continue
        port = found[0].leaders[0].ports["http"]
        for e in found:
            if out.setdefault(e.role.name, port) != port:
                problems.append(problem(rs, "upstreams", (
                    f"engine {e.role.name} is discovered by routers on two ports ({out[e.role.name]} and {port}); "
                    "give the routers' upstreams the same first role")))
    return out


def selector(rs: RoleSet, engine: str) -> dict[str, str]:
    """The labels of an engine role's group leaders."""
    return {**names.selector(rs.deployment, engine), "role": "leader"}


def discovery_args(rs: RoleSet, args: list[str], port: int) -> list[str]:
    """The router's args with its worker URLs replaced by discovery of their pods."""
    out: list[str] = []
    skipping = False
    for word in args:
        if word in UPSTREAM_FLAGS:
            skipping = True
            continue
        if skipping and not word.startswith("--"):
            continue
        skipping = False
        out.append(word)
    out += ["--service-discovery", "--service-discovery-port", str(port),
            "--service-discovery-namespace", "$(POD_NAMESPACE)"]
    for kind, engine in upstream_roles(rs):
        out += [SELECTOR_FLAGS[kind], *(f"{k}={v}" for k, v in selector(rs, engine).items())]
    return out


def rbac(rs: RoleSet) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding that let the router watch its namespace's pods."""
    name = names.router(rs.deployment, rs.role.name)
    labels = names.labels(rs.deployment, rs.role.name, "sglang-router")
    meta = {"name": name, "labels": dict(labels)}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": dict(meta)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": dict(meta),
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": dict(meta),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name}]},
    ]


def bootstrap_annotated(sets: list[RoleSet]) -> set[str]:
    """Prefill roles a discovering router fronts: their pods carry their bootstrap port."""
    return {r for rs in sets if discovering(rs) for kind, r in upstream_roles(rs) if kind == "prefill"}


def discovery_note(sets: list[RoleSet]) -> str | None:
    routers = [rs for rs in sets if discovering(rs)]
    if not routers:
        return None
    parts = [f"router {rs.role.name} finds {', '.join(r for _, r in upstream_roles(rs))} by their group leaders' "
             f"labels (sglang-router --service-discovery) in its own namespace, through ServiceAccount "
             f"{names.router(rs.deployment, rs.role.name)} (a Role to get, list and watch pods)" for rs in routers]
    return ("Service discovery: " + "; ".join(parts) + ". A pod joins once it is Ready, so scaling a role's "
            "LeaderWorkerSet needs no router change; the engines it finds listen on one port (the first upstream's), "
            f"and prefill pods carry their bootstrap port in the {BOOTSTRAP_ANNOTATION} annotation.")
