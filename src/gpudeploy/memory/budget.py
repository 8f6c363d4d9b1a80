"""How one SGLang rank sizes GPU memory at start, per release: the arithmetic and the verdict.

Pure. Per GPU rank, in GiB (the sources of each rule are in :mod:`.sglang_release`):

  C   capacity of one GPU;  P = C - CUDA context - NCCL/custom-all-reduce buffers
  W   target weights / TP (+ draft weights where the release counts them as static memory)
  f   --mem-fraction-static (SGLang's default formula of the release when not given)
  rest = f * P - W                <= 0 -> "Not enough memory"               (kv-pool-empty)
  hybrid models: the mamba state takes r / (1 + r) of rest (r = --mamba-full-memory-ratio);
      SGLang caps running requests at slots // slots-per-request and fails only at 0
      (mamba-state-does-not-fit); speculative decoding keeps D intermediate states per request
  KV tokens = (rest - state) / bytes-per-token
  H = (1 - f) * P must hold what is allocated after the KV pool:
      CUDA graphs (decode or target-verify, draft, prefill)   :mod:`.graphmem`, measured
      the capture's transient peak, or the prefill activations at run time, whichever is larger
      req-to-token table   running requests x (context + 4) x 4 B (exact)
      draft weights and draft KV where the release allocates them after the KV pool
      speculative buffers (1 GiB, not measured), DeepEP buffers (2 GiB, SGLang's own reserve),
      misc 0.3 GiB (sampling buffers, attention workspaces)
  Startup dies in graph capture when H is too small (oom-in-graph-capture), and the weights do
  not load when W >= P (weights-do-not-fit).

The verdict comes with a confidence: weights that do not fit, an empty KV pool and zero mamba
slots are arithmetic and refuse; a graph-capture shortfall refuses only when it exceeds the
error band of the estimate (graph term: :func:`.graphmem.error_band`; activations 30 %; the
speculative buffers in full), and inside the band it is a warning with the margin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .graphs import (
    POOL_FACTOR,
    Capture,
    GraphMemory,
    capture_memory,
    error_band,
    layer_live_bytes,
)
from .modelfacts import GIB, ModelFacts
from .releases import R0523, Release
from .settings import KV_DTYPE_BYTES, EngineSettings

VERDICTS = ("fits", "oom-in-graph-capture", "kv-pool-empty", "weights-do-not-fit",
            "mamba-state-does-not-fit")
CERTAIN = ("kv-pool-empty", "weights-do-not-fit", "mamba-state-does-not-fit")
SEVERITIES = ("ok", "warn", "refuse")

CTX_OVERHEAD_GIB = 0.5            # CUDA context, cuBLAS/cuDNN handles, torch allocator
NCCL_GIB_PER_RANK = 0.25          # per TP rank (up to 8) when tp > 1: NCCL + custom all-reduce
SPEC_FIXED_GIB = 1.0              # EAGLE/MTP buffers (tree masks, hidden states): not measured
DEEPEP_GIB = 2.0                  # SGLang reserves this for DeepEP all-to-all buffers (0.5.23)
MLA_PREFILL_GRAPH_GIB = 1.5       # SGLang's own reserve: "MLA backend overhead is much higher"
MISC_GIB = 0.3
ACTIVATION_REL_ERROR = 0.3
SPEC_STEP_CAPS = (512, 384, 256, 192, 160, 128, 96, 64, 48, 32, 24, 16, 8, 4, 2, 1)
SPEC_RUNNING_DEFAULT = 48         # EAGLE/EAGLE3/STANDALONE/NGRAM without --max-running-requests


# ---- SGLang's defaults, per release ----------------------------------------------------------

def resolved_defaults(cap: float, s: EngineSettings, rel: Release = R0523) -> tuple[int, int]:
    """(chunked_prefill_size, decode cuda_graph_max_bs) as the release resolves them."""
    chunk, bs = rel.tier(cap * 1024, s.tp_size)
    if s.chunked_prefill_size is not None:
        chunk = s.chunked_prefill_size
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


def prefill_graphs_on(s: EngineSettings, rel: Release) -> bool:
    """Whether the release captures prefill graphs for these settings."""
    if s.disable_prefill_cuda_graph or rel.prefill_graphs == "none":
        return False
    if rel.prefill_graphs == "piecewise":      # 0.5.10: _handle_piecewise_cuda_graph
        return not (s.speculative_algorithm or s.enable_dp_attention or s.enable_torch_compile
                    or s.moe_a2a_backend != "none" or s.disaggregation_mode != "null" or s.enable_lora)
    return s.disaggregation_mode != "decode"   # 0.5.23: breakable prefill graphs on CUDA


def decode_graphs_on(s: EngineSettings, rel: Release) -> bool:
    # 0.5.23: a PD prefill server never replays decode graphs and captures none
    return not s.disable_cuda_graph and not (rel.name == "0.5.23" and s.disaggregation_mode == "prefill")


def _prefill_max_tokens(model: ModelFacts, s: EngineSettings, chunk: int) -> int:
    if s.prefill_graph_max_tokens is not None:
        return s.prefill_graph_max_tokens
    return min(8192, chunk) if model.kind == "mla" else chunk


def default_mem_fraction(cap: float, s: EngineSettings, rel: Release = R0523,
                         model: ModelFacts | None = None) -> float:
    """The release's default ``--mem-fraction-static`` (see :mod:`.sglang_release`)."""
    gpu_mib = cap * 1024
    chunk, bs = resolved_defaults(cap, s, rel)
    mla = model is not None and model.kind == "mla"
    reserved = 512.0 + max(chunk if chunk > 0 else 16384, 2048) * 1.5
    reserved += 0 if not decode_graphs_on(s, rel) else bs * 2
    reserved += s.tp_size / 8 * 1024
    if s.enable_dp_attention:
        reserved += bs * s.dp_size * 3
        if bs > 300:
            reserved += bs * s.dp_size * 1.5
    if prefill_graphs_on(s, rel):
        sizes = prefill_graph_sizes(_prefill_max_tokens(model, s, chunk) if model else chunk)
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


