"""`invoke facts` and the checks deploy makes from them, and flags learned from a host's own engine."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from conftest import Lab
from deploytools import FLAGS_CACHE, Deployments, gd, standin_role

from gpudeploy_lab import control

pytestmark = pytest.mark.lab


@pytest.fixture
def lab3_as_found(lab: Lab) -> Iterator[str]:
    """lab3, given back as it was (NVML and the stand-in's release) after the test."""
    yield "lab3"
    control.restore_nvml("lab3")
    control.clear_sglang_release("lab3")


def test_facts_show_the_real_gpus_and_where_they_differ_from_the_inventory(deployments: Deployments,
                                                                           lab3_as_found: str) -> None:
    swapped = [{"id": 0, "gpus": [4, 5, 6, 7], "cpus": "0"}, {"id": 1, "gpus": [0, 1, 2, 3], "cpus": "1"}]
    good = deployments.inventory("fct", {"srv": standin_role(None)}, host="lab3")
    res = gd("facts", "--inventory", str(good), "--host", "lab3", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads(res.stdout)["lab3"]
    assert doc["source"] == "nvml" and len(doc["gpus"]) == 8 and doc["init"] == "systemd"
    assert all(g["uuid"].startswith("GPU-") and g["bus_id"] for g in doc["gpus"])
    assert [g["numa_node"] for g in doc["gpus"]] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert doc["versions"]["/usr/bin/python3"]["sglang"] == "0.5.23"

    wrong = deployments.inventory("fct2", {"srv": standin_role(None)}, host="lab3",
                                  host_settings={"lab3": {"numa_nodes": swapped}})
    text = gd("facts", "--inventory", str(wrong), "--host", "lab3")
    assert text.returncode == 1 and "DIFFERS FROM THE INVENTORY: inventory puts GPU 0 on NUMA node 1 but the host " \
        "has it on NUMA node 0" in text.stdout, text.stdout
    dep = gd("deploy", "--inventory", str(wrong), "--host", "lab3")
    assert dep.returncode == 1 and "preflight failed, nothing was changed" in dep.stdout, dep.stdout
    assert "inventory puts GPU 4 on NUMA node 0 but the host has it on NUMA node 1" in dep.stdout, dep.stdout


def test_facts_on_a_host_without_nvml_say_so_and_show_the_inventory(deployments: Deployments,
                                                                   lab3_as_found: str) -> None:
    control.remove_nvml("lab3")
    inv = deployments.inventory("fnv", {"srv": standin_role(None)}, host="lab3")
    res = gd("facts", "--inventory", str(inv), "--host", "lab3")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "GPUs: no NVML (NVML init failed:" in res.stdout and "the GPUs below are the INVENTORY's" in res.stdout
    assert "(inventory)" in res.stdout and "Traceback" not in res.stderr
    dep = gd("deploy", "--inventory", str(inv), "--host", "lab3")
    assert dep.returncode == 1 and "cannot check the declared GPUs: NVML init failed" in dep.stdout, dep.stdout


def test_a_release_gpudeploy_has_not_captured_is_learned_from_the_hosts_help(deployments: Deployments,
                                                                            lab3_as_found: str) -> None:
    # lab3's SGLang says it is 0.5.99 and takes 0.5.10's flags (--cuda-graph-max-bs, not 0.5.23's
    # --cuda-graph-max-bs-decode): gpudeploy must read that from the host, not assume 0.5.23's.
    control.set_sglang_release("lab3", "0.5.99", flags_like="0.5.10")
    role = standin_role(None, settings={"cuda_graph_max_bs": 16})
    inv = deployments.inventory("flrn", {"srv": role}, host="lab3",
                                host_settings={"lab3": {"engine_versions": {"sglang": "0.5.99"}}})
    for kept in (FLAGS_CACHE / "sglang").glob("0.5.99.*.json"):
        kept.unlink()  # what an earlier run learned (by release and digest, see flagcache.py)
    offline = gd("plan", "--inventory", str(inv))  # plans offline with the nearest captured release (issue 22)
    assert offline.returncode == 0, offline.stdout + offline.stderr
    assert "0.5.99 is not captured, so `invoke deploy` reads its --help from lab3" in offline.stdout, offline.stdout
    res = gd("deploy", "--inventory", str(inv), "--host", "lab3")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "[lab3] learned the flags of sglang 0.5.99 from its --help" in res.stdout, res.stdout
    [kept] = (FLAGS_CACHE / "sglang").glob("0.5.99.*.json")
    assert list(json.loads(kept.read_text())["hosts"]) == ["lab3"]  # the host that taught it
    plan = json.loads(gd("plan", "--inventory", str(inv), "--json").stdout)  # now offline too
    assert plan["units"][0]["flags"]["learned_from"] == "lab3", plan["units"][0]["flags"]
    assert "   flags    of sglang 0.5.99 learned from lab3 on " in gd("plan", "--inventory", str(inv)).stdout
    argv = plan["units"][0]["argv"]
    assert argv[argv.index("--cuda-graph-max-bs") + 1] == "16" and "--cuda-graph-max-bs-decode" not in argv


def test_a_host_running_another_release_than_the_inventory_says_is_refused(deployments: Deployments,
                                                                          lab3_as_found: str) -> None:
    control.set_sglang_release("lab3", "0.5.10")
    inv = deployments.inventory("fver", {"srv": standin_role(None)}, host="lab3")  # says 0.5.23
    res = gd("deploy", "--inventory", str(inv), "--host", "lab3")
    assert res.returncode == 1 and "has sglang 0.5.10, but the plan rendered role srv's flags for 0.5.23" \
        in res.stdout, res.stdout


def test_a_redeploy_that_changes_nothing_reads_no_gpus_and_one_that_changes_something_does(
        deployments: Deployments, lab3_as_found: str) -> None:
    # Deploy's probe in two stages (apply/probe_stages.py): GPUs, ports and releases guard a start,
    # so they are read only when something will start. NVML gone after the deploy shows which it was.
    inv = deployments.inventory("fst", {"srv": standin_role(None)}, host="lab3")
    first = gd("deploy", "--inventory", str(inv))
    assert first.returncode == 0, first.stdout + first.stderr
    control.remove_nvml("lab3")
    again = gd("deploy", "--inventory", str(inv))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "[lab3/srv] unchanged and healthy" in again.stdout, again.stdout
    changed = deployments.inventory("fst", {"srv": standin_role(None, settings={"cuda_graph_max_bs": 16})},
                                    host="lab3")
    res = gd("deploy", "--inventory", str(changed))
    assert res.returncode == 1 and "cannot check the declared GPUs: NVML init failed" in res.stdout, res.stdout
    assert "preflight failed, nothing was changed" in res.stdout, res.stdout
