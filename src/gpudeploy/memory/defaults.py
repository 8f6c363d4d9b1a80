"""SGLang's own defaults, per release (:mod:`.releases` names where each comes from).

Pure functions of the GPU (torch's total, GiB), the settings, the model and the release: the
default ``--mem-fraction-static``, chunked prefill and decode graph batch caps, the captured batch
sizes, speculative decoding's step/topk/draft-token defaults, and the attention backend.
"""

from __future__ import annotations

from .modelfacts import ModelFacts
from .releases import R0523, Release, version_key
from .settings import EngineSettings

SPEC_RUNNING_DEFAULT = 48         # EAGLE/EAGLE3/STANDALONE/NGRAM without --max-running-requests
# server_args' default capture lists before 0.5.3 ended here (more on big GPUs)
LEGACY_LIST_END = 160
# 0.4.6 - 0.4.9 picked FA3 on Hopper for these architectures (utils.is_fa3_default_architecture)
FA3_ARCHS = ("Qwen2ForCausalLM", "Llama4ForConditionalGeneration", "LlamaForCausalLM", "Gemma2ForCausalLM",
             "Gemma3ForConditionalGeneration", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM")


def spec_defaults(model: ModelFacts | None, rel: Release, algo: str | None = None) -> tuple[int, int, int]:
    """(steps, topk, draft tokens) SGLang picks when only the algorithm is named."""
    arch = model.architecture if model is not None else ""
    if algo == "STANDALONE" and rel.spec_params != "all-548":
        return 3, 1, 4
    if rel.spec_params == "all-548":
        return 5, 4, 8
    if rel.spec_params == "deepseek-314":
        return (3, 1, 4) if arch in ("DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM") else (5, 4, 8)
    return (5, 4, 8) if arch in ("LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM") else (3, 1, 4)


def spec_of(s: EngineSettings, model: ModelFacts | None, rel: Release) -> tuple[int, int, int]:
    return s.spec(spec_defaults(model, rel, s.speculative_algorithm))


def wanted_running(s: EngineSettings) -> int | None:
    """max_running_requests as SGLang's server args leave it (48 with speculative decoding)."""
    if s.max_running_requests is None and s.speculative_algorithm is not None:
        return SPEC_RUNNING_DEFAULT
    return s.max_running_requests


def legacy_list_end(cap: float, rel: Release) -> int:
    """Where a pre-0.5.3 default capture list ends on this GPU."""
    mib = cap * 1024
    if rel.capture_list == "to-160":
        return 256 if mib > 96 * 1024 else LEGACY_LIST_END
    end = 256 if mib > 90 * 1024 else LEGACY_LIST_END
    return 512 if mib > 160 * 1000 else end


def resolved_defaults(cap: float, s: EngineSettings, rel: Release = R0523) -> tuple[int, int]:
    """(chunked_prefill_size, decode cuda_graph_max_bs) as the release resolves them."""
    mib = cap * 1024
    chunk, bs = rel.tier(mib, s.tp_size)
    if rel.fraction_rule == "tp-table" and s.disaggregation_mode != "null" and chunk == 8192:
        chunk = 16384                 # <= 0.4.7: PD servers prefill 16k chunks
    if rel.name == "0.4.7" and mib > 180_000:
        chunk = 16384
    if bs == 0:
        bs = legacy_list_end(cap, rel)
    if s.chunked_prefill_size is not None:
        chunk = s.chunked_prefill_size
    if s.enable_dp_attention and rel.fraction_rule != "formula" and chunk > 0:
        chunk //= s.dp_size           # <= 0.5.2 divides the chunk itself
    if s.cuda_graph_max_bs is not None:
        bs = s.cuda_graph_max_bs
    elif rel.cap_decode_bs_at_running and s.max_running_requests is not None:
        bs = min(bs, s.max_running_requests)
    return chunk, bs


def prefill_graph_sizes(max_tokens: int) -> list[int]:
    """Token counts of the prefill (0.5.23) / piecewise (0.5.10) graphs up to ``max_tokens``."""
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
             + list(range(576, 1025, 64)) + list(range(1280, 4097, 256)) + list(range(4608, max_tokens + 1, 512)))
    return [t for t in sizes if t <= max_tokens]


