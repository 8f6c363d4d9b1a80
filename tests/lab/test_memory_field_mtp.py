"""Issue 22 on lab hosts: the field's MTP launch that died in CUDA-graph capture, replayed through
`invoke deploy`, and what the next `invoke plan` makes of it.

The field: a TP4 FP8 MoE (~146 GB checkpoint, shape unknown: taken as DeepSeek-V3's) with MTP on
96 GB GPUs at --mem-fraction-static 0.70 died with "Tried to allocate 7.50 GiB. GPU 1 has a total
capacity of 94.97 GiB of which 2.30 GiB is free." and no "Capture cuda graph failed" line. The
stand-in's `oom-graph-field` fault prints that line verbatim, from rank 1, mid capture. Before: the
plan said "fits +20.7 +-2.2 GiB", and the OOM alone was called "weights do not fit, use more GPUs".
Now: the plan is uncertain and says what it assumes; the deploy names the phase; the next plan
refuses those settings and recommends ones whose headroom holds what the run proved, and they boot.

The other failing field cases (tests/memory/cases.yaml), replayed the same way (issue 44: "the lab
replay of each failing one recommends settings that boot on the first try"):
* field-tp4-fp8-moe-f085, the same model without MTP at 0.85, died in CUDA-graph capture; the report
  names no figures, so the stand-in's `oom-graph-spent` prints a capture OOM that reads as a real one;
* field-pd-prefill-f085 / field-pd-decode-f085, a PD pair of that model at 0.85 that died ~40 s into
  startup: the report says neither which side nor where, so the decode dies in capture (`oom-graph-spent`);
* field-hybrid-512-extra-buffer, the 27B hybrid + MTP at 512 running requests with extra_buffer, never
  fit ("~74 GB of state alone") on a release that takes the state off the top (0.5.9 - 0.5.12; the lab
  host runs the captured 0.5.10): refused before anything launches, and its recommendation boots.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Lab
from deploytools import Deployments, gd, standin_role

from gpudeploy.plan import unit_name
from gpudeploy_lab import control, engine

pytestmark = pytest.mark.lab

FIELD = {"kind": "mla", "assumed": ["shape"], "architecture": "DeepseekV3ForCausalLM", "weights_bytes": 146000000000,
         "layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "hidden_size": 7168, "vocab_size": 129280,
         "moe_intermediate_size": 2048, "num_experts_per_tok": 8, "context_length": 163840, "mtp_layers": 1}
MTP = {"speculative_algorithm": "EAGLE", "speculative_num_steps": 1, "speculative_eagle_topk": 1,
       "speculative_num_draft_tokens": 2}
PATH = "/models/field-mtp-oom"   # a model path no other test deploys: no earlier measurement


def field_role(fault: str | None, settings: dict[str, Any], path: str = PATH) -> dict[str, Any]:
    role = standin_role(fault, tp=4, timeout_s=60, settings=settings, model={"path": path, "facts": FIELD})
    # the stand-in's own arithmetic with this checkpoint and MLA's 70272 B of KV per token (any TP)
    role["env"].update({"SGLANG_STANDIN_WEIGHTS_GIB": f"{146000000000 / 2**30:.2f}",
                        "SGLANG_STANDIN_KV_BYTES_PER_TOKEN": "70272"})
    return role


def memory_of(inv: Path) -> dict[str, Any]:
    res = gd("plan", "--inventory", str(inv), "--json")
    doc = json.loads(res.stdout)
    assert res.returncode == (2 if doc["deploy_would_refuse"] else 0), res.stderr  # 2: deploy would refuse
    mem: dict[str, Any] = doc["units"][0]["memory"]
    return mem


def test_the_fields_mtp_oom_replayed_teaches_the_next_plan(deployments: Deployments) -> None:
    failing = deployments.inventory("fieldmtp", {"srv": field_role("oom-graph-field",
                                                                   {"mem_fraction_static": 0.70, **MTP})})
    first = memory_of(failing)
    # flagged before anything ran: the shape is a guess and MTP's graphs are unmeasured
    assert (first["verdict"], first["severity"]) == ("uncertain", "warn"), first["reason"]
    assert {"model shape", "speculative graphs"} <= set(first["assumed"])

    res = gd("deploy", "--inventory", str(failing), "--host", "lab2")
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    assert "memory preflight: uncertain" in out                    # warned, and went ahead
    assert "while capturing CUDA graphs" in out and "5.20 GiB short" in out, out
    assert "weights do not fit" not in out and "use more GPUs" not in out

    learned = memory_of(failing)                                   # the same settings, planned again
    assert (learned["verdict"], learned["severity"]) == ("oom-in-graph-capture", "refuse"), learned["reason"]
    assert learned["measured"]["failure"] == "oom-in-graph-capture"
    assert learned["measured"]["phase"].startswith("graph-capture")
    assert learned["measured"]["shortfall_gib"] == pytest.approx(5.2)
    assert "7.50 GiB with 2.30 GiB free" in learned["lesson"]
    proven = float(re.search(r"needed at least ([\d.]+) GiB of headroom", learned["lesson"]).group(1))  # type: ignore[union-attr]
    assert proven > learned["headroom_available_gib"]
    assert "--mem-fraction-static" in learned["recommended_flags"]
    assert "covers the last run's shortfall" in learned["message"]

    # the recommendation, merged into the role, holds what the run proved with the band to spare
    fixed_settings = learned["recommended_settings"]
    assert fixed_settings["speculative_algorithm"] == "EAGLE"
    fixed = deployments.inventory("fieldmtp", {"srv": field_role(None, fixed_settings)})
    second = memory_of(fixed)
    assert (second["verdict"], second["severity"]) == ("fits", "ok"), second["reason"]
    assert second["headroom_available_gib"] >= proven + second["error_band_gib"] - 0.01
    assert second["measured"]["failure"] == "oom-in-graph-capture"   # still knows the failed run
    res = gd("deploy", "--inventory", str(fixed), "--host", "lab2")
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("asked", [{"mem_fraction_static": 0.85}, {}], ids=["f085", "default-fraction"])
def test_the_fields_capture_oom_at_085_replayed_recommends_settings_that_boot(deployments: Deployments,
                                                                             asked: dict[str, Any]) -> None:
    # field-tp4-fp8-moe-f085 and -default: SGLang's own default fraction (~0.85 at TP4 on 96 GB) was
    # one of the failing values; each its own path, so one replay's failed run teaches nothing to another
    path = f"/models/field-{'f085' if asked else 'default'}-oom"
    failing = deployments.inventory("fieldf085", {"srv": field_role("oom-graph-spent", asked, path)})
    first = memory_of(failing)
    assert (first["verdict"], first["severity"]) == ("uncertain", "warn"), first["reason"]

    res = gd("deploy", "--inventory", str(failing), "--host", "lab2")
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    assert "cause: CUDA out of memory while capturing CUDA graphs" in out, out    # the cause, named
    assert "weights do not fit" not in out and "use more GPUs" not in out

    learned = memory_of(failing)
    assert (learned["verdict"], learned["severity"]) == ("oom-in-graph-capture", "refuse"), learned["reason"]
    assert "2.00 GiB with 0.50 GiB free" in learned["lesson"], learned["lesson"]
    fixed_settings = learned["recommended_settings"]
    assert fixed_settings["mem_fraction_static"] < first["fraction"], (fixed_settings, first["fraction"])
    assert "covers the last run's shortfall" in learned["message"]

    fixed = deployments.inventory("fieldf085", {"srv": field_role(None, fixed_settings, path)})
    second = memory_of(fixed)
    assert (second["verdict"], second["severity"]) == ("fits", "ok"), second["reason"]
    res = gd("deploy", "--inventory", str(fixed), "--host", "lab2")
    assert res.returncode == 0, res.stdout + res.stderr


# The field's 27B hybrid (cases.yaml field-51gb-hybrid): Qwen3.5-27B's shape, bf16, 51.8 GiB
HYBRID = {"kind": "hybrid", "architecture": "Qwen3_5ForConditionalGeneration", "weights_gib": 51.8, "layers": 64,
          "full_attention_layers": 16, "linear_layers": 48, "kv_heads": 4, "head_dim": 256,
          "state_bytes_per_request": 153944064, "hidden_size": 5120, "vocab_size": 248320,
          "intermediate_size": 17408, "context_length": 262144, "mtp_layers": 1}
OFF_TOP = "0.5.10"   # a captured release that takes the mamba state off the top, as the field's 0.5.9 did


@pytest.fixture
def lab3_at_off_top(lab: Lab) -> Iterator[str]:
    """lab3's SGLang at that release for the test, and 0.5.23 again after it."""
    control.set_sglang_release("lab3", OFF_TOP)
    try:
        yield "lab3"
    finally:
        control.clear_sglang_release("lab3")


