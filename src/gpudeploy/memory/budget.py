"""How one SGLang rank sizes GPU memory at start, per release: the arithmetic and the verdict.

Pure. Per GPU rank, in GiB (the rules and their sources: :mod:`.releases`, :mod:`.defaults`):

  C   capacity of one GPU (torch's total);  P = C - CUDA context - NCCL init (:mod:`.gpuclass`),
      or what a previous run logged, or NVML's free memory at deploy
  W   target weights / TP (+ draft weights where the release counts them as static memory); with DP
      attention the attention weights are split over TP / DP ranks only, so each rank holds more
  f   --mem-fraction-static (the release's default when not given; a multimodal model lowers it)
  rest = f * P - W                <= 0 -> "Not enough memory"               (kv-pool-empty)
  hybrid models: the mamba state comes out of rest first (:mod:`.hybrid`)
  KV tokens = (rest - state) / bytes-per-token (capped by --max-total-tokens)
  H = (1 - f) * P must hold what is allocated after the KV pool:
      the request-to-token table, max_num_reqs x (context + 4 + draft tokens) x 4 B, exact and
      allocated with the pool: more than H fails the memory pool itself      (memory-pool-does-not-fit)
      CUDA graphs (decode or target-verify, draft, prefill; :mod:`.graphs`), the capture's transient
      peak or the prefill activations, draft weights and KV where the release allocates them late,
      speculative buffers (1 GiB), DeepEP buffers (2 GiB), misc 0.3 GiB   -> short: oom-in-graph-capture
  the weights do not load when W >= P                                        (weights-do-not-fit)

The verdict comes with its error band (:mod:`.inputs`): the measured error of the terms plus what
each assumed input can move. Arithmetic failures refuse unless the band of the free memory covers
them; a graph-capture shortfall refuses only beyond the whole band. Inside the band the verdict is
"uncertain" when assumed inputs make it wide (a warning naming them and what would make them
certain), else "fits" or "oom-in-graph-capture" with a warning and the margin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from .defaults import (
    SPEC_RUNNING_DEFAULT,
    attention_backend,
    capture_batch_sizes,
    decode_graphs_on,
    default_mem_fraction,
    effective_fraction,
    prefill_graph_sizes,
    prefill_graphs_on,
    prefill_max_tokens,
    resolved_defaults,
    spec_of,
    wanted_running,
)
from .gpuclass import GpuClass, gpu_class
from .graphs import (
    COMM_REL_ERROR,
    POOL_FACTOR,
    REL_ERROR,
    Capture,
    GraphMemory,
    capture_memory,
    comm_gib,
    error_band,
    layer_live_bytes,
)
from .hybrid import mamba_state, slots_per_request
from .inputs import (
    MULTIMODAL_SHARE_OF_FREE,
    RELEASE_DRIFT_FLOOR_GIB,
    RELEASE_DRIFT_GIB,
    SHAPE_SHARE_OF_WEIGHTS,
    SPEC_GIB_PER_VERIFY_TOKEN,
    SPEC_SHARE_OF_FREE,
    WIDE_GIB,
    Input,
    assumed,
    describe,
)
from .modelfacts import GIB, ModelFacts
from .releases import R0523, Release, checked_above
from .settings import KV_DTYPE_BYTES, SSM_DTYPE_BYTES, EngineSettings
from .speculative import fixed_buffer_bytes, spec_captures
from .speculative import read as spec_read

__all__ = ["CERTAIN", "SEVERITIES", "SPEC_RUNNING_DEFAULT", "SPEC_STEP_CAPS", "VERDICTS", "Budget", "Cal",
           "activations_gib", "capture_batch_sizes", "default_mem_fraction", "evaluate", "mamba_slots_per_request",
           "preload_free_gib", "resolved_defaults"]

VERDICTS = ("fits", "uncertain", "oom-in-graph-capture", "kv-pool-empty", "weights-do-not-fit",
            "mamba-state-does-not-fit", "memory-pool-does-not-fit")
CERTAIN = ("kv-pool-empty", "weights-do-not-fit", "mamba-state-does-not-fit", "memory-pool-does-not-fit")
SEVERITIES = ("ok", "warn", "refuse")

DEEPEP_GIB = 2.0                  # SGLang reserves this for DeepEP all-to-all buffers (0.5.23)
MLA_PREFILL_GRAPH_GIB = 1.5       # SGLang's own reserve: "MLA backend overhead is much higher"
MISC_GIB = 0.3
ACTIVATION_REL_ERROR = 0.3
SPEC_STEP_CAPS = (512, 384, 256, 192, 160, 128, 96, 64, 48, 32, 24, 16, 8, 4, 2, 1)


def preload_free_gib(cap: float, tp: int, name: str | None = None) -> float:
    """P at plan time: free memory per rank before the weights load, for this kind of GPU."""
    return gpu_class(cap, name).preload_free(cap, tp)[0]


def mamba_slots_per_request(s: EngineSettings, rel: Release = R0523, architecture: str = "") -> int:
    return slots_per_request(s, rel, architecture)


def activations_gib(model: ModelFacts, tp: int, chunk: int) -> float:
    """Prefill activations of one chunk, with the allocator factor measured for graph pools."""
    tokens = max(chunk, 0)
    if model.activation_bytes_per_token_override is not None:
        return tokens * model.activation_bytes_per_token_override / GIB
    return POOL_FACTOR * layer_live_bytes(model, tp, tokens) / GIB


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
    spare_wanted_gib: float = 0.0        # what a recommendation leaves spare
    graphs: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    recommended: dict[str, Any] = field(default_factory=dict)
    needs_more_gpus: int | None = None
    message: str = ""
    measured: dict[str, Any] = field(default_factory=dict)
    inputs: tuple[Input, ...] = ()
    gpu: str = ""
    lesson: str = ""                     # what a failed run taught (the recommendation covers it)
    mamba_strategy: str = ""
    # the error band, term by term (GiB): the terms' measured error, then each assumed input's share
    band_terms: dict[str, float] = field(default_factory=dict)
    # a plain fit far above what the release needs: the fraction that takes the spare headroom within
    # the band, and the KV tokens and running requests it buys (recommend.budget fills it)
    on_the_table: dict[str, Any] = field(default_factory=dict)

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
            "measured": dict(self.measured), "inputs": [i.to_json() for i in self.inputs],
            "assumed": [i.name for i in assumed(self.inputs)], "gpu_class": self.gpu, "lesson": self.lesson,
            "mamba_strategy": self.mamba_strategy,
            "band_terms": {k: _r(v) for k, v in self.band_terms.items()},
            "on_the_table": dict(self.on_the_table),
        }


@dataclass(frozen=True)
class Cal:
    """Measured figures carried into every evaluation (the recommendation search too)."""

    preload_free_gib: float | None = None
    preload_source: str = ""              # where P came from ("a previous run's log", "NVML at deploy")
    preload_band_gib: float = 0.0         # NVML's free still loses the context: its band
    weights_gib: float | None = None
    # graph family -> measured / predicted; a family the previous run did not capture keeps the
    # estimate (a speculative run says nothing about the plain decode graphs, and back)
    graph_scales: tuple[tuple[str, float], ...] = ()
    graph_measured: bool = False          # a previous run logged its graph memory (not only a floor)
    # what a failed run proved was missing, by headroom term (GiB), and its story for messages
    extra_headroom: tuple[tuple[str, float], ...] = ()
    lesson: str = ""
    learned_gib: float = 0.0              # how much a floor raised the estimate (it replaces guesses)
    # the installed release's own defaults for these settings, asked of it (:mod:`.asked`): where from
    defaults_source: str = ""

    def scale(self, family: str) -> float:
        return dict(self.graph_scales).get(family, 1.0)


# ---- the model -------------------------------------------------------------------------------

def _graph_families(model: ModelFacts, s: EngineSettings, rel: Release, cap: float, bs_max: int,
                    running: int, ctx: int, chunk: int, spec: tuple[int, int, int], tp: int,
                    per_graph_table: bool, backend: str) -> dict[str, GraphMemory]:
    """Predicted memory of each captured graph family (decode/verify, draft, prefill)."""
    out: dict[str, GraphMemory] = {}
    speculative = s.speculative_algorithm is not None
    local_attn = 1 if model.attention_chunk_size else 0
    pt = {"page_table_per_graph": per_graph_table}
    if decode_graphs_on(s, rel) and bs_max > 0:
        sizes = tuple(capture_batch_sizes(bs_max, speculative, rel, cap, pool_size=running))
        if speculative:
            draft_layers = max(1, model.mtp_layers) if not model.draft_weight_bytes else max(1, model.draft_layers)
            caps = spec_captures(model, rel, backend, sizes, spec, draft_layers, bool(local_attn))
            out["verify_graphs"] = capture_memory(model, tp, ctx, caps["verify"], rel, **pt)
            if s.has_draft:
                decode = capture_memory(model, tp, ctx, caps["draft_decode"], rel, first=False, **pt)
                extend = capture_memory(model, tp, ctx, caps["draft_extend"], rel, first=False, **pt)
                out["draft_graphs"] = GraphMemory(0.0, decode.graph_exec + extend.graph_exec,
                                                  decode.input_buffers + extend.input_buffers,
                                                  decode.attn_metadata + extend.attn_metadata,
                                                  max(decode.pool, extend.pool), decode.per_graph + extend.per_graph)
        else:
            out["cuda_graphs"] = capture_memory(model, tp, ctx, Capture(
                sizes, 1, model.layers, 1, metadata_tables=1 + local_attn), rel, **pt)
    if prefill_graphs_on(s, rel, model, captured=True):
        tokens = prefill_graph_sizes(prefill_max_tokens(model, s, chunk))
        if tokens:
            out["prefill_graphs"] = capture_memory(model, tp, ctx, Capture(
                tuple(tokens), 1, model.layers, 1, metadata_tables=0, prefill=True), rel, first=not out, **pt)
    if out and tp > 1:
        # the first capture's collectives connect NCCL's channels (graphs.comm_gib)
        name = next(iter(out))
        out[name] = replace(out[name], comm=comm_gib(tp))
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


def _weights(model: ModelFacts, s: EngineSettings, rel: Release, cal: Cal, draft_w: float) -> tuple[float, str]:
    """W per rank, and a note when DP attention keeps the attention weights whole on fewer ranks."""
    if cal.weights_gib is not None:
        return cal.weights_gib, ""
    tp = s.tp_size
    target = model.target_weight_bytes()
    extra = draft_w if rel.draft_weights_static else 0.0
    if s.enable_dp_attention and s.dp_size > 1 and model.attention_weight_bytes:
        attn_tp = max(1, tp // s.dp_size)
        attn = min(model.attention_weight_bytes, target)
        w = (target - attn) / tp / GIB + attn / attn_tp / GIB
        return w + extra, (f"DP attention splits the attention weights ({attn / GIB:.1f} GiB) over {attn_tp} "
                           f"rank(s) only: {attn / attn_tp / GIB:.2f} GiB of them on each rank")
    return target / tp / GIB + extra, ""


def _kv_cell(model: ModelFacts, s: EngineSettings, rel: Release, spec_has_draft: bool) -> tuple[int, float]:
    """(bytes per token per rank of the target's pool, the draft's per token) as SGLang sizes them."""
    kv_tp = max(1, s.tp_size // s.dp_size) if s.enable_dp_attention else s.tp_size
    kvd = KV_DTYPE_BYTES.get(s.kv_cache_dtype)
    cell = model.kv_bytes_per_token(kv_tp, None if kvd is None else max(1, math.ceil(kvd)))
    if kvd is not None and kvd < 1:
        cell = max(1, math.ceil(cell * kvd))
    draft_layers = (max(1, model.mtp_layers) if not model.draft_weight_bytes else max(1, model.draft_layers))
    draft_cell = model.kv_bytes_per_token_per_layer(kv_tp) * draft_layers if spec_has_draft else 0.0
    if spec_has_draft and rel.draft_weights_static:
        cell = int(cell + draft_cell)        # one unified pool holds the draft's KV too
    return cell, draft_cell


def _inputs(model: ModelFacts, s: EngineSettings, rel: Release, cal: Cal, gpu: GpuClass, f: float, p_band: float,
            w: float, p: float, graphs_total: float, graphs_grounded: bool, dp_note: str,
            verify_tokens: int = 0, drift: tuple[float, str] | None = None) -> tuple[Input, ...]:
    """Every input, grounded or assumed, with its share of the band (:mod:`.inputs`); ``drift``: how far
    the headroom need moves between the checked releases either side of an unread one, and which."""
    out: list[Input] = []
    measured_graphs = cal.graph_measured
    if "shape" in model.assumed:
        band = 0.0 if measured_graphs else SHAPE_SHARE_OF_WEIGHTS * w
        out.append(Input("model shape", False, "guessed in the role's model.facts", band,
                         "the model's config.json (a readable model.path) or a measured run"))
    else:
        out.append(Input("model shape", True, model.source or "the role's model.facts"))
    # the checkpoint's size moves the static memory (the KV tokens), not the headroom: no band
    if "weights" in model.assumed:
        out.append(Input("checkpoint size", False, "assumed from the parameter count and dtype (moves the KV tokens)",
                         0.0, "the model directory's safetensors index or its files' headers"))
    elif cal.weights_gib is not None:
        out.append(Input("checkpoint size", True, "a previous run's log (Load weight end)"))
    else:
        out.append(Input("checkpoint size", True, model.weights_source or "given in the role's model.facts"))
    others = [a for a in model.assumed if a not in ("shape", "weights")]
    if others:
        # a guessed checkpoint size moves the static memory (the KV tokens), not the headroom
        out.append(Input(", ".join(others), False, "guessed in the role's model.facts (moves the KV tokens)", 0.0,
                         "the model directory's safetensors index"))
    if cal.defaults_source:
        out.append(Input("release defaults", True, cal.defaults_source))
    elif not rel.checked:
        # the defaults (fraction, chunk, graph cap, running requests) are the captured rules' reading;
        # their share of the band is the release rules' drift below
        out.append(Input("release defaults", False, f"{rel.checked_as}'s rules for {rel.name}: not asked of the "
                         "installed release", 0.0, "a deploy to a host that has it (its ServerArgs are asked)"))
    if rel.checked:
        out.append(Input("release rules", True, f"SGLang {rel.name}, read from its wheel"))
    else:
        band, between = (max(RELEASE_DRIFT_FLOOR_GIB, drift[0]), f"; {drift[1]}") if drift else (RELEASE_DRIFT_GIB, "")
        out.append(Input("release rules", False, f"SGLang {rel.name} not read: {rel.checked_as}'s rules{between}",
                         band, f"a reading of {rel.name}'s server_args (gpudeploy/memory/releases.py)"))
    if cal.preload_free_gib is not None:
        out.append(Input("free memory before load", cal.preload_band_gib == 0, cal.preload_source,
                         (1 - f) * cal.preload_band_gib, "the engine's own log line (Load weight begin)"))
    else:
        out.append(Input("free memory before load", False, f"GPU class: {gpu.name}", (1 - f) * p_band,
                         "NVML's reading at deploy or a measured run"))
    if s.speculative_algorithm is not None:
        measured_spec = measured_graphs and any(k in dict(cal.graph_scales) for k in ("verify_graphs", "draft_graphs"))
        # the release's own arithmetic (:mod:`.speculative`) for a known shape: the graph terms' error
        own = spec_read(rel) and "shape" not in model.assumed
        if measured_spec or own:
            out.append(Input("speculative graphs", True, "measured in a previous run" if measured_spec else
                             f"SGLang {rel.name}'s draft and verify graphs ({verify_tokens} verify tokens)"))
        else:
            why = ("the model's shape is guessed, and with it the draft's" if "shape" in model.assumed
                   else f"SGLang {rel.name}'s speculative graphs were not read")
            band = min(SPEC_GIB_PER_VERIFY_TOKEN * verify_tokens, SPEC_SHARE_OF_FREE * p)
            out.append(Input("speculative graphs", False, f"draft and verify graphs: {why} ({verify_tokens} "
                             "verify tokens)", band, "the model's config.json, or a measured run of these settings"))
    if model.multimodal:
        out.append(Input("vision tower", False, "image encoder activations and caches, not modelled",
                         MULTIMODAL_SHARE_OF_FREE * p, "a measured run that served images at peak load"))
    if not graphs_grounded:
        what = ", ".join(n for n, on in (("DP attention", s.enable_dp_attention),
                                         ("DeepEP", s.moe_a2a_backend != "none"),
                                         ("torch.compile", s.enable_torch_compile), ("LoRA", s.enable_lora)) if on)
        grounded_band = error_band(graphs_total, True)
        out.append(Input(f"graphs with {what}", False, "not covered by the device runs or public logs",
                         error_band(graphs_total, False) - grounded_band, "a measured run of these settings"))
    if dp_note and not model.attention_weight_bytes:
        out.append(Input("DP attention weights", False, "attention shape unknown: weights taken as split by TP",
                         0.0, "num_attention_heads (and MLA ranks) in model.facts"))
    return tuple(out)


# what each assumed input's band stands for, term by term: the release's own arithmetic on the guessed
# inputs (known once the inputs are), and what is not known
_SHAPE_TERMS = (("cuda_graphs", "decode graphs"), ("prefill_graphs", "prefill graphs"), ("activations", "activations"))
_SPEC_TERMS = (("verify_graphs", "verify graphs"), ("draft_graphs", "draft graphs"), ("draft_weights", "draft weights"),
               ("draft_kv", "draft KV"), ("spec_buffers", "draft buffers"))


def _per_term(inputs: tuple[Input, ...], br: dict[str, float], rel: Release) -> tuple[Input, ...]:
    """A guessed shape's inputs say which headroom terms are SGLang's own arithmetic on the guess, with
    their GiB, and which facts are unknown: a user sees what the band is made of, and what to read."""
    def terms(names: tuple[tuple[str, str], ...]) -> str:
        return ", ".join(f"{label} {br[k]:.2f}" for k, label in names if br.get(k, 0.0) >= 0.005)

    out = []
    for i in inputs:
        if i.grounded or i.band_gib <= 0:
            out.append(i)
            continue
        if i.name == "model shape" and terms(_SHAPE_TERMS):
            i = replace(i, source=f"{i.source}; known: SGLang {rel.name}'s own arithmetic on that guess gives "
                        f"{terms(_SHAPE_TERMS)} GiB; unknown: the model's real layers, hidden size, attention heads "
                        "and MoE sizes, which set each of them and the kernels' workspaces in capture")
        elif i.name == "speculative graphs" and terms(_SPEC_TERMS):
            i = replace(i, source=f"{i.source}; known: SGLang {rel.name}'s own arithmetic on the guessed draft gives "
                        f"{terms(_SPEC_TERMS)} GiB; unknown: the draft layer's real shape and what the target's "
                        "kernels allocate when verify batches are captured")
        out.append(i)
    return tuple(out)


def evaluate(cap: float, model: ModelFacts, s: EngineSettings, cal: Cal, rel: Release = R0523,
             gpu: GpuClass | None = None) -> Budget:
    """The outcome of one rank under the release's rules (no recommendation)."""
    gpu = gpu or gpu_class(cap)
    tp = s.tp_size
    chunk, bs_max = resolved_defaults(cap, s, rel)
    f = effective_fraction(cap, s, rel, model)
    if cal.preload_free_gib is not None:
        p, p_band = cal.preload_free_gib, cal.preload_band_gib
    else:
        p, p_band = gpu.preload_free(cap, tp)
    algo = s.speculative_algorithm
    spec = spec_of(s, model, rel)
    _steps, _topk, draft_tokens = spec
    has_draft = s.has_draft
    notes: list[str] = []
    draft_w = model.draft_bytes() / tp / GIB if has_draft else 0.0
    w, dp_note = _weights(model, s, rel, cal, draft_w)
    if dp_note:
        notes.append(dp_note)
    cell, draft_cell = _kv_cell(model, s, rel, has_draft)
    ctx = s.context_length or model.context_length
    per_req = model.state_bytes_per_request(max(1, tp // s.dp_size) if s.enable_dp_attention else tp,
                                            SSM_DTYPE_BYTES.get(s.mamba_ssm_dtype or ""))
    wanted = wanted_running(s)
    if wanted is not None and s.enable_dp_attention and s.dp_size > 1:
        # each attention-DP rank serves its share of the requests: its request pool, mamba slots and
        # captured batches are sized for max_running_requests // dp (0.5.10
        # model_runner_kv_cache_mixin.py:841-852, 0.5.23 mem_cache/kv_cache_configurator.py:3119-3131)
        wanted = max(1, wanted // s.dp_size)
    graphs_grounded = bool(cal.graph_scales) or not (
        s.enable_dp_attention or s.moe_a2a_backend != "none" or s.enable_torch_compile or s.enable_lora)
    backend = attention_backend(model, s, rel, gpu.hopper)
    per_graph_table = rel.per_graph_page_table and backend == "fa3"
    inputs = _inputs(model, s, rel, cal, gpu, f, p_band, w, p, 0.0, True, dp_note)
    refusal = ""                 # SGLang refuses these settings at start (set below, hybrid models)

    def result(verdict: str, reason: str, **kw: Any) -> Budget:
        base: dict[str, Any] = dict(
            verdict=verdict, capacity_gib=cap, preload_free_gib=p, weights_gib=w, fraction=f,
            fraction_is_default=s.mem_fraction_static is None, kv_pool_gib=0.0, kv_tokens=0,
            kv_bytes_per_token=cell, state_gib=0.0, state_slots=0, state_bytes_per_request=per_req,
            running_requests=0, headroom_needed_gib=0.0, headroom_breakdown={},
            headroom_available_gib=(1 - f) * p, cuda_graph_max_bs=0 if s.disable_cuda_graph else bs_max,
            chunked_prefill_size=chunk, reason=reason, release=rel.name,
            severity="refuse" if verdict in CERTAIN else "ok", notes=tuple(notes), inputs=inputs, gpu=gpu.name,
            lesson=cal.lesson)
        base.update(kw)
        if refusal and base["severity"] == "ok":
            # SGLang stops before sizing anything: whatever the memory says, it never starts
            base.update(severity="warn", reason=f"{base['reason']}; but {refusal}")
        return Budget(**base)

    def arithmetic(verdict: str, short: float, band: float, reason: str, **kw: Any) -> Budget:
        """A failure of plain arithmetic: certain, unless the free memory's band covers it."""
        if short <= band:
            return result("uncertain", f"{reason}; but the free memory before load is known only to "
                          f"+-{p_band:.2f} GiB ({gpu.name}), which covers it: NVML's reading at deploy decides",
                          severity="warn", **kw)
        return result(verdict, reason, **kw)

    if w >= p:
        return arithmetic("weights-do-not-fit", w - p, p_band,
                          f"weights need {w:.2f} GiB per rank at TP{tp} but only {p:.2f} GiB is free "
                          f"before loading on a {cap:.1f} GiB GPU")
    rest = f * p - w
    if rest <= 0:
        return arithmetic("kv-pool-empty", -rest, f * p_band,
                          f"mem_fraction_static {f:.3f} gives {f * p:.2f} GiB static memory but the weights "
                          f"take {w:.2f} GiB per rank: no room for the KV cache (needs > {w / p:.3f})",
                          kv_pool_gib=rest)

    state_gib = 0.0
    slots = 0
    served: int | None = None
    strategy = ""
    kv_pool = rest
    if model.kind == "hybrid" and per_req > 0:
        ms = mamba_state(rest, per_req, s, rel, wanted, draft_tokens if algo else 0, model.architecture)
        strategy = ms.strategy
        if ms.refused:
            notes.append(ms.refused)
            refusal = ms.refused
        state_gib, slots, served, kv_pool = ms.state_gib, max(ms.slots, 0), ms.served, ms.rest_gib
        asked = wanted or 1
        why = (f"the mamba state of {asked} running request(s) ({ms.strategy}, {ms.ratio} slot(s) per request"
               + (f", {draft_tokens} speculative states each" if algo else "") + f", {per_req / 2**20:.1f} MiB "
               f"per slot) takes {state_gib:.2f} of the {rest:.2f} GiB KV budget")
        fix = ("lower max_running_requests, drop extra_buffer (mamba_scheduler_strategy no_buffer) or "
               "set max_mamba_cache_size; a higher mem_fraction_static only helps if the state fits at all")
        if ms.failure == "kv-pool-empty" and s.max_mamba_cache_size is not None and not algo:
            # the slots were asked for: the state is fixed, and only the fraction (or fewer slots) helps
            floor = (w + state_gib) / p
            return result("kv-pool-empty", f"max_mamba_cache_size {s.max_mamba_cache_size} fixes the mamba state at "
                          f"{state_gib:.2f} GiB ({per_req / 2**20:.1f} MiB a slot), more than the {rest:.2f} GiB KV "
                          f"budget that mem_fraction_static {f:.3f} leaves after {w:.2f} GiB of weights: SGLang says "
                          f"\"Not enough memory. Please try to increase --mem-fraction-static\", and it is right: "
                          f"raise it above {floor:.3f}, or lower max_mamba_cache_size",
                          kv_pool_gib=kv_pool, state_gib=state_gib, state_slots=slots, mamba_strategy=strategy)
        if ms.failure == "kv-pool-empty":
            return result("kv-pool-empty", f"{why}, leaving nothing for the KV cache: SGLang says \"Not enough "
                          f"memory. Please try to increase --mem-fraction-static\", but the state is the cause: {fix}",
                          kv_pool_gib=kv_pool, state_gib=state_gib, state_slots=slots, mamba_strategy=strategy)
        if ms.failure == "mamba-state-does-not-fit":
            return result("mamba-state-does-not-fit", f"{why}, and no request fits: {fix}",
                          kv_pool_gib=kv_pool, state_gib=state_gib, state_slots=slots, mamba_strategy=strategy)
        if s.max_running_requests is not None and ms.served < s.max_running_requests:
            notes.append(f"SGLang caps max_running_requests at {ms.served} (mamba state for {ms.slots} slots, "
                         f"{ms.ratio} per request, {ms.strategy}); asked for {s.max_running_requests}")

    tokens = int(kv_pool * GIB // cell) if cell else 0
    if s.max_total_tokens is not None:
        tokens = min(tokens, s.max_total_tokens)
    if tokens < 1:
        return result("kv-pool-empty", f"KV pool of {kv_pool:.2f} GiB holds no tokens",
                      kv_pool_gib=kv_pool, state_gib=state_gib, state_slots=slots, mamba_strategy=strategy)

    # running requests as SGLang resolves them (max_num_reqs: the request-to-token table's rows)
    if wanted is not None:
        running = min(wanted, tokens // 2) if tokens > 1 else 1
    else:
        running = min(max(min(int(tokens / ctx * 512), 4096), 2048), tokens // 2)
    if served is not None:
        running = min(running, served)
    running = max(running, 1)
    req_to_token = running * (ctx + 4 + draft_tokens) * 4 / GIB
    available = (1 - f) * p

    common_pool = dict(kv_pool_gib=kv_pool, kv_tokens=tokens, state_gib=state_gib, state_slots=slots,
                       running_requests=running, mamba_strategy=strategy)
    if req_to_token > available:
        return arithmetic("memory-pool-does-not-fit", req_to_token - available, (1 - f) * p_band,
                          f"the request-to-token table ({running} requests x {ctx + 4 + draft_tokens} tokens x 4 B "
                          f"= {req_to_token:.2f} GiB) is allocated with the KV pool and does not fit in the "
                          f"{available:.2f} GiB headroom: lower context_length or max_running_requests",
                          headroom_needed_gib=req_to_token, headroom_breakdown={"req_to_token": req_to_token},
                          **common_pool)

    families = _graph_families(model, s, rel, cap, bs_max, running, ctx, chunk, spec, tp, per_graph_table, backend)
    graph_gib = {k: cal.scale(k) * v for k, v in _shared_pool(families).items()}
    if s.enable_dp_attention and "cuda_graphs" in graph_gib:
        # not measured here: SGLang's own reserve for what DP attention's padded buffers take
        # ("DP attention uses much more memory for large cuda graph max bs", server_args)
        extra = bs_max * s.dp_size * (3 + (1.5 if bs_max > 300 else 0)) / 1024
        graph_gib["cuda_graphs"] += cal.scale("cuda_graphs") * extra
    br: dict[str, float] = dict(graph_gib)
    if "prefill_graphs" in families and model.kind == "mla":
        br["prefill_graphs"] += MLA_PREFILL_GRAPH_GIB
    # DP attention splits each prefill chunk over the DP ranks (_handle_data_parallelism, 0.5.3 on;
    # earlier releases divide the chunk itself, :func:`.defaults.resolved_defaults`)
    act_chunk = chunk // s.dp_size if (s.enable_dp_attention and rel.fraction_rule == "formula") else chunk
    act = activations_gib(model, tp, act_chunk)
    prefill_pool = families["prefill_graphs"].pool if "prefill_graphs" in families else 0.0
    run_act = max(0.0, act - prefill_pool)      # prefill graphs replay out of the shared pool
    transient = max((g.peak_extra * cal.scale(k) for k, g in families.items()), default=0.0)
    br["activations"] = max(run_act, transient)
    if algo is not None:
        # the draft runners' own buffers (:func:`.speculative.fixed_buffer_bytes`); masks and kv
        # indices are in the graph families
        spec_bs = max(capture_batch_sizes(bs_max, True, rel, cap, pool_size=running), default=running)
        br["spec_buffers"] = fixed_buffer_bytes(model, spec_bs, spec) / GIB
    if has_draft and not rel.draft_weights_static:
        br["draft_weights"] = draft_w
        br["draft_kv"] = tokens * draft_cell / GIB
    br["req_to_token"] = req_to_token
    if s.moe_a2a_backend.lower().startswith("deepep"):
        br["deepep_buffers"] = DEEPEP_GIB
    for term, gib in cal.extra_headroom:
        br[term] = br.get(term, 0.0) + gib
    br["misc"] = MISC_GIB
    needed = sum(br.values())
    graphs_total = sum(graph_gib.values())
    comm = sum(g.comm for g in families.values()) * (cal.scale("cuda_graphs") if "cuda_graphs" in families else 1.0)
    # a logged graph figure leaves only the noise between two runs of the same settings
    graph_band = (max(0.25, 0.1 * graphs_total) if cal.graph_measured
                  else error_band(graphs_total, True, comm))
    rest_band = ACTIVATION_REL_ERROR * br["activations"] + REL_ERROR * br.get("spec_buffers", 0.0)
    verify = families.get("verify_graphs")
    verify_tokens = (max(capture_batch_sizes(bs_max, True, rel, cap, pool_size=running), default=0) * draft_tokens
                     if verify is not None else (draft_tokens * running if algo else 0))
    drift = None
    above = checked_above(rel)
    if not rel.checked and above is not None:
        # an unread release between two read ones: its band is how far their arithmetic moves the
        # headroom need for these very settings (the release below's rules are this one's)
        other = evaluate(cap, model, s, cal, above, gpu)
        if other.headroom_breakdown:
            drift = (abs(other.headroom_needed_gib - needed),
                     f"{above.name}'s rules need {other.headroom_needed_gib:.2f} GiB of headroom here")
    inputs = _per_term(_inputs(model, s, rel, cal, gpu, f, p_band, w, p, graphs_total, graphs_grounded, dp_note,
                               verify_tokens, drift), br, rel)
    guessed = sum(i.band_gib for i in assumed(inputs))
    # a floor a failed run proved replaces part of what the guesses allowed for
    guessed = max(0.0, guessed - cal.learned_gib)
    band = graph_band + rest_band + guessed
    wide = guessed >= max(WIDE_GIB, graph_band + rest_band)
    # what a recommendation leaves spare: the whole band, less the ungrounded graph share (doubling
    # the graph term for DP attention would recommend settings nobody runs; it only warns)
    ungrounded = sum(i.band_gib for i in inputs if i.name.startswith("graphs with"))
    spare = band - ungrounded
    detail: dict[str, Any] = {k: g.to_json() for k, g in families.items()}
    detail["scale_from_measurement"] = {k: _r(v) for k, v in cal.graph_scales}
    detail["attention_backend"] = backend
    # per term: what is the release's own arithmetic with its measured error, what is assumed
    band_terms = {"CUDA graphs (measured error of the terms)": graph_band,
                  "activations and speculative buffers (measured error)": rest_band}
    band_terms.update({f"{i.name} (assumed)": i.band_gib for i in assumed(inputs) if i.band_gib > 0})
    if cal.learned_gib and guessed < sum(i.band_gib for i in assumed(inputs)):
        band_terms["a failed run's proven floor (replaces assumed GiB)"] = -min(
            cal.learned_gib, sum(i.band_gib for i in assumed(inputs)))
    common = dict(headroom_needed_gib=needed, headroom_breakdown=br, headroom_available_gib=available,
                  error_band_gib=band, spare_wanted_gib=spare, graphs=detail, notes=tuple(notes), inputs=inputs,
                  band_terms=band_terms, **common_pool)
    margin = available - needed
    what = (f"CUDA graphs {graphs_total:.2f} GiB (decode bs up to {bs_max}"
            + (f", prefill up to {max(prefill_graph_sizes(prefill_max_tokens(model, s, chunk)), default=0)} tokens"
               if "prefill_graphs" in families else "") + ")")
    unknown = describe(inputs)
    if margin < 0:
        head = (f"headroom (1 - {f:.3f}) x {p:.2f} = {available:.2f} GiB is {-margin:.2f} GiB short of the "
                f"{needed:.2f} GiB needed ({what}, req-to-token {br['req_to_token']:.2f}, "
                f"activations {br['activations']:.2f}); the estimate is good to +-{band:.2f} GiB")
        if graphs_grounded and -margin > band:
            return result("oom-in-graph-capture", head, severity="refuse", **common)
        if wide:
            return result("uncertain", f"{head}, since it assumes: {unknown}", severity="warn", **common)
        return result("oom-in-graph-capture", head, severity="warn", **common)
    fits = (f"weights {w:.2f} + KV {kv_pool:.2f} GiB ({tokens} tokens) fit in {f:.3f} x {p:.2f} GiB; "
            f"headroom {available:.2f} GiB covers {needed:.2f} GiB ({what}) with {margin:.2f} GiB spare")
    if margin < band:
        if wide:
            return result("uncertain", f"{fits}, inside the +-{band:.2f} GiB error band: it assumes {unknown}",
                          severity="warn", **common)
        return result("fits", f"{fits}, inside the +-{band:.2f} GiB error band", severity="warn", **common)
    return result("fits", fits, severity="ok", **common)


# the measured error of the terms, for callers that state it
TERM_ERRORS = {"graphs": REL_ERROR, "comm": COMM_REL_ERROR, "activations": ACTIVATION_REL_ERROR}
