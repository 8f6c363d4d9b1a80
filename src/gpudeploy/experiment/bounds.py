"""Regions a failed launch showed not to boot, so the search does not launch there again. Pure.

A launch that died tells more than its own point. Its cause (the gate's, verify/causes.py) says
which way memory runs short, and for the settings in that cause's table, a value at least as hungry
cannot boot either when the role's other searched keys are the same:

    headroom OOMs (CUDA graph capture, warmup, serving, a plain CUDA OOM): the static share and the
        buffers left too little room, so a mem_fraction_static, cuda_graph_max_bs, chunked_prefill_size,
        max_running_requests ... at least as large, or a TP size at least as small, fails too
    a static pool too small (the weights or the KV pool do not fit in mem_fraction_static): a
        mem_fraction_static at least as small, a context at least as long, a TP at least as small

After an OOM at mem_fraction_static 0.88 with cuda_graph_max_bs 160, a trial at 0.9 with 256 (the
rest of that role equal) is refused without a launch; one at 0.86, or 0.9 with 64, is still launched:
nothing says it fails. A cause of another kind (a crash, a flag the engine refuses) bounds only its own
point (that role's searched keys all equal), and a checkpoint the host lacks bounds that checkpoint.
Only the keys of the role whose unit died are compared: a prefill OOM says nothing of decode's keys.
Causes of the host, not of the settings (a lost connection, a timeout, a port in use, Ctrl-C) bound
nothing: that point may be tried again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .search_space import Dimension, Search

# settings -> +1: larger needs more of the GPU's memory; -1: smaller does
HEADROOM = {"mem_fraction_static": 1, "cuda_graph_max_bs": 1, "cuda_graph_bs": 1, "chunked_prefill_size": 1,
            "max_prefill_tokens": 1, "max_running_requests": 1, "speculative_num_steps": 1,
            "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 1, "gpu_memory_utilization": 1,
            "max_num_seqs": 1, "max_num_batched_tokens": 1, "tp_size": -1}
STATIC = {"mem_fraction_static": -1, "gpu_memory_utilization": -1, "context_length": 1, "max_model_len": 1,
          "max_total_tokens": 1, "tp_size": -1}
HEADROOM_CAUSES = frozenset({"cuda-oom", "oom-in-graph-capture", "oom-at-warmup", "oom-while-serving",
                             "memory-pool-does-not-fit", "out-of-memory", "kv-cache-too-large"})
STATIC_CAUSES = frozenset({"weights-do-not-fit", "kv-pool-empty", "kv-cache-too-small", "max-model-len-too-long",
                           "mamba-state-does-not-fit"})
# the host's or the run's, not the settings': no region
NOT_THE_SETTINGS = frozenset({"connection-lost", "interrupted", "start-failed", "port-in-use", "timeout", "stalled",
                              "group-failed", "peer-lost", "missing-module"})
ONLY_THE_CHECKPOINT = frozenset({"model-not-found"})


@dataclass(frozen=True)
class Region:
    trial: int
    cause: str
    roles: frozenset[str]  # the unit's role and its role file (a space key naming either is compared)
    params: dict[str, Any] = field(hash=False)  # the failed trial's point
    worse: dict[str, int] = field(hash=False)  # space key -> the direction that is at least as bad
    only: tuple[str, ...] = ()  # compare these keys only (a checkpoint); () = every key of the role


def region(trial: int, cause: str | None, roles: frozenset[str], params: Mapping[str, Any],
           search: Search) -> Region | None:
    """What a launch that died of ``cause`` in a unit of ``roles`` rules out, or None (the host's cause)."""
    if not cause or cause in NOT_THE_SETTINGS:
        return None
    table = HEADROOM if cause in HEADROOM_CAUSES else STATIC if cause in STATIC_CAUSES else {}
    mine = [d for d in search.space if roles & set(d.roles)]
    # a number's direction; choices of numbers too (cuda_graph_max_bs: [64, 128, 256])
    worse = {d.key: table[d.name] for d in mine
             if d.name in table and (d.kind != "choice" or all(_num(c) for c in d.choices))}
    only = tuple(d.key for d in mine if d.section == "model") if cause in ONLY_THE_CHECKPOINT else ()
    if cause in ONLY_THE_CHECKPOINT and not only:
        return None  # the checkpoint is not searched: nothing here to rule out
    return Region(trial, cause, roles, dict(params), worse, only)


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def covers(r: Region, params: Mapping[str, Any], search: Search) -> str | None:
    """Why ``params`` lies in the region (a sentence), or None."""
    why = []
    for d in _compared(r, search):
        a, b = r.params.get(d.key), params.get(d.key)
        direction = r.worse.get(d.key)
        if direction and isinstance(a, (int, float)) and isinstance(b, (int, float)):
            if (b - a) * direction < 0:
                return None
            if b != a:
                why.append(f"{_short(d)} {b:g} {'>=' if direction > 0 else '<='} {a:g}")
        elif a != b:
            return None
    held = f"{', '.join(why)}; the rest of {'/'.join(sorted(r.roles))} equal" if why else "the same point"
    return (f"inside the region trial {r.trial}'s launch showed fails ({r.cause} at "
            f"{', '.join(f'{_short(d)}={_text(r.params.get(d.key))}' for d in _compared(r, search))}): {held}")


def _compared(r: Region, search: Search) -> list[Dimension]:
    return [d for d in search.space if (r.roles & set(d.roles)) and (not r.only or d.key in r.only)]


def _short(d: Dimension) -> str:
    return f"{'+'.join(d.roles)}.{d.name}"


def _text(v: Any) -> str:
    return "-" if v is None else f"{v:g}" if isinstance(v, float) else str(v)
