"""What the manifests of a deployment cannot say, in the words of its own plan.

gpudeploy binds each engine to a NUMA node, picks its GPUs by index, places it on a host, checks
memory and releases before it starts anything, and gates the deployment on a real generation. A
manifest can ask for none of that; these notes say so, per deployment, instead of pretending.
"""

from __future__ import annotations

from . import lws
from .build import Options, engine_image, model_dir
from .discovery import discovering, discovery_note
from .names import secret
from .placement import placement_note
from .probes import startup_budget_s
from .resources import qos_class, reserved
from .roleset import Manifest, RoleSet
from .transport import Network, host_network_note, network, rdma_note, tcp_note

VALIDATED = ("Validated offline: the LeaderWorkerSet against its CRD's schema (kubernetes-sigs/lws 060ab4d, "
             "unknown fields refused), the other kinds against the schemas of Kubernetes {version} "
             "(kubernetes-validate, strict). Not checked: the LWS webhook's defaults and validation, admission "
             "policies (Pod Security and others), and whether the cluster has LWS, the NVIDIA device plugin "
             "and the images.")


def qos_classes(manifests: list[Manifest]) -> dict[str, str]:
    """role -> the QoS class of its pods, as the kubelet will compute it from the rendered spec."""
    out: dict[str, str] = {}
    for m in manifests:
        spec = m.doc.get("spec") or {}
        templates = [spec.get("template")] + [(spec.get("leaderWorkerTemplate") or {}).get(t)
                                              for t in ("leaderTemplate", "workerTemplate")]
        classes = sorted({qos_class(t["spec"]) for t in templates if t})
        if classes:
            out[m.role.name] = "/".join(classes)
    return out


def cluster_note(sets: list[RoleSet], nets: list[tuple[RoleSet, Network]], qos: dict[str, str]) -> str | None:
    """What the cluster must have for these manifests to run."""
    engines = [rs for rs in sets if rs.role.engine == "sglang"]
    needs = []
    if engines:
        needs.append(f"LeaderWorkerSet {lws.MIN_VERSION} or later (its webhook gives every pod "
                     f"{' and '.join(lws.INJECTED)}, the latter from {lws.MIN_VERSION}; LWS_WORKER_INDEX, which it "
                     "gives only from v0.6.0, is set here from the pod's worker-index label)")
    if any(u.gpus for rs in engines for u in rs.units):
        needs.append("the NVIDIA device plugin on the GPU nodes (nvidia.com/gpu)")
    plugins = sorted({net.rdma_resource for _, net in nets if net.rdma_resource})
    if plugins:
        needs.append(f"an RDMA device plugin that advertises {', '.join(plugins)} on those nodes")
    aligned = [rs.role.name for rs in engines if qos.get(rs.role.name) == "Guaranteed"]
    if aligned:
        needs.append(f"for {', '.join(aligned)} to get one NUMA node: kubelets there with the Topology Manager policy "
                     "single-numa-node and the CPU Manager policy static")
    if any(discovering(rs) for rs in sets):
        needs.append("the right to create a Role and RoleBinding in the namespace (the router's service discovery)")
    return "The cluster needs: " + "; ".join(needs) + "." if needs else None


def qos_note(sets: list[RoleSet], qos: dict[str, str]) -> str:
    shown = ", ".join(f"{rs.role.name} {qos[rs.role.name]}" for rs in sets if rs.role.name in qos)
    kept = sorted({reserved(u.host) for rs in sets if rs.role.engine == "sglang" for u in rs.units})
    less = " or ".join(f"{c} CPUs and {m:g} GiB" for c, m in kept) or "nothing"
    text = (f"QoS class: {shown}. Burstable pods request CPU and memory (where its size is known) and limit "
            "memory to its request, not CPU; Guaranteed ones (kubernetes.qos: guaranteed) limit both to their "
            "requests. Engines ask for their share of their NUMA nodes' CPUs and memory (one CPU at least), less "
            "what each node keeps "
            f"for the kubelet, the system and daemonsets ({less} per NUMA node: kubernetes.reserved_cpus and "
            "reserved_memory_gib in the inventory), routers for 1 CPU and 2 GiB; kubernetes.cpus and memory_gib in "
            "a role replace them.")
    unsized = [rs.role.name for rs in sets
               if rs.role.engine == "sglang" and rs.role.kubernetes.memory_gib is None
               and any(n.memory_gib is None for u in rs.units for n in u.host.numa_nodes
                       if any(g in n.gpus for g in u.gpus))]
    if unsized:
        text += (f" {', '.join(unsized)} request no memory: the inventory gives no numa_nodes[].memory_gib for their "
                 "NUMA nodes (or give kubernetes.memory_gib in the role).")
    return text


