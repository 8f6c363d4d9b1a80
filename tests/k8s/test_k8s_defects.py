"""Issue 24: what a cluster operator would hit at run time with manifests that only validated.
One test per defect, named by its number in the issue; each failed before its fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from k8stools import DECODE, PREFILL, ROUTER, by_kind, container, docs, multinode, pd_inventory, write_inventory

from gpudeploy.errors import InputError
from gpudeploy.k8s import render
from gpudeploy.k8s.envrefs import undefined_references

RDMA_RESOURCE = {"kubernetes": {"rdma_resource": "rdma/ib"}}


def mooncake(role: dict[str, Any]) -> dict[str, Any]:
    return {"settings": {**role["settings"], "disaggregation_transfer_backend": "mooncake"}}


def ib(role: dict[str, Any], devices: str = "mlx5_0,mlx5_1") -> dict[str, Any]:
    return {"settings": {**role["settings"], "disaggregation_transfer_backend": "mooncake",
                         "disaggregation_ib_device": devices}}


WORKER_INDEX = {"name": "LWS_WORKER_INDEX", "valueFrom": {"fieldRef": {
    "fieldPath": "metadata.labels['leaderworkerset.sigs.k8s.io/worker-index']"}}}


def test_5_the_node_rank_comes_from_the_worker_index_label_not_from_lws_0_6(tmp_path: Path) -> None:
    """LWS injects LWS_WORKER_INDEX only from v0.6.0; before that --node-rank would get the literal
    text $(LWS_WORKER_INDEX). SGLang's own LWS examples set it from the pod's label."""
    r = render(multinode(tmp_path))
    lws = by_kind(r.streams["big"], "LeaderWorkerSet")["big-tp16"]
    for template in ("leaderTemplate", "workerTemplate"):
        c = container(lws, template)
        assert c["args"][c["args"].index("--node-rank") + 1] == "$(LWS_WORKER_INDEX)"
        assert WORKER_INDEX in c["env"], template
    assert any("LeaderWorkerSet v0.4.0 or later" in n for n in r.notes["big"])


def test_5_a_multi_node_render_passes_the_variable_check(tmp_path: Path) -> None:
    """render() runs envrefs: $(LWS_WORKER_INDEX) is defined by the fieldRef, the rest by LWS."""
    r = render(multinode(tmp_path))
    assert undefined_references(r.manifests["big"], docs(r.streams["big"])) == []


def engine_env(text: str, lws_name: str) -> dict[str, str]:
    """What the engine's container gets from its ConfigMap."""
    [source] = container(by_kind(text, "LeaderWorkerSet")[lws_name])["envFrom"]
    data: dict[str, str] = by_kind(text, "ConfigMap")[source["configMapRef"]["name"]]["data"]
    return data


