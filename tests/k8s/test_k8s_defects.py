"""Issue 24: what a cluster operator would hit at run time with manifests that only validated.
One test per defect, named by its number in the issue; each failed before its fix."""

from __future__ import annotations

from pathlib import Path

from k8stools import by_kind, container, docs, multinode

from gpudeploy.k8s import render
from gpudeploy.k8s.envrefs import undefined_references

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
