"""Where pods go, from the inventory: nodeSelector, tolerations and affinity per host or role."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from k8stools import DECODE, PREFILL, ROUTER, by_kind, multinode, write_inventory

from gpudeploy.errors import InputError
from gpudeploy.k8s import render

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
AFFINITY = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
    {"labelSelector": {"matchLabels": {"app.kubernetes.io/component": "decode"}},
     "topologyKey": "kubernetes.io/hostname"}]}}


def pod_spec(text: str, kind: str, name: str, template: str = "workerTemplate") -> dict[str, Any]:
    doc = by_kind(text, kind)[name]["spec"]
    spec: dict[str, Any] = (doc["template"] if "template" in doc else doc["leaderWorkerTemplate"][template])["spec"]
    return spec


def test_the_inventory_says_where_each_role_goes(tmp_path: Path) -> None:
    inv = write_inventory(tmp_path, {
        "n1": {"address": "192.0.2.11", "roles": ["prefill", "decode", "router"]},
    }, {"prefill": {**PREFILL, "kubernetes": {"affinity": AFFINITY, "node_selector": {"tier": "prefill"}}},
        "decode": DECODE,
        "router": {**ROUTER, "kubernetes": {"tolerations": [{"key": "cpu-only", "operator": "Exists"}]}}},
        defaults={"kubernetes": {"node_selector": {"pool": "h200"},
                                 "tolerations": [{"key": "dedicated", "value": "llm", "effect": "NoSchedule"}]}})
    r = render(inv)
    text = r.streams["t"]
    dedicated = {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}
    prefill = pod_spec(text, "LeaderWorkerSet", "t-prefill")
    assert prefill["nodeSelector"] == {"pool": "h200", "tier": "prefill"}
    assert prefill["tolerations"] == [dedicated, GPU_TOLERATION]
    assert prefill["affinity"] == AFFINITY
    decode = pod_spec(text, "LeaderWorkerSet", "t-decode")
    assert decode["nodeSelector"] == {"pool": "h200"} and "affinity" not in decode
    router = pod_spec(text, "Deployment", "t-router")
    assert router["tolerations"] == [dedicated, {"key": "cpu-only", "operator": "Exists"}]  # no GPU toleration
    note = next(n for n in r.notes["t"] if n.startswith("Hosts are not expressed"))
    assert "prefill by nodeSelector pool=h200, tier=prefill and its affinity" in note
    assert "decode by nodeSelector pool=h200" in note


def test_every_rank_of_a_group_is_placed_alike(tmp_path: Path) -> None:
    text = render(multinode(tmp_path, tp16={"kubernetes": {"node_selector": {"nvlink": "yes"}}})).streams["big"]
    for template in ("leaderTemplate", "workerTemplate"):
        assert pod_spec(text, "LeaderWorkerSet", "big-tp16", template)["nodeSelector"] == {"nvlink": "yes"}


def test_hosts_of_one_role_that_disagree_are_refused(tmp_path: Path) -> None:
    inv = write_inventory(tmp_path, {
        "n1": {"address": "192.0.2.11", "roles": ["decode"], "kubernetes": {"node_selector": {"zone": "a"}}},
        "n2": {"address": "192.0.2.12", "roles": ["decode"], "kubernetes": {"node_selector": {"zone": "b"}}},
    }, {"decode": DECODE})
    with pytest.raises(InputError) as err:
        render(inv)
    [p] = err.value.problems
    assert p.role == "decode" and "kubernetes settings differs from n1's on n2" in p.message
    assert "node_selector={'zone': 'b'} (not {'zone': 'a'})" in p.message


def test_a_bad_affinity_is_refused_by_the_schema_with_the_manifest(tmp_path: Path) -> None:
    bad = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerm": []}}}
    inv = write_inventory(tmp_path, {"n1": {"address": "192.0.2.11", "roles": ["decode"]}},
                          {"decode": {**DECODE, "kubernetes": {"affinity": bad}}})
    with pytest.raises(InputError) as err:
        render(inv)
    text = str(err.value)
    assert "LeaderWorkerSet t-decode" in text and "'nodeSelectorTerm' was unexpected" in text
    assert "roles/decode.yml" in text and "key kubernetes.affinity" in text
