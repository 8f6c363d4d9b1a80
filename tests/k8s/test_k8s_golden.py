"""The shipped inventories rendered for Kubernetes, compared with committed files, and validation
that refuses what an API server would.

Golden files: ``golden/<name>/`` holds what ``invoke render --target k8s --inventory
lab/inventory/<name>.yml --out DIR`` writes for the lab's inventories, and for the cases of issue 24
(``cases/<name>/inventory.yml``: PD on one node over TCP, PD over RDMA with a named RDMA resource,
TP16 over two nodes, a router's service discovery). After an intended change of the rendering,
write them again and review the diff:

    GPUDEPLOY_K8S_GOLDEN=write .venv/bin/pytest tests/k8s/test_k8s_golden.py
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from k8stools import REPO, container, docs

from gpudeploy.k8s import render
from gpudeploy.k8s.envrefs import references, undefined_references
from gpudeploy.k8s.resources import qos_class
from gpudeploy.k8s.roleset import Manifest
from gpudeploy.k8s.validate import K8S_VERSION, LWS_SCHEMA, lws_schema_from_crd, manifest_problems
from gpudeploy.model import Role

GOLDEN = Path(__file__).parent / "golden"
CASES_DIR = Path(__file__).parent / "cases"
SHIPPED = ["lab", "hosts"]  # lab/inventory/<name>.yml
CASES = sorted(p.name for p in CASES_DIR.iterdir() if (p / "inventory.yml").exists())
INVENTORIES = SHIPPED + CASES


def source(name: str) -> str:
    """The inventory as given on the command line (the header names it so)."""
    return f"lab/inventory/{name}.yml" if name in SHIPPED else f"tests/k8s/cases/{name}/inventory.yml"
SHARED_CRD = REPO.parent / "shared" / "reference" / "k8s" / "leaderworkerset-crd.yaml"


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # the header names the inventory as given: lab/inventory/<name>.yml


@pytest.mark.parametrize("name", INVENTORIES)
def test_render_matches_golden_files(name: str) -> None:
    files = render(source(name)).files()
    folder = GOLDEN / name
    if os.environ.get("GPUDEPLOY_K8S_GOLDEN") == "write":
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.iterdir():
            old.unlink()
        for file, text in files.items():
            (folder / file).write_text(text)
    assert sorted(p.name for p in folder.iterdir()) == sorted(files)
    for file, text in files.items():
        assert (folder / file).read_text() == text, f"{folder / file} differs: GPUDEPLOY_K8S_GOLDEN=write (see above)"


def golden_docs() -> list[tuple[str, dict[str, Any]]]:
    return [(f"{path.parent.name}/{path.name}", d) for path in sorted(GOLDEN.glob("*/*.yaml"))
            for d in docs(path.read_text())]


def test_golden_files_hold_what_the_shipped_inventories_deploy() -> None:
    kinds = {name: sorted(d["kind"] for d in docs((GOLDEN / name / f"{dep}.yaml").read_text()))
             for name, dep in (("lab", "lab"), ("hosts", "pd"))}
    # prefill and decode: a LeaderWorkerSet, its Service and ConfigMap each; the router a Deployment too.
    expected = sorted(["ConfigMap"] * 3 + ["LeaderWorkerSet"] * 2 + ["Service"] * 3 + ["Deployment"])
    assert kinds == {"lab": expected, "hosts": expected}


@pytest.mark.parametrize("where,doc", golden_docs(), ids=lambda v: v if isinstance(v, str) else v["metadata"]["name"])
def test_every_golden_manifest_validates(where: str, doc: dict[str, Any]) -> None:
    role = Role(name="r", engine="sglang", file="r.yml")
    assert manifest_problems(Manifest(doc, "d", role)) == []
    if doc["kind"] != "LeaderWorkerSet":
        # kubernetes-validate's own entry point agrees (it raises on the first error).
        assert kubernetes_validate.validate(doc, K8S_VERSION, strict=True) == K8S_VERSION


def test_golden_engines_match_the_plan() -> None:
    """What users care about in the lab's render: GPUs, probes sized from the role, the router's upstreams."""
    [text] = [p.read_text() for p in (GOLDEN / "lab").glob("*.yaml")]
    lws = {d["metadata"]["name"]: d for d in docs(text) if d["kind"] == "LeaderWorkerSet"}
    for name in ("lab-prefill", "lab-decode"):
        c = container(lws[name])
        assert c["resources"]["requests"]["nvidia.com/gpu"] == c["resources"]["limits"]["nvidia.com/gpu"] == 4
        assert c["resources"]["requests"]["cpu"] >= 1  # never BestEffort
        start = c["startupProbe"]
        assert start["httpGet"] == {"path": "/health", "port": "http"}
        assert start["failureThreshold"] * start["periodSeconds"] >= 1800  # roles/prefill.yml health.timeout_s
        assert c["readinessProbe"]["httpGet"]["path"] == "/health"
        assert c["command"] == ["python3"] and "/usr/bin/python3" not in c["args"]
        pod = lws[name]["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
        assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}} in pod["volumes"]
        assert lws[name]["spec"]["startupPolicy"] == "LeaderCreated"
        assert lws[name]["spec"]["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"
    [router] = [d for d in docs(text) if d["kind"] == "Deployment"]
    args = container(router)["args"]
    assert args[args.index("--prefill") + 1:args.index("--prefill") + 3] == ["http://lab-prefill-leader:30000", "8998"]
    assert args[args.index("--decode") + 1] == "http://lab-decode-leader:30010"
    assert container(router)["readinessProbe"]["httpGet"]["path"] == "/readiness"
    assert "10.231.0.11" not in text  # no host address is left anywhere
    configs = {d["metadata"]["name"]: d["data"] for d in docs(text) if d["kind"] == "ConfigMap"}
    assert not any("CUDA_VISIBLE_DEVICES" in data for data in configs.values())


@pytest.mark.skipif(not SHARED_CRD.exists(), reason=f"{SHARED_CRD} is not here")
def test_shipped_lws_schema_is_the_crds() -> None:
    crd = yaml.load(SHARED_CRD.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    shipped = json.loads((REPO / "src" / "gpudeploy" / "data" / LWS_SCHEMA).read_text())
    assert shipped == lws_schema_from_crd(crd)


def lab_lws() -> Manifest:
    m = render("lab/inventory/lab.yml").manifests["lab"][1]
    assert m.kind == "LeaderWorkerSet"
    return m


@pytest.mark.parametrize("change,needle", [
    (lambda c, s: c["ports"][0].update(containerPort="forty"), "'forty' is not of type 'integer'"),
    (lambda c, s: s.update(bogusField=True), "'bogusField' was unexpected"),
    (lambda c, s: c["startupProbe"].update(failureThreshold=2**31), "does not fit an int32"),
    (lambda c, s: c.update(imagePullPolicy=None, envFromm=[]), "'envFromm' was unexpected"),
    (lambda c, s: s.update(startupPolicy="LeaderStarted"), "'LeaderStarted' is not one of"),
], ids=["string-port", "unknown-spec-field", "int32-overflow", "unknown-container-field", "bad-enum"])
def test_lws_validation_refuses_what_the_api_server_would(change: Any, needle: str) -> None:
    m = lab_lws()
    doc = copy.deepcopy(m.doc)
    change(container(doc), doc["spec"])
    problems = [str(p) for p in manifest_problems(m, doc)]
    assert any(needle in p for p in problems), problems
    assert all("LeaderWorkerSet lab-prefill" in p and "roles/prefill.yml" in p for p in problems)


def test_int_or_string_takes_both() -> None:
    m = lab_lws()
    doc = copy.deepcopy(m.doc)
    c = container(doc)
    c["readinessProbe"]["httpGet"]["port"] = 30000
    c["resources"]["limits"]["nvidia.com/gpu"] = "4"
    assert manifest_problems(m, doc) == []
    c["readinessProbe"]["httpGet"]["port"] = 3.5
    assert manifest_problems(m, doc)


def test_lws_metadata_is_checked_as_object_meta() -> None:
    m = lab_lws()
    doc = copy.deepcopy(m.doc)
    doc["metadata"]["lables"] = {"a": "b"}
    [problem] = manifest_problems(m, doc)
    assert "metadata: " in str(problem) and "'lables' was unexpected" in str(problem)


def test_core_kinds_are_checked_strictly() -> None:
    m = render("lab/inventory/lab.yml").manifests["lab"][2]
    assert m.kind == "Service"
    doc = copy.deepcopy(m.doc)
    doc["spec"]["ports"][0]["port"] = "30000"
    doc["spec"]["selectr"] = {}
    text = "\n".join(str(p) for p in manifest_problems(m, doc))
    assert "spec.ports[0].port: '30000' is not of type 'integer'" in text
    assert "'selectr' was unexpected" in text and "Kubernetes 1.30 Service schema" in text


@pytest.mark.parametrize("word,refs", [
    ("$(LWS_LEADER_ADDRESS):20000", ["LWS_LEADER_ADDRESS"]),
    ("q$$(HOME)$x", []),  # $$ is an escaped $: the server gets q$(HOME)$x
    ("$$$(A)", ["A"]),
    ("$(A)$(B)", ["A", "B"]),
    ("$(unclosed", []),
    ("plain", []),
])
def test_references_are_read_as_kubernetes_expands_them(word: str, refs: list[str]) -> None:
    assert references(word) == refs


def lws_docs(name: str) -> tuple[list[Manifest], list[dict[str, Any]]]:
    r = render(source(name))
    [(dep, manifests)] = r.manifests.items()
    return manifests, docs(r.streams[dep])


@pytest.mark.parametrize("name", INVENTORIES)
def test_every_variable_the_golden_containers_use_is_defined(name: str) -> None:
    assert undefined_references(*lws_docs(name)) == []


def case_docs(name: str) -> list[dict[str, Any]]:
    [path] = (GOLDEN / name).glob("*.yaml")
    return docs(path.read_text())


def test_the_issue_24_goldens_hold_what_they_are_named_for() -> None:
    assert sorted(CASES) == ["discovery", "pd-rdma", "pd-tcp", "tp16"]
    tcp = case_docs("pd-tcp")
    assert all(d["data"].get("MC_FORCE_TCP") == "1" for d in tcp if d["kind"] == "ConfigMap"
               and d["metadata"]["name"] != "tcp-router-env")
    assert all(qos_class(c["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]) == "Guaranteed"
               for c in tcp if c["kind"] == "LeaderWorkerSet")
    rdma = [d for d in case_docs("pd-rdma") if d["kind"] == "LeaderWorkerSet"]
    assert len(rdma) == 2 and all(container(d)["resources"]["limits"]["rdma/ib"] == 1 for d in rdma)
    assert all(d["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["hostNetwork"] for d in rdma)
    [tp16] = [d for d in case_docs("tp16") if d["kind"] == "LeaderWorkerSet"]
    assert tp16["spec"]["leaderWorkerTemplate"]["size"] == 2
    assert container(tp16, "leaderTemplate")["args"].count("--tp-size") == 1
    sd = case_docs("discovery")
    [router] = [d for d in sd if d["kind"] == "Deployment"]
    assert "--service-discovery" in container(router)["args"]
    assert {d["kind"] for d in sd} >= {"ServiceAccount", "Role", "RoleBinding"}
    assert [d["spec"]["replicas"] for d in sd if d["kind"] == "LeaderWorkerSet"] == [2, 1]  # prefill, decode


def test_a_variable_no_env_defines_is_an_error_naming_manifest_and_container() -> None:
    manifests, rendered = lws_docs("lab")
    changed = copy.deepcopy(rendered)
    [lws] = [d for d in changed if d["metadata"]["name"] == "lab-prefill"]
    c = container(lws)
    c["args"] += ["--dist-init-addr", "$(LWS_LEADER_ADDRESS):20000", "--node-rank", "$(LWS_WORKER_INDEX)"]
    [problem] = undefined_references(manifests, changed)
    text = str(problem)
    assert "LeaderWorkerSet lab-prefill of deployment lab, container sglang (workerTemplate)" in text
    assert "$(LWS_WORKER_INDEX), which is not defined" in text and "roles/prefill.yml" in text
    assert "ConfigMap lab-prefill-env" in text and "LWS_LEADER_ADDRESS" in text  # where it looked
    # Defined in the container's own env, or in the ConfigMap it reads: no error.
    c["env"] = [{"name": "LWS_WORKER_INDEX", "value": "0"}]
    assert undefined_references(manifests, changed) == []
    del c["env"]
    [config] = [d for d in changed if d["metadata"]["name"] == "lab-prefill-env"]
    config["data"]["LWS_WORKER_INDEX"] = "0"
    assert undefined_references(manifests, changed) == []


def test_only_leaderworkerset_pods_get_what_lws_injects() -> None:
    manifests, rendered = lws_docs("lab")
    changed = copy.deepcopy(rendered)
    [router] = [d for d in changed if d["kind"] == "Deployment"]
    container(router)["args"] += ["--host", "$(LWS_LEADER_ADDRESS)"]
    [problem] = undefined_references(manifests, changed)
    assert "Deployment lab-lab-router" in str(problem) and "container router (template)" in str(problem)