# 0.5.10 configs/model_config.py:1352-1358: piecewise prefill graphs never for these architectures
PIECEWISE_OFF_ARCHS = ("DeepseekV32ForCausalLM", "Qwen3NextForCausalLM", "GlmMoeDsaForCausalLM",
                       "BailingMoeV2_5ForCausalLM", "LLaDAModelLM")
# 0.5.23 configs/model_config.py:2501-2516: multimodal architectures whose breakable prefill graphs stay on
BREAKABLE_MULTIMODAL_ARCHS = ("MiniMaxM3SparseForConditionalGeneration", "Cohere2VisionForConditionalGeneration",
                              "Glm5NextForConditionalGeneration", "InternS2MobiusForConditionalGeneration",
                              "PaddleOCRVLForConditionalGeneration", "Qwen3_5ForConditionalGeneration",
                              "Qwen3_5MoeForConditionalGeneration", "Qwen4ExpForConditionalGeneration",
                              "KimiK3ForConditionalGeneration", "KimiK25ForConditionalGeneration")


def prefill_graphs_on(s: EngineSettings, rel: Release, model: ModelFacts | None = None, *,
                      captured: bool = False) -> bool:
    """Whether the release turns prefill graphs on for these settings (``captured``: and really captures
    them, after the model runner's own checks, which the default fraction's reserve does not see)."""
    if s.disable_prefill_cuda_graph or rel.prefill_graphs == "none":
        return False
    arch = model.architecture if model is not None else ""
    multimodal = model is not None and model.multimodal
    if rel.prefill_graphs == "piecewise":      # 0.5.10: _handle_piecewise_cuda_graph
        if captured and (multimodal or arch in PIECEWISE_OFF_ARCHS):
            return False                       # 0.5.10 server_args.py:1086-1087 and :1110-1111
        return not (s.speculative_algorithm or s.enable_dp_attention or s.enable_torch_compile
                    or s.moe_a2a_backend != "none" or s.disaggregation_mode != "null" or s.enable_lora)
    if s.disaggregation_mode == "decode":      # 0.5.23: breakable prefill graphs on CUDA
        return False
    # 0.5.23 arg_groups/cuda_graph_hook.py:229-238. Gated-delta-net layers count as attention layers
    # for the runner's standard-GQA check (model_runner_components/layer_setup.py:58-62), so a Qwen3.5 /
    # Qwen3-Next captures them (a public 0.5.17-era Qwen3.5-4B log: 58 buckets, "cuda graph: True")
    return not (captured and multimodal and arch not in BREAKABLE_MULTIMODAL_ARCHS)


def decode_graphs_on(s: EngineSettings, rel: Release) -> bool:
    # 0.5.23: a PD prefill server never replays decode graphs and captures none
    return not s.disable_cuda_graph and not (rel.name == "0.5.23" and s.disaggregation_mode == "prefill")


def prefill_max_tokens(model: ModelFacts | None, s: EngineSettings, chunk: int) -> int:
    if s.prefill_graph_max_tokens is not None:
        return s.prefill_graph_max_tokens
    if model is not None and model.kind == "mla":
        return min(8192, chunk)
    return chunk


def vit_factor(model: ModelFacts) -> float:
    """``adjust_mem_fraction_for_vlm``: 0.95 x (1 - 0.1 (complexity - 1)), clamped to 0.8 - 1.05."""
    ratio = model.vision_layers * model.vision_hidden_size ** 2 / (24 * 1024 ** 2)
    return 0.95 * max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0)))


