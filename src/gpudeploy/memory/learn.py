"""What one run's log teaches the next plan: measured figures replace estimates, and a failure's
shortfall, by the phase it happened in, becomes a floor the recommendation must cover.

* measured "Load weight begin/end" and graph "end ... mem usage" lines replace P, W and the graph
  terms (a family the run did not capture keeps its estimate);
* an OOM in graph capture (or while the 0.5.9/0.5.10 draft worker loads and captures, after the
  target's graphs) proves the headroom need was at least what the headroom held, less what was still
  free, plus what the failing allocation asked for: the graph terms are scaled up to that floor;
* an OOM in warmup or while serving (the graphs were captured) is the activations': the shortfall
  is added to them;
* an OOM while the KV pool and request table were allocated means less was free than the log's own
  "avail mem" (another process, WSL2's hidden driver memory): the next plan takes that much less as free.

The floor is a lower bound, not a measurement: the estimate's band stays, less what the floor
already explains of the assumed inputs (:attr:`.budget.Cal.learned_gib`).
"""

from __future__ import annotations

from dataclasses import replace

from .budget import Cal, evaluate
from .gpuclass import GpuClass
from .logparse import Measured
from .modelfacts import ModelFacts
from .releases import Release
from .settings import EngineSettings

GRAPH_FAMILIES = ("cuda_graphs", "verify_graphs", "draft_graphs", "prefill_graphs")
# the family an OOM's phase names ("graph-capture:verify")
PHASE_FAMILY = {"decode": "cuda_graphs", "verify": "verify_graphs", "draft": "draft_graphs",
                "prefill": "prefill_graphs"}
MEASURED_FAMILY = {"graph_gib": ("cuda_graphs", "verify_graphs"), "draft_graph_gib": ("draft_graphs",),
                   "prefill_graph_gib": ("prefill_graphs",)}
PHASE_WORDS = {
    "loading-weights": "loading the weights",
    "weights-loaded": "allocating the KV pool", "kv-allocated": "allocating the KV pool",
    "memory-pool": "setting up the CUDA graph runners",
    "graph-capture": "capturing CUDA graphs",
    "graph-capture:decode": "capturing the decode CUDA graphs",
    "graph-capture:verify": "capturing the target-verify CUDA graphs",
    "graph-capture:draft": "capturing the draft CUDA graphs",
    "graph-capture:prefill": "capturing the prefill CUDA graphs",
    "draft": "building the draft model (its weights, KV and graphs)",
    "graphs-captured": "in warmup", "warmup": "in warmup",
    "ready": "while serving",
}


def phase_words(phase: str | None) -> str:
    return PHASE_WORDS.get(phase or "", PHASE_WORDS.get((phase or "").split(":")[0], "at start"))


def _settings_words(s: EngineSettings) -> str:
    parts = [f"mem_fraction_static {s.mem_fraction_static}" if s.mem_fraction_static is not None
             else "SGLang's default fraction"]
    if s.cuda_graph_max_bs is not None:
        parts.append(f"cuda_graph_max_bs {s.cuda_graph_max_bs}")
    if s.speculative_algorithm:
        parts.append(s.speculative_algorithm)
    return ", ".join(parts)


