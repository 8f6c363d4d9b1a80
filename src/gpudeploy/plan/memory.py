"""Memory preflight: predict whether an SGLang server boots on a GPU, and which settings would.

Pure (no network, no I/O). Per GPU rank, in GiB, following how SGLang sizes memory at start:

  C   capacity of one GPU.
  P   free memory before weights load = C - CUDA context - NCCL/custom-allreduce buffers.
  W   weights per rank = checkpoint / TP (MTP layers only when speculative decoding is on; a
      separate draft model's weights too: newer builds count draft weights as static memory).
  f   ``--mem-fraction-static`` (SGLang's default formula when the role does not set it).
  rest = f * P - W                    <= 0  -> SGLang "Not enough memory"       (kv-pool-empty)
  hybrid models: SGLang splits rest: mamba budget = rest * r / (1 + r), r = 0.9
      (--mamba-full-memory-ratio); slots = budget / (state * (1 + D / ratio)), running requests
      = slots // ratio with ratio = 3 slots per request (+2 extra_buffer, +1 extra_buffer_lazy)
      and D = draft tokens (spec decoding keeps D intermediate states per request).
      A role that asks for more running requests than that, or none fitting -> mamba-state-does-not-fit.
  KV tokens = (rest - state) / bytes-per-token  (MHA/GQA: 2*max(1,kv_heads//tp)*head_dim*layers*b;
      MLA: (kv_lora_rank + qk_rope_head_dim)*layers*b at any TP; hybrid: full-attention layers only)
  H = (1 - f) * P must hold, or startup dies in CUDA graph capture (oom-in-graph-capture):
      CUDA graphs       n_graphs * 0.02 GiB + max_bs * tokens_per_bs * g bytes, where
                        g = 50 B * hidden * layers + 16 B * vocab per captured token (target);
                        spec decoding: verify graphs capture max_bs * draft_tokens tokens, draft
                        graphs max_bs * topk tokens through the draft layers, plus 1 GiB buffers
      req-to-token      max_running_requests * (context_len + 4) * 4 B
      activations       chunked_prefill_size * 2 B * (6 * hidden + 3 * mlp_width / tp)
      draft KV pool     the draft's KV (same token count as the target, draft layers only)
      DeepEP buffers    2 GiB when moe_a2a_backend is deepep
      misc              0.3 GiB (sampling buffers, attention-backend workspaces)
  and P - W must be > 0 or the weights do not load (weights-do-not-fit).

The constants were calibrated against the public data points and field reports listed in
``tests/memory/cases.yaml`` (see the notes there); measured figures from a previous run
(:mod:`gpudeploy.plan.calibrate`) replace estimates when given: preload free memory, weights,
and a scale factor on CUDA-graph memory (from the measured graph usage or an OOM's
"Tried to allocate X ... Y free").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpudeploy.errors import InputError, Problem
from gpudeploy.plan.calibrate import Measured
from gpudeploy.plan.modelfacts import GIB, ModelFacts

VERDICTS = ("fits", "oom-in-graph-capture", "kv-pool-empty", "weights-do-not-fit",
            "mamba-state-does-not-fit")

# ---- calibrated constants (see module docstring and tests/memory/cases.yaml) -----------------
CTX_OVERHEAD_GIB = 0.5            # CUDA context, cuBLAS/cuDNN handles, torch allocator
NCCL_GIB_PER_RANK = 0.25          # per TP rank (up to 8) when tp > 1: NCCL + custom all-reduce
GRAPH_FIXED_GIB = 0.02            # per captured CUDA graph
GRAPH_BYTES_PER_HIDDEN_LAYER = 50  # per captured token, times hidden_size * layers
GRAPH_BYTES_PER_VOCAB = 16        # per captured token, times vocab_size (logits, sampling)
SPEC_FIXED_GIB = 1.0              # EAGLE/MTP buffers: tree masks, hidden-state and top-k buffers
DEEPEP_GIB = 2.0                  # DeepEP all-to-all buffers per rank
MISC_GIB = 0.3
MAMBA_FULL_MEMORY_RATIO = 0.9     # SGLang --mamba-full-memory-ratio default
SAFETY_MARGIN_GIB = 0.5           # recommendations keep max(this, 10% of the need) spare
SAFETY_MARGIN_SHARE = 0.10
MIN_USEFUL_GRAPH_BS = 16          # below this, turning speculative decoding off is preferred
MIN_KV_TOKENS = 4096              # a recommendation must leave at least this many KV tokens

_SPEC_ALGOS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH")
_STRATEGIES = ("auto", "no_buffer", "extra_buffer", "extra_buffer_lazy")
_BS_CAPS = (512, 384, 256, 192, 160, 128, 96, 64, 48, 32, 24, 16, 8, 4, 2, 1)
_KV_DTYPE_BYTES = {"auto": None, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2,
                   "fp8_e5m2": 1, "fp8_e4m3": 1, "mxfp8": 1, "nvfp4": 0.5625, "fp4_mx_block16": 0.5625}

# release-specific spellings accepted by EngineSettings.from_settings
_ALIASES = {
    "tp": "tp_size", "tensor_parallel_size": "tp_size",
    "cuda_graph_max_bs_decode": "cuda_graph_max_bs",
    "mamba_radix_cache_strategy": "mamba_scheduler_strategy",
    "context_len": "context_length",
}


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
    disable_cuda_graph: bool = False
    disable_radix_cache: bool = False
    disable_overlap_schedule: bool = False
    moe_a2a_backend: str = "none"
    enable_dp_attention: bool = False
    dp_size: int = 1
    mamba_full_memory_ratio: float = MAMBA_FULL_MEMORY_RATIO

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], tp_size: int, where: str = "settings") -> EngineSettings:
        """From a role's settings (canonical underscore names; unknown keys are ignored)."""
        vals: dict[str, Any] = {"tp_size": tp_size}
        names = {f for f in cls.__dataclass_fields__}
        for raw_key, value in settings.items():
            key = _ALIASES.get(raw_key.replace("-", "_").lstrip("_"), raw_key.replace("-", "_").lstrip("_"))
            if key in names and key != "tp_size":
                vals[key] = value
        problems: list[Problem] = []

        def bad(key: str, msg: str) -> None:
            problems.append(Problem(message=msg, file=where, key=key))

        for key in ("cuda_graph_max_bs", "max_running_requests", "chunked_prefill_size", "context_length",
                    "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
                    "dp_size", "tp_size"):
            v = vals.get(key)
            if v is None or (key == "chunked_prefill_size" and v == -1):
                continue
            low = 0 if key in ("cuda_graph_max_bs", "chunked_prefill_size") else 1
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                bad(key, f"{key} must be a positive whole number, got {v!r}")
        f = vals.get("mem_fraction_static")
        if f is not None and (isinstance(f, bool) or not isinstance(f, int | float) or not 0 < f < 1):
            bad("mem_fraction_static", f"mem_fraction_static must be between 0 and 1, got {f!r}")
        algo = vals.get("speculative_algorithm")
        if algo is not None:
            algo = str(algo).upper()
            if algo not in _SPEC_ALGOS:
                bad("speculative_algorithm", f"unknown speculative_algorithm {algo!r}")
            vals["speculative_algorithm"] = "EAGLE" if algo == "NEXTN" else algo
        strat = str(vals.get("mamba_scheduler_strategy", "auto"))
        if strat not in _STRATEGIES:
            bad("mamba_scheduler_strategy", f"mamba_scheduler_strategy must be one of {_STRATEGIES}")
        kvd = str(vals.get("kv_cache_dtype", "auto"))
        if kvd not in _KV_DTYPE_BYTES:
            bad("kv_cache_dtype", f"unknown kv_cache_dtype {kvd!r}")
        if problems:
            raise InputError(problems)
        for key in ("disable_cuda_graph", "disable_radix_cache", "disable_overlap_schedule",
                    "enable_dp_attention"):
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

    # spec decoding defaults when the role names an algorithm but not the three numbers
    def spec(self) -> tuple[int, int, int]:
        """(num_steps, eagle_topk, num_draft_tokens); zeros when speculative decoding is off."""
        if self.speculative_algorithm is None:
            return 0, 0, 0
        steps = self.speculative_num_steps or 3
        topk = self.speculative_eagle_topk or 1
        draft = self.speculative_num_draft_tokens or (steps + 1 if topk == 1 else steps * topk)
        return steps, topk, draft


