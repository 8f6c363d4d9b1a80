"""Speculative decoding's draft as each release places it: from 0.5.14 the draft weights and the draft's
KV are static memory (0.5.14 model_runner_kv_cache_mixin.py:102 "Loaded weights (target + draft)",
pool_configurator.py:136 the draft's layers in the target's cell); before, the draft worker loads after
the pool is sized and its weights and KV come out of the headroom."""

from __future__ import annotations

import pytest

from gpudeploy.memory import budget, model_facts_from_mapping
from gpudeploy.memory.settings import EngineSettings

GLM_AIR = {"name": "glm-4.5-air", "kind": "mha", "architecture": "Glm4MoeForCausalLM", "num_attention_heads": 96,
           "weights_gib": 205, "layers": 46, "kv_heads": 8, "head_dim": 128, "hidden_size": 4096,
           "vocab_size": 151552, "moe_intermediate_size": 1408, "num_experts_per_tok": 8,
           "context_length": 131072, "mtp_layers": 1}
MTP = {"mem_fraction_static": 0.85, "speculative_algorithm": "EAGLE", "speculative_num_steps": 3,
       "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}


@pytest.mark.parametrize(("release", "static"), [("0.5.10", False), ("0.5.12", False), ("0.5.13", False),
                                                 ("0.5.14", True), ("0.5.17", True), ("0.5.23", True)])
def test_the_draft_is_static_memory_from_0_5_14(release: str, static: bool) -> None:
    model = model_facts_from_mapping(GLM_AIR, "t")
    got = budget(139.8, model, EngineSettings.from_settings(MTP, tp_size=4), release=release)
    per_rank_draft = model.draft_bytes() / 4 / 2**30
    target = model.target_weight_bytes() / 4 / 2**30
    if static:
        assert got.weights_gib == pytest.approx(target + per_rank_draft)
        assert "draft_weights" not in got.headroom_breakdown and "draft_kv" not in got.headroom_breakdown
    else:
        assert got.weights_gib == pytest.approx(target)
        assert got.headroom_breakdown["draft_weights"] == pytest.approx(per_rank_draft)
        assert got.headroom_breakdown["draft_kv"] > 0
