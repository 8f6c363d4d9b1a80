"""A router that finds its workers itself (sglang-router's --service-discovery), beside static URLs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from k8stools import DECODE, PREFILL, REPO, ROUTER, by_kind, container, docs, multinode, write_inventory

from gpudeploy.errors import InputError
from gpudeploy.k8s import render

ROUTER_HELP = (REPO / "src" / "gpudeploy" / "data" / "sglang_router-0.3.2-help.txt").read_text()
DISCOVER = {**ROUTER, "kubernetes": {"service_discovery": True}}


def pd(root: Path, router: dict[str, Any] | None = None) -> str:
    return write_inventory(root, {"n1": {"address": "192.0.2.11", "roles": ["prefill", "decode", "router"]}},
                           {"prefill": PREFILL, "decode": DECODE, "router": router or DISCOVER})


def values(args: list[str], flag: str) -> list[str]:
    """The words after ``flag`` up to the next flag."""
    i = args.index(flag) + 1
    out = []
    while i < len(args) and not args[i].startswith("--"):
        out.append(args[i])
        i += 1
    return out


def test_the_router_discovers_pd_workers_by_their_leaders_labels(tmp_path: Path) -> None:
    r = render(pd(tmp_path))
    text = r.streams["t"]
    router = container(by_kind(text, "Deployment")["t-router"])
    args = router["args"]
    assert not {"--prefill", "--decode", "--worker-urls"} & set(args)  # no static URL left
    assert "--service-discovery" in args and "--pd-disaggregation" in args
    assert values(args, "--service-discovery-namespace") == ["$(POD_NAMESPACE)"]
    assert {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}} in router["env"]
    prefill_sel = dict(v.split("=", 1) for v in values(args, "--prefill-selector"))
    decode_sel = dict(v.split("=", 1) for v in values(args, "--decode-selector"))
    lws = by_kind(text, "LeaderWorkerSet")
    for sel, name in ((prefill_sel, "t-prefill"), (decode_sel, "t-decode")):
        labels = lws[name]["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"]["labels"]
        assert sel.items() <= labels.items() and sel["role"] == "leader", name
    # One port for every worker: the decode listens on the prefill's http port here.
    port = values(args, "--service-discovery-port")
    assert port == ["30000"]
    decode = container(lws["t-decode"])
    assert decode["args"][decode["args"].index("--port") + 1] == "30000"
    assert {"name": "http", "containerPort": 30000} in decode["ports"]
    assert by_kind(text, "Service")["t-decode-leader"]["spec"]["ports"] == [
        {"name": "http", "port": 30000, "targetPort": "http"}]
    # The prefill's bootstrap port, where the router's discovery reads it.
    meta = lws["t-prefill"]["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"]
    assert meta["annotations"] == {"sglang.ai/bootstrap-port": "8998"}
    assert any("Service discovery: router router finds prefill, decode" in n for n in r.notes["t"])


def test_every_flag_it_adds_is_one_sglang_router_0_3_2_has() -> None:
    for flag in ("--service-discovery", "--service-discovery-port", "--service-discovery-namespace",
                 "--prefill-selector", "--decode-selector", "--selector", "--worker-startup-timeout-secs"):
        assert re.search(rf"^\s+{re.escape(flag)}\b", ROUTER_HELP, re.M), flag


def test_the_router_may_watch_pods_and_nothing_more(tmp_path: Path) -> None:
    text = render(pd(tmp_path)).streams["t"]
    [account] = by_kind(text, "ServiceAccount").values()
    [role] = by_kind(text, "Role").values()
    [binding] = by_kind(text, "RoleBinding").values()
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"]}]
    pod = by_kind(text, "Deployment")["t-router"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    kinds = [d["kind"] for d in docs(text)]
    assert kinds.index("RoleBinding") < kinds.index("Deployment")  # the router can watch from its start
    assert not by_kind(text, "ClusterRole")  # its own namespace only


def test_static_urls_stay_the_default(tmp_path: Path) -> None:
    text = render(pd(tmp_path, router=ROUTER)).streams["t"]
    args = container(by_kind(text, "Deployment")["t-router"])["args"]
    assert "--service-discovery" not in args and values(args, "--prefill") == ["http://t-prefill-leader:30000", "8998"]
    assert not by_kind(text, "ServiceAccount") and "sglang.ai/bootstrap-port" not in text
    decode = container(by_kind(text, "LeaderWorkerSet")["t-decode"])
    assert decode["args"][decode["args"].index("--port") + 1] == "30010"  # the plan's port


def test_regular_workers_over_two_nodes_are_selected_by_their_leader(tmp_path: Path) -> None:
    inv = multinode(tmp_path, front={"kubernetes": {"service_discovery": True}})
    text = render(inv).streams["big"]
    args = container(by_kind(text, "Deployment")["big-front"])["args"]
    assert "--pd-disaggregation" not in args and "--worker-urls" not in args
    assert values(args, "--selector") == ["app.kubernetes.io/instance=big", "app.kubernetes.io/component=tp16",
                                          "role=leader"]
    worker = by_kind(text, "LeaderWorkerSet")["big-tp16"]["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    assert worker["metadata"]["labels"]["role"] == "worker"  # a rank with no API is never selected


def test_one_role_per_kind(tmp_path: Path) -> None:
    inv = write_inventory(tmp_path, {"n1": {"address": "192.0.2.11", "roles": ["prefill", "p2", "decode", "router"]}},
                          {"prefill": {**PREFILL, "tp_size": 2}, "p2": {**PREFILL, "tp_size": 2}, "decode": DECODE,
                           "router": {**DISCOVER, "upstreams": {"prefill": ["prefill", "p2"], "decode": ["decode"]}}})
    with pytest.raises(InputError) as err:
        render(inv)
    [p] = [p for p in err.value.problems if p.role == "router"]
    assert p.key == "upstreams" and "upstreams.prefill names prefill, p2" in p.message
