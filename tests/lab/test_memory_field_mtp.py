"""Issue 22 on lab hosts: the field's MTP launch that died in CUDA-graph capture, replayed through
`invoke deploy`, and what the next `invoke plan` makes of it.

The field: a TP4 FP8 MoE (~146 GB checkpoint, shape unknown: taken as DeepSeek-V3's) with MTP on
96 GB GPUs at --mem-fraction-static 0.70 died with "Tried to allocate 7.50 GiB. GPU 1 has a total
capacity of 94.97 GiB of which 2.30 GiB is free." and no "Capture cuda graph failed" line. The
stand-in's `oom-graph-field` fault prints that line verbatim, from rank 1, mid capture. Before: the
plan said "fits +20.7 +-2.2 GiB", and the OOM alone was called "weights do not fit, use more GPUs".
Now: the plan is uncertain and says what it assumes; the deploy names the phase; the next plan
refuses those settings and recommends ones whose headroom holds what the run proved, and they boot.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from deploytools import Deployments, gd, standin_role

pytestmark = pytest.mark.lab

FIELD = {"kind": "mla", "assumed": ["shape"], "architecture": "DeepseekV3ForCausalLM", "weights_bytes": 146000000000,
         "layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "hidden_size": 7168, "vocab_size": 129280,
         "moe_intermediate_size": 2048, "num_experts_per_tok": 8, "context_length": 163840, "mtp_layers": 1}
MTP = {"speculative_algorithm": "EAGLE", "speculative_num_steps": 1, "speculative_eagle_topk": 1,
       "speculative_num_draft_tokens": 2}
PATH = "/models/field-mtp-oom"   # a model path no other test deploys: no earlier measurement


def field_role(fault: str | None, settings: dict[str, Any]) -> dict[str, Any]:
    role = standin_role(fault, tp=4, timeout_s=60, settings=settings, model={"path": PATH, "facts": FIELD})
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