def multimodal_factor(model: ModelFacts | None, s: EngineSettings, rel: Release, *, default: bool) -> float:
    """What the release multiplies the fraction by for a multimodal model (1.0 when it does not)."""
    if model is None or not model.multimodal:
        return 1.0
    if rel.multimodal_rule == "times-0.9":       # model_runner, any fraction (0.4.5 - 0.4.7)
        return 0.9
    if rel.multimodal_rule == "vit" and default:
        if rel.name == "0.5.23" and s.disaggregation_mode == "decode":
            return 1.0
        return vit_factor(model)
    return 1.0


def _tp_table(cap: float, s: EngineSettings, rel: Release) -> float:
    mib = cap * 1024
    parallel = s.tp_size
    if mib <= 81920:
        f = (0.79 if parallel >= 16 else 0.81 if parallel >= 8 else 0.85 if parallel >= 4
             else 0.87 if parallel >= 2 else 0.88)
    else:
        f = 0.88
    spec = s.speculative_algorithm is not None
    if rel.spec_tp_table_adjust and mib > 180_000:
        return 0.79
    if mib > 96 * 1024:
        reserve = 20 * 1024 if (rel.spec_tp_table_adjust and spec) else 18 * 1024
        return min(f + 48 * 1024 * (1 - f) / mib, (mib - reserve) / mib)
    if rel.spec_tp_table_adjust and spec:
        return f * 0.95
    return f


def _class_table(cap: float, s: EngineSettings, rel: Release) -> float:
    mib = cap * 1024
    parallel = s.tp_size
    if mib < 35 * 1024:
        reserved = (2.8 + parallel / 10) * 1024
    elif mib < 90 * 1024:
        reserved = (9.5 + parallel / 2) * 1024
    elif mib < 160 * 1024:
        reserved = (12 + parallel / 2) * 1024
    else:
        reserved = 32 * 1024
    if s.speculative_algorithm is not None:
        # STANDALONE reserves 6 GiB from 0.5.2 (its server_args); EAGLE 2 GiB throughout
        standalone = s.speculative_algorithm == "STANDALONE" and (rel.checked_as or rel.name) == "0.5.2"
        reserved += 6 * 1024 if standalone else 2 * 1024
    if s.enable_dp_attention:
        reserved += 4 * 1024
    return round((mib - reserved) / mib, 3)


def _formula(cap: float, s: EngineSettings, rel: Release, model: ModelFacts | None) -> float:
    gpu_mib = cap * 1024
    chunk, bs = resolved_defaults(cap, s, rel)
    mla = model is not None and model.kind == "mla"
    if rel.name == "0.5.23" and s.disaggregation_mode == "decode":
        running = s.max_running_requests or bs or 1
        draft = spec_of(s, model, rel)[2] or 1
        activation_tokens = max(running * draft, 2048)
    else:
        activation_tokens = max(chunk if chunk > 0 else 16384, 2048)
    reserved = 512.0 + activation_tokens * 1.5
    reserved += 0 if not decode_graphs_on(s, rel) else bs * 2
    reserved += s.tp_size / 8 * 1024
    if s.enable_dp_attention:
        reserved += bs * s.dp_size * 3
        if bs > 300:
            reserved += bs * s.dp_size * 1.5
    if prefill_graphs_on(s, rel):
        sizes = prefill_graph_sizes(prefill_max_tokens(model, s, chunk) if model else chunk)
        reserved += 1.5 * 1024 if mla else len(sizes) * 8
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    if rel.deepep_reserve and s.moe_a2a_backend.lower().startswith("deepep") and decode_graphs_on(s, rel):
        reserved += 2 * 1024
    algo = s.speculative_algorithm
    if algo == "STANDALONE":
        reserved += rel.standalone_reserve_mib
    elif algo is not None and algo != "NGRAM":
        reserved += rel.eagle_reserve_mib
    return round((gpu_mib - reserved) / gpu_mib, 3)