def capture_batch_sizes(max_bs: int, speculative: bool, rel: Release = R0523, cap: float = 139.8,
                        pool_size: int | None = None) -> list[int]:
    """The decode batch sizes the release captures up to ``max_bs`` (capped at the request pool)."""
    if rel.legacy_capture_list:
        big = cap * 1024 > 96 * 1024
        sizes = (list(range(1, 9)) + list(range(10, 33, 2)) + list(range(40, 161, 16)) if speculative
                 else [1, 2, 4, 8, *range(16, 161, 8)])
        sizes += list(range(160, 257, 8)) if big else []
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


def preload_free_gib(cap: float, tp: int) -> float:
    """P: free memory per rank before the weights load."""
    nccl = NCCL_GIB_PER_RANK * min(tp, 8) if tp > 1 else 0.0
    return cap - CTX_OVERHEAD_GIB - nccl


def mamba_slots_per_request(s: EngineSettings, rel: Release = R0523) -> int:
    """Mamba cache slots per running request (``_calculate_mamba_ratio``)."""
    if s.disable_radix_cache:
        return 1
    strat = s.mamba_scheduler_strategy
    overlap = not s.disable_overlap_schedule and (s.speculative_algorithm is None or rel.spec_keeps_overlap)
    if strat == "extra_buffer":
        return 3 + (2 if overlap else 1)
    if strat == "extra_buffer_lazy":
        return 3 + 1
    return 3


def activations_gib(model: ModelFacts, tp: int, chunk: int) -> float:
    """Prefill activations of one chunk, with the allocator factor measured for graph pools."""
    tokens = max(chunk, 0)
    if model.activation_bytes_per_token_override is not None:
        return tokens * model.activation_bytes_per_token_override / GIB
    return POOL_FACTOR * layer_live_bytes(model, tp, tokens) / GIB