def test_1_mooncake_without_infiniband_devices_moves_kv_over_tcp(tmp_path: Path) -> None:
    """mooncake defaults to RDMA: a pod without RDMA access crashed at startup ("Mooncake Transfer
    Engine initialization failed"). Without RDMA wiring the TCP transport is rendered explicitly."""
    r = render(pd_inventory(tmp_path / "a", prefill=mooncake(PREFILL), decode=mooncake(DECODE)))
    text = r.streams["t"]
    for name in ("t-prefill", "t-decode"):
        assert engine_env(text, name)["MC_FORCE_TCP"] == "1", name
        pod = by_kind(text, "LeaderWorkerSet")[name]["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
        assert "hostNetwork" not in pod
    assert any("KV cache moves over TCP" in n and "prefill, decode" in n for n in r.notes["t"])
    # The default backend is mooncake too; mooncake_tcp needs nothing (SGLang sets MC_FORCE_TCP itself);
    # nixl picks its own transport; a server without PD moves no KV.
    text = render(pd_inventory(tmp_path / "b")).streams["t"]
    assert engine_env(text, "t-prefill")["MC_FORCE_TCP"] == "1"
    tcp = {"settings": {**PREFILL["settings"], "disaggregation_transfer_backend": "mooncake_tcp"}}
    tcp_d = {"settings": {**DECODE["settings"], "disaggregation_transfer_backend": "mooncake_tcp"}}
    text = render(pd_inventory(tmp_path / "c", prefill=tcp, decode=tcp_d)).streams["t"]
    assert "MC_FORCE_TCP" not in engine_env(text, "t-prefill")
    text = render(multinode(tmp_path / "d")).streams["big"]
    assert "MC_FORCE_TCP" not in engine_env(text, "big-tp16")


def test_1_a_user_setting_wins(tmp_path: Path) -> None:
    inv = pd_inventory(tmp_path, prefill={**mooncake(PREFILL), "env": {"MC_FORCE_TCP": "0"}}, decode=mooncake(DECODE))
    assert engine_env(render(inv).streams["t"], "t-prefill")["MC_FORCE_TCP"] == "0"


def test_1_infiniband_devices_mean_rdma_not_tcp(tmp_path: Path) -> None:
    inv = pd_inventory(tmp_path, prefill=ib(PREFILL), decode=ib(DECODE), defaults=RDMA_RESOURCE)
    text = render(inv).streams["t"]
    assert "MC_FORCE_TCP" not in engine_env(text, "t-prefill")
    assert engine_env(text, "t-prefill")["NCCL_IB_HCA"] == "mlx5_0,mlx5_1"


def lws_pod(text: str, name: str, template: str = "workerTemplate") -> dict[str, Any]:
    spec: dict[str, Any] = by_kind(text, "LeaderWorkerSet")[name]["spec"]["leaderWorkerTemplate"][template]["spec"]
    return spec


def test_2_rdma_pods_request_the_rdma_device_plugins_resource(tmp_path: Path) -> None:
    """/dev/infiniband and IPC_LOCK alone leave uverbs blocked by the device cgroup: the pod asks
    the RDMA device plugin for its resource (llm-d: rdma/ib: 1), named in the inventory."""
    inv = pd_inventory(tmp_path, prefill=ib(PREFILL), decode=ib(DECODE), defaults=RDMA_RESOURCE)
    r = render(inv)
    for name in ("t-prefill", "t-decode"):
        c = container(by_kind(r.streams["t"], "LeaderWorkerSet")[name])
        assert c["resources"]["requests"]["rdma/ib"] == c["resources"]["limits"]["rdma/ib"] == 1
        assert c["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}  # not privileged unless asked
    assert any("RDMA device plugin that advertises rdma/ib" in n for n in r.notes["t"])


def test_2_privileged_only_when_asked(tmp_path: Path) -> None:
    asked = {**ib(PREFILL), "kubernetes": {"privileged": True}}
    inv = pd_inventory(tmp_path, prefill=asked, decode={**ib(DECODE), "kubernetes": {"privileged": True}})
    r = render(inv)
    c = container(by_kind(r.streams["t"], "LeaderWorkerSet")["t-prefill"])
    assert c["securityContext"] == {"privileged": True, "capabilities": {"add": ["IPC_LOCK"]}}
    assert "rdma/ib" not in c["resources"]["limits"]
    assert {"name": "infiniband", "mountPath": "/dev/infiniband"} in c["volumeMounts"]  # the node's devices
    assert any("privileged" in n and "sees every GPU of its node" in n for n in r.notes["t"])


def test_2_rdma_without_a_resource_or_privileged_is_refused(tmp_path: Path) -> None:
    inv = pd_inventory(tmp_path, prefill=ib(PREFILL), decode=ib(DECODE))
    with pytest.raises(InputError) as err:
        render(inv)
    problems = [p for p in err.value.problems if p.role == "prefill"]
    [p] = problems
    assert p.key == "settings.disaggregation_ib_device" and p.file and p.file.endswith("roles/prefill.yml")
    assert p.line is not None
    assert "kubernetes.rdma_resource" in p.message and "kubernetes.privileged" in p.message


HOST_IP = {"name": "SGLANG_HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}


def test_6_host_network_pods_pin_their_interfaces(tmp_path: Path) -> None:
    """On the host network of a multi-NIC node, gloo, NCCL and SGLang's bootstrap each pick an
    interface of their own; every reference pins them (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME,
    SGLANG_HOST_IP). The interfaces are the inventory's; the address is the pod's (the node's)."""
    defaults = {"kubernetes": {"rdma_resource": "rdma/ib", "socket_ifname": "bond0"}}
    r = render(pd_inventory(tmp_path / "a", prefill=ib(PREFILL), decode=ib(DECODE), defaults=defaults))
    for name in ("t-prefill", "t-decode"):
        env = engine_env(r.streams["t"], name)
        assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "bond0"
        assert HOST_IP in container(by_kind(r.streams["t"], "LeaderWorkerSet")[name])["env"]
    assert not any("socket_ifname" in n for n in r.notes["t"])
    # Without the setting: the address is still pinned, and the notes say what to set.
    r = render(pd_inventory(tmp_path / "b", prefill=ib(PREFILL), decode=ib(DECODE), defaults=RDMA_RESOURCE))
    assert HOST_IP in container(by_kind(r.streams["t"], "LeaderWorkerSet")["t-prefill"])["env"]
    assert "GLOO_SOCKET_IFNAME" not in engine_env(r.streams["t"], "t-prefill")
    assert any("kubernetes.socket_ifname" in n and "prefill, decode" in n for n in r.notes["t"])


def test_6_ranks_of_a_multi_node_group_pin_them_too(tmp_path: Path) -> None:
    inv = multinode(tmp_path, tp16={"kubernetes": {"socket_ifname": "eth0"}})
    env = engine_env(render(inv).streams["big"], "big-tp16")
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "eth0"


def test_6_the_users_own_value_wins(tmp_path: Path) -> None:
    inv = multinode(tmp_path, tp16={"kubernetes": {"socket_ifname": "eth0"}, "env": {"NCCL_SOCKET_IFNAME": "=ib0"}})
    env = engine_env(render(inv).streams["big"], "big-tp16")
    assert (env["GLOO_SOCKET_IFNAME"], env["NCCL_SOCKET_IFNAME"]) == ("eth0", "=ib0")


WITH_MEMORY = {"numa_nodes": [{"id": 0, "gpus": [0, 1, 2, 3], "cpus": "0-15", "memory_gib": 512},
                              {"id": 1, "gpus": [4, 5, 6, 7], "cpus": "16-31", "memory_gib": 512}]}


def pd_with_memory(root: Path, prefill: dict[str, Any] | None = None, **kwargs: Any) -> str:
    return write_inventory(root, {"n1": {**WITH_MEMORY, "address": "192.0.2.11",
                                         "roles": ["prefill", "decode", "router"]}},
                           {"prefill": {**PREFILL, **(prefill or {})}, "decode": DECODE, "router": ROUTER}, **kwargs)


def test_3_pods_request_cpu_and_memory_from_the_inventory(tmp_path: Path) -> None:
    """GPU-only requests make a pod BestEffort (QoS counts CPU and memory only): evicted and
    OOM-killed first. The pod asks for its share of its NUMA node, less what the node keeps."""
    r = render(pd_with_memory(tmp_path))
    text = r.streams["t"]
    c = container(by_kind(text, "LeaderWorkerSet")["t-prefill"])
    # NUMA node 0: 16 CPUs, 512 GiB, all 4 GPUs the prefill's; 2 CPUs and 16 GiB kept by default.
    assert c["resources"]["requests"] == {"cpu": 14, "memory": "496Gi", "nvidia.com/gpu": 4}
    assert c["resources"]["limits"] == {"memory": "496Gi", "nvidia.com/gpu": 4}  # Burstable: no CPU limit
    router = container(by_kind(text, "Deployment")["t-router"])
    assert router["resources"]["requests"] == {"cpu": 1, "memory": "2Gi"}
    qos = next(n for n in r.notes["t"] if n.startswith("QoS class:"))
    assert "prefill Burstable" in qos and "router Burstable" in qos and "BestEffort" not in qos


def test_3_guaranteed_qos_when_asked(tmp_path: Path) -> None:
    r = render(pd_with_memory(tmp_path, prefill={"kubernetes": {"qos": "guaranteed"}},
                              defaults={"kubernetes": {"reserved_cpus": 0, "reserved_memory_gib": 0}}))
    c = container(by_kind(r.streams["t"], "LeaderWorkerSet")["t-prefill"])
    assert c["resources"]["requests"] == c["resources"]["limits"] == {"cpu": 16, "memory": "512Gi",
                                                                        "nvidia.com/gpu": 4}
    qos = next(n for n in r.notes["t"] if n.startswith("QoS class:"))
    assert "prefill Guaranteed" in qos and "decode Burstable" in qos
    assert any("single-numa-node" in n and "static" in n and "prefill" in n for n in r.notes["t"])


def test_3_shm_has_a_size_limit(tmp_path: Path) -> None:
    """An unbounded Memory emptyDir may take the node's memory; llm-d gives 16-64 Gi, Dynamo 8 Gi."""
    r = render(pd_with_memory(tmp_path, prefill={"kubernetes": {"shm_gib": 32}}))
    volumes = lws_pod(r.streams["t"], "t-prefill")["volumes"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "32Gi"}} in volumes
    volumes = lws_pod(r.streams["t"], "t-decode")["volumes"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}} in volumes


def test_3_roles_that_share_a_numa_node_share_its_cpus(tmp_path: Path) -> None:
    tp2 = {**DECODE, "tp_size": 2}
    inv = write_inventory(tmp_path, {"n1": {**WITH_MEMORY, "address": "192.0.2.11", "roles": ["a", "b"]}},
                          {"a": tp2, "b": tp2})
    text = render(inv).streams["t"]
    for name in ("t-a", "t-b"):  # both on NUMA node 0, 2 of its 4 GPUs each
        assert container(by_kind(text, "LeaderWorkerSet")[name])["resources"]["requests"] == {
            "cpu": 7, "memory": "248Gi", "nvidia.com/gpu": 2}


def test_3_without_memory_sizes_only_cpu_is_requested_and_notes_say_so(tmp_path: Path) -> None:
    r = render(pd_inventory(tmp_path))
    c = container(by_kind(r.streams["t"], "LeaderWorkerSet")["t-prefill"])
    assert c["resources"]["requests"] == {"cpu": 14, "nvidia.com/gpu": 4}
    qos = next(n for n in r.notes["t"] if n.startswith("QoS class:"))
    assert "prefill Burstable" in qos and "numa_nodes[].memory_gib" in qos


def test_3_impossible_sizes_are_refused_with_their_file_and_line(tmp_path: Path) -> None:
    with pytest.raises(InputError) as err:
        render(pd_inventory(tmp_path / "a", prefill={"kubernetes": {"qos": "guaranteed"}}))
    [p] = err.value.problems
    assert p.key == "kubernetes.qos" and p.file and p.file.endswith("roles/prefill.yml") and p.line
    assert "needs a memory size" in p.message
    with pytest.raises(InputError) as err:
        render(pd_with_memory(tmp_path / "b", prefill={"kubernetes": {"memory_gib": 8}}))
    [p] = err.value.problems
    assert p.key == "kubernetes.memory_gib" and "/dev/shm" in p.message


def test_4_a_multi_node_group_is_ready_when_its_ranks_serve_not_when_a_port_opens(tmp_path: Path) -> None:
    """With LeaderReady the leader had to be Ready before LWS made its workers, so it was probed on
    its dist-init port: the group counted as serving minutes before it did and stayed Ready if it
    hung, and rolling updates moved on that. LeaderCreated starts every rank at once, and each
    probes SGLang's /health: the leader's API (up once every rank joined), a worker's health
    server (SGLang's on non-zero ranks, up once their schedulers are)."""
    r = render(multinode(tmp_path))
    lws = by_kind(r.streams["big"], "LeaderWorkerSet")["big-tp16"]
    assert lws["spec"]["startupPolicy"] == "LeaderCreated"
    for template in ("leaderTemplate", "workerTemplate"):
        c = container(lws, template)
        for probe in ("startupProbe", "readinessProbe"):
            assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}, (template, probe)
        assert {"name": "http", "containerPort": 30000} in c["ports"]
    assert "tcpSocket" not in r.streams["big"]
    assert any("LeaderCreated" in n and "every rank" in n for n in r.notes["big"])


