"""Memory preflight: will an SGLang server boot on this GPU, how sure is that, and what would boot.

Pure (no network, no I/O). :mod:`.memmodel` holds the arithmetic and its sources (per release:
:mod:`.sglang_release`; the CUDA-graph term, measured on an H200: :mod:`.graphmem`). This module
adds what a previous run measured (:mod:`.calibrate`) and searches for the smallest change that
fits with the estimate's error band to spare: the largest ``--mem-fraction-static``, then smaller
CUDA-graph batch caps, then without speculative decoding, then more GPUs.

Measured figures replace estimates: the free memory before loading, the weights, and the graph
memory, either as logged ("Capture ... graph end ... mem usage") or as the floor an OOM in graph
capture proves ("Capture cuda graph begin ... avail mem=A", then "Tried to allocate X ... Y free":
the graphs needed at least A - Y + X).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpudeploy.errors import InputError, Problem

from .budget import (
    CERTAIN,
    SEVERITIES,
    SPEC_STEP_CAPS,
    VERDICTS,
    Budget,
    Cal,
    capture_batch_sizes,
    default_mem_fraction,
    evaluate,
    mamba_slots_per_request,
    preload_free_gib,
    resolved_defaults,
)
from .logparse import Measured
from .modelfacts import ModelFacts
from .releases import Release, release_rules
from .settings import EngineSettings

__all__ = ["CERTAIN", "SEVERITIES", "VERDICTS", "Budget", "EngineSettings", "Suggestion", "budget",
           "capture_batch_sizes", "default_mem_fraction", "mamba_slots_per_request", "preload_free_gib",
           "recommendation_flags", "resolved_defaults", "suggest"]

MIN_USEFUL_GRAPH_BS = 16          # below this, turning speculative decoding off is preferred
MIN_KV_TOKENS = 4096              # a recommendation must leave at least this many KV tokens


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
                "headroom_spare_gib": round(self.headroom_spare_gib, 3), "speculative": self.speculative}


def _ok(b: Budget, min_kv_tokens: int) -> bool:
    """Fits with the measured error band to spare: what a recommendation must reach."""
    return b.verdict == "fits" and b.margin_gib >= b.spare_wanted_gib and b.kv_tokens >= min_kv_tokens


def _largest_fraction(cap: float, model: ModelFacts, s: EngineSettings, cal: Cal, rel: Release,
                      min_kv: int) -> tuple[EngineSettings, Budget] | None:
    """Largest fraction (0.01 steps) that fits with the band to spare."""
    for hundredths in range(95, 29, -1):
        cand = replace(s, mem_fraction_static=hundredths / 100)
        b = evaluate(cap, model, cand, cal, rel)
        if _ok(b, min_kv):
            return cand, b
    return None


def _search(cap: float, model: ModelFacts, s: EngineSettings, cal: Cal, rel: Release,
            min_kv: int) -> list[tuple[EngineSettings, Budget]]:
    """Fitting settings: for each (speculative on/off, graph bs cap), the largest safe fraction."""
    found: list[tuple[EngineSettings, Budget]] = []
    spec_options = [s] + ([replace(s, speculative_algorithm=None, speculative_num_steps=None,
                                   speculative_eagle_topk=None, speculative_num_draft_tokens=None)]
                          if s.speculative_algorithm is not None else [])
    for base in spec_options:
        _, bs_default = resolved_defaults(cap, base, rel)
        caps: list[int | None] = [base.cuda_graph_max_bs]
        caps += [c for c in SPEC_STEP_CAPS if c < bs_default]
        if base.disable_cuda_graph:
            caps = [base.cuda_graph_max_bs]
        for bs in caps:
            hit = _largest_fraction(cap, model, replace(base, cuda_graph_max_bs=bs), cal, rel, min_kv)
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


def _recommend(cap: float, model: ModelFacts, s: EngineSettings, cal: Cal, rel: Release,
               verdict: str) -> tuple[dict[str, Any], int | None, str]:
    min_kv = _min_kv(model, s)
    if verdict != "weights-do-not-fit":
        found = _search(cap, model, s, cal, rel, min_kv)
        if found:
            new, b = found[0]
            return _changes(s, new), None, f"{b.kv_tokens} KV tokens, {b.running_requests} running requests"
    scale_only = replace(cal, preload_free_gib=None, weights_gib=None)
    tp = s.tp_size
    while tp < 64:
        tp *= 2
        found = _search(cap, model, replace(s, tp_size=tp), scale_only, rel, min_kv)
        if found:
            new, b = found[0]
            return _changes(s, new), tp, (f"needs more GPUs: TP{tp} ({b.kv_tokens} KV tokens at "
                                          f"mem_fraction_static {new.mem_fraction_static})")
    return {}, None, "no setting fits on this GPU type up to TP64"


GRAPH_FAMILIES = ("cuda_graphs", "verify_graphs", "draft_graphs", "prefill_graphs")
MEASURED_FAMILY = {"graph_gib": ("cuda_graphs", "verify_graphs"), "draft_graph_gib": ("draft_graphs",),
                   "prefill_graph_gib": ("prefill_graphs",)}


def _calibration(cap: float, model: ModelFacts, s: EngineSettings, measured: Measured | None,
                 rel: Release) -> Cal:
    cal = Cal()
    if measured is not None:
        cal = Cal(preload_free_gib=measured.preload_free_gib, weights_gib=measured.weights_gib)
        if (cal.preload_free_gib is None and measured.after_load_avail_gib is not None
                and measured.weights_gib is not None):
            cal = replace(cal, preload_free_gib=measured.after_load_avail_gib + measured.weights_gib)
    predicted = evaluate(cap, model, s, cal, rel)
    br = predicted.headroom_breakdown
    scales: dict[str, float] = {}
    logged = {"graph_gib": measured.graph_gib if measured is not None else None,
              "draft_graph_gib": measured.draft_graph_gib if measured is not None else None,
              "prefill_graph_gib": measured.prefill_graph_gib if measured is not None else None}
    if not logged["graph_gib"] and model.graph_gib:
        logged["graph_gib"] = model.graph_gib
    for key, families in MEASURED_FAMILY.items():
        got = logged[key]
        for fam in families:
            if got and br.get(fam, 0.0) > 0:
                scales[fam] = got / br[fam]
    if scales:
        return replace(cal, graph_scales=tuple(sorted(scales.items())), graph_measured=True)
    graphs = sum(br.get(f, 0.0) for f in GRAPH_FAMILIES)
    if measured is not None and graphs > 0 and measured.failure == "oom-in-graph-capture":
        # whatever the figures, dying in capture proves the need exceeded that headroom
        others = predicted.headroom_needed_gib - graphs
        exceeded = (predicted.headroom_available_gib * 1.01 - others) / graphs
        if measured.graph_floor_gib is not None:
            scale = max(1.0, measured.graph_floor_gib / graphs, exceeded)
        else:
            # no begin line: the headroom ran out, so the need was at least what it held (less
            # what was still free) plus what the failing allocation asked for
            available = predicted.headroom_available_gib
            if measured.pool_end_avail_gib is not None:
                # "Memory pool end" is logged after the req-to-token table is allocated
                available = measured.pool_end_avail_gib + br.get("req_to_token", 0.0)
            floor = available - (measured.oom_free_gib or 0.0) + (measured.oom_tried_gib or 0.0)
            scale = max(1.0, (floor - others) / graphs, exceeded)
        # a floor, not a measurement: the capture had more to go, so the band stays as it was;
        # it scales the families that run captured, not the ones it did not
        return replace(cal, graph_scales=tuple((f, scale) for f in GRAPH_FAMILIES if br.get(f, 0.0) > 0))
    return cal


def budget(gpu_capacity_gib: float, model: ModelFacts, settings: EngineSettings,
           measured: Measured | None = None, measured_settings: EngineSettings | None = None,
           release: str | Release | None = None) -> Budget:
    """Predict the startup outcome of one rank and, unless it fits with room to spare, what would.

    ``release`` is the host's SGLang version (or a :class:`Release`); ``measured`` is what a
    previous run of this model on this GPU logged, under ``measured_settings`` (default:
    ``settings``). Measured preload memory and weights replace the estimates; measured graph
    memory (or an OOM's floor of it) rescales the graph estimate for every setting.
    """
    if gpu_capacity_gib <= 0 or not math.isfinite(gpu_capacity_gib):
        raise InputError([Problem(message=f"GPU capacity must be positive, got {gpu_capacity_gib}",
                                  key="gpu_capacity_gib")])
    rel = release if isinstance(release, Release) else release_rules(release)
    cal = _calibration(gpu_capacity_gib, model, measured_settings or settings, measured, rel)
    b = evaluate(gpu_capacity_gib, model, settings, cal, rel)
    if measured is not None:
        estimate = evaluate(gpu_capacity_gib, model, settings, Cal(), rel)
        cmp: dict[str, Any] = {}
        for name, pred in (("preload_free_gib", estimate.preload_free_gib), ("weights_gib", estimate.weights_gib),
                           ("kv_tokens", estimate.kv_tokens),
                           ("graph_gib", estimate.headroom_breakdown.get("cuda_graphs", 0.0)
                            + estimate.headroom_breakdown.get("verify_graphs", 0.0))):
            got = getattr(measured, name)
            if got is not None:
                cmp[name] = {"measured": got, "predicted": round(float(pred), 3)}
        if measured.failure:
            cmp["failure"] = measured.failure
        cmp["graph_scale"] = {k: round(v, 3) for k, v in cal.graph_scales}
        b = replace(b, measured=cmp)
    if b.verdict == "fits" and b.severity == "ok":
        return b
    rec, more, msg = _recommend(gpu_capacity_gib, model, settings, cal, rel, b.verdict)
    return replace(b, recommended=rec, needs_more_gpus=more, message=msg)


def suggest(gpu_capacity_gib: float, model: ModelFacts, settings: EngineSettings,
            measured: Measured | None = None, measured_settings: EngineSettings | None = None,
            limit: int = 8, release: str | Release | None = None) -> list[Suggestion]:
    """Settings that fit, best first: speculative kept, larger graph batch, more KV tokens."""
    rel = release if isinstance(release, Release) else release_rules(release)
    cal = _calibration(gpu_capacity_gib, model, measured_settings or settings, measured, rel)
    out: list[Suggestion] = []
    for new, b in _search(gpu_capacity_gib, model, settings, cal, rel, _min_kv(model, settings)):
        out.append(Suggestion(settings=_changes(settings, new), kv_tokens=b.kv_tokens,
                              running_requests=b.running_requests, headroom_spare_gib=b.margin_gib,
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