# ---- result types ----------------------------------------------------------------------------

def _r(x: float) -> float:
    return round(x, 3)


@dataclass(frozen=True)
class Budget:
    """The memory budget of one rank of one unit, with a verdict, its confidence and a recommendation."""

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
    release: str = R0523.name
    severity: str = "ok"                 # "ok" | "warn" (deploy goes ahead) | "refuse"
    error_band_gib: float = 0.0          # how far the headroom need can be off
    spare_wanted_gib: float = 0.0        # what a recommendation leaves spare (the measured band)
    graphs: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    recommended: dict[str, Any] = field(default_factory=dict)
    needs_more_gpus: int | None = None
    message: str = ""
    measured: dict[str, Any] = field(default_factory=dict)

    @property
    def fits(self) -> bool:
        return self.verdict == "fits"

    @property
    def margin_gib(self) -> float:
        """Headroom left over (negative: short by that much)."""
        return self.headroom_available_gib - self.headroom_needed_gib

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict, "severity": self.severity, "reason": self.reason,
            "release_rules": self.release, "recommended": dict(self.recommended),
            "needs_more_gpus": self.needs_more_gpus, "message": self.message, "notes": list(self.notes),
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
            "margin_gib": _r(self.margin_gib), "error_band_gib": _r(self.error_band_gib),
            "cuda_graphs": dict(self.graphs),
            "cuda_graph_max_bs": self.cuda_graph_max_bs, "chunked_prefill_size": self.chunked_prefill_size,
            "measured": dict(self.measured),
        }


@dataclass(frozen=True)
class Cal:
    """Measured figures carried into every evaluation (the recommendation search too)."""

    preload_free_gib: float | None = None
    weights_gib: float | None = None
    # graph family -> measured / predicted; a family the previous run did not capture keeps the
    # estimate (a speculative run says nothing about the plain decode graphs, and back)
    graph_scales: tuple[tuple[str, float], ...] = ()
    graph_measured: bool = False          # a previous run logged its graph memory (not only a floor)

    def scale(self, family: str) -> float:
        return dict(self.graph_scales).get(family, 1.0)


# ---- the model -------------------------------------------------------------------------------

def _graph_families(model: ModelFacts, s: EngineSettings, rel: Release, cap: float, bs_max: int,
                    running: int, ctx: int, chunk: int) -> dict[str, GraphMemory]:
    """Predicted memory of each captured graph family (decode/verify, draft, prefill)."""
    tp = s.tp_size
    out: dict[str, GraphMemory] = {}
    steps, topk, draft_tokens = s.spec()
    spec = s.speculative_algorithm is not None
    local_attn = 1 if model.attention_chunk_size else 0
    if decode_graphs_on(s, rel) and bs_max > 0:
        sizes = tuple(capture_batch_sizes(bs_max, spec, rel, cap, pool_size=running))
        if spec:
            out["verify_graphs"] = capture_memory(model, tp, ctx, Capture(
                sizes, draft_tokens, model.layers, draft_tokens, metadata_tables=4 + local_attn), rel)
            if s.has_draft:
                draft_layers = max(1, model.mtp_layers) if not model.draft_weight_bytes else max(1, model.draft_layers)
                decode = capture_memory(model, tp, ctx, Capture(sizes, topk, draft_layers * steps, topk, 0), rel,
                                        first=False)
                extend = capture_memory(model, tp, ctx, Capture(sizes, steps + 1, draft_layers, 1, 0), rel,
                                        first=False)
                out["draft_graphs"] = GraphMemory(0.0, decode.graph_exec + extend.graph_exec,
                                                  decode.input_buffers + extend.input_buffers, 0.0,
                                                  max(decode.pool, extend.pool), decode.per_graph + extend.per_graph)
        else:
            out["cuda_graphs"] = capture_memory(model, tp, ctx, Capture(
                sizes, 1, model.layers, 1, metadata_tables=1 + local_attn), rel)
    if prefill_graphs_on(s, rel):
        tokens = prefill_graph_sizes(_prefill_max_tokens(model, s, chunk))
        if tokens:
            out["prefill_graphs"] = capture_memory(model, tp, ctx, Capture(
                tuple(tokens), 1, model.layers, 1, metadata_tables=0, prefill=True), rel, first=not out)
    return out


