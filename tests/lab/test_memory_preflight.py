"""Issue 10 on lab hosts: the memory preflight lets a common setup at SGLang's defaults deploy, and
after a start that dies in CUDA graph capture, the next plan predicts it and its recommendation boots.

The lab's GPUs are 96 GiB (not an H100's 80), so the Llama-3.1-70B TP4 setup runs on those; the
stand-in engine gets the model's real weights and KV size so its own memory arithmetic is that
model's. tests/plan/test_memory_cli.py checks the H100 figures without hosts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from deploytools import Deployments, gd, standin_role

pytestmark = pytest.mark.lab

LLAMA_70B = {"kind": "mha", "weights_bytes": 141107412992, "layers": 80, "kv_heads": 8, "head_dim": 128,
             "hidden_size": 8192, "intermediate_size": 28672, "vocab_size": 128256, "context_length": 131072}


def llama_role(path: str, fault: str | None = None, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    role = standin_role(fault, tp=4, timeout_s=60, settings=settings or {},
                        model={"path": path, "facts": LLAMA_70B})
    role["env"].update({"SGLANG_STANDIN_WEIGHTS_GIB": f"{141107412992 / 2**30:.2f}",
                        "SGLANG_STANDIN_KV_BYTES_PER_TOKEN": str(327680 // 4)})
    return role


def memory_of(inv: Path) -> dict[str, Any]:
    res = gd("plan", "--inventory", str(inv), "--json")
    doc = json.loads(res.stdout)
    assert res.returncode == (2 if doc["deploy_would_refuse"] else 0), res.stderr  # 2: deploy would refuse
    mem: dict[str, Any] = doc["units"][0]["memory"]
    return mem


def test_llama_70b_tp4_at_sglang_defaults_plans_fits_and_deploys(deployments: Deployments) -> None:
    inv = deployments.inventory("l70", {"srv": llama_role("/models/llama70b-defaults")})
    mem = memory_of(inv)
    assert (mem["verdict"], mem["severity"]) == ("fits", "ok"), mem["reason"]
    assert mem["fraction_is_default"] and mem["recommended_flags"] == []
    res = gd("deploy", "--inventory", str(inv), "--host", "lab2")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "memory preflight" not in res.stdout + res.stderr      # neither refused nor warned


def test_after_a_graph_capture_failure_the_calibrated_plan_boots(deployments: Deployments) -> None:
    path = "/models/llama70b-after-oom"   # a model path no other test deploys: no earlier measurement
    failing = deployments.inventory("l70oom", {"srv": llama_role(path, fault="oom-graph")})
    assert memory_of(failing)["verdict"] == "fits"                 # nothing measured foresees the fault
    res = gd("deploy", "--inventory", str(failing), "--host", "lab2")
    assert res.returncode != 0
    assert "CUDA graph" in res.stdout + res.stderr
    learned = memory_of(failing)                                   # the same settings, planned again
    assert learned["verdict"] == "oom-in-graph-capture", learned["reason"]
    assert learned["measured"]["failure"] == "oom-in-graph-capture"
    assert "--mem-fraction-static" in learned["recommended_flags"]
    fixed = deployments.inventory("l70oom", {"srv": llama_role(path, settings=learned["recommended"])})
    second = memory_of(fixed)
    assert (second["verdict"], second["severity"]) == ("fits", "ok"), second["reason"]
    assert second["measured"]["failure"] == "oom-in-graph-capture"   # still knows the failed run
    res = gd("deploy", "--inventory", str(fixed), "--host", "lab2")
    assert res.returncode == 0, res.stdout + res.stderr