# ---- SGLang's defaults -----------------------------------------------------------------------

def _tier_defaults(gpu_mib: float, tp: int) -> tuple[int, int]:
    """SGLang's (chunked_prefill_size, cuda_graph_max_bs) defaults by GPU memory (MiB)."""
    if gpu_mib < 20 * 1024:
        return 2048, (16 if tp < 4 else 64)
    if gpu_mib < 35 * 1024:
        return 2048, (24 if tp < 4 else 80)
    if gpu_mib < 60 * 1024:
        return 4096, (32 if tp < 4 else 160)
    if gpu_mib < 160 * 1024:
        return 8192, (256 if tp < 4 else 512)
    return 16384, 512


def resolved_defaults(gpu_capacity_gib: float, settings: EngineSettings) -> tuple[int, int]:
    """(chunked_prefill_size, cuda_graph_max_bs) as SGLang would resolve them."""
    chunk, bs = _tier_defaults(gpu_capacity_gib * 1024, settings.tp_size)
    if settings.chunked_prefill_size is not None:
        chunk = settings.chunked_prefill_size
    if settings.cuda_graph_max_bs is not None:
        bs = settings.cuda_graph_max_bs
    return chunk, bs


def default_mem_fraction(gpu_capacity_gib: float, settings: EngineSettings) -> float:
    """SGLang's default ``--mem-fraction-static`` (server_args._handle_gpu_memory_settings)."""
    gpu_mib = gpu_capacity_gib * 1024
    chunk, bs = resolved_defaults(gpu_capacity_gib, settings)
    reserved = 512.0
    reserved += max(chunk if chunk > 0 else 16384, 2048) * 1.5
    reserved += bs * 2
    reserved += settings.tp_size / 8 * 1024
    if settings.enable_dp_attention:
        reserved += bs * settings.dp_size * 3
        if bs > 300:
            reserved += bs * settings.dp_size * 1.5
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    algo = settings.speculative_algorithm
    if algo == "STANDALONE":
        reserved += 6 * 1024
    elif algo is not None and algo != "NGRAM":
        reserved += 2 * 1024
    return round((gpu_mib - reserved) / gpu_mib, 3)


