"""Rendering for Kubernetes from small inventories: multi-node groups, replicas, secrets, RDMA, and
roles a manifest cannot carry (each a clear error, and nothing written)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from k8stools import (
    DECODE,
    MODEL,
    PREFILL,
    ROUTER,
    by_kind,
    container,
    docs,
    invoke,
    multinode,
    pd_inventory,
    write_inventory,
)

from gpudeploy.errors import InputError
from gpudeploy.k8s import Options, render


def test_a_role_over_two_nodes_is_one_leaderworkerset_of_size_2(tmp_path: Path) -> None:
    r = render(multinode(tmp_path))
    text = r.streams["big"]
    lws = by_kind(text, "LeaderWorkerSet")["big-tp16"]
    spec = lws["spec"]
    assert spec["replicas"] == 1 and spec["startupPolicy"] == "LeaderCreated"  # defect 4 of issue 24
    assert spec["leaderWorkerTemplate"]["size"] == 2
    assert spec["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader, worker = container(lws, "leaderTemplate"), container(lws, "workerTemplate")
    assert leader["args"] == worker["args"]  # one command line; LWS tells each pod its rank
    args = leader["args"]
    pairs = {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--")}
    assert pairs["--dist-init-addr"] == "$(LWS_LEADER_ADDRESS):20000"
    assert pairs["--nnodes"] == "$(LWS_GROUP_SIZE)" and pairs["--node-rank"] == "$(LWS_WORKER_INDEX)"
    assert pairs["--tp-size"] == "16" and pairs["--host"] == "0.0.0.0"
    for c in (leader, worker):  # eight GPUs per node, requests = limits; the node's 64 CPUs less 2 kept
        assert c["resources"] == {"requests": {"cpu": 62, "nvidia.com/gpu": 8}, "limits": {"nvidia.com/gpu": 8}}
    # Every rank is probed on /health (test_k8s_defects.py, defect 4); only the leader serves dist-init.
    assert leader["startupProbe"]["failureThreshold"] * leader["startupProbe"]["periodSeconds"] >= 3600
    assert {"name": "dist-init", "containerPort": 20000} in leader["ports"]
    assert "dist-init" not in [p["name"] for p in worker["ports"]]
    template = spec["leaderWorkerTemplate"]
    assert [template[t]["metadata"]["labels"]["role"] for t in ("leaderTemplate", "workerTemplate")] == [
        "leader", "worker"]
    service = by_kind(text, "Service")["big-tp16-leader"]
    assert service["spec"]["selector"] == {"leaderworkerset.sigs.k8s.io/name": "big-tp16", "role": "leader"}
    router = container(by_kind(text, "Deployment")["big-front"])
    assert router["args"][router["args"].index("--worker-urls") + 1] == "http://big-tp16-leader:30000"
    for host_value in ("192.0.2.2", "/opt/sglang/venv/bin/python"):  # addresses, the host's interpreter
        assert host_value not in text
    assert any("spans 2 nodes" in n and "LeaderCreated" in n for n in r.notes["big"])


def test_ranks_that_differ_cannot_share_a_template(tmp_path: Path) -> None:
    with pytest.raises(InputError) as err:
        render(multinode(tmp_path, n2_env={"NCCL_DEBUG": "INFO"}))
    text = str(err.value)
    assert "role tp16" in text and "env differs from n1's on n2: NCCL_DEBUG='INFO'" in text


def test_several_groups_are_replicas_and_the_router_sees_each(tmp_path: Path) -> None:
    inv = write_inventory(tmp_path, {
        "n1": {"address": "192.0.2.11", "roles": ["prefill", "decode", "router"]},
        "n2": {"address": "192.0.2.12", "roles": ["prefill", "decode"]},
    }, {"prefill": PREFILL, "decode": DECODE, "router": ROUTER})
    text = render(inv).streams["t"]
    lws = by_kind(text, "LeaderWorkerSet")
    assert lws["t-prefill"]["spec"]["replicas"] == 2 and lws["t-decode"]["spec"]["replicas"] == 2
    args = container(by_kind(text, "Deployment")["t-router"])["args"]
    prefills = [args[i + 1] for i, a in enumerate(args) if a == "--prefill"]
    decodes = [args[i + 1] for i, a in enumerate(args) if a == "--decode"]
    # Each server by its own name under LWS's headless Service: a PD request's bootstrap must reach
    # the prefill server that took it, which a Service in front of both would not guarantee.
    assert prefills == ["http://t-prefill-0.t-prefill:30000", "http://t-prefill-1.t-prefill:30000"]
    assert decodes == ["http://t-decode-0.t-decode:30010", "http://t-decode-1.t-decode:30010"]


def test_secret_values_never_reach_a_manifest(tmp_path: Path) -> None:
    value = "hf_k8s_test_value_4f1c9e"  # what must not leak
    inv = pd_inventory(tmp_path, prefill={"secret_env": ["HF_TOKEN"]}, decode={"secret_env": ["HF_TOKEN"]})
    out = tmp_path / "out"
    res = invoke("render", "--target", "k8s", "--inventory", inv, "--out", str(out),
                 env={**os.environ, "HF_TOKEN": value})
    assert res.returncode == 0, res.stderr
    files = {p.name: p.read_text() for p in out.iterdir()}
    assert sorted(files) == ["NOTES.md", "t.yaml"]
    stdout = invoke("render", "--target", "k8s", "--inventory", inv, env={**os.environ, "HF_TOKEN": value})
    for text in [*files.values(), res.stdout, res.stderr, stdout.stdout, stdout.stderr]:
        assert value not in text
    lws = by_kind(files["t.yaml"], "LeaderWorkerSet")
    for name in ("t-prefill", "t-decode"):
        assert container(lws[name])["env"] == [
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "t-secrets", "key": "HF_TOKEN"}}}]
    assert not by_kind(files["t.yaml"], "Secret")  # referenced, never written
    for d in by_kind(files["t.yaml"], "ConfigMap").values():
        assert "HF_TOKEN" not in d["data"]
    assert 'kubectl create secret generic t-secrets --from-literal=HF_TOKEN="$HF_TOKEN"' in res.stdout
    assert "kubectl create secret generic t-secrets" in files["NOTES.md"]


RDMA_WORDS = ("hostNetwork", "IPC_LOCK", "/dev/infiniband", "NCCL_IB")


def test_rdma_only_where_infiniband_devices_are_declared(tmp_path: Path) -> None:
    plain = render(pd_inventory(tmp_path / "a")).streams["t"]
    assert not [w for w in RDMA_WORDS if w in plain]

    ib = {"settings": {**PREFILL["settings"], "disaggregation_ib_device": "mlx5_0,mlx5_1"}}
    ib_decode = {"settings": {**DECODE["settings"], "disaggregation_ib_device": "mlx5_0,mlx5_1"}}
    r = render(pd_inventory(tmp_path / "b", prefill=ib, decode=ib_decode,
                            defaults={"kubernetes": {"rdma_resource": "rdma/ib"}}))
    text = r.streams["t"]
    for name in ("t-prefill", "t-decode"):
        lws = by_kind(text, "LeaderWorkerSet")[name]
        pod = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
        assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
        c = container(lws)
        assert c["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
        # The RDMA device plugin gives the pod its devices; only a privileged pod mounts the node's.
        assert {"name": "infiniband", "mountPath": "/dev/infiniband"} not in c["volumeMounts"]
        assert by_kind(text, "ConfigMap")[f"{name}-env"]["data"]["NCCL_IB_HCA"] == "mlx5_0,mlx5_1"
    router = by_kind(text, "Deployment")["t-router"]
    assert "hostNetwork" not in router["spec"]["template"]["spec"]  # the router moves no KV
    assert any("RDMA: prefill, decode through the RDMA device plugin's rdma/ib" in n for n in r.notes["t"])


def test_a_role_value_no_manifest_can_hold_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    inv = pd_inventory(tmp_path, prefill={"health": {"timeout_s": 1e12}})  # failureThreshold past int32
    out = tmp_path / "out"
    res = invoke("render", "--target", "k8s", "--inventory", inv, "--out", str(out))
    assert res.returncode == 1
    assert "Traceback" not in res.stderr and not out.exists()
    err = res.stderr
    assert "nothing was changed" in err
    # Refused at the role's own line since durations are capped at a day (issue 43, item 11): the
    # startupProbe's failureThreshold (2 x health.timeout_s) it would have overflowed can no longer be made.
    assert "roles/prefill.yml" in err and "key health.timeout_s" in err
    assert "must be at most 86400 seconds (a day)" in err


def test_names_kubernetes_refuses(tmp_path: Path) -> None:
    roles = {"decode_": DECODE, "my_prefill": {**PREFILL}}
    inv = write_inventory(tmp_path, {"n1": {"address": "192.0.2.11", "roles": ["my_prefill", "decode_"]}}, roles)
    with pytest.raises(InputError) as err:
        render(inv)
    [problem] = err.value.problems  # my_prefill becomes t-my-prefill; decode_ cannot end a name
    assert problem.role == "decode_" and "'t-decode-' is not a DNS-1035 label" in str(problem)

    long = "a" * 41
    inv = write_inventory(tmp_path / "long", {"n1": {"address": "192.0.2.11", "roles": [long]}},
                          {long: DECODE}, deployment="b" * 12)
    with pytest.raises(InputError) as err:
        render(inv)
    # 54 characters fit a name, but not LWS's StatefulSet of group 0 under its revision-hash label.
    assert f"names its StatefulSets up to '{'b' * 12}-{long}-0'" in str(err.value)
    assert "no pods for a StatefulSet name over 52" in str(err.value)


def test_a_command_engine_is_refused_with_the_reason(tmp_path: Path) -> None:
    inv = write_inventory(tmp_path, {"n1": {"address": "192.0.2.11", "roles": ["custom"]}}, {"custom": {
        "engine": "command", "gpus": 1, "ports": {"http": 18000},
        "argv": ["{{ python }}", "-m", "vllm.entrypoints.openai.api_server", "--port", "{{ port }}"]}})
    with pytest.raises(InputError) as err:
        render(inv)
    assert "engine command cannot be rendered for Kubernetes" in str(err.value)


def test_dollar_signs_reach_the_server_as_written(tmp_path: Path) -> None:
    inv = pd_inventory(tmp_path, decode={"settings": {**DECODE["settings"], "served_model_name": "q$(HOME)$x"}})
    c = container(by_kind(render(inv).streams["t"], "LeaderWorkerSet")["t-decode"])
    # Kubernetes expands $(VAR) in args and reads $$ as $: doubled, the server gets q$(HOME)$x.
    assert c["args"][c["args"].index("--served-model-name") + 1] == "q$$(HOME)$$x"


def test_images_default_to_the_planned_release_and_can_be_chosen(tmp_path: Path) -> None:
    inv = pd_inventory(tmp_path)
    text = render(inv).streams["t"]
    images = {d["metadata"]["name"]: container(d)["image"] for kind in ("LeaderWorkerSet", "Deployment")
              for d in by_kind(text, kind).values()}
    assert images == {"t-prefill": "lmsysorg/sglang:v0.5.23", "t-decode": "lmsysorg/sglang:v0.5.23",
                      "t-router": "lmsysorg/sglang:v0.5.23"}
    text = render(inv, Options(image="registry.local/sglang:x", router_image="registry.local/router:y")).streams["t"]
    assert {container(d)["image"] for d in by_kind(text, "LeaderWorkerSet").values()} == {"registry.local/sglang:x"}
    assert container(by_kind(text, "Deployment")["t-router"])["image"] == "registry.local/router:y"


def test_model_directory_is_mounted_at_the_planned_path(tmp_path: Path) -> None:
    lws = by_kind(render(pd_inventory(tmp_path)).streams["t"], "LeaderWorkerSet")["t-prefill"]
    c = container(lws)
    assert c["args"][c["args"].index("--model-path") + 1] == MODEL["path"]
    assert {"name": "model", "mountPath": MODEL["path"], "readOnly": True} in c["volumeMounts"]
    volumes = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["volumes"]
    assert {"name": "model", "hostPath": {"path": MODEL["path"], "type": "Directory"}} in volumes


def test_model_from_a_persistent_volume_claim(tmp_path: Path) -> None:
    inv = pd_inventory(tmp_path)
    r = render(inv, Options(model_pvc="models-ro"))
    lws = by_kind(r.streams["t"], "LeaderWorkerSet")["t-prefill"]
    c = container(lws)
    assert {"name": "model", "mountPath": MODEL["path"], "readOnly": True} in c["volumeMounts"]
    volumes = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["volumes"]
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "models-ro", "readOnly": True}} in volumes
    assert not any("hostPath" in v for v in volumes)
    assert any("PersistentVolumeClaim models-ro" in n for n in r.notes["t"])
    out = tmp_path / "out"
    res = invoke("render", "--target", "k8s", "--inventory", inv, "--out", str(out), "--model-pvc", "Models_RO")
    assert res.returncode == 1 and not out.exists() and "Traceback" not in res.stderr
    assert "--model-pvc: 'Models_RO' is not a DNS-1123 subdomain" in res.stderr, res.stderr


def test_cli_prints_the_yaml_without_out_and_refuses_other_targets(tmp_path: Path) -> None:
    res = invoke("render", "--target", "k8s", "--inventory", "lab/inventory/lab.yml")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("# Deployment lab of lab/inventory/lab.yml")
    assert len(docs(res.stdout)) == 9
    res = invoke("render", "--target", "helm")
    assert res.returncode == 1 and "the one target so far is k8s" in res.stderr and "Traceback" not in res.stderr


def test_each_deployment_is_its_own_file_and_one_can_be_chosen(tmp_path: Path) -> None:
    inv = write_inventory(tmp_path, {
        "n1": {"address": "192.0.2.11", "roles": ["prefill", "decode", "router"]},
        "n2": {"address": "192.0.2.12", "deployment": "blue", "roles": ["prefill", "decode", "router"]},
    }, {"prefill": PREFILL, "decode": DECODE, "router": ROUTER})
    files = render(inv).files()
    assert sorted(files) == ["NOTES.md", "blue.yaml", "t.yaml"]
    blue = files["blue.yaml"]
    args = container(by_kind(blue, "Deployment")["blue-router"])["args"]
    assert args[args.index("--prefill") + 1] == "http://blue-prefill-leader:30000"
    assert not [d for d in docs(blue) if d["metadata"]["name"].startswith("t-")]
    out = tmp_path / "out"
    res = invoke("render", "--target", "k8s", "--inventory", inv, "--deployment", "blue", "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in out.iterdir()) == ["NOTES.md", "blue.yaml"]