def hybrid_role(settings: dict[str, Any]) -> dict[str, Any]:
    role = standin_role(None, tp=1, timeout_s=60, settings=settings,
                        model={"path": "/models/field-hybrid-27b", "facts": HYBRID})
    # the stand-in's own arithmetic with these weights and the 16 full-attention layers' KV (4 x 256 bf16)
    role["env"].update({"SGLANG_STANDIN_WEIGHTS_GIB": "51.80", "SGLANG_STANDIN_KV_BYTES_PER_TOKEN": "65536"})
    return role


def test_the_fields_hybrid_at_512_requests_is_refused_and_its_recommendation_boots(
        deployments: Deployments, lab: Lab, lab3_at_off_top: str) -> None:
    host = lab3_at_off_top
    versions = {host: {"engine_versions": {"sglang": OFF_TOP, "sglang_router": "0.3.2"}}}
    asked = {"max_running_requests": 512, "mamba_scheduler_strategy": "extra_buffer", **MTP}
    refused = deployments.inventory("fieldhyb", {"srv": hybrid_role(asked)}, host=host, host_settings=versions)
    first = memory_of(refused)
    assert (first["verdict"], first["severity"]) == ("kv-pool-empty", "refuse"), first["reason"]
    assert "the state is the cause" in first["reason"]

    res = gd("deploy", "--inventory", str(refused), "--host", host)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    assert "memory preflight predicts kv-pool-empty" in out and "Fix: " in out, out   # refused, and how to fix it
    unit = unit_name("fieldhyb", "srv")
    assert lab.ssh(host, f"test -e /etc/systemd/system/{unit}").returncode != 0   # nothing written or launched

    fixed_settings = first["recommended_settings"]
    assert fixed_settings and fixed_settings["speculative_algorithm"] == "EAGLE", first["message"]  # MTP kept
    assert fixed_settings["max_running_requests"] < 512, fixed_settings
    fixed = deployments.inventory("fieldhyb", {"srv": hybrid_role(fixed_settings)}, host=host, host_settings=versions)
    second = memory_of(fixed)
    assert (second["verdict"], second["severity"]) == ("fits", "ok"), second["reason"]
    res = gd("deploy", "--inventory", str(fixed), "--host", host)
    assert res.returncode == 0, res.stdout + res.stderr


