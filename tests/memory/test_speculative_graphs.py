"""Speculative decoding's CUDA graphs as the release captures them (memory/speculative.py cites the
file and line of each buffer): the verify and draft families' kv indices and masks per backend, the
draft extend width per release, and a known shape with MTP under a read release judged by the
release's own arithmetic, not hedged."""

from __future__ import annotations

import pytest

from gpudeploy.memory import budget, model_facts_from_mapping
from gpudeploy.memory.budget import Cal, evaluate
from gpudeploy.memory.modelfacts import GIB
from gpudeploy.memory.releases import release_rules
from gpudeploy.memory.settings import EngineSettings

# Qwen3.5-27B / Qwen3.6-27B's text config (tests/memory/cases.yaml models.field-51gb-hybrid)
QWEN35_27B = {"name": "qwen3.5-27b", "kind": "hybrid", "architecture": "Qwen3_5ForConditionalGeneration",
              "weights_gib": 51.8, "layers": 64, "full_attention_layers": 16, "linear_layers": 48, "kv_heads": 4,
              "head_dim": 256, "state_bytes_per_request": 153944064, "hidden_size": 5120, "vocab_size": 248320,
              "intermediate_size": 17408, "context_length": 262144, "mtp_layers": 1}
MTP = {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
       "speculative_num_draft_tokens": 4}
# a dense GQA model (Qwen3-32B's shape) with a one-layer EAGLE draft: no state pool to clamp the batch
DENSE = {"name": "dense-32b", "kind": "mha", "architecture": "Qwen3ForCausalLM", "weights_gib": 61.0, "layers": 64,
         "kv_heads": 8, "head_dim": 128, "hidden_size": 5120, "vocab_size": 151936, "intermediate_size": 25600,
         "context_length": 131072, "draft_weights_gib": 1.5}
CTX = 131072


def _graphs(backend: str, release: str, **kw: object) -> dict[str, dict[str, float]]:
    model = model_facts_from_mapping(DENSE, "t")
    s = EngineSettings.from_settings({"mem_fraction_static": 0.8, "max_running_requests": 64,
                                      "cuda_graph_max_bs": 64, "attention_backend": backend, **MTP, **kw}, tp_size=1)
    got = evaluate(139.8, model, s, Cal(), release_rules(release))
    return got.graphs


@pytest.mark.parametrize(("backend", "verify_row", "draft_row"), [
    # triton: int64 kv indices + a uint8 mask per verify token; int64 per draft step and extend token
    ("triton", 4 * 9, 3 * 1 * 8 + 4 * 8),
    # flashinfer: int32 indices + a uint8 custom mask; int32 per draft step, + the mask when extending
    ("flashinfer", 4 * 5, 3 * 1 * 4 + 4 * 5),
    # FA3: four page tables in the target's backend, in each of steps - 1 draft backends and the extend one
    ("fa3", 4 * 4, 2 * 4 * 4 + 4 * 4)])
def test_verify_and_draft_index_buffers_follow_the_backend(backend: str, verify_row: int, draft_row: int) -> None:
    g = _graphs(backend, "0.5.23")
    assert g["verify_graphs"]["attn_metadata"] == pytest.approx(64 * CTX * verify_row / GIB, abs=0.001)
    assert g["draft_graphs"]["attn_metadata"] == pytest.approx(64 * CTX * draft_row / GIB, abs=0.001)


def test_the_draft_extend_width_is_the_draft_tokens_from_0_5_13() -> None:
    # topk 4: 8 draft tokens, where steps + 1 is 6 (0.5.12 eagle_draft_extend_cuda_graph_runner.py:107,
    # 0.5.13 :113); flashinfer keeps 5 bytes a token
    tree = {"speculative_num_steps": 5, "speculative_eagle_topk": 4, "speculative_num_draft_tokens": 8}
    old = _graphs("flashinfer", "0.5.12", **tree)["draft_graphs"]["attn_metadata"]
    new = _graphs("flashinfer", "0.5.13", **tree)["draft_graphs"]["attn_metadata"]
    decode = 64 * CTX * 5 * 4 * 4 / GIB
    assert (old - decode, new - decode) == (pytest.approx(64 * CTX * 6 * 5 / GIB, abs=0.001),
                                             pytest.approx(64 * CTX * 8 * 5 / GIB, abs=0.001))


def test_a_known_shape_with_mtp_under_a_read_release_is_not_hedged() -> None:
    """The field's 27B hybrid + MTP, 512 requests, extra_buffer on one 96 GB GPU: under 0.5.23 the
    release's own arithmetic says what happens (SGLang serves fewer requests; 0.80 and 0.90 fit), with
    the speculative graphs grounded, where before the whole term was an assumed +-20 GiB."""
    model = model_facts_from_mapping(QWEN35_27B, "t")
    for f in (0.80, 0.90):
        s = EngineSettings.from_settings({"mem_fraction_static": f, "max_running_requests": 512,
                                          "mamba_scheduler_strategy": "extra_buffer", **MTP}, tp_size=1)
        got = budget(95.0, model, s, release="0.5.23")
        assert (got.verdict, got.severity) == ("fits", "ok"), got.reason
        assert "speculative graphs" not in [i.name for i in got.inputs if not i.grounded]
        assert got.error_band_gib < 2.0
        assert {"verify_graphs", "draft_graphs", "spec_buffers"} <= set(got.headroom_breakdown)


def test_a_guessed_shape_keeps_the_speculative_graphs_in_the_band() -> None:
    """The field's TP4 FP8 MoE (shape guessed as DeepSeek-V3's) with MTP died at 0.70 needing >= 34.7 GiB
    of headroom where the release's arithmetic for that shape gives under 7: never called fits."""
    guessed = {"name": "moe", "kind": "mla", "assumed": ["shape"], "architecture": "DeepseekV3ForCausalLM",
               "weights_bytes": 146000000000, "layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
               "hidden_size": 7168, "vocab_size": 129280, "moe_intermediate_size": 2048,
               "num_experts_per_tok": 8, "context_length": 163840, "mtp_layers": 1}
    model = model_facts_from_mapping(guessed, "t")
    mtp = {"speculative_algorithm": "EAGLE", "speculative_num_steps": 1, "speculative_eagle_topk": 1,
           "speculative_num_draft_tokens": 2}
    for release in ("0.5.9", "0.5.17", "0.5.23"):
        died = budget(95.0, model, EngineSettings.from_settings({"mem_fraction_static": 0.70, **mtp}, tp_size=4),
                      release=release)
        assert died.verdict != "fits", (release, died.reason)
        assert "speculative graphs" in [i.name for i in died.inputs if not i.grounded]
        booted = budget(95.0, model, EngineSettings.from_settings(
            {"mem_fraction_static": 0.60, "cuda_graph_max_bs": 16, **mtp}, tp_size=4), release=release)
        assert booted.severity != "refuse", (release, booted.reason)
