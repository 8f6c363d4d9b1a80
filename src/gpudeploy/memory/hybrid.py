"""Hybrid (mamba / linear-attention) models: the state slots SGLang allocates, per release.

From ``handle_max_mamba_cache`` and ``init_memory_pool`` (0.5.9 / 0.5.10
``model_runner_kv_cache_mixin.py``) and ``_handle_max_mamba_cache`` (0.5.23
``mem_cache/kv_cache_configurator.py``), in GiB of the KV budget ``rest = f x P - W``:

* up to 0.5.10, speculative decoding first takes ``per_request x max_running_requests x draft_tokens``
  of intermediate states off the top (48 running requests when none are given); then the slots are
  ``--max-mamba-cache-size``, or ``max_running_requests`` when the radix cache is off, or
  ``rest x r / (1 + r)`` (r = ``--mamba-full-memory-ratio``). What is left is the KV pool: when it
  comes out empty, SGLang says "Not enough memory. Please try to increase --mem-fraction-static"
  although the state took it (the field's hybrid + MTP at 512 requests: 512 x 2 x 147 MiB = 147 GiB of
  intermediate states, which no fraction holds).
* 0.5.23 solves slots and intermediate states together and caps the intermediate states at the
  requests the slots serve, so it fits and serves fewer; it fails only when no slot is left ("Not
  enough GPU memory for hybrid (mamba/linear-attention) state cache").
* slots per running request (``_calculate_mamba_ratio``): 1 without the radix cache, else 3, +2 with
  ``extra_buffer`` and the overlap scheduler, +1 without it, +1 ``extra_buffer_lazy``; SGLang caps
  running requests at slots // ratio. ``auto`` is ``no_buffer`` up to 0.5.10 (server_args) and
  ``extra_buffer`` in 0.5.23 (sgl-project/sglang#26127); ``no_buffer`` with speculative decoding turns
  the radix cache off (0.5.9 ``_handle_mamba_radix_cache``: "speculative decoding ... is not supported
  with radix cache yet"; assumed the same in 0.5.23).
"""

from __future__ import annotations

from dataclasses import dataclass

from .modelfacts import GIB
from .releases import Release
from .settings import EngineSettings


@dataclass(frozen=True)
class MambaState:
    """How the release sizes the state of one rank."""

    strategy: str              # the strategy as resolved
    radix_cache: bool
    ratio: int                 # slots per running request
    slots: int                 # max_mamba_cache_size
    served: int                # running requests the slots serve (SGLang's cap)
    state_gib: float           # slots and intermediate (speculative) states
    rest_gib: float            # left for the KV pool
    failure: str | None = None  # "kv-pool-empty" (0.5.9/0.5.10) or "mamba-state-does-not-fit"


def resolved_strategy(s: EngineSettings, rel: Release) -> str:
    if s.mamba_scheduler_strategy != "auto":
        return s.mamba_scheduler_strategy
    return "extra_buffer" if rel.mamba_joint else "no_buffer"


def radix_cache_on(s: EngineSettings, rel: Release) -> bool:
    if s.disable_radix_cache:
        return False
    return not (resolved_strategy(s, rel) == "no_buffer" and s.speculative_algorithm is not None)


def slots_per_request(s: EngineSettings, rel: Release) -> int:
    """Mamba cache slots per running request (``_calculate_mamba_ratio``)."""
    if not radix_cache_on(s, rel):
        return 1
    strat = resolved_strategy(s, rel)
    overlap = not s.disable_overlap_schedule and (s.speculative_algorithm is None or rel.spec_keeps_overlap)
    if strat == "extra_buffer":
        return 3 + (2 if overlap else 1)
    if strat == "extra_buffer_lazy":
        return 3 + 1
    return 3


def mamba_state(rest: float, per_req_bytes: int, s: EngineSettings, rel: Release, running: int | None,
                draft_tokens: int) -> MambaState:
    """The state SGLang allocates out of ``rest`` GiB (``running``: max_running_requests as resolved)."""
    per = per_req_bytes / GIB
    dp = s.dp_size if s.enable_dp_attention else 1
    spec = s.speculative_algorithm is not None and draft_tokens > 0
    ratio = slots_per_request(s, rel)
    radix = radix_cache_on(s, rel)
    strat = resolved_strategy(s, rel)
    r = s.mamba_full_memory_ratio
    reqs = max(1, (running or 1) // dp)
    if not rel.mamba_joint:
        inter = per * reqs * draft_tokens if spec else 0.0
        avail = rest - inter
        if s.max_mamba_cache_size is not None:
            slots = s.max_mamba_cache_size // dp
        elif not radix and running is not None:
            slots = running // dp
        else:
            slots = int(avail * r / (1 + r) // per) if avail > 0 else 0
        state = max(slots, 0) * per + inter
        left = rest - state
        served = slots // ratio if slots > 0 else 0
        failure = "kv-pool-empty" if left <= 0 else ("mamba-state-does-not-fit" if served < 1 else None)
        return MambaState(strat, radix, ratio, slots, served, state, left, failure)
    inter = 0.0
    if s.max_mamba_cache_size is not None:
        slots = s.max_mamba_cache_size // dp
        if spec:
            inter = per * (min(reqs, slots // ratio) + 1) * draft_tokens
    elif not radix and running is not None:
        slots = max(1, running // dp)
        if spec:
            inter = per * (slots + 1) * draft_tokens
    else:
        budget = rest * r / (1 + r)
        if spec:
            slots = int((budget - per * (1 + draft_tokens)) // (per * (1 + draft_tokens / ratio)))
            inter = per * (min(reqs, max(slots, 0) // ratio) + 1) * draft_tokens
        else:
            slots = int((budget - per) // per)
    if slots <= 0:
        return MambaState(strat, radix, ratio, slots, 0, inter, rest - inter, "mamba-state-does-not-fit")
    state = (slots + 1) * per + inter
    left = rest - state
    served = slots // ratio
    failure = "kv-pool-empty" if left <= 0 else ("mamba-state-does-not-fit" if served < 1 else None)
    return MambaState(strat, radix, ratio, slots, served, state, left, failure)