def startup_budget(c: dict[str, Any]) -> int:
    probe = c["startupProbe"]
    return int(probe["failureThreshold"] * probe["periodSeconds"])


def test_8_the_startup_budget_has_room_and_readiness_outwaits_a_health_generation(tmp_path: Path) -> None:
    """Overrunning the startup probe restarts the container, and with RecreateGroupOnPodRestart the
    whole group, in a loop: a budget equal to health.timeout_s left no room (llm-d allows 30 s x
    120). SGLang's /health runs a one-token generation and answers 503 itself after
    SGLANG_HEALTH_CHECK_TIMEOUT (20 s): a 5 s probe timeout failed a busy server before that."""
    r = render(multinode(tmp_path))  # health.timeout_s 3600
    c = container(by_kind(r.streams["big"], "LeaderWorkerSet")["big-tp16"], "leaderTemplate")
    assert startup_budget(c) >= 7200
    assert c["readinessProbe"]["timeoutSeconds"] > 20
    text = render(pd_inventory(tmp_path / "pd", prefill={"env": {"SGLANG_HEALTH_CHECK_TIMEOUT": "60"}})).streams["t"]
    prefill = container(by_kind(text, "LeaderWorkerSet")["t-prefill"])  # health.timeout_s 900
    assert startup_budget(prefill) >= 3600 and prefill["readinessProbe"]["timeoutSeconds"] > 60
    assert any("startup" in n and "7200 s" in n for n in r.notes["big"])