def memory_by_role(inv: Path) -> dict[str, dict[str, Any]]:
    res = gd("plan", "--inventory", str(inv), "--json")
    doc = json.loads(res.stdout)
    assert res.returncode == (2 if doc["deploy_would_refuse"] else 0), res.stderr
    return {u["role"]: u["memory"] for u in doc["units"] if u.get("memory")}


def pd_pair(pre: dict[str, Any], dec: dict[str, Any], dec_fault: str | None = None) -> dict[str, dict[str, Any]]:
    path = "/models/field-pd-oom"
    rt = {"engine": "sglang_router", "upstreams": {"prefill": ["pre"], "decode": ["dec"]},
          "python": engine.ROUTER_GUEST_PYTHON, "extra_args": ["--disable-circuit-breaker"],
          "health": {"timeout_s": 60}, "stop_timeout_s": 5}
    return {"pre": field_role(None, pre, path), "dec": field_role(dec_fault, dec, path), "rt": rt}


@pytest.mark.skipif(not engine.ROUTER.is_built(), reason="the lab's sglang-router venv is not built")
def test_the_fields_pd_pair_at_085_replayed_recommends_settings_that_boot(deployments: Deployments) -> None:
    placed: list[Any] = ["pre", {"role": "dec", "numa_node": 1}, "rt"]
    asked = {"pre": {"mem_fraction_static": 0.85, "disaggregation_mode": "prefill"},
             "dec": {"mem_fraction_static": 0.85, "disaggregation_mode": "decode"}}
    failing = deployments.inventory("fieldpd", pd_pair(asked["pre"], asked["dec"], "oom-graph-spent"), placed=placed)
    first = memory_by_role(failing)
    assert {r: (m["verdict"], m["severity"]) for r, m in first.items()} == {
        "pre": ("uncertain", "warn"), "dec": ("uncertain", "warn")}, first

    res = gd("deploy", "--inventory", str(failing), "--host", "lab2")
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    assert "lab2/dec: FAILED" in out and "cause: CUDA out of memory while capturing CUDA graphs" in out, out

    learned = memory_by_role(failing)
    assert (learned["dec"]["verdict"], learned["dec"]["severity"]) == ("oom-in-graph-capture", "refuse"), \
        learned["dec"]["reason"]
    # each side's recommendation where it has one (a side that warns has a safer one), else its own settings
    fixed_settings = {r: learned[r]["recommended_settings"] or asked[r] for r in ("pre", "dec")}
    assert fixed_settings["dec"]["mem_fraction_static"] < 0.85, fixed_settings
    assert fixed_settings["dec"]["disaggregation_mode"] == "decode"

    fixed = deployments.inventory("fieldpd", pd_pair(fixed_settings["pre"], fixed_settings["dec"]), placed=placed)
    second = memory_by_role(fixed)
    assert second["dec"]["severity"] == "ok" and second["pre"]["severity"] != "refuse", second
    res = gd("deploy", "--inventory", str(fixed), "--host", "lab2")
    assert res.returncode == 0, res.stdout + res.stderr
