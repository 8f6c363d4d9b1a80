"""Hybrid models (Mamba / gated-delta-net linear attention): the state pool SGLang allocates, per release.

Read from each release's wheel (sglang/srt/..., file:line at that release). In GiB of the KV budget
``rest = f x P - W`` that ``profile_max_num_token`` / ``_profile_available_bytes`` computes (0.5.10
model_runner_kv_cache_mixin.py:169-175, 0.5.23 mem_cache/kv_cache_configurator.py:3009-3040), the state
comes off first and the full-attention KV pool gets what is left, at the full-attention layers'
bytes per token only (0.5.10 mixin.py:159-168, 0.5.23 model_executor/pool_configurator.py:228-236).

One request's state (``mamba_cache_per_req``, configs/mamba_utils.py:116 in 0.5.10 and 0.5.23): per
linear layer the conv window (conv_dim / TP x (kernel - 1), bf16) and the SSM state (V heads / TP x
key dim x value dim) in ``mamba_ssm_dtype``: ``--mamba-ssm-dtype``, else config.json's
``mamba_ssm_dtype``, else float32 (mamba_utils.py:47-104 ``mamba2_state_dtype``).

How the slot count (``max_mamba_cache_size``) is chosen moved twice; ``Release.mamba_sizing`` says which:

* ``off-top`` (0.5.9 - 0.5.12; 0.5.10 model_runner_kv_cache_mixin.py:179-238): speculative decoding first
  takes ``per_req x max_running_requests x draft_tokens`` of intermediate states off the top (:184-199);
  then the slots are ``--max-mamba-cache-size`` (:201), or ``max_running_requests`` when the radix
  cache is off (:206), or ``rest x r / (1 + r) // per_req`` (:216-231, r = ``--mamba-full-memory-ratio``,
  0.9). When the KV pool comes out empty SGLang says "Not enough memory. Please try to increase
  --mem-fraction-static" although the state took it (the field's 27B hybrid + MTP at 512 requests).
* ``joint`` (0.5.13 - 0.5.16; 0.5.13 model_runner_kv_cache_mixin.py:82-170): slots and intermediate
  states are solved together inside the ratio's budget, ``K = budget // (per_req (1 + D / ratio))``, and
  the intermediate states are kept only for the requests the slots serve, ``min(running, K // ratio)``.
* ``joint-padded`` (0.5.17 on; 0.5.17 mem_cache/kv_cache_configurator.py:1816-1960, 0.5.23 the same
  file :3229-3409): as ``joint`` plus each pool's padding slot, ``K = (budget - per_req (1 + D)) //
  (per_req (1 + D / ratio))``, intermediate ``(min(running, K // ratio) + 1) x D``, state ``(K + 1) x
  per_req`` (:3362-3409). It fails only when no slot is left ("Not enough GPU memory for hybrid
  (mamba/linear-attention) state cache", :3392).

Slots per running request (``_calculate_mamba_ratio``: 0.5.10 mixin.py:373-385, 0.5.23
kv_cache_configurator.py:3062-3089 with mem_cache/allocation_sizing.py:11-19): 1 without the radix
cache, else 3, +2 with ``extra_buffer`` and the overlap scheduler, +1 without it, +1 for
``extra_buffer_lazy``; SGLang caps running requests at ``K // ratio`` (0.5.10 mixin.py:853-858, 0.5.23
kv_cache_configurator.py:3137-3160). The overlap scheduler is off with speculative decoding until
spec v2 became the default (0.5.11 environ.py:459), and always off with ``no_buffer``.

``--mamba-scheduler-strategy auto`` is ``no_buffer`` up to 0.5.13 (0.5.13 server_args.py:1225); from 0.5.14
(server_args.py:4385; 0.5.23 arg_groups/overrides.py:477-487) ``extra_buffer`` where the overlap scheduler
is on and the architecture supports it (Qwen3-Next, Qwen3.5/3.6, Kimi-Linear, ...: overrides.py:403),
else ``no_buffer`` with the overlap scheduler off. ``no_buffer`` with speculative decoding and the
radix cache on is refused ("Speculative decoding for ... is not compatible with
radix cache when using --mamba-scheduler-strategy no_buffer", 0.5.10 - 0.5.13; 0.5.13
server_args.py:2755); 0.5.9 turns the radix cache off instead (one slot per request), and from 0.5.14
it is kept (3 slots per request; 0.5.23 arg_groups/mamba_hook.py:156).
"""

from __future__ import annotations

from dataclasses import dataclass

from .modelfacts import GIB
from .releases import Release
from .settings import EngineSettings

# architectures whose linear attention supports extra_buffer (0.5.23 arg_groups/overrides.py:403-420)
EXTRA_BUFFER_ARCHS = ("Qwen3Next", "Qwen3_5", "Qwen3_6", "Qwen4Exp", "KimiLinear", "InternS2Preview",
                      "MiniCPMV4_6", "MiniCPMV4_7", "BailingMoeV2_5", "BailingMoeV3", "NemotronH")


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
    failure: str | None = None  # "kv-pool-empty" (off-top releases) or "mamba-state-does-not-fit"
    refused: str = ""          # SGLang refuses these settings before sizing anything (why)