def _shared_pool(families: dict[str, GraphMemory]) -> dict[str, float]:
    """Per family, GiB: all families capture into SGLang's one global pool, so pools overlap."""
    biggest = max((g.pool for g in families.values()), default=0.0)
    out: dict[str, float] = {}
    seen_pool = False
    for name, g in families.items():
        pool = biggest if (not seen_pool and g.pool == biggest) else 0.0
        seen_pool = seen_pool or pool > 0
        out[name] = g.usage - g.pool + pool
    return out


def evaluate(cap: float, model: ModelFacts, s: EngineSettings, cal: Cal, rel: Release = R0523) -> Budget:
    """The outcome of one rank under the release's rules (no recommendation)."""
    tp = s.tp_size
    chunk, bs_max = resolved_defaults(cap, s, rel)
    f_default = default_mem_fraction(cap, s, rel, model)
    f = s.mem_fraction_static if s.mem_fraction_static is not None else f_default
    p = cal.preload_free_gib if cal.preload_free_gib is not None else preload_free_gib(cap, tp)
    algo = s.speculative_algorithm
    _steps, _topk, draft_tokens = s.spec()
    has_draft = s.has_draft
    notes: list[str] = []
    draft_w = model.draft_bytes() / tp / GIB if has_draft else 0.0
    if cal.weights_gib is not None:
        w = cal.weights_gib
    else:
        w = model.target_weight_bytes() / tp / GIB + (draft_w if rel.draft_weights_static else 0.0)
    kvd = KV_DTYPE_BYTES.get(s.kv_cache_dtype)
    cell = model.kv_bytes_per_token(tp, None if kvd is None else max(1, math.ceil(kvd)))
    if kvd is not None and kvd < 1:
        cell = max(1, math.ceil(cell * kvd))
    draft_layers = (max(1, model.mtp_layers) if not model.draft_weight_bytes else max(1, model.draft_layers))
    draft_cell = model.kv_bytes_per_token_per_layer(tp) * draft_layers if has_draft else 0.0
    if has_draft and rel.draft_weights_static:
        cell = int(cell + draft_cell)        # one unified pool holds the draft's KV too
    ctx = s.context_length or model.context_length
    per_req = model.state_bytes_per_request(tp)
    wanted_running = s.max_running_requests
    if wanted_running is None and algo is not None:
        wanted_running = SPEC_RUNNING_DEFAULT
    # the device runs and public logs cover plain TP decode; a measured figure from a previous run
    # of these settings grounds the rest
    grounded = bool(cal.graph_scales) or not (
        s.enable_dp_attention or s.moe_a2a_backend != "none" or s.enable_torch_compile or s.enable_lora)

    def result(verdict: str, reason: str, **kw: Any) -> Budget:
        base: dict[str, Any] = dict(
            verdict=verdict, capacity_gib=cap, preload_free_gib=p, weights_gib=w, fraction=f,
            fraction_is_default=s.mem_fraction_static is None, kv_pool_gib=0.0, kv_tokens=0,
            kv_bytes_per_token=cell, state_gib=0.0, state_slots=0, state_bytes_per_request=per_req,
            running_requests=0, headroom_needed_gib=0.0, headroom_breakdown={},
            headroom_available_gib=(1 - f) * p, cuda_graph_max_bs=0 if s.disable_cuda_graph else bs_max,
            chunked_prefill_size=chunk, reason=reason, release=rel.name,
            severity="refuse" if verdict in CERTAIN else "ok", notes=tuple(notes))
        base.update(kw)
        return Budget(**base)

    if w >= p:
        return result("weights-do-not-fit",
                      f"weights need {w:.2f} GiB per rank at TP{tp} but only {p:.2f} GiB is free "
                      f"before loading on a {cap:.1f} GiB GPU")
    rest = f * p - w
    if rest <= 0:
        return result("kv-pool-empty",
                      f"mem_fraction_static {f:.3f} gives {f * p:.2f} GiB static memory but the weights "
                      f"take {w:.2f} GiB per rank: no room for the KV cache (needs > {w / p:.3f})",
                      kv_pool_gib=rest)

    # hybrid (mamba / linear-attention) state, as the release sizes it
    state_gib = 0.0
    slots = 0
    served: int | None = None
    if model.kind == "hybrid" and per_req > 0:
        ratio = mamba_slots_per_request(s, rel)
        req_gib = per_req / GIB
        avail = rest
        running_for_state = wanted_running or 1
        if algo is not None and not rel.spec_keeps_overlap:
            # <= 0.5.10: D intermediate states per running request come off the top
            avail -= req_gib * running_for_state * draft_tokens
        budget_gib = avail * s.mamba_full_memory_ratio / (1 + s.mamba_full_memory_ratio)
        if algo is not None and rel.spec_keeps_overlap:
            # 0.5.23 solves slots and intermediate states together
            slots = int((budget_gib - req_gib * (1 + draft_tokens)) // (req_gib * (1 + draft_tokens / ratio)))
        else:
            slots = int(budget_gib // req_gib) if budget_gib > 0 else 0
        served = slots // ratio if slots > 0 else 0
        inter = req_gib * (min(running_for_state, served) + 1) * draft_tokens if algo else 0.0
        state_gib = max(slots, 0) * req_gib + inter
        if served < 1:
            need = (ratio + draft_tokens) * req_gib * running_for_state
            return result(
                "mamba-state-does-not-fit",
                f"{running_for_state} running request(s) need about {need:.2f} GiB of mamba state "
                f"({ratio} slots + {draft_tokens} speculative states x {per_req / 2**20:.1f} MiB each) "
                f"but the state budget of {max(budget_gib, 0):.2f} GiB (of {rest:.2f} GiB) holds no request",
                kv_pool_gib=rest - state_gib, state_gib=state_gib, state_slots=max(slots, 0))
        if s.max_running_requests is not None and served < s.max_running_requests:
            notes.append(f"SGLang caps max_running_requests at {served} (mamba state for {slots} slots, "
                         f"{ratio} per request); asked for {s.max_running_requests}")

    kv_pool = rest - state_gib
    tokens = int(kv_pool * GIB // cell) if cell else 0
    if tokens < 1:
        return result("kv-pool-empty", f"KV pool of {kv_pool:.2f} GiB holds no tokens",
                      kv_pool_gib=kv_pool, state_gib=state_gib, state_slots=slots)

    # running requests as SGLang resolves them
    if wanted_running is not None:
        running = min(wanted_running, tokens // 2)
    else:
        running = min(max(min(int(tokens / ctx * 512), 4096), 2048), tokens // 2)
    if served is not None:
        running = min(running, served)
    running = max(running, 1)

    # headroom
    families = _graph_families(model, s, rel, cap, bs_max, running, ctx, chunk)
    graph_gib = {k: cal.scale(k) * v for k, v in _shared_pool(families).items()}
    if s.enable_dp_attention and "cuda_graphs" in graph_gib:
        # not measured here: SGLang's own reserve for what DP attention's padded buffers take
        # ("DP attention uses much more memory for large cuda graph max bs", server_args)
        extra = bs_max * s.dp_size * (3 + (1.5 if bs_max > 300 else 0)) / 1024
        graph_gib["cuda_graphs"] += cal.scale("cuda_graphs") * extra
    br: dict[str, float] = dict(graph_gib)
    if "prefill_graphs" in families and model.kind == "mla":
        br["prefill_graphs"] += MLA_PREFILL_GRAPH_GIB
    # DP attention splits each prefill chunk over the DP ranks (_handle_data_parallelism)
    act = activations_gib(model, tp, chunk // s.dp_size if s.enable_dp_attention else chunk)
    prefill_pool = families["prefill_graphs"].pool if "prefill_graphs" in families else 0.0
    run_act = max(0.0, act - prefill_pool)      # prefill graphs replay out of the shared pool
    transient = max((g.peak_extra * cal.scale(k) for k, g in families.items()), default=0.0)
    br["activations"] = max(run_act, transient)
    if algo is not None:
        br["spec_buffers"] = SPEC_FIXED_GIB
    if has_draft and not rel.draft_weights_static:
        br["draft_weights"] = draft_w
        br["draft_kv"] = tokens * draft_cell / GIB
    br["req_to_token"] = running * (ctx + 4 + draft_tokens) * 4 / GIB
    if s.moe_a2a_backend.lower().startswith("deepep"):
        br["deepep_buffers"] = DEEPEP_GIB
    br["misc"] = MISC_GIB
    available = (1 - f) * p
    needed = sum(br.values())
    graphs_total = sum(graph_gib.values())
    # a logged graph figure leaves only the noise between two runs of the same settings
    graph_band = max(0.25, 0.1 * graphs_total) if cal.graph_measured else error_band(graphs_total, grounded)
    rest_band = ACTIVATION_REL_ERROR * br["activations"] + br.get("spec_buffers", 0.0)
    band = graph_band + rest_band
    # what a recommendation leaves spare: the measured band, also where the verdict's band is wider
    spare = (graph_band if grounded or cal.graph_measured else error_band(graphs_total, True)) + rest_band
    if not grounded:
        notes.append("DP attention, DeepEP, torch.compile or LoRA: the graph estimate is not grounded in "
                     "measurements, so a predicted shortfall only warns")
    detail: dict[str, Any] = {k: g.to_json() for k, g in families.items()}
    detail["scale_from_measurement"] = {k: _r(v) for k, v in cal.graph_scales}
    common = dict(kv_pool_gib=kv_pool, kv_tokens=tokens, state_gib=state_gib, state_slots=slots,
                  running_requests=running, headroom_needed_gib=needed, headroom_breakdown=br,
                  headroom_available_gib=available, error_band_gib=band, spare_wanted_gib=spare, graphs=detail,
                  notes=tuple(notes))
    margin = available - needed
    what = (f"CUDA graphs {graphs_total:.2f} GiB (decode bs up to {bs_max}"
            + (f", prefill up to {max(prefill_graph_sizes(_prefill_max_tokens(model, s, chunk)), default=0)} tokens"
               if "prefill_graphs" in families else "") + ")")
    if margin < 0:
        certain = grounded and -margin > band
        return result("oom-in-graph-capture",
                      f"headroom (1 - {f:.3f}) x {p:.2f} = {available:.2f} GiB is {-margin:.2f} GiB short of the "
                      f"{needed:.2f} GiB needed ({what}, req-to-token {br['req_to_token']:.2f}, "
                      f"activations {br['activations']:.2f}); the estimate is good to +-{band:.2f} GiB",
                      severity="refuse" if certain else "warn", **common)
    return result("fits",
                  f"weights {w:.2f} + KV {kv_pool:.2f} GiB ({tokens} tokens) fit in {f:.3f} x {p:.2f} GiB; "
                  f"headroom {available:.2f} GiB covers {needed:.2f} GiB ({what}) with {margin:.2f} GiB spare"
                  + (f", inside the +-{band:.2f} GiB error band" if margin < band else ""),
                  severity="warn" if margin < band else "ok", **common)
