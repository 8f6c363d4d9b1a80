"""Plan -> Kubernetes manifests (dicts), per deployment. Pure: reads the plan, writes nothing.

Per engine role of a deployment (``engine: sglang``): a ConfigMap with its public environment, a
LeaderWorkerSet (``size`` = the role's nnodes, ``replicas`` = its groups in the deployment) and a
Service in front of the group leaders. Per router role (``engine: sglang_router``): a ConfigMap, a
Deployment whose args reach the engines by their Services' DNS names, and a Service. Secrets are
referenced by name (``<deployment>-secrets``), never rendered: their values stay with the user.

Every pod of one role runs one template, so what the plan lets differ between the hosts of a role
(ports packed around other roles, host env, releases) must agree here; where it does not, that is
a problem naming the hosts, not a silent pick. What a manifest cannot say at all (NUMA binding,
GPU indices, hosts) is in ``notes.py``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import InputError, Problem
from ..model import Plan, Role, Unit
from ..plan.build import RESERVED_ENV
from . import lws, names
from .args import CONTAINER_PYTHON, engine_args, router_args
from .discovery import (
    BOOTSTRAP_ANNOTATION,
    NAMESPACE_ENV,
    bootstrap_annotated,
    discovering,
    discovery_args,
    discovery_ports,
    rbac,
)
from .placement import pod_placement
from .probes import engine_probes, router_probes, startup_budget_s
from .resources import Figures, figures, quantity
from .roleset import Manifest, RoleSet, problem, role_sets, same
from .transport import network, role_env

LWS_API = lws.API
WORKER_STARTUP_FLAG = "--worker-startup-timeout-secs"  # sglang-router 0.3.2
SHUTDOWN_GRACE_FLAG = "--shutdown-grace-period-secs"
ROUTER_SHUTDOWN_GRACE_S = 180  # sglang-router 0.3.2's default (its --help)
GRACE_MARGIN_S = 10
IMAGE = "lmsysorg/sglang:v{release}"  # SGLang's own images: the engine and its sglang-router


@dataclass(frozen=True)
class Options:
    image: str | None = None  # every engine's image; default lmsysorg/sglang:v<planned release>
    router_image: str | None = None  # default: --image, else the image of the engines it fronts
    model_pvc: str | None = None  # the model directory from this PersistentVolumeClaim, not the node's disk


@dataclass(frozen=True)
class Context:
    """What the roles of one deployment need to know of each other."""

    urls: dict[str, str]  # planned upstream URL -> in-cluster URL
    images: dict[str, str]  # engine role -> image
    budgets: dict[str, int]  # engine role -> startup budget (s)
    ports: dict[str, int]  # engine role -> the port a discovering router reaches it on
    annotated: set[str]  # prefill roles whose pods carry their bootstrap port for a discovering router


def build(plan: Plan, options: Options) -> dict[str, list[Manifest]]:
    """deployment -> its manifests. Raises InputError with every problem found."""
    problems: list[Problem] = []
    out: dict[str, list[Manifest]] = {}
    if options.model_pvc is not None and (why := names.subdomain_problem(options.model_pvc)):
        raise InputError([Problem(f"--model-pvc: {why}", key="--model-pvc")])
    for dep, sets in role_sets(plan).items():
        ports = discovery_ports(sets, problems)
        urls, images = _upstreams(sets, options, ports)
        budgets: dict[str, int] = {}
        for e in sets:
            if e.role.engine == "sglang":
                budgets[e.role.name] = startup_budget_s(e.role)
                # an upstream may name the role file of named instances: the longest of theirs
                budgets[e.role.file_role] = max(budgets.get(e.role.file_role, 0), startup_budget_s(e.role))
        ctx = Context(urls=urls, images=images, ports=ports, annotated=bootstrap_annotated(sets), budgets=budgets)
        manifests: list[Manifest] = []
        for rs in sets:
            before = len(problems)
            _name_problems(rs, problems)
            rs.agree(problems)  # one template: every host of the role gives the same kubernetes: settings
            if rs.role.engine == "sglang":
                made = _engine(rs, ctx, options, problems)
            elif rs.role.engine == "sglang_router":
                made = _router(rs, ctx, options, problems)
            else:
                problems.append(problem(rs, "engine", (
                    f"engine {rs.role.engine} cannot be rendered for Kubernetes: its argv is a template of host "
                    "values (interpreter, bind address, state directory) and there is no image to run it in; "
                    "gpudeploy renders sglang and sglang_router roles (render other deployments with --deployment)")))
                made = []
            if len(problems) == before:
                manifests += made
        _unique(dep, manifests, problems)
        out[dep] = manifests
    if problems:
        raise InputError(problems)
    return out


def _upstreams(sets: list[RoleSet], options: Options,
               ports: dict[str, int]) -> tuple[dict[str, str], dict[str, str]]:
    """Planned upstream URL -> in-cluster URL, and engine role -> image, for one deployment.

    One group: the role's leader Service. Several: each leader by its own DNS name under the
    headless Service LWS makes (``<lws>-<group>.<lws>``), so a router still sees every server (a
    PD request's bootstrap must reach the prefill server that took it, not any behind a Service).
    """
    urls: dict[str, str] = {}
    images: dict[str, str] = {}
    for rs in sets:
        if rs.role.engine != "sglang":
            continue
        images[rs.role.name] = engine_image(rs, options)
        images.setdefault(rs.role.file_role, images[rs.role.name])  # an upstream may name the instances' file
        set_name = names.engine(rs.deployment, rs.role.name)
        for i, u in enumerate(rs.leaders):
            if "http" not in u.ports:
                continue
            one = rs.replicas == 1
            host = names.leader_service(rs.deployment, rs.role.name) if one else f"{set_name}-{i}.{set_name}"
            port = ports.get(rs.role.name, u.ports["http"])
            urls[f"http://{u.host.address}:{u.ports['http']}"] = f"http://{host}:{port}"
    return urls, images


def engine_image(rs: RoleSet, options: Options) -> str:
    return options.image or IMAGE.format(release=rs.leaders[0].engine_version)


def _engine(rs: RoleSet, ctx: Context, options: Options, problems: list[Problem]) -> list[Manifest]:
    role, dep, lead = rs.role, rs.deployment, rs.leaders[0]
    image = ctx.images[role.name]
    http = ctx.ports.get(role.name, lead.ports["http"])  # a discovering router's one port, else the plan's
    args = same(rs, "args", {u.host.name: engine_args(u, http) for u in rs.units}, problems)
    env = same(rs, "env", {u.host.name: _public_env(u) for u in rs.units}, problems)
    same(rs, "engine release", {u.host.name: u.engine_version for u in rs.units}, problems)
    gpus = same(rs, "GPU count", {u.host.name: len(u.gpus) for u in rs.units}, problems)
    if args is None or env is None or gpus is None:
        return []
    net = network(rs, problems)
    env = role_env(net, env)
    rdma = net.rdma
    # The RDMA device plugin puts the pod's own devices in its /dev/infiniband; a privileged pod
    # reads the node's (SGLang's LWS chart mounts it).
    host_devices = rdma and net.privileged and not net.rdma_resource
    figs = figures(rs, net.rdma_resource, problems)
    if figs is None:
        return []
    set_name = names.engine(dep, role.name)
    labels = names.labels(dep, role.name, "sglang")
    ports = [("http", http)]
    ports += [(k, lead.ports[k]) for k in ("bootstrap", "nccl") if k in lead.ports]
    if rs.size > 1:
        ports.append(("dist-init", int(lead.ports["dist_init"])))

    def pod(leader: bool) -> dict[str, Any]:
        container: dict[str, Any] = {
            "name": "sglang", "image": image, "command": [CONTAINER_PYTHON], "args": list(args),
            "envFrom": [{"configMapRef": {"name": names.env_config(dep, role.name)}}],
        }
        env_list = [lws.worker_index_env()] if rs.size > 1 else []  # --node-rank $(LWS_WORKER_INDEX)
        env_list += net.pod_env
        env_list += secret_env(dep, role.secret_env)
        if env_list:
            container["env"] = env_list
        # Only the leader listens on the dist-init port (its torch.distributed store).
        container["ports"] = [{"name": n, "containerPort": p} for n, p in ports if leader or n != "dist-init"]
        # CPU and memory too (a pod that requests only GPUs is BestEffort); the RDMA device plugin's
        # resource opens /dev/infiniband to the pod.
        container["resources"] = figs.resources()
        # Every rank: the leader's API (200 once every rank has joined and the server is up), a
        # worker's (node rank >= 1) the health server SGLang starts there once its schedulers are
        # ready (launch_dummy_health_check_server, srt/utils/common.py): the group is Ready when it serves.
        container.update(engine_probes(role, env))
        container["volumeMounts"] = _mounts(role, host_devices)
        security: dict[str, Any] = {"privileged": True} if net.privileged else {}
        if rdma:
            security["capabilities"] = {"add": ["IPC_LOCK"]}  # RDMA pins (locks) its registered memory
        if security:
            container["securityContext"] = security
        spec: dict[str, Any] = {"containers": [container],
                                "volumes": _volumes(role, host_devices, options.model_pvc, figs),
                                "terminationGracePeriodSeconds": math.ceil(role.stop_timeout_s)}
        spec.update(pod_placement(rs, bool(gpus)))
        if net.host_network:
            spec["hostNetwork"] = True
            spec["dnsPolicy"] = "ClusterFirstWithHostNet"
        meta: dict[str, Any] = {"labels": {**labels, "role": "leader" if leader else "worker"}}
        if role.name in ctx.annotated and "bootstrap" in lead.ports:
            meta["annotations"] = {BOOTSTRAP_ANNOTATION: str(lead.ports["bootstrap"])}  # for the router's discovery
        return {"metadata": meta, "spec": spec}

    template: dict[str, Any] = {"size": rs.size, "restartPolicy": "RecreateGroupOnPodRestart"}
    if rs.size > 1:
        template["leaderTemplate"] = pod(True)
        template["workerTemplate"] = pod(False)
    else:
        template["workerTemplate"] = pod(True)  # a group of one: its only pod is the leader
    lws_doc = {
        "apiVersion": LWS_API, "kind": "LeaderWorkerSet",
        "metadata": {"name": set_name, "labels": dict(labels)},
        # LeaderCreated (LWS's default): the workers start with the leader, so each rank can be
        # probed on /health; LeaderReady would hold them until a leader that needs them is Ready.
        "spec": {"replicas": rs.replicas, "startupPolicy": "LeaderCreated", "leaderWorkerTemplate": template},
    }
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": names.leader_service(dep, role.name), "labels": dict(labels)},
        "spec": {"selector": {lws.NAME_LABEL: set_name, "role": "leader"},
                 "ports": [{"name": n, "port": p, "targetPort": n}
                           for n, p in ports if n in ("http", "bootstrap")]},
    }
    return [_config_map(rs, env), rs.manifest(lws_doc), rs.manifest(service)]


def _router(rs: RoleSet, ctx: Context, options: Options, problems: list[Problem]) -> list[Manifest]:
    role, dep, lead = rs.role, rs.deployment, rs.leaders[0]
    planned: dict[str, list[str]] = {}
    for u in rs.units:
        args, missing = router_args(u, ctx.urls)
        for url in missing:
            problems.append(problem(rs, "upstreams", f"upstream {url} (on host {u.host.name}) is no engine "
                                                      "rendered for Kubernetes in this deployment"))
        planned[u.host.name] = args
    agreed: list[str] | None = same(rs, "args", planned, problems)
    env = same(rs, "env", {u.host.name: _public_env(u) for u in rs.units}, problems)
    ups = [r for kind in ("prefill", "decode", "workers") for r in role.upstreams.get(kind, ())]
    if agreed is not None:
        agreed = _worker_startup(rs, agreed, max((ctx.budgets[r] for r in ups if r in ctx.budgets), default=0),
                                 problems)
    discovered = discovering(rs)
    if agreed is not None and discovered:
        agreed = discovery_args(rs, agreed, next((ctx.ports[r] for r in ups if r in ctx.ports), 0))
    image = options.router_image or options.image or next((ctx.images[r] for r in ups if r in ctx.images), None)
    if image is None:
        problems.append(problem(rs, "upstreams", "no image for the router: it fronts no sglang engine of this "
                                                  "deployment; give one with --router-image"))
    figs = figures(rs, None, problems)
    if agreed is None or env is None or image is None or figs is None:
        return []
    name = names.router(dep, role.name)
    labels = names.labels(dep, role.name, "sglang-router")
    container: dict[str, Any] = {
        "name": "router", "image": image, "command": [CONTAINER_PYTHON], "args": agreed,
        "envFrom": [{"configMapRef": {"name": names.env_config(dep, role.name)}}],
    }
    env_list = [dict(NAMESPACE_ENV)] if discovered else []  # --service-discovery-namespace $(POD_NAMESPACE)
    env_list += secret_env(dep, role.secret_env)
    if env_list:
        container["env"] = env_list
    container["ports"] = [{"name": "http", "containerPort": lead.ports["http"]}]
    container["resources"] = figs.resources()
    container.update(router_probes(role))
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {"replicas": rs.replicas, "selector": {"matchLabels": names.selector(dep, role.name)},
                 "template": {"metadata": {"labels": dict(labels)},
                              "spec": {**({"serviceAccountName": name} if discovered else {}),
                                       "containers": [container],
                                       "terminationGracePeriodSeconds": _router_grace_s(role, agreed),
                                       **pod_placement(rs, False)}}},
    }
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {"selector": names.selector(dep, role.name),
                 "ports": [{"name": "http", "port": lead.ports["http"], "targetPort": "http"}]},
    }
    access = [rs.manifest(doc) for doc in rbac(rs)] if discovered else []
    return [*access, _config_map(rs, env), rs.manifest(deployment), rs.manifest(service)]


def _router_grace_s(role: Role, args: list[str]) -> int:
    """Seconds the kubelet gives the router between SIGTERM and SIGKILL: its own drain of in-flight
    requests (--shutdown-grace-period-secs, 180 s unless set) and a little more, or its streams are
    cut on every rollout."""
    given = args[args.index(SHUTDOWN_GRACE_FLAG) + 1] if SHUTDOWN_GRACE_FLAG in args else ""
    drain = int(given) if given.isdigit() else ROUTER_SHUTDOWN_GRACE_S
    return max(math.ceil(role.stop_timeout_s), drain + GRACE_MARGIN_S)


def _worker_startup(rs: RoleSet, args: list[str], needed_s: int, problems: list[Problem]) -> list[str] | None:
    """The router's args with --worker-startup-timeout-secs covering its engines' startup budget.

    On Kubernetes the router starts with its engines, not once they are ready as deploy starts it,
    and drops a worker still unhealthy after that timeout (default 1800 s, shorter than a TP16
    load). A shorter one the role sets itself is refused rather than dropped.
    """
    if not needed_s:
        return args
    if WORKER_STARTUP_FLAG not in args:
        return [*args, WORKER_STARTUP_FLAG, str(needed_s)]
    given = args[args.index(WORKER_STARTUP_FLAG) + 1]
    if given.isdigit() and int(given) >= needed_s:
        return args
    key = "settings.worker_startup_timeout_secs" if "worker_startup_timeout_secs" in rs.role.settings else "extra_args"
    problems.append(problem(rs, key, (
        f"the router drops a worker that is not healthy {given} s after it starts ({WORKER_STARTUP_FLAG}), but on "
        f"Kubernetes it starts with its engines, which may take {needed_s} s (their startup budget); raise it to "
        f"{needed_s} or remove it")))
    return None


def _config_map(rs: RoleSet, env: dict[str, str]) -> Manifest:
    doc = {"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": names.env_config(rs.deployment, rs.role.name),
                        "labels": names.labels(rs.deployment, rs.role.name,
                                               "sglang" if rs.role.engine == "sglang" else "sglang-router")},
           "data": dict(env)}
    return rs.manifest(doc)


def secret_env(deployment: str, secrets: Iterable[str]) -> list[dict[str, Any]]:
    """Each secret by reference: the pod reads it from the deployment's Secret, which the user makes."""
    return [{"name": s, "valueFrom": {"secretKeyRef": {"name": names.secret(deployment), "key": s}}}
            for s in secrets]


def _public_env(u: Unit) -> dict[str, str]:
    # The device plugin gives the pod its GPUs, numbered from 0: the host's indices would name others.
    # The address the plan advertises for a host (SGLANG_HOST_IP) is no pod's: a pod has its own
    # (SGLang finds it, or a host-network pod gets it from status.podIP: transport.py).
    return {k: v for k, v in u.env.items() if k not in RESERVED_ENV
            and not (k == "SGLANG_HOST_IP" and v == u.host.address)}


def _mounts(role: Role, host_devices: bool) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    path = model_dir(role)
    if path:
        mounts.append({"name": "model", "mountPath": path, "readOnly": True})
    if host_devices:
        mounts.append({"name": "infiniband", "mountPath": "/dev/infiniband"})
    return mounts


def _volumes(role: Role, host_devices: bool, model_pvc: str | None, figs: Figures) -> list[dict[str, Any]]:
    # Bounded: an unbounded Memory emptyDir may grow to the node's memory (and counts against the pod's).
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": {"medium": "Memory",
                                                                   "sizeLimit": quantity(figs.shm_gib)}}]
    path = model_dir(role)
    if path and model_pvc:
        # Mounted at the planned path, so --model-path stays the one the plan rendered and checked.
        volumes.append({"name": "model", "persistentVolumeClaim": {"claimName": model_pvc, "readOnly": True}})
    elif path:
        volumes.append({"name": "model", "hostPath": {"path": path, "type": "Directory"}})
    if host_devices:
        volumes.append({"name": "infiniband", "hostPath": {"path": "/dev/infiniband", "type": "Directory"}})
    return volumes


