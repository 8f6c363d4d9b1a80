"""The hybrid (Mamba / gated-delta-net) state pool as each release sizes it (memory/hybrid.py cites the
file and line of each rule): a release between two checked ones gets the state rules of its own wheel,
not of the release below it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudeploy.memory import budget, model_facts_from_dir, model_facts_from_mapping
from gpudeploy.memory.hybrid import mamba_state, slots_per_request
from gpudeploy.memory.modelfacts import GIB
from gpudeploy.memory.releases import release_rules
from gpudeploy.memory.settings import EngineSettings

FIXTURES = Path(__file__).parent / "fixtures"
# the field's 27B hybrid (tests/memory/cases.yaml models.field-51gb-hybrid): 146.8 MiB of state a request
HYBRID = {"name": "hybrid-27b", "kind": "hybrid", "architecture": "Qwen3_5ForConditionalGeneration",
          "weights_gib": 51.8, "layers": 64, "full_attention_layers": 16, "linear_layers": 48, "kv_heads": 4,
          "head_dim": 256, "state_bytes_per_request": 153944064, "hidden_size": 5120, "vocab_size": 248320,
          "intermediate_size": 17408, "context_length": 262144, "mtp_layers": 1}
PER = 153944064
MTP = {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
       "speculative_num_draft_tokens": 4}


def settings(**kw: object) -> EngineSettings:
    return EngineSettings.from_settings(kw, tp_size=1)


def test_a_release_after_0_5_13_solves_slots_and_speculative_states_together() -> None:
    # 512 running requests with MTP: 0.5.10's rule takes 512 x 4 states off the top (294 GiB) and no
    # fraction holds it; from 0.5.13 SGLang solves both inside the ratio's budget and serves fewer.
    # 0.5.17 borrowed 0.5.10's rule and was refused as kv-pool-empty.
    model = model_facts_from_mapping(HYBRID, "t")
    s = settings(mem_fraction_static=0.9, max_running_requests=512, mamba_scheduler_strategy="extra_buffer", **MTP)
    assert budget(95.0, model, s, release="0.5.10").verdict == "kv-pool-empty"
    got = budget(95.0, model, s, release="0.5.17")
    assert got.verdict != "kv-pool-empty" and got.severity != "refuse", got.reason
    assert 0 < got.running_requests < 512 and got.state_slots > 0


@pytest.mark.parametrize(("release", "sizing"), [("0.5.9", "off-top"), ("0.5.11", "off-top"), ("0.5.12", "off-top"),
                                                 ("0.5.13", "joint"), ("0.5.16", "joint"),
                                                 ("0.5.17", "joint-padded"), ("0.5.22", "joint-padded"),
                                                 ("0.5.23", "joint-padded")])
def test_each_release_sizes_the_state_by_its_own_rule(release: str, sizing: str) -> None:
    rel = release_rules(release)
    assert rel.mamba_sizing == sizing
    s = settings(mamba_scheduler_strategy="extra_buffer", max_running_requests=64, **MTP)
    rest = 60.0
    got = mamba_state(rest, PER, s, rel, 64, 4, "Qwen3_5ForConditionalGeneration")
    per = PER / GIB
    ratio = slots_per_request(s, rel)
    budget_gib = rest * 0.9 / 1.9
    if sizing == "off-top":
        assert got.slots == int((rest - per * 64 * 4) * 0.9 / 1.9 // per)
    elif sizing == "joint":        # 0.5.13 model_runner_kv_cache_mixin.py:130-150
        assert got.slots == int(budget_gib // (per * (1 + 4 / ratio)))
        assert got.state_gib == pytest.approx(got.slots * per + per * min(64, got.slots // ratio) * 4)
    else:                          # 0.5.17 kv_cache_configurator.py: the padding slot on both buffers
        assert got.slots == int((budget_gib - per * 5) // (per * (1 + 4 / ratio)))
        assert got.state_gib == pytest.approx((got.slots + 1) * per + per * (min(64, got.slots // ratio) + 1) * 4)


def test_auto_is_extra_buffer_from_0_5_14_where_the_overlap_scheduler_runs() -> None:
    arch = "Qwen3_5ForConditionalGeneration"
    assert slots_per_request(EngineSettings(), release_rules("0.5.13"), arch) == 3
    assert slots_per_request(EngineSettings(), release_rules("0.5.17"), arch) == 5
    # without the overlap scheduler auto is no_buffer (0.5.23 arg_groups/overrides.py:477-487)
    assert slots_per_request(EngineSettings(disable_overlap_schedule=True), release_rules("0.5.17"), arch) == 3
    # an architecture without extra_buffer support stays no_buffer
    assert slots_per_request(EngineSettings(), release_rules("0.5.23"), "NemotronFlashForCausalLM") == 3


def test_speculative_no_buffer_with_the_radix_cache_per_release() -> None:
    s = EngineSettings(mamba_scheduler_strategy="no_buffer", speculative_algorithm="EAGLE")
    assert slots_per_request(s, release_rules("0.5.9")) == 1       # 0.5.9 turns the radix cache off
    assert slots_per_request(s, release_rules("0.5.20")) == 3      # 0.5.14 on keeps it
    # 0.5.10 - 0.5.13 refuse to start: said, not sized as if it ran
    model = model_facts_from_mapping(HYBRID, "t")
    got = budget(95.0, model, settings(mem_fraction_static=0.9, mamba_scheduler_strategy="no_buffer", **MTP),
                 release="0.5.12")
    assert any("not compatible with radix cache" in n for n in got.notes), got.notes
    assert got.severity != "ok"


def test_mamba_ssm_dtype_bfloat16_halves_the_state() -> None:
    model = model_facts_from_mapping(HYBRID, "t")
    fp32 = budget(95.0, model, settings(mem_fraction_static=0.9), release="0.5.23")
    bf16 = budget(95.0, model, settings(mem_fraction_static=0.9, mamba_ssm_dtype="bfloat16"), release="0.5.23")
    assert bf16.state_bytes_per_request == PER // 2
    assert bf16.state_slots == pytest.approx(2 * fp32.state_slots, abs=2)


def test_the_config_s_mamba_ssm_dtype_is_read(tmp_path: Path) -> None:
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    cfg = json.loads((FIXTURES / "qwen3-next-80b-a3b" / "config.json").read_text())
    for name in ("model.safetensors.index.json",):
        (model_dir / name).write_text((FIXTURES / "qwen3-next-80b-a3b" / name).read_text())
    (model_dir / "config.json").write_text(json.dumps(cfg))
    fp32 = model_facts_from_dir(model_dir).state_bytes_per_request()
    (model_dir / "config.json").write_text(json.dumps({**cfg, "mamba_ssm_dtype": "bfloat16"}))
    bf16 = model_facts_from_dir(model_dir)
    assert bf16.ssm_dtype_bytes == 2
    assert fp32 > bf16.state_bytes_per_request() > fp32 // 2


# A public boot log at 0.5.21 (auto strategy, no speculative decoding, mamba_full_memory_ratio 0.9):
# KI-KUBE/dgxarley TESTLOGS/sglang_nn4_tp4_ep1/nemotron-3-nano-omni-30b-a3b-reasoning-nvfp4/
# TESTLOG_sglang-0.5.21-sm121_nemotron-3-nano-omni-30b-a3b-reasoning-nvfp4_4n.md (commit 31e6af1c):
#   "Mamba Cache is allocated. max_mamba_cache_size: 2211, conv_state size: 0.44GB, ssm_state size: 24.84GB"
#   "KV Cache is allocated. dtype: float8_e4m3fn, #tokens: 19644177, K size: 14.05 GB, V size: 14.05 GB"
#   with --mamba-ssm-dtype bfloat16: "max_mamba_cache_size doubles (2211 to 4348, ssm_state 24.42 GB)"
def test_the_split_of_a_public_0_5_21_log_is_reproduced_fp32_and_bf16() -> None:
    slots_logged = 2211
    conv, ssm, kv = 0.44, 24.84, 2 * 14.05
    rest = conv + ssm + kv                     # the budget both pools came out of
    per_fp32 = (conv + ssm) / (slots_logged + 1) * GIB   # the pools hold K + 1 slots (the padding slot)
    rel = release_rules("0.5.21")
    got = mamba_state(rest, round(per_fp32), EngineSettings(), rel, None, 0, "NemotronHForCausalLM")
    assert got.slots == pytest.approx(slots_logged, rel=0.005)
    assert got.rest_gib == pytest.approx(kv, rel=0.01)
    # bfloat16 halves the SSM part only: the conv window stays bf16
    per_bf16 = (conv + ssm / 2) / (slots_logged + 1) * GIB
    bf16 = mamba_state(rest, round(per_bf16), EngineSettings(mamba_ssm_dtype="bfloat16"), rel, None, 0,
                       "NemotronHForCausalLM")
    assert bf16.slots == pytest.approx(4348, rel=0.005)


@pytest.mark.parametrize(("release", "arch", "multimodal", "prefill"), [
    # 0.5.10: piecewise prefill graphs never for a multimodal model (server_args.py:1110-1111) nor Qwen3-Next
    ("0.5.10", "Qwen3_5ForConditionalGeneration", True, False),
    ("0.5.10", "Qwen3NextForCausalLM", False, False),
    # 0.5.23: Qwen3.5 is on the breakable multimodal list (model_config.py:2501-2516) and its linear
    # attention layers pass the runner's standard-GQA check; a multimodal model off the list does not
    ("0.5.23", "Qwen3_5ForConditionalGeneration", True, True),
    ("0.5.23", "Qwen2_5_VLForConditionalGeneration", True, False),
    ("0.5.23", "Qwen3NextForCausalLM", False, True)])
def test_prefill_graphs_follow_the_runners_own_checks(release: str, arch: str, multimodal: bool,
                                                      prefill: bool) -> None:
    model = model_facts_from_mapping({**HYBRID, "architecture": arch, "multimodal": multimodal}, "t")
    got = budget(95.0, model, settings(mem_fraction_static=0.9, max_running_requests=16), release=release)
    assert ("prefill_graphs" in got.headroom_breakdown) is prefill, got.headroom_breakdown