def supports_extra_buffer(architecture: str) -> bool:
    """Whether ``auto`` can become extra_buffer for this model (an unknown architecture: assumed so)."""
    return not architecture or architecture.startswith(EXTRA_BUFFER_ARCHS)


def resolved_strategy(s: EngineSettings, rel: Release, architecture: str = "") -> str:
    if s.mamba_scheduler_strategy != "auto":
        return s.mamba_scheduler_strategy
    if rel.auto_extra_buffer and not s.disable_overlap_schedule and supports_extra_buffer(architecture):
        return "extra_buffer"
    return "no_buffer"


def _spec_no_buffer(s: EngineSettings, rel: Release, architecture: str) -> bool:
    return (s.speculative_algorithm is not None and not s.disable_radix_cache
            and resolved_strategy(s, rel, architecture) == "no_buffer")


def radix_cache_on(s: EngineSettings, rel: Release, architecture: str = "") -> bool:
    """0.5.9 turns the radix cache off for speculative decoding under no_buffer (server_args.py:1759-1763)."""
    if s.disable_radix_cache:
        return False
    return not (rel.spec_no_buffer == "radix-off" and _spec_no_buffer(s, rel, architecture))


def refusal(s: EngineSettings, rel: Release, architecture: str = "") -> str:
    """Why the release refuses these hybrid settings at start ("" when it does not)."""
    if rel.spec_no_buffer == "refused" and _spec_no_buffer(s, rel, architecture):
        return (f"SGLang {rel.name} refuses speculative decoding with the radix cache under mamba strategy "
                "no_buffer (\"not compatible with radix cache when using --mamba-scheduler-strategy "
                "no_buffer\"): set mamba_scheduler_strategy extra_buffer or disable_radix_cache")
    return ""


def overlap_on(s: EngineSettings, rel: Release, architecture: str = "") -> bool:
    """The overlap scheduler as the release leaves it for a hybrid model."""
    if s.disable_overlap_schedule or resolved_strategy(s, rel, architecture) == "no_buffer":
        return False
    return s.speculative_algorithm is None or rel.spec_keeps_overlap


def slots_per_request(s: EngineSettings, rel: Release, architecture: str = "") -> int:
    """Mamba cache slots per running request (``_calculate_mamba_ratio``)."""
    if not radix_cache_on(s, rel, architecture):
        return 1
    strat = resolved_strategy(s, rel, architecture)
    if strat == "extra_buffer":
        return 3 + (2 if overlap_on(s, rel, architecture) else 1)
    if strat == "extra_buffer_lazy":
        return 3 + 1
    return 3


def mamba_state(rest: float, per_req_bytes: int, s: EngineSettings, rel: Release, running: int | None,
                draft_tokens: int, architecture: str = "") -> MambaState:
    """The state SGLang allocates out of ``rest`` GiB (``running``: max_running_requests as resolved)."""
    per = per_req_bytes / GIB
    dp = s.dp_size if s.enable_dp_attention else 1
    spec = s.speculative_algorithm is not None and draft_tokens > 0
    ratio = slots_per_request(s, rel, architecture)
    radix = radix_cache_on(s, rel, architecture)
    strat = resolved_strategy(s, rel, architecture)
    refused = refusal(s, rel, architecture)
    r = s.mamba_full_memory_ratio
    reqs = max(1, (running or 1) // dp)
    if rel.mamba_sizing == "off-top":
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
        return MambaState(strat, radix, ratio, slots, served, state, left, failure, refused)
    pad = 1 if rel.mamba_sizing == "joint-padded" else 0
    inter = 0.0
    if s.max_mamba_cache_size is not None:
        slots = s.max_mamba_cache_size // dp
        if spec:
            inter = per * (min(reqs, slots // ratio) + pad) * draft_tokens
    elif not radix and running is not None:
        slots = max(1, running // dp)
        if spec:
            inter = per * (slots + pad) * draft_tokens
    else:
        budget = rest * r / (1 + r)
        if spec:
            slots = int((budget - pad * per * (1 + draft_tokens)) // (per * (1 + draft_tokens / ratio)))
            inter = per * (min(reqs, max(slots, 0) // ratio) + pad) * draft_tokens
        else:
            slots = int((budget - pad * per) // per)
    if slots <= 0:
        return MambaState(strat, radix, ratio, slots, 0, inter, rest - inter, "mamba-state-does-not-fit", refused)
    state = (slots + pad) * per + inter
    left = rest - state
    served = slots // ratio
    failure = "kv-pool-empty" if left <= 0 else ("mamba-state-does-not-fit" if served < 1 else None)
    return MambaState(strat, radix, ratio, slots, served, state, left, failure, refused)