def router_flag(text: str, name: str, flag: str) -> str:
    args = container(by_kind(text, "Deployment")[name])["args"]
    assert args.count(flag) == 1, args
    return str(args[args.index(flag) + 1])


def test_7_the_router_waits_for_workers_as_long_as_they_may_take_to_start(tmp_path: Path) -> None:
    """On Kubernetes router and engines start together; the router drops a worker that is not
    healthy after --worker-startup-timeout-secs (default 1800 s), shorter than a TP16 load."""
    text = render(multinode(tmp_path)).streams["big"]
    c = container(by_kind(text, "LeaderWorkerSet")["big-tp16"], "leaderTemplate")
    assert int(router_flag(text, "big-front", "--worker-startup-timeout-secs")) >= startup_budget(c)


def test_7_a_shorter_timeout_of_the_users_is_refused_at_its_line(tmp_path: Path) -> None:
    front = {"settings": {"worker_startup_timeout_secs": 600}}
    with pytest.raises(InputError) as err:
        render(multinode(tmp_path, front=front))
    [p] = err.value.problems
    assert p.key == "settings.worker_startup_timeout_secs" and p.role == "front" and p.line
    assert "600" in p.message and "7200" in p.message


GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def test_9_the_router_has_time_to_finish_its_streams_and_gpu_pods_tolerate_gpu_nodes(tmp_path: Path) -> None:
    """terminationGracePeriodSeconds 30 killed the router 150 s before its own drain
    (--shutdown-grace-period-secs, default 180) ended: every rollout cut in-flight streams. GPU
    nodes are often tainted nvidia.com/gpu (GKE does it); OME and llm-d's pods tolerate it."""
    text = render(pd_inventory(tmp_path / "a")).streams["t"]
    router = by_kind(text, "Deployment")["t-router"]["spec"]["template"]["spec"]
    assert router["terminationGracePeriodSeconds"] > 180
    assert "tolerations" not in router  # it asks for no GPU
    for name in ("t-prefill", "t-decode"):
        assert GPU_TOLERATION in lws_pod(text, name)["tolerations"]
    slow = {**ROUTER, "settings": {"shutdown_grace_period_secs": 600}}
    inv = write_inventory(tmp_path / "b", {"n1": {"address": "192.0.2.11", "roles": ["prefill", "decode", "router"]}},
                          {"prefill": PREFILL, "decode": DECODE, "router": slow})
    router = by_kind(render(inv).streams["t"], "Deployment")["t-router"]["spec"]["template"]["spec"]
    assert router["terminationGracePeriodSeconds"] > 600
    assert router_flag(render(inv).streams["t"], "t-router", "--shutdown-grace-period-secs") == "600"