def model_dir(role: Role) -> str | None:
    """The model directory mounted from the node at the same path (so --model-path is the plan's);
    None for a hub id, which the server downloads itself."""
    path = str(role.model.get("path", ""))
    return path if path.startswith("/") else None


def _name_problems(rs: RoleSet, problems: list[Problem]) -> None:
    dep, role = rs.deployment, rs.role.name
    wanted = [names.env_config(dep, role)]
    wanted += [names.engine(dep, role), names.leader_service(dep, role)] if rs.role.engine == "sglang" \
        else [names.router(dep, role)]
    for name in wanted:
        bad = names.name_problem(name)
        if bad:
            problems.append(problem(rs, None, f"{bad}: rename the role or deployment {dep!r}"))
            return
    for value in (dep, role):
        bad = names.label_problem(value)
        if bad:
            problems.append(problem(rs, None, f"{bad}: rename the role or deployment"))
            return
    if rs.role.engine == "sglang":
        bad = names.statefulset_problem(names.engine(dep, role), rs.replicas)
        if bad:
            problems.append(problem(rs, None, f"{bad}: shorten the role or deployment name"))


def _unique(dep: str, manifests: list[Manifest], problems: list[Problem]) -> None:
    seen: dict[tuple[str, str], Manifest] = {}
    for m in manifests:
        other = seen.setdefault((m.kind, m.name), m)
        if other is not m:
            problems.append(Problem(f"{m} and role {other.role.name} both need the {m.kind} name {m.name!r} "
                                    f"in deployment {dep!r}; rename one of the roles",
                                    file=m.role.file, role=m.role.name))
