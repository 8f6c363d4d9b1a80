"""What a verdict tells a user beyond fits / does not: the band term by term (what is the release's
own arithmetic, what is assumed), and what a safe setting leaves on the table (issue 44 item 5)."""

from __future__ import annotations

import pytest

from gpudeploy.memory import budget, model_facts_from_mapping
from gpudeploy.memory.settings import EngineSettings

# the packaged TP4 prefill role's model (src/gpudeploy/roles/prefill.yml)
QWEN3_235B = {"name": "Qwen3-235B-A22B-FP8", "kind": "mha", "weights_gib": 219.8, "layers": 94,
              "num_attention_heads": 64, "kv_heads": 4, "head_dim": 128, "hidden_size": 4096,
              "vocab_size": 151936, "moe_intermediate_size": 1536, "num_experts_per_tok": 8,
              "context_length": 40960}


def prefill(fraction: float) -> EngineSettings:
    return EngineSettings.from_settings({"mem_fraction_static": fraction, "disaggregation_mode": "prefill",
                                         "chunked_prefill_size": 8192}, tp_size=4)


def test_a_safe_setting_says_what_the_spare_headroom_would_buy() -> None:
    # The packaged prefill at 0.70 on 96 GB GPUs planned "fits, 24 GiB spare" and stopped there.
    model = model_facts_from_mapping(QWEN3_235B, "t")
    got = budget(95.0, model, prefill(0.70), release="0.5.23")
    assert got.verdict == "fits" and got.severity == "ok"
    table = got.on_the_table
    assert table["mem_fraction_static"] > 0.70
    assert table["kv_tokens"] > got.kv_tokens and table["kv_tokens_gained"] == table["kv_tokens"] - got.kv_tokens
    # the setting it names fits with the band to spare, by the same check
    taken = budget(95.0, model, prefill(table["mem_fraction_static"]), release="0.5.23")
    assert taken.verdict == "fits" and taken.severity == "ok" and taken.kv_tokens == table["kv_tokens"]
    assert taken.margin_gib >= taken.spare_wanted_gib


def test_a_setting_that_already_takes_the_headroom_leaves_nothing_said() -> None:
    model = model_facts_from_mapping(QWEN3_235B, "t")
    first = budget(95.0, model, prefill(0.70), release="0.5.23")
    best = first.on_the_table["mem_fraction_static"]
    assert budget(95.0, model, prefill(best), release="0.5.23").on_the_table == {}


def test_the_band_is_told_term_by_term_and_adds_up() -> None:
    model = model_facts_from_mapping({**QWEN3_235B, "assumed": ["shape"]}, "t")
    got = budget(95.0, model, prefill(0.85), release="0.5.23")
    terms = got.band_terms
    assert any(k.startswith("CUDA graphs") for k in terms)
    assert "model shape (assumed)" in terms and terms["model shape (assumed)"] > 0
    assert sum(terms.values()) == pytest.approx(got.error_band_gib, abs=1e-6)


# the field report's MTP launch (issue 44): "TP4 FP8 MoE with a ~146 GB checkpoint", its shape guessed
# as DeepSeek V3's (tests/memory/cases.yaml field-146gb-fp8-moe)
FIELD_MOE = {"kind": "mla", "assumed": ["shape"], "architecture": "DeepseekV3ForCausalLM",
             "weights_bytes": 146000000000, "layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
             "hidden_size": 7168, "vocab_size": 129280, "moe_intermediate_size": 2048, "num_experts_per_tok": 8,
             "context_length": 163840, "mtp_layers": 1}
FIELD_MTP = {"mem_fraction_static": 0.70, "speculative_algorithm": "EAGLE", "speculative_num_steps": 1,
             "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 2}


def test_the_field_mtp_launch_says_per_term_what_is_known_and_what_is_not() -> None:
    """The MTP launch at 0.70 died capturing its verify graphs at least 5.2 GiB short; with the model's
    shape a guess, SGLang's own arithmetic cannot see why (its terms add up to ~4 GiB of 28 GiB of
    headroom). The verdict stays a warning, and says term by term what that arithmetic gives on the
    guess and what is unknown, so a user knows what to read (the model's config.json) or measure."""
    got = budget(95.0, model_facts_from_mapping(FIELD_MOE, "t"),
                 EngineSettings.from_settings(FIELD_MTP, tp_size=4), release="0.5.9")
    assert (got.verdict, got.severity) == ("uncertain", "warn")
    spec = next(i for i in got.inputs if i.name == "speculative graphs")
    assert not spec.grounded
    assert f"verify graphs {got.headroom_breakdown['verify_graphs']:.2f}" in spec.source
    assert f"draft KV {got.headroom_breakdown['draft_kv']:.2f}" in spec.source
    assert "unknown: the draft layer's real shape" in spec.source
    shape = next(i for i in got.inputs if i.name == "model shape")
    assert f"activations {got.headroom_breakdown['activations']:.2f}" in shape.source and "unknown:" in shape.source
    assert "draft buffers" not in spec.source        # 2 MiB: below what a figure of 0.01 GiB shows
    assert spec.source in got.reason and shape.source in got.reason