def default_mem_fraction(cap: float, s: EngineSettings, rel: Release = R0523,
                         model: ModelFacts | None = None) -> float:
    """The release's default ``--mem-fraction-static`` (multimodal adjustment included)."""
    if rel.fraction_rule == "tp-table":
        f = _tp_table(cap, s, rel)
    elif rel.fraction_rule == "class-table":
        f = _class_table(cap, s, rel)
    else:
        f = _formula(cap, s, rel, model)
    return round(f * multimodal_factor(model, s, rel, default=True), 3)


def effective_fraction(cap: float, s: EngineSettings, rel: Release, model: ModelFacts | None) -> float:
    """The fraction the run uses: the given one (x 0.9 for a multimodal model in 0.4.5 - 0.4.7) or the default."""
    if s.mem_fraction_static is None:
        return default_mem_fraction(cap, s, rel, model)
    return round(s.mem_fraction_static * multimodal_factor(model, s, rel, default=False), 4)


def capture_batch_sizes(max_bs: int, speculative: bool, rel: Release = R0523, cap: float = 139.8,
                        pool_size: int | None = None) -> list[int]:
    """The decode batch sizes the release captures up to ``max_bs`` (capped at the request pool)."""
    if rel.legacy_capture_list:
        end = legacy_list_end(cap, rel)
        if speculative:
            # 0.4.5 / 0.4.6: 40-160 by 16; from 0.4.7: 40, 48, 56, then 80-160 by 16
            sizes = (list(range(1, 9)) + list(range(10, 33, 2))
                     + (list(range(40, 161, 16)) if version_key(rel.checked_as or rel.name) < (0, 4, 7)
                        else list(range(40, 64, 8)) + list(range(80, 161, 16))))
        else:
            sizes = [1, 2, 4, 8, *range(16, 161, 8)]
        if end >= 256:
            sizes += list(range(160, 257, 8))
        if end >= 512:
            sizes += list(range(256, 513, 16))
        sizes = [b for b in sizes if b <= max_bs]
        if sizes and max(sizes) < max_bs:
            sizes += list(range(max(sizes), max_bs + 1, 16))
    elif speculative:
        sizes = (list(range(1, 9)) + list(range(10, 33, 2)) + list(range(40, 65, 4))
                 + list(range(72, 257, 8)) + list(range(272, max_bs + 1, 16)))
    else:
        sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    sizes = [b for b in sizes if b <= max_bs]
    if rel.append_max_bs and max_bs not in sizes and max_bs > 0:
        sizes.append(max_bs)
    if pool_size is not None:
        if sizes and max(sizes) > pool_size:
            sizes.append(pool_size)          # the runner captures the request pool's size too
        sizes = [b for b in sizes if b <= pool_size]
    return sorted(set(sizes))


def attention_backend(model: ModelFacts, s: EngineSettings, rel: Release, hopper: bool | None) -> str:
    """The backend the release picks; only FA3 before PR #8567 keeps a page table per graph."""
    if s.attention_backend:
        return s.attention_backend
    topk_one = s.speculative_algorithm is None or (s.speculative_eagle_topk or spec_of(s, model, rel)[1]) == 1
    if version_key(rel.name) >= (0, 5, 9):
        # 0.5.9 server_args.py:1797-1834, 0.5.23 arg_groups/model_override_base.py:302-345: FA3 on Hopper
        # (MHA only without topk > 1); Blackwell's trtllm_mha is not modelled (flashinfer's buffers)
        if hopper and (topk_one or model.kind == "mla"):
            return "fa3"
        return "flashinfer" if model.kind != "mla" else "triton"
    if not rel.fa3_default:
        return "flashinfer" if model.kind != "mla" else "triton"
    if hopper and topk_one and (model.kind == "mla" or model.architecture in FA3_ARCHS):
        return "fa3"
    return "flashinfer" if model.kind != "mla" else "triton"