def capture_batch_sizes(max_bs: int, speculative: bool) -> list[int]:
    """The CUDA-graph batch sizes SGLang captures up to ``max_bs``."""
    if speculative:
        sizes = (list(range(1, 9)) + list(range(10, 33, 2)) + list(range(40, 65, 4))
                 + list(range(72, 257, 8)) + list(range(272, max_bs + 1, 16)))
    else:
        sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    return [b for b in sizes if b <= max_bs]


def preload_free_gib(gpu_capacity_gib: float, tp: int) -> float:
    """P: free memory per rank before the weights load."""
    nccl = NCCL_GIB_PER_RANK * min(tp, 8) if tp > 1 else 0.0
    return gpu_capacity_gib - CTX_OVERHEAD_GIB - nccl


def graph_bytes_per_token(model: ModelFacts, layers: int | None = None) -> float:
    """CUDA-graph memory per captured token through ``layers`` layers (default: the target)."""
    if model.graph_bytes_per_token_override is not None and layers is None:
        return float(model.graph_bytes_per_token_override)
    n = model.layers if layers is None else layers
    return float(GRAPH_BYTES_PER_HIDDEN_LAYER * model.hidden_size * n + GRAPH_BYTES_PER_VOCAB * model.vocab_size)


def activation_bytes_per_token(model: ModelFacts, tp: int) -> float:
    """Prefill activation bytes per token on one rank (hidden states + MLP/MoE intermediates)."""
    if model.activation_bytes_per_token_override is not None:
        return float(model.activation_bytes_per_token_override)
    if model.num_experts_per_tok and model.moe_intermediate_size:
        width = model.num_experts_per_tok * model.moe_intermediate_size
    else:
        width = model.intermediate_size or 4 * model.hidden_size
    return 2.0 * (6 * model.hidden_size + 3 * width / tp)