def deployment_notes(sets: list[RoleSet], manifests: list[Manifest], options: Options,
                     k8s_version: str) -> list[str]:
    engines = [rs for rs in sets if rs.role.engine == "sglang"]
    routers = [rs for rs in sets if rs.role.engine == "sglang_router"]
    notes: list[str] = []
    qos = qos_classes(manifests)
    nets = [(rs, network(rs, [])) for rs in engines]
    if needs := cluster_note(sets, nets, qos):
        notes.append(needs)
    notes.append(qos_note(sets, qos))
    bound = [f"{u.role.name} on {u.host.name}: NUMA node {u.numa_node}, CPUs {u.cpus}"
             for rs in engines for u in rs.units if u.numa_node is not None and u.cpus]
    aligned = [rs.role.name for rs in engines if qos.get(rs.role.name) == "Guaranteed"]
    loose = [rs.role.name for rs in engines if qos.get(rs.role.name) != "Guaranteed"]
    notes.append(
        "NUMA placement is not expressed" + (f" ({'; '.join(bound)})" if bound else "") + ". The kubelet puts a "
        "pod's GPUs, CPUs and memory on one NUMA node only where it runs the Topology Manager with policy "
        "single-numa-node and the CPU Manager with policy static (the Memory Manager with policy Static for its "
        "memory), and only for Guaranteed pods with whole CPUs"
        + (f": {', '.join(aligned)} are Guaranteed, so such nodes align them" if aligned else "")
        + (f"{'; ' if aligned else ': '}{', '.join(loose)} are not (kubernetes.qos: guaranteed in the role)"
           if loose else "") + ".")
    indices = [f"{u.role.name} on {u.host.name}: {','.join(str(g) for g in u.gpus)}"
               for rs in engines for u in rs.units if u.gpus]
    if indices:
        notes.append(f"GPU indices are not honoured ({'; '.join(indices)}): the device plugin picks a pod's "
                     "GPUs and numbers them from 0, so CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER are left out.")
    notes.append(placement_note(sets))
    images: dict[str, list[str]] = {}
    for rs in engines:
        images.setdefault(engine_image(rs, options), []).append(rs.role.name)
    for image, roles in images.items():
        releases = sorted({str(u.engine_version) for rs in engines if rs.role.name in roles for u in rs.units})
        notes.append(f"Image {image} for {', '.join(roles)}: their flags were rendered and checked for SGLang "
                     f"{', '.join(releases)}, so the image must run that release (--image to choose another).")
    for rs in routers:
        ups = [r for kind in ("prefill", "decode", "workers") for r in rs.role.upstreams.get(kind, ())]
        used = options.router_image or options.image or next(
            (engine_image(e, options) for e in engines if {e.role.name, e.role.file_role} & set(ups)), "?")
        waits = max((startup_budget_s(e.role) for e in engines if {e.role.name, e.role.file_role} & set(ups)),
                    default=0)
        notes.append(f"Router {rs.role.name} runs in {used} with the sglang-router that image ships, not "
                     f"necessarily the planned sglang_router {rs.leaders[0].engine_version} (--router-image to "
                     "choose)." + (f" It starts with its engines, not after them as deploy starts it, so it waits "
                                   f"up to {waits} s for them (--worker-startup-timeout-secs, their startup "
                                   "budget)." if waits else ""))
    for path in sorted({p for rs in engines if (p := model_dir(rs.role))}):
        if options.model_pvc:
            notes.append(f"Model: {path} is the PersistentVolumeClaim {options.model_pvc} mounted read-only at that "
                         "path; gpudeploy does not create the claim, and it must hold the model's files at its root "
                         "and allow ReadOnlyMany (or ReadWriteMany) where pods run on several nodes.")
        else:
            notes.append(f"Model: {path} is mounted read-only from the node (hostPath, type Directory), so it must "
                         "exist at that path on every node a pod may run on; --model-pvc NAME mounts a "
                         "PersistentVolumeClaim there instead.")
    secrets = {s: [rs.role.name for rs in sets if s in rs.role.secret_env]
               for rs in sets for s in rs.role.secret_env}
    if secrets:
        dep = sets[0].deployment
        literal = " ".join(f'--from-literal={s}="${s}"' for s in secrets)
        notes.append(f"Secrets {', '.join(secrets)} are read from Secret {secret(dep)}, which gpudeploy does not "
                     f"write (no value leaves your environment): kubectl create secret generic {secret(dep)} "
                     f"{literal}")
    for rs in engines:
        if rs.size > 1:
            notes.append(
                f"{rs.role.name} spans {rs.size} nodes per group, started together (startupPolicy LeaderCreated): "
                f"every rank is probed on {rs.role.health.path}, the leader's API answering once every rank has "
                "joined, a worker's once its schedulers are ready, so the group is Ready when it serves. A worker "
                "that starts before the leader's address resolves retries the leader's store until SGLang's "
                "--dist-timeout; a rank that fails or overruns its startup probe restarts the whole group "
                "(RecreateGroupOnPodRestart).")
    if engines:
        budgets = ", ".join(f"{rs.role.name} {startup_budget_s(rs.role)} s" for rs in engines)
        notes.append(
            f"Startup: an engine pod may take {budgets} to serve (twice its health.timeout_s, an hour at least) "
            "before its startup probe restarts it, and with RecreateGroupOnPodRestart its whole group; its "
            "readiness probe waits out SGLang's own health-check time (SGLANG_HEALTH_CHECK_TIMEOUT, 20 s unless the "
            "role's env sets it) and 5 s "
            "more, since /health runs a generation.")
    if tcp := tcp_note(nets):
        notes.append(tcp)
    if rdma := rdma_note(nets):
        notes.append(rdma)
    if hosted := host_network_note(nets):
        notes.append(hosted)
    if discovered := discovery_note(sets):
        notes.append(discovered)
    notes.append("Not done by Kubernetes, done by deploy: the memory preflight, the checks of GPUs and engine "
                 "release on the host, failure causes read from the server's log, the final generation through "
                 "the router, and teardown's proof that nothing is left. LimitMEMLOCK=infinity has no pod "
                 "equivalent.")
    notes.append(VALIDATED.format(version=k8s_version))
    return notes