def calibration(cap: float, model: ModelFacts, s: EngineSettings, measured: Measured | None, rel: Release,
                gpu: GpuClass | None = None, base: Cal | None = None) -> Cal:
    """The figures ``measured`` (a run under settings ``s``) carries into every later evaluation."""
    cal = base or Cal()
    if measured is not None:
        p = measured.preload_free_gib
        if p is None and measured.after_load_avail_gib is not None and measured.weights_gib is not None:
            p = measured.after_load_avail_gib + measured.weights_gib
        if p is not None:
            cal = replace(cal, preload_free_gib=p, preload_source="logged by a previous run (Load weight begin)",
                          preload_band_gib=0.0)
        if measured.weights_gib is not None:
            cal = replace(cal, weights_gib=measured.weights_gib)
    predicted = evaluate(cap, model, s, cal, rel, gpu)
    br = predicted.headroom_breakdown
    if measured is None:
        return cal
    scales: dict[str, float] = {}
    logged = {"graph_gib": measured.graph_gib, "draft_graph_gib": measured.draft_graph_gib,
              "prefill_graph_gib": measured.prefill_graph_gib}
    if not logged["graph_gib"] and model.graph_gib:
        logged["graph_gib"] = model.graph_gib
    for key, families in MEASURED_FAMILY.items():
        got = logged[key]
        for fam in families:
            if got and br.get(fam, 0.0) > 0:
                scales[fam] = got / br[fam]
    failure = measured.failure
    if scales and failure != "oom-in-graph-capture":
        cal = replace(cal, graph_scales=tuple(sorted(scales.items())), graph_measured=True)
        if failure not in ("oom-at-warmup", "oom-while-serving", "memory-pool-does-not-fit"):
            return cal
        predicted = evaluate(cap, model, s, cal, rel, gpu)
    short = measured.shortfall_gib
    tried = f"it asked for {measured.oom_tried_gib:.2f} GiB with {measured.oom_free_gib or 0:.2f} GiB free" \
        if measured.oom_tried_gib is not None else "no allocation figures in its log"
    where = phase_words(measured.oom_phase or ("graph-capture" if failure == "oom-in-graph-capture" else None))
    graphs = sum(predicted.headroom_breakdown.get(f, 0.0) for f in GRAPH_FAMILIES)
    br = predicted.headroom_breakdown
    available = predicted.headroom_available_gib
    family = PHASE_FAMILY.get((measured.oom_phase or "").partition(":")[2], "")
    if failure == "oom-in-graph-capture" and measured.graph_floor_gib is not None and br.get(family, 0.0) > 0:
        # the floor is what the family under capture took from its own "begin" line to the OOM: it
        # scales that family; the families captured after it (a draft's, after the target's) were
        # never reached and keep their estimate
        own = br[family]
        others = predicted.headroom_needed_gib - own
        scale = max(1.0, measured.graph_floor_gib / own, (available * 1.01 - others) / own)
        need = others + scale * own
        lesson = (f"the last run ({_settings_words(s)}) died {where}: {tried}; that capture took at least "
                  f"{measured.graph_floor_gib:.2f} GiB, so it needed at least {need:.2f} GiB of headroom where "
                  f"it had {available:.2f} GiB ({max(0.0, need - available):.2f} GiB short)")
        return replace(cal, graph_scales=((family, scale),), lesson=lesson,
                       learned_gib=max(0.0, need - predicted.headroom_needed_gib))
    if failure == "oom-in-graph-capture" and graphs > 0:
        # whatever the figures, dying in capture proves the need exceeded that headroom
        others = predicted.headroom_needed_gib - graphs
        exceeded = (available * 1.01 - others) / graphs
        if measured.graph_floor_gib is not None:
            floor_graphs = max(measured.graph_floor_gib, graphs)
            scale = max(1.0, floor_graphs / graphs, exceeded)
        else:
            # no begin line: the headroom ran out, so the need was at least what it held (less
            # what was still free) plus what the failing allocation asked for
            held = available
            if measured.pool_end_avail_gib is not None:
                # "Memory pool end" is logged after the req-to-token table is allocated
                held = measured.pool_end_avail_gib + br.get("req_to_token", 0.0)
            floor = held - (measured.oom_free_gib or 0.0) + (measured.oom_tried_gib or 0.0)
            scale = max(1.0, (floor - others) / graphs, exceeded)
        need = others + scale * graphs
        lesson = (f"the last run ({_settings_words(s)}) died {where}: {tried}, so it needed at least "
                  f"{need:.2f} GiB of headroom where it had {available:.2f} GiB "
                  f"({max(0.0, need - available):.2f} GiB short)")
        # a floor, not a measurement: the capture had more to go; it scales the families that run
        # captured, not the ones it did not
        return replace(cal, graph_scales=tuple((f, scale) for f in GRAPH_FAMILIES if br.get(f, 0.0) > 0),
                       lesson=lesson, learned_gib=max(0.0, need - predicted.headroom_needed_gib))
    if failure in ("oom-at-warmup", "oom-while-serving"):
        extra = max(short or 0.0, available * 1.01 - predicted.headroom_needed_gib + (short or 0.0))
        lesson = (f"the last run ({_settings_words(s)}) ran out of memory {where}: {tried}: the activations "
                  f"need {extra:.2f} GiB more than estimated")
        return replace(cal, extra_headroom=(("activations", extra),), lesson=lesson, learned_gib=extra)
    if failure == "memory-pool-does-not-fit" and cal.preload_free_gib is not None:
        less = short or 0.0
        lesson = (f"the last run ({_settings_words(s)}) ran out of memory {where}: {tried}: {less:.2f} GiB less "
                  "was free than its own log said (another process, or a driver that hides memory, as WSL2 does)")
        return replace(cal, preload_free_gib=cal.preload_free_gib - less, lesson=lesson)
    if failure is not None:
        lesson = f"the last run ({_settings_words(s)}) failed {where} ({failure}); {tried}"
        return replace(cal, lesson=lesson)
    return cal