def mamba_slots_per_request(settings: EngineSettings) -> int:
    """SGLang's mamba cache slots per running request (``_calculate_mamba_ratio``)."""
    if settings.disable_radix_cache:
        return 1
    strat = settings.mamba_scheduler_strategy
    if strat == "extra_buffer":
        return 3 + (1 if settings.disable_overlap_schedule else 2)
    if strat == "extra_buffer_lazy":
        return 3 + 1
    return 3


# ---- result types ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Budget:
    """The memory budget of one rank of one unit, with a verdict and a recommendation."""

    verdict: str
    capacity_gib: float
    preload_free_gib: float
    weights_gib: float
    fraction: float
    fraction_is_default: bool
    kv_pool_gib: float
    kv_tokens: int
    kv_bytes_per_token: int
    state_gib: float
    state_slots: int
    state_bytes_per_request: int
    running_requests: int
    headroom_needed_gib: float
    headroom_breakdown: dict[str, float]
    headroom_available_gib: float
    cuda_graph_max_bs: int
    chunked_prefill_size: int
    reason: str
    recommended: dict[str, Any] = field(default_factory=dict)
    needs_more_gpus: int | None = None
    message: str = ""
    measured: dict[str, Any] = field(default_factory=dict)

    @property
    def fits(self) -> bool:
        return self.verdict == "fits"

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict, "reason": self.reason, "recommended": dict(self.recommended),
            "needs_more_gpus": self.needs_more_gpus, "message": self.message,
            "capacity_gib": _r(self.capacity_gib), "preload_free_gib": _r(self.preload_free_gib),
            "weights_gib": _r(self.weights_gib), "fraction": self.fraction,
            "fraction_is_default": self.fraction_is_default, "kv_pool_gib": _r(self.kv_pool_gib),
            "kv_tokens": self.kv_tokens, "kv_bytes_per_token": self.kv_bytes_per_token,
            "state_gib": _r(self.state_gib), "state_slots": self.state_slots,
            "state_bytes_per_request": self.state_bytes_per_request,
            "running_requests": self.running_requests,
            "headroom_needed_gib": _r(self.headroom_needed_gib),
            "headroom_breakdown": {k: _r(v) for k, v in self.headroom_breakdown.items()},
            "headroom_available_gib": _r(self.headroom_available_gib),
            "cuda_graph_max_bs": self.cuda_graph_max_bs, "chunked_prefill_size": self.chunked_prefill_size,
            "measured": dict(self.measured),
        }


@dataclass(frozen=True)
class Suggestion:
    """One setting combination that fits, with what it buys."""

    settings: dict[str, Any]          # canonical name -> value, to merge into the role
    kv_tokens: int
    running_requests: int
    headroom_spare_gib: float
    speculative: bool

    def to_json(self) -> dict[str, Any]:
        return {"settings": dict(self.settings), "kv_tokens": self.kv_tokens,
                "running_requests": self.running_requests,
                "headroom_spare_gib": _r(self.headroom_spare_gib), "speculative": self.speculative}


def _r(x: float) -> float:
    return round(x, 3)


@dataclass(frozen=True)
class _Cal:
    """Measured overrides carried into every evaluation (also the recommendation search)."""

    preload_free_gib: float | None = None
    weights_gib: float | None = None
    graph_scale: float = 1.0


# ---- the model -------------------------------------------------------------------------------

