"""Memory preflight: will an SGLang server boot on this GPU, how sure is that, and what would.

Pure (no network, no I/O). :mod:`.budget` holds the arithmetic and the verdict, :mod:`.learn` what a
previous run teaches. This module searches for the smallest change that fits with the estimate's
whole error band to spare, over what an operator can change: ``--mem-fraction-static``, the decode
graph batch cap, speculative decoding (kept, or off), and for hybrid models the mamba strategy,
``--max-running-requests`` and ``--max-mamba-cache-size``; then more GPUs (TP). The best keeps
speculative decoding and a useful graph batch, serves the most of the requests asked for (hybrid
models), then holds the most KV tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..errors import InputError, Problem
from .asked import AskedDefaults, filled
from .budget import (
    CERTAIN,
    SEVERITIES,
    SPEC_STEP_CAPS,
    VERDICTS,
    Budget,
    Cal,
    evaluate,
)
from .defaults import capture_batch_sizes, default_mem_fraction, resolved_defaults, wanted_running
from .gpuclass import GpuClass, gpu_class, preload_from_nvml
from .hybrid import slots_per_request
from .learn import calibration
from .logparse import Measured
from .modelfacts import ModelFacts
from .releases import Release, release_rules
from .settings import EngineSettings

__all__ = ["CERTAIN", "SEVERITIES", "VERDICTS", "Budget", "EngineSettings", "Suggestion", "budget",
           "capture_batch_sizes", "default_mem_fraction", "recommendation_flags", "resolved_defaults", "suggest"]

MEMORY_FAILURES = ("oom-in-graph-capture", "kv-pool-empty", "weights-do-not-fit", "mamba-state-does-not-fit",
                   "memory-pool-does-not-fit", "oom-at-warmup", "oom-while-serving")
MIN_USEFUL_GRAPH_BS = 16          # below this, turning speculative decoding off is preferred
MIN_KV_TOKENS = 4096              # a recommendation must leave at least this many KV tokens
RUNNING_STEPS = (1024, 512, 384, 256, 192, 128, 96, 64, 48, 32, 24, 16, 8)
SPEC_KEYS = ("speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
             "speculative_num_draft_tokens")


@dataclass(frozen=True)
class Suggestion:
    """One setting combination that fits, with what it buys."""

    settings: dict[str, Any]          # canonical name -> value, to merge into the role (None: drop it)
    kv_tokens: int
    running_requests: int
    headroom_spare_gib: float
    speculative: bool

    def to_json(self) -> dict[str, Any]:
        return {"settings": dict(self.settings), "kv_tokens": self.kv_tokens,
                "running_requests": self.running_requests,
                "headroom_spare_gib": round(self.headroom_spare_gib, 3), "speculative": self.speculative}


def _ok(b: Budget, min_kv_tokens: int) -> bool:
    """Fits with the band to spare: what a recommendation must reach."""
    return (b.verdict == "fits" and b.severity == "ok" and b.margin_gib >= b.spare_wanted_gib
            and b.kv_tokens >= min_kv_tokens)


@dataclass(frozen=True)
class _Ctx:
    cap: float
    model: ModelFacts
    cal: Cal
    rel: Release
    gpu: GpuClass
    min_kv: int
    running_matters: bool = False     # the verdict is about the request-to-token table

    def eval(self, s: EngineSettings) -> Budget:
        return evaluate(self.cap, self.model, s, self.cal, self.rel, self.gpu)


def _largest_fraction(ctx: _Ctx, s: EngineSettings) -> tuple[EngineSettings, Budget] | None:
    """Largest fraction (0.01 steps) that fits with the band to spare."""
    for hundredths in range(95, 29, -1):
        cand = replace(s, mem_fraction_static=hundredths / 100)
        b = ctx.eval(cand)
        if _ok(b, ctx.min_kv):
            return cand, b
        if b.verdict in ("kv-pool-empty", "weights-do-not-fit") and b.severity == "refuse":
            return None                   # a lower fraction only leaves less for the KV cache
    return None


def _spec_off(s: EngineSettings) -> EngineSettings:
    return replace(s, speculative_algorithm=None, speculative_num_steps=None, speculative_eagle_topk=None,
                   speculative_num_draft_tokens=None)


def _bases(ctx: _Ctx, s: EngineSettings) -> Iterator[EngineSettings]:
    """The settings to try besides the fraction and graph cap: speculative on/off, and for hybrid
    models every mamba strategy, a lower max_running_requests and max_mamba_cache_size."""
    specs = [s] + ([_spec_off(s)] if s.speculative_algorithm is not None else [])
    if ctx.model.kind != "hybrid":
        yield from specs
        if ctx.running_matters:
            # the request-to-token table (requests x context) is what does not fit: fewer requests
            asked = wanted_running(s) or 4096
            for spec in specs:
                yield from (replace(spec, max_running_requests=r) for r in RUNNING_STEPS if r < asked)
        return
    strategies = ["no_buffer", "extra_buffer"] + (["extra_buffer_lazy"] if ctx.rel.lazy_strategy else [])
    if s.mamba_scheduler_strategy not in strategies:
        strategies.insert(0, s.mamba_scheduler_strategy)
    else:
        strategies.remove(s.mamba_scheduler_strategy)
        strategies.insert(0, s.mamba_scheduler_strategy)
    asked = wanted_running(s) or 4096
    runs = [s.max_running_requests] + [r for r in RUNNING_STEPS if r < asked]
    for spec in specs:
        for strat in strategies:
            for run in runs:
                base = replace(spec, mamba_scheduler_strategy=strat, max_running_requests=run)
                yield base
                if run is not None and s.max_mamba_cache_size is None:
                    # slots for exactly the requests asked for, instead of SGLang's share of the pool
                    ratio = slots_per_request(base, ctx.rel, ctx.model.architecture)
                    yield replace(base, max_mamba_cache_size=run * ratio)


def _caps(ctx: _Ctx, base: EngineSettings) -> list[int | None]:
    """The graph caps worth trying: each below what is captured now (the request pool caps it too)."""
    if base.disable_cuda_graph:
        return [base.cuda_graph_max_bs]
    _, bs_default = resolved_defaults(ctx.cap, base, ctx.rel)
    captured = min(bs_default, wanted_running(base) or bs_default)
    return [base.cuda_graph_max_bs] + [c for c in SPEC_STEP_CAPS if c < captured]


def _search(ctx: _Ctx, s: EngineSettings, *, every_cap: bool = False) -> list[tuple[EngineSettings, Budget]]:
    """Fitting settings: for each base (speculative, mamba), the largest graph cap with the largest safe
    fraction (``every_cap``: each graph cap's, for ``suggest``)."""
    found: list[tuple[EngineSettings, Budget]] = []
    hybrid = ctx.model.kind == "hybrid"
    best_served: dict[tuple[str | None, str], int] = {}
    for base in _bases(ctx, s):
        key = (base.speculative_algorithm, base.mamba_scheduler_strategy)
        if hybrid and key in best_served and (base.max_running_requests or 0) < best_served[key]:
            continue                      # a larger running count of this kind already fits
        for bs in _caps(ctx, base):
            hit = _largest_fraction(ctx, replace(base, cuda_graph_max_bs=bs))
            if hit is not None:
                found.append(hit)
                if (hit[1].cuda_graph_max_bs or 10**6) >= MIN_USEFUL_GRAPH_BS:
                    # fewer running requests of this kind can only rank lower
                    best_served[key] = max(best_served.get(key, 0), hit[1].running_requests)
                if not every_cap:
                    break
    spec_on = s.speculative_algorithm is not None
    asked = wanted_running(s) or 0

    def rank(item: tuple[EngineSettings, Budget]) -> tuple[int, int, int, int, int, int]:
        new, b = item
        bs = b.cuda_graph_max_bs or 10**6
        kept = (new.speculative_algorithm is not None) == spec_on
        served = min(b.running_requests, asked) if hybrid and asked else 0
        changes = len(_changes(s, new))
        return (0 if bs >= MIN_USEFUL_GRAPH_BS else 1, 0 if kept else 1, -served, -bs, -b.kv_tokens, changes)

    found.sort(key=rank)
    return found


def _changes(old: EngineSettings, new: EngineSettings) -> dict[str, Any]:
    """What to set in the role (``None``: remove that setting) to go from ``old`` to ``new``."""
    out: dict[str, Any] = {"mem_fraction_static": new.mem_fraction_static}
    for name in ("cuda_graph_max_bs", "max_running_requests", "mamba_scheduler_strategy", "max_mamba_cache_size"):
        if getattr(new, name) != getattr(old, name):
            out[name] = getattr(new, name)
    if new.speculative_algorithm != old.speculative_algorithm:
        out.update({k: None for k in SPEC_KEYS})
    if new.tp_size != old.tp_size:
        out["tp_size"] = new.tp_size
    return out


def _min_kv(model: ModelFacts, s: EngineSettings) -> int:
    return min(MIN_KV_TOKENS, s.context_length or model.context_length)


def _why(b: Budget, cal: Cal) -> str:
    what = f"{b.kv_tokens} KV tokens, {b.running_requests} running requests, {b.margin_gib:.2f} GiB spare headroom"
    if cal.lesson:
        return (f"{what}: it covers the last run's shortfall ({cal.lesson}); this leaves "
                f"{b.headroom_available_gib:.2f} GiB of headroom for the {b.headroom_needed_gib:.2f} GiB that run "
                f"proved, with the +-{b.error_band_gib:.2f} GiB band to spare")
    return what


def _recommend(ctx: _Ctx, s: EngineSettings, verdict: str) -> tuple[dict[str, Any], int | None, str]:
    ctx = replace(ctx, running_matters=verdict == "memory-pool-does-not-fit")
    if verdict != "weights-do-not-fit":
        found = _search(ctx, s)
        if found:
            new, b = found[0]
            return _changes(s, new), None, _why(b, ctx.cal)
    scale_only = replace(ctx.cal, preload_free_gib=None, weights_gib=None, preload_band_gib=0.0)
    tp = s.tp_size
    while tp < 64:
        tp *= 2
        found = _search(replace(ctx, cal=scale_only), replace(s, tp_size=tp))
        if found:
            new, b = found[0]
            return _changes(s, new), tp, (f"needs more GPUs: TP{tp} ({b.kv_tokens} KV tokens at "
                                          f"mem_fraction_static {new.mem_fraction_static})")
    return {}, None, "no setting fits on this GPU type up to TP64"


def _context(gpu_capacity_gib: float, model: ModelFacts, settings: EngineSettings, measured: Measured | None,
             measured_settings: EngineSettings | None, release: str | Release | None, gpu_name: str | None,
             free_gib: float | None, asked: AskedDefaults | None = None) -> _Ctx:
    if gpu_capacity_gib <= 0 or not math.isfinite(gpu_capacity_gib):
        raise InputError([Problem(message=f"GPU capacity must be positive, got {gpu_capacity_gib}",
                                  key="gpu_capacity_gib")])
    rel = release if isinstance(release, Release) else release_rules(release)
    gpu = gpu_class(gpu_capacity_gib, gpu_name)
    base = Cal(defaults_source=asked.source if asked else "")
    if free_gib is not None:
        p, band = preload_from_nvml(free_gib, settings.tp_size, gpu_name, gpu_capacity_gib)
        base = replace(base, preload_free_gib=p, preload_band_gib=band,
                       preload_source=f"NVML at deploy: {free_gib:.2f} GiB free on the GPU, less the engine's context")
    cal = calibration(gpu_capacity_gib, model, measured_settings or settings, measured, rel, gpu, base)
    if free_gib is not None and cal.preload_source != base.preload_source and cal.preload_free_gib is not None:
        # what is free now bounds what a previous run found free then
        cal = replace(cal, preload_free_gib=min(cal.preload_free_gib, base.preload_free_gib or cal.preload_free_gib))
    return _Ctx(gpu_capacity_gib, model, cal, rel, gpu, _min_kv(model, settings))


def budget(gpu_capacity_gib: float, model: ModelFacts, settings: EngineSettings,
           measured: Measured | None = None, measured_settings: EngineSettings | None = None,
           release: str | Release | None = None, *, gpu_name: str | None = None,
           free_gib: float | None = None, asked: AskedDefaults | None = None) -> Budget:
    """Predict the startup outcome of one rank and, unless it fits with room to spare, what would.

    ``release`` is the host's SGLang version (or a :class:`Release`); ``measured`` is what a
    previous run of this model on this GPU logged, under ``measured_settings`` (default:
    ``settings``); ``gpu_name`` and ``free_gib`` are NVML's name and free memory of the GPU at deploy.
    Measured preload memory and weights replace the estimates; measured graph memory (or an OOM's
    floor of it) rescales the graph estimate for every setting. ``asked``: the installed release's
    own defaults for these settings on this GPU (:mod:`.asked`), taken for what the role leaves unset.
    """
    role_fraction = settings.mem_fraction_static
    settings = filled(settings, asked)
    measured_settings = filled(measured_settings, asked) if measured_settings is not None else None
    ctx = _context(gpu_capacity_gib, model, settings, measured, measured_settings, release, gpu_name, free_gib,
                   asked)
    b = _as_default(ctx.eval(settings), role_fraction)
    if measured is not None:
        estimate = evaluate(gpu_capacity_gib, model, settings, Cal(), ctx.rel, ctx.gpu)
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
            cmp["phase"] = measured.oom_phase or measured.phase_reached
            if measured.shortfall_gib is not None:
                cmp["shortfall_gib"] = round(measured.shortfall_gib, 3)
        cmp["graph_scale"] = {k: round(v, 3) for k, v in ctx.cal.graph_scales}
        b = replace(b, measured=cmp)
        same = measured_settings is None or measured_settings == settings
        if same and measured.failure in MEMORY_FAILURES and b.severity != "refuse":
            # these very settings died for memory: that is no estimate any more
            verdict = measured.failure if measured.failure in VERDICTS else b.verdict
            if verdict == "fits":
                verdict = "oom-in-graph-capture"
            lesson = ctx.cal.lesson or measured.failure
            b = replace(b, verdict=verdict, severity="refuse",
                        reason=f"these settings failed in the last run: {lesson}; {b.reason}")
    if b.verdict == "fits" and b.severity == "ok":
        return replace(b, on_the_table=left_on_the_table(ctx, settings, b))
    rec, more, msg = _recommend(ctx, settings, b.verdict)
    return replace(b, recommended=rec, needs_more_gpus=more, message=msg)


def _as_default(b: Budget, role_fraction: float | None) -> Budget:
    """The release's own fraction, asked of it, is still the default the role leaves unset."""
    return b if b.fraction_is_default or role_fraction is not None else replace(b, fraction_is_default=True)


# below this much more headroom than the band wants, the spare is not worth a setting of its own
TABLE_MIN_GIB = 1.0


def left_on_the_table(ctx: _Ctx, s: EngineSettings, b: Budget) -> dict[str, Any]:
    """What a plain fit leaves unused: where the headroom is more than the band wants by
    :data:`TABLE_MIN_GIB` or more, the largest fraction that still fits with the band to spare
    (the same search a recommendation makes) and the KV tokens and running requests it buys."""
    spare = b.margin_gib - b.spare_wanted_gib
    if spare < TABLE_MIN_GIB or not b.headroom_breakdown:
        return {}
    hit = _largest_fraction(ctx, s)
    if hit is None or (hit[0].mem_fraction_static or 0) <= b.fraction:
        return {}
    new, got = hit
    if got.kv_tokens <= b.kv_tokens:
        return {}
    return {"spare_gib": round(spare, 3), "mem_fraction_static": new.mem_fraction_static,
            "kv_tokens": got.kv_tokens, "kv_tokens_gained": got.kv_tokens - b.kv_tokens,
            "running_requests": got.running_requests,
            "running_requests_gained": got.running_requests - b.running_requests,
            "margin_gib": round(got.margin_gib, 3), "error_band_gib": round(got.error_band_gib, 3)}


def suggest(gpu_capacity_gib: float, model: ModelFacts, settings: EngineSettings,
            measured: Measured | None = None, measured_settings: EngineSettings | None = None,
            limit: int = 8, release: str | Release | None = None, *, gpu_name: str | None = None,
            free_gib: float | None = None, asked: AskedDefaults | None = None) -> list[Suggestion]:
    """Settings that fit, best first: speculative kept, larger graph batch, more KV tokens."""
    settings = filled(settings, asked)
    measured_settings = filled(measured_settings, asked) if measured_settings is not None else None
    ctx = _context(gpu_capacity_gib, model, settings, measured, measured_settings, release, gpu_name, free_gib,
                   asked)
    out: list[Suggestion] = []
    for new, b in _search(ctx, settings, every_cap=True):
        out.append(Suggestion(settings=_changes(settings, new), kv_tokens=b.kv_tokens,
                              running_requests=b.running_requests, headroom_spare_gib=b.margin_gib,
                              speculative=new.speculative_algorithm is not None))
    return out[:limit]


def default_flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def recommendation_flags(recommended: Mapping[str, Any],
                         version_flag_name: Callable[[str], str] = default_flag_name) -> list[str]:
    """Render a recommendation as CLI arguments to add for the host's release.

    A setting set to ``None`` is one to remove (``removed_flags`` names them); ``tp_size`` (needs
    more GPUs) is not a flag to add: both are left to the caller and skipped here.
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


def removed_flags(recommended: Mapping[str, Any],
                  version_flag_name: Callable[[str], str] = default_flag_name) -> list[str]:
    """The flags a recommendation drops (its settings set to ``None``)."""
    return [version_flag_name(n) for n, v in recommended.items() if v is None]
