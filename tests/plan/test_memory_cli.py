"""The memory preflight as a user meets it: in `plan`, in `plan --suggest`, and as deploy's refusal."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from gpudeploy.plan import load_plan

REPO = Path(__file__).resolve().parents[2]
FACTS = {"kind": "mla", "weights_bytes": 146000000000, "layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
         "hidden_size": 7168, "vocab_size": 129280, "moe_intermediate_size": 2048, "num_experts_per_tok": 8,
         "mtp_layers": 1, "context_length": 163840}
MTP = {"speculative_algorithm": "EAGLE", "speculative_num_steps": 1, "speculative_eagle_topk": 1,
       "speculative_num_draft_tokens": 2}


def make(tmp: Path, settings: dict[str, Any]) -> Path:
    (tmp / "roles").mkdir(exist_ok=True)
    (tmp / "roles" / "srv.yml").write_text(yaml.safe_dump(
        {"engine": "sglang", "tp_size": 4, "model": {"path": "/models/moe", "facts": FACTS}, "settings": settings}))
    inv = tmp / "hosts.yml"
    # 127.0.0.1 port 1: if anything tried to connect, it would fail at once and stay on this machine.
    inv.write_text(yaml.safe_dump({
        "deployment": "m", "roles_dir": "roles", "templates_dir": str(REPO / "templates"),
        "defaults": {"gpu_memory_gib": 95.6, "engine_versions": {"sglang": "0.5.23"}, "ssh": {"port": 1}},
        "hosts": {"node171": {"address": "127.0.0.1", "roles": ["srv"], "numa_nodes": [
            {"id": 0, "gpus": [0, 1, 2, 3], "cpus": "0-31"}]}}}))
    return inv


def verdict(tmp: Path, settings: dict[str, Any]) -> dict[str, Any]:
    mem = load_plan(str(make(tmp, settings))).units[0].memory
    assert mem is not None
    return mem


def test_field_report_with_mtp_fails_at_070_and_the_recommendation_fits(tmp_path: Path) -> None:
    bad = verdict(tmp_path, {"mem_fraction_static": 0.70, **MTP})
    assert bad["verdict"] == "oom-in-graph-capture"
    assert bad["recommended"], bad
    fixed = verdict(tmp_path, {"mem_fraction_static": 0.70, **MTP, **bad["recommended"]})
    assert fixed["verdict"] == "fits", fixed
    booted = verdict(tmp_path, {"mem_fraction_static": 0.60, "cuda_graph_max_bs": 16, **MTP})
    assert booted["verdict"] == "fits"  # what worked in the field


def test_deploy_refuses_a_predicted_oom_before_touching_any_host(tmp_path: Path) -> None:
    inv = make(tmp_path, {"mem_fraction_static": 0.85})
    res = subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), "deploy", "--inventory",
                          str(inv), "--host", "node171"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 1
    assert "memory preflight predicts oom-in-graph-capture" in res.stderr
    assert "Recommended: --mem-fraction-static" in res.stderr
    assert "cannot reach" not in res.stdout + res.stderr  # refused before any connection


def test_plan_suggest_prints_settings_that_fit(tmp_path: Path) -> None:
    inv = make(tmp_path, {"mem_fraction_static": 0.85, **MTP})
    res = subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), "plan", "--inventory",
                          str(inv), "--suggest"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "verdict OOM-IN-GRAPH-CAPTURE" in res.stdout
    assert "fits: --mem-fraction-static" in res.stdout and "KV tokens" in res.stdout