def _evaluate(cap: float, model: ModelFacts, s: EngineSettings, cal: _Cal) -> Budget:
    tp = s.tp_size
    chunk, bs_max = resolved_defaults(cap, s)
    f_default = default_mem_fraction(cap, s)
    f = s.mem_fraction_static if s.mem_fraction_static is not None else f_default
    p = cal.preload_free_gib if cal.preload_free_gib is not None else preload_free_gib(cap, tp)
    algo = s.speculative_algorithm
    _steps, topk, draft_tokens = s.spec()
    has_draft = algo is not None and algo != "NGRAM"
    if cal.weights_gib is not None:
        w = cal.weights_gib
    else:
        wb = model.target_weight_bytes() + (model.draft_bytes() if has_draft else 0)
        w = wb / tp / GIB
    kvd = _KV_DTYPE_BYTES.get(s.kv_cache_dtype)
    cell = model.kv_bytes_per_token(tp, None if kvd is None else max(1, math.ceil(kvd)))
    if kvd is not None and kvd < 1:
        cell = max(1, math.ceil(cell * kvd))
    ctx = s.context_length or model.context_length
    per_req = model.state_bytes_per_request(tp)

    def result(verdict: str, reason: str, **kw: Any) -> Budget:
        base: dict[str, Any] = dict(
            verdict=verdict, capacity_gib=cap, preload_free_gib=p, weights_gib=w, fraction=f,
            fraction_is_default=s.mem_fraction_static is None, kv_pool_gib=0.0, kv_tokens=0,
            kv_bytes_per_token=cell, state_gib=0.0, state_slots=0, state_bytes_per_request=per_req,
            running_requests=0, headroom_needed_gib=0.0, headroom_breakdown={},
            headroom_available_gib=(1 - f) * p, cuda_graph_max_bs=0 if s.disable_cuda_graph else bs_max,
            chunked_prefill_size=chunk, reason=reason)
        base.update(kw)
        return Budget(**base)

    if w >= p:
        return result("weights-do-not-fit",
                      f"weights need {w:.2f} GiB per rank at TP{tp} but only {p:.2f} GiB is free "
                      f"before loading on a {cap:.1f} GiB GPU")
    rest = f * p - w
    if rest <= 0:
        need_f = w / p
        return result("kv-pool-empty",
                      f"mem_fraction_static {f:.3f} gives {f * p:.2f} GiB static memory but the weights "
                      f"take {w:.2f} GiB per rank: no room for the KV cache (needs > {need_f:.3f})",
                      kv_pool_gib=rest)

    # hybrid (mamba / linear-attention) state
    state_gib = 0.0
    slots = 0
    served: int | None = None
    if model.kind == "hybrid" and per_req > 0:
        ratio = mamba_slots_per_request(s)
        req_gib = per_req / GIB
        mamba_budget = rest * s.mamba_full_memory_ratio / (1 + s.mamba_full_memory_ratio)
        slots = int(mamba_budget // (req_gib * (1 + draft_tokens / ratio)))
        served = slots // ratio
        state_gib = (slots + served * draft_tokens) * req_gib
        wanted = s.max_running_requests
        if served < 1 or (wanted is not None and served < wanted):
            need = (wanted or 1) * (ratio + draft_tokens) * req_gib
            return result(
                "mamba-state-does-not-fit",
                f"{wanted or 1} running requests need {need:.2f} GiB of mamba state "
                f"({ratio + draft_tokens} slots x {per_req / 2**20:.1f} MiB each; "
                f"{wanted or 1} x 1 slot = {(wanted or 1) * req_gib:.2f} GiB) but the state budget "
                f"is {mamba_budget:.2f} GiB of {rest:.2f} GiB: at most {max(served, 0)} requests",
                kv_pool_gib=rest - state_gib, state_gib=state_gib, state_slots=slots,
                running_requests=max(served, 0))

    kv_pool = rest - state_gib
    tokens = int(kv_pool * GIB // cell) if cell else 0
    if tokens < 1:
        return result("kv-pool-empty", f"KV pool of {kv_pool:.2f} GiB holds no tokens",
                      kv_pool_gib=kv_pool, state_gib=state_gib, state_slots=slots)

    # running requests as SGLang resolves them
    if s.max_running_requests is not None:
        running = min(s.max_running_requests, tokens // 2)
    else:
        running = min(max(min(int(tokens / ctx * 512), 4096), 2048), tokens // 2)
    if served is not None:
        running = min(running, served)
    running = max(running, 1)

    # headroom
    br: dict[str, float] = {}
    if not s.disable_cuda_graph:
        sizes = capture_batch_sizes(bs_max, algo is not None)
        per_bs = draft_tokens if algo is not None else 1
        br["cuda_graphs"] = cal.graph_scale * (
            len(sizes) * GRAPH_FIXED_GIB + bs_max * per_bs * graph_bytes_per_token(model) / GIB)
        if has_draft:
            draft_layers = max(1, model.mtp_layers)
            br["draft_graphs"] = cal.graph_scale * (
                len(sizes) * GRAPH_FIXED_GIB
                + bs_max * topk * graph_bytes_per_token(model, draft_layers) / GIB)
    if algo is not None:
        br["spec_buffers"] = SPEC_FIXED_GIB
    if has_draft:
        draft_layers = max(1, model.mtp_layers)
        br["draft_kv"] = tokens * model.kv_bytes_per_token_per_layer(tp) * draft_layers / GIB
    br["req_to_token"] = running * (ctx + 4) * 4 / GIB
    br["activations"] = max(chunk, 0) * activation_bytes_per_token(model, tp) / GIB
    if s.moe_a2a_backend.lower().startswith("deepep"):
        br["deepep_buffers"] = DEEPEP_GIB
    br["misc"] = MISC_GIB
    available = (1 - f) * p
    needed = sum(br.values())
    common = dict(kv_pool_gib=kv_pool, kv_tokens=tokens, state_gib=state_gib, state_slots=slots,
                  running_requests=running, headroom_needed_gib=needed, headroom_breakdown=br,
                  headroom_available_gib=available)
    graphs = br.get("cuda_graphs", 0.0) + br.get("draft_graphs", 0.0)
    if needed > available:
        return result("oom-in-graph-capture",
                      f"headroom (1 - {f:.3f}) x {p:.2f} = {available:.2f} GiB is less than the "
                      f"{needed:.2f} GiB needed (CUDA graphs up to bs {bs_max}: {graphs:.2f} GiB, "
                      f"req-to-token {br['req_to_token']:.2f}, activations {br['activations']:.2f})",
                      **common)
    return result("fits",
                  f"weights {w:.2f} + KV {kv_pool:.2f} GiB ({tokens} tokens) fit in {f:.3f} x {p:.2f} GiB; "
                  f"headroom {available:.2f} GiB covers {needed:.2f} GiB (CUDA graphs {graphs:.2f})",
                  **common)


def _ok(b: Budget, min_kv_tokens: int) -> bool:
    return (b.verdict == "fits" and b.kv_tokens >= min_kv_tokens
            and b.headroom_available_gib - b.headroom_needed_gib
            >= max(SAFETY_MARGIN_GIB, SAFETY_MARGIN_SHARE * b.headroom_needed_gib))


def _largest_fraction(cap: float, model: ModelFacts, s: EngineSettings, cal: _Cal,
                      min_kv: int, cap_running: bool) -> tuple[EngineSettings, Budget] | None:
    """Largest fraction (0.01 steps) that fits with margin; hybrid: cap running requests too."""
    for hundredths in range(95, 29, -1):
        cand = replace(s, mem_fraction_static=hundredths / 100)
        b = _evaluate(cap, model, cand, cal)
        if b.verdict == "mamba-state-does-not-fit" and cap_running and b.running_requests >= 1:
            cand = replace(cand, max_running_requests=b.running_requests)
            b = _evaluate(cap, model, cand, cal)
        if _ok(b, min_kv):
            return cand, b
    return None


def _search(cap: float, model: ModelFacts, s: EngineSettings, cal: _Cal,
            min_kv: int) -> list[tuple[EngineSettings, Budget]]:
    """Fitting settings: for each (speculative on/off, graph bs cap), the largest safe fraction."""
    found: list[tuple[EngineSettings, Budget]] = []
    cap_running = model.kind == "hybrid"
    spec_options = [s] + ([replace(s, speculative_algorithm=None, speculative_num_steps=None,
                                   speculative_eagle_topk=None, speculative_num_draft_tokens=None)]
                          if s.speculative_algorithm is not None else [])
    for base in spec_options:
        _, bs_default = resolved_defaults(cap, base)
        caps: list[int | None] = [base.cuda_graph_max_bs]
        caps += [c for c in _BS_CAPS if c < bs_default]
        if base.disable_cuda_graph:
            caps = [base.cuda_graph_max_bs]
        for bs in caps:
            hit = _largest_fraction(cap, model, replace(base, cuda_graph_max_bs=bs), cal, min_kv, cap_running)
            if hit is not None:
                found.append(hit)
    spec_on = s.speculative_algorithm is not None

    def rank(item: tuple[EngineSettings, Budget]) -> tuple[int, int, int, int]:
        new, b = item
        bs = b.cuda_graph_max_bs or 10**6
        kept = (new.speculative_algorithm is not None) == spec_on
        return (0 if bs >= MIN_USEFUL_GRAPH_BS else 1, 0 if kept else 1, -bs, -b.kv_tokens)

    found.sort(key=rank)
    return found


def _changes(old: EngineSettings, new: EngineSettings) -> dict[str, Any]:
    out: dict[str, Any] = {"mem_fraction_static": new.mem_fraction_static}
    if new.cuda_graph_max_bs != old.cuda_graph_max_bs:
        out["cuda_graph_max_bs"] = new.cuda_graph_max_bs
    if new.max_running_requests != old.max_running_requests:
        out["max_running_requests"] = new.max_running_requests
    if new.speculative_algorithm != old.speculative_algorithm:
        out["speculative_algorithm"] = None
    if new.tp_size != old.tp_size:
        out["tp_size"] = new.tp_size
    return out


def _min_kv(model: ModelFacts, s: EngineSettings) -> int:
    return min(MIN_KV_TOKENS, s.context_length or model.context_length)


def _recommend(cap: float, model: ModelFacts, s: EngineSettings, cal: _Cal,
               verdict: str) -> tuple[dict[str, Any], int | None, str]:
    min_kv = _min_kv(model, s)
    if verdict != "weights-do-not-fit":
        found = _search(cap, model, s, cal, min_kv)
        if found:
            new, b = found[0]
            return _changes(s, new), None, f"{b.kv_tokens} KV tokens, {b.running_requests} running requests"
    scale_only = replace(cal, preload_free_gib=None, weights_gib=None)
    tp = s.tp_size
    while tp < 64:
        tp *= 2
        bigger = replace(s, tp_size=tp)
        found = _search(cap, model, bigger, scale_only, min_kv)
        if found:
            new, b = found[0]
            rec = _changes(s, new)
            return rec, tp, (f"needs more GPUs: TP{tp} ({b.kv_tokens} KV tokens at "
                             f"mem_fraction_static {new.mem_fraction_static})")
    return {}, None, "no setting fits on this GPU type up to TP64"


def _calibration(cap: float, model: ModelFacts, s: EngineSettings, measured: Measured | None) -> _Cal:
    if measured is None:
        return _Cal()
    cal = _Cal(preload_free_gib=measured.preload_free_gib, weights_gib=measured.weights_gib)
    if (cal.preload_free_gib is None and measured.after_load_avail_gib is not None
            and measured.weights_gib is not None):
        cal = replace(cal, preload_free_gib=measured.after_load_avail_gib + measured.weights_gib)
    predicted = _evaluate(cap, model, s, cal)
    br = predicted.headroom_breakdown
    graphs = br.get("cuda_graphs", 0.0) + br.get("draft_graphs", 0.0)
    if graphs > 0 and measured.graph_gib is not None and measured.graph_gib > 0:
        cal = replace(cal, graph_scale=measured.graph_gib / graphs)
    elif (graphs > 0 and measured.failure == "oom-in-graph-capture"
          and measured.oom_tried_gib is not None and measured.oom_free_gib is not None):
        # at the failure: used so far = available - free; it wanted `tried` more
        available = (measured.pool_end_avail_gib if measured.pool_end_avail_gib is not None
                     else predicted.headroom_available_gib)
        if measured.pool_end_avail_gib is not None:
            # "Memory pool end" is logged after the req-to-token table is allocated
            available += predicted.headroom_breakdown.get("req_to_token", 0.0)
        lower_bound = available - measured.oom_free_gib + measured.oom_tried_gib
        others = predicted.headroom_needed_gib - graphs
        if lower_bound > predicted.headroom_needed_gib:
            cal = replace(cal, graph_scale=max(1.0, (lower_bound - others) / graphs))
    return cal


def budget(gpu_capacity_gib: float, model: ModelFacts, settings: EngineSettings,
           measured: Measured | None = None, measured_settings: EngineSettings | None = None) -> Budget:
    """Predict the startup outcome of one rank and, when it fails, what would make it fit.

    ``measured`` is what a previous run of this model on this GPU logged, under
    ``measured_settings`` (default: ``settings``). Its preload free memory and weights replace
    the estimates; its CUDA-graph usage (or OOM "Tried to allocate X ... Y free") rescales the
    graph estimate for every setting, so recommendations use it too.
    """
    if gpu_capacity_gib <= 0 or not math.isfinite(gpu_capacity_gib):
        raise InputError([Problem(message=f"GPU capacity must be positive, got {gpu_capacity_gib}",
                                  key="gpu_capacity_gib")])
    cal = _calibration(gpu_capacity_gib, model, measured_settings or settings, measured)
    b = _evaluate(gpu_capacity_gib, model, settings, cal)
    if measured is not None:
        cmp: dict[str, Any] = {}
        for name, pred in (("preload_free_gib", preload_free_gib(gpu_capacity_gib, settings.tp_size)),
                           ("weights_gib", _evaluate(gpu_capacity_gib, model, settings, _Cal()).weights_gib),
                           ("kv_tokens", b.kv_tokens),
                           ("graph_gib", b.headroom_breakdown.get("cuda_graphs", 0.0)
                            + b.headroom_breakdown.get("draft_graphs", 0.0))):
            got = getattr(measured, name)
            if got is not None:
                cmp[name] = {"measured": got, "predicted": _r(float(pred))}
        if measured.failure:
            cmp["failure"] = measured.failure
        cmp["graph_scale"] = _r(cal.graph_scale)
        b = replace(b, measured=cmp)
    if b.verdict == "fits":
        return b
    rec, more, msg = _recommend(gpu_capacity_gib, model, settings, cal, b.verdict)
    return replace(b, recommended=rec, needs_more_gpus=more, message=msg)


def suggest(gpu_capacity_gib: float, model: ModelFacts, settings: EngineSettings,
            measured: Measured | None = None, measured_settings: EngineSettings | None = None,
            limit: int = 8) -> list[Suggestion]:
    """Settings that fit, best first: speculative kept, larger graph batch, more KV tokens."""
    cal = _calibration(gpu_capacity_gib, model, measured_settings or settings, measured)
    found = _search(gpu_capacity_gib, model, settings, cal, _min_kv(model, settings))
    out: list[Suggestion] = []
    for new, b in found:
        out.append(Suggestion(settings=_changes(settings, new), kv_tokens=b.kv_tokens,
                              running_requests=b.running_requests,
                              headroom_spare_gib=b.headroom_available_gib - b.headroom_needed_gib,
                              speculative=new.speculative_algorithm is not None))
    return out[:limit]


def default_flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def recommendation_flags(recommended: Mapping[str, Any],
                         version_flag_name: Callable[[str], str] = default_flag_name) -> list[str]:
    """Render a recommendation as CLI arguments for the host's release.

    ``speculative_algorithm: None`` (turn speculative decoding off) and ``tp_size`` (needs more
    GPUs) are not flags to add; they are left to the caller and skipped here.
    """
    out: list[str] = []
    for name, value in recommended.items():
        if value is None or name in ("tp_size", "needs_more_gpus"):
            continue
        flag = version_flag_name(name)
        if isinstance(value, bool):
            if value:
                out.append(flag)
            continue
        out += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    return out
