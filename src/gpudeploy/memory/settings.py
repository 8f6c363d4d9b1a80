"""The SGLang settings that shape GPU memory, by release-neutral name, validated once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpudeploy.errors import InputError, Problem

MAMBA_FULL_MEMORY_RATIO = 0.9     # SGLang --mamba-full-memory-ratio default
SPEC_ALGOS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH")
STRATEGIES = ("auto", "no_buffer", "extra_buffer", "extra_buffer_lazy")
KV_DTYPE_BYTES: dict[str, float | None] = {
    "auto": None, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "fp8_e5m2": 1, "fp8_e4m3": 1,
    "mxfp8": 1, "nvfp4": 0.5625, "fp4_mx_block16": 0.5625}
DISAGG_MODES = ("null", "prefill", "decode")
# --mamba-ssm-dtype: bytes of one SSM state element (configs/mamba_utils.py:47-104)
SSM_DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}

# release-specific spellings accepted by EngineSettings.from_settings
_ALIASES = {
    "tp": "tp_size", "tensor_parallel_size": "tp_size",
    "cuda_graph_max_bs_decode": "cuda_graph_max_bs",
    "mamba_radix_cache_strategy": "mamba_scheduler_strategy",
    "context_len": "context_length",
    "disable_piecewise_cuda_graph": "disable_prefill_cuda_graph",      # 0.5.10
    "cuda_graph_max_bs_prefill": "prefill_graph_max_tokens",           # 0.5.23
    "piecewise_cuda_graph_max_tokens": "prefill_graph_max_tokens",     # 0.5.10
    "disable_decode_cuda_graph": "disable_cuda_graph",                 # 0.5.23: decode graphs only
}


def quoted_number(key: str, value: str) -> str:
    """A number written in quotes is a string in YAML: say so, and how to write it."""
    try:
        float(value)
    except ValueError:
        return f"{key} must be a number, got the string {value!r}"
    return f"{key} is the string {value!r} (quoted in the YAML), not a number: write it without quotes, {key}: {value}"


@dataclass(frozen=True)
class EngineSettings:
    """Engine settings that shape memory, by canonical (release-neutral) name."""

    tp_size: int = 1
    mem_fraction_static: float | None = None
    cuda_graph_max_bs: int | None = None
    max_running_requests: int | None = None
    chunked_prefill_size: int | None = None
    context_length: int | None = None
    speculative_algorithm: str | None = None
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_num_draft_tokens: int | None = None
    mamba_scheduler_strategy: str = "auto"
    kv_cache_dtype: str = "auto"
    disable_cuda_graph: bool = False            # decode graphs (0.5.23's --disable-decode-cuda-graph too)
    disable_prefill_cuda_graph: bool = False    # 0.5.23 prefill graphs / 0.5.10 piecewise graphs
    prefill_graph_max_tokens: int | None = None
    disable_radix_cache: bool = False
    disable_overlap_schedule: bool = False
    moe_a2a_backend: str = "none"
    enable_dp_attention: bool = False
    dp_size: int = 1
    disaggregation_mode: str = "null"
    enable_torch_compile: bool = False
    enable_lora: bool = False
    mamba_full_memory_ratio: float = MAMBA_FULL_MEMORY_RATIO
    max_mamba_cache_size: int | None = None     # hybrid models: state slots, instead of SGLang's own sizing
    max_total_tokens: int | None = None         # caps the KV pool
    attention_backend: str | None = None        # SGLang picks one by model, GPU and release when unset
    mamba_ssm_dtype: str | None = None          # hybrid models: the SSM state's dtype (config.json's when unset)

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], tp_size: int, where: str = "settings") -> EngineSettings:
        """From a role's settings (canonical underscore names; unknown keys are ignored)."""
        vals: dict[str, Any] = {"tp_size": tp_size}
        names = set(cls.__dataclass_fields__)
        for raw_key, value in settings.items():
            base = raw_key.replace("-", "_").lstrip("_")
            if base in ("cuda_graph_backend_decode", "cuda_graph_backend_prefill"):
                # 0.5.23 spells "no graphs for this phase" as a backend named "disabled"
                if str(value).lower() == "disabled":
                    vals["disable_cuda_graph" if base.endswith("decode") else "disable_prefill_cuda_graph"] = True
                continue
            key = _ALIASES.get(base, base)
            if key in names and key != "tp_size":
                vals[key] = value
        problems: list[Problem] = []

        def bad(key: str, msg: str) -> None:
            problems.append(Problem(message=msg, file=where, key=key))

        for key in ("cuda_graph_max_bs", "max_running_requests", "chunked_prefill_size", "context_length",
                    "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
                    "dp_size", "tp_size", "prefill_graph_max_tokens", "max_mamba_cache_size", "max_total_tokens"):
            v = vals.get(key)
            if v is None or (key == "chunked_prefill_size" and v == -1):
                continue
            low = 0 if key in ("cuda_graph_max_bs", "chunked_prefill_size") else 1
            if isinstance(v, str):
                bad(key, quoted_number(key, v))
            elif isinstance(v, bool) or not isinstance(v, int) or v < low:
                bad(key, f"{key} must be a positive whole number, got {v!r}")
        f = vals.get("mem_fraction_static")
        if isinstance(f, str):
            bad("mem_fraction_static", quoted_number("mem_fraction_static", f))
        elif f is not None and (isinstance(f, bool) or not isinstance(f, int | float) or not 0 < f < 1):
            bad("mem_fraction_static", f"mem_fraction_static must be between 0 and 1, got {f!r}")
        algo = vals.get("speculative_algorithm")
        if algo is not None:
            algo = str(algo).upper()
            if algo not in SPEC_ALGOS:
                bad("speculative_algorithm", f"unknown speculative_algorithm {algo!r}")
            vals["speculative_algorithm"] = "EAGLE" if algo == "NEXTN" else algo
        strat = str(vals.get("mamba_scheduler_strategy", "auto"))
        if strat not in STRATEGIES:
            bad("mamba_scheduler_strategy", f"mamba_scheduler_strategy must be one of {STRATEGIES}")
        kvd = str(vals.get("kv_cache_dtype", "auto"))
        if kvd not in KV_DTYPE_BYTES:
            bad("kv_cache_dtype", f"unknown kv_cache_dtype {kvd!r}")
        ssm = vals.get("mamba_ssm_dtype")
        if ssm is not None and str(ssm) not in SSM_DTYPE_BYTES:
            bad("mamba_ssm_dtype", f"mamba_ssm_dtype must be one of {', '.join(SSM_DTYPE_BYTES)}, got {ssm!r}")
        mode = str(vals.get("disaggregation_mode", "null"))
        if mode not in DISAGG_MODES:
            bad("disaggregation_mode", f"disaggregation_mode must be one of {DISAGG_MODES}")
        if problems:
            raise InputError(problems)
        for key in ("disable_cuda_graph", "disable_prefill_cuda_graph", "disable_radix_cache",
                    "disable_overlap_schedule", "enable_dp_attention", "enable_torch_compile", "enable_lora"):
            if key in vals:
                vals[key] = bool(vals[key])
        if "mem_fraction_static" in vals and vals["mem_fraction_static"] is not None:
            vals["mem_fraction_static"] = float(vals["mem_fraction_static"])
        return cls(**vals)

    def canonical(self) -> dict[str, Any]:
        """Non-default settings as canonical name -> value (for keys and display)."""
        base = EngineSettings()
        return {k: getattr(self, k) for k in self.__dataclass_fields__
                if getattr(self, k) != getattr(base, k)}

    @property
    def has_draft(self) -> bool:
        """A draft model or MTP layers run beside the target (NGRAM drafts from the prompt)."""
        return self.speculative_algorithm is not None and self.speculative_algorithm != "NGRAM"

    def spec(self, defaults: tuple[int, int, int] = (3, 1, 4)) -> tuple[int, int, int]:
        """(num_steps, eagle_topk, num_draft_tokens); zeros when speculative decoding is off.

        ``defaults`` are SGLang's own when only the algorithm is named (the release's
        auto_choose_speculative_params, :func:`.defaults.spec_defaults`); topk 1 forces draft
        tokens = steps + 1.
        """
        if self.speculative_algorithm is None:
            return 0, 0, 0
        if self.speculative_num_steps is None:
            steps, topk, draft = defaults
        else:
            steps = self.speculative_num_steps
            topk = self.speculative_eagle_topk or 1
            draft = self.speculative_num_draft_tokens or steps * topk
        return steps, topk, (steps + 1 if topk == 1 else draft)
