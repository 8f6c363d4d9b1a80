"""Measured memory figures from an SGLang run's log lines (pure).

:func:`parse_memory_log` turns the engine's startup log lines (see the reference's "Log lines in
startup order"; SGLang's "GB" there is GiB) into a :class:`Measured`. Only rank 0's lines are used
when lines carry a ``TPn`` tag. ``recommend.budget(..., measured=...)`` prefers those numbers over
its estimates and reports both; ``gpudeploy.plan.calibrate`` keeps them between runs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

# phases in startup order; a speculative run loads and sizes its draft after the target's graphs
PHASES = ("start", "loading-weights", "weights-loaded", "kv-allocated", "memory-pool", "graph-capture",
          "graphs-captured", "warmup", "ready")
# where an out-of-memory error was, by the phase it happened in: what it means
OOM_MEANS = {
    "start": "other",
    "loading-weights": "weights-do-not-fit",
    "weights-loaded": "memory-pool-does-not-fit",   # allocating the KV pool, req-to-token table, mamba state
    "kv-allocated": "memory-pool-does-not-fit",
    "memory-pool": "oom-in-graph-capture",          # the graph runners' buffers, before the first capture
    "graph-capture": "oom-in-graph-capture",
    "draft": "oom-in-graph-capture",                # the draft's weights, KV and graphs come out of the headroom
    "graphs-captured": "oom-at-warmup",
    "warmup": "oom-at-warmup",
    "ready": "oom-while-serving",
}


@dataclass(frozen=True)
class Measured:
    """Figures read from one run's log (GiB per rank; None where the log did not say)."""

    preload_free_gib: float | None = None       # Load weight begin. avail mem
    weights_gib: float | None = None            # Load weight end. mem usage
    after_load_avail_gib: float | None = None   # Load weight end. avail mem
    kv_tokens: int | None = None                # KV Cache is allocated. #tokens
    kv_gib: float | None = None                 # K + V size (or MLA KV size)
    mamba_slots: int | None = None              # max_mamba_cache_size
    state_gib: float | None = None              # conv_state + ssm_state size
    pool_end_avail_gib: float | None = None     # Memory pool end. avail mem
    graph_gib: float | None = None              # decode (or target verify) graphs: "... graph end ... mem usage"
    graph_end_avail_gib: float | None = None
    draft_weights_gib: float | None = None      # a speculative run's second "Load weight end"
    draft_kv_gib: float | None = None           # ... and its second KV line
    draft_graph_gib: float | None = None        # "Capture draft ... graph end" lines, summed
    prefill_graph_gib: float | None = None      # "Capture piecewise/prefill ... graph end" lines, summed
    graph_begin_avail_gib: float | None = None  # the last "Capture ... graph begin ... avail mem" before a failure
    graph_floor_gib: float | None = None        # graphs needed at least this much (from an OOM in capture)
    max_running_requests: int | None = None
    oom_tried_gib: float | None = None          # "Tried to allocate X"
    oom_free_gib: float | None = None           # "... of which Y is free"
    oom_capacity_gib: float | None = None       # "GPU N has a total capacity of T"
    oom_gpu: int | None = None
    oom_in_use_gib: float | None = None         # "this process has X memory in use" / "Process P has X ..."
    oom_allocated_gib: float | None = None      # "X is allocated by PyTorch"
    oom_reserved_gib: float | None = None       # "R is reserved by PyTorch but unallocated"
    oom_phase: str | None = None                # where the OOM hit: a PHASES name or "draft", ":family" for graphs
    failure: str | None = None                  # a verdict of the memory model, "oom-at-warmup", ... or "other"
    phase_reached: str = "start"

    @property
    def shortfall_gib(self) -> float | None:
        """What the failing allocation lacked: asked minus free (a floor on what was missing)."""
        if self.oom_tried_gib is None:
            return None
        return max(0.0, self.oom_tried_gib - (self.oom_free_gib or 0.0))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Measured:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


_NUM = r"([0-9]+(?:\.[0-9]+)?)"
_FAMILY_WORDS = ("draft", "verify", "prefill", "piecewise")
_RANK = re.compile(r"\bTP(\d+)\b")
_SIZE_UNITS = {"B": 1 / (1 << 30), "KiB": 1 / (1 << 20), "MiB": 1 / 1024, "GiB": 1.0, "TiB": 1024.0,
               "KB": 1 / (1 << 20), "MB": 1 / 1024, "GB": 1.0}


def _size(value: str, unit: str) -> float:
    return float(value) * _SIZE_UNITS[unit]


# The line formats, from SGLang's format strings (0.5.9 wheel / 0.5.23 wheel, file:line):
#   Load weight end. ..., avail mem=X GB, mem usage=Y GB.    model_runner.py:1041 / model_runner.py:1373
#   KV Cache is allocated. [dtype: D, ]#tokens: N, K size: X GB, V size: Y GB (or KV size: X GB)
#                                                            memory_pool.py:652 / memory_pool.py:2089
#   Capture cuda graph begin. ... avail mem=X GB             model_runner.py:2147
#   Capture target decode CUDA graph begin. backend=B, num_tokens_per_req=1, avail mem=X GB
#                                                            model_runner_components/cuda_graph_setup.py:759
#   Capture cuda graph end. Time elapsed: T s. mem usage=X GB. avail mem=Y GB.      model_runner.py:2161
#   Capture target decode CUDA graph end. bs=[...], elapsed=T s, mem usage=X GB, avail mem=Y GB.
#                                                            model_runner_components/cuda_graph_setup.py:788
#   Capture draft [extend] cuda graph end. ...               speculative/eagle_worker.py:256 / eagle_worker_v2.py:533
#   Capture piecewise CUDA graph end. ... / Capture target prefill CUDA graph end. ...
#                                                            model_runner.py:2236 / cuda_graph_setup.py:696
_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("load_begin", re.compile(r"Load weight begin\..*?avail mem=" + _NUM)),
    ("load_end", re.compile(r"Load weight end\..*?avail mem=" + _NUM + r"\s*GB, mem usage=" + _NUM)),
    ("kv", re.compile(r"KV [Cc]ache (?:is )?allocated\. (?:dtype: [\w.]+, )?#tokens: (\d+), (?:K size: " + _NUM
                      + r"\s*GB, V size: " + _NUM + r"|KV size: " + _NUM + r")")),
    ("mamba", re.compile(r"Mamba Cache is allocated\. max_mamba_cache_size: (\d+), conv_state size: "
                         + _NUM + r"\s*GB, ssm_state size: " + _NUM)),
    ("pool_end", re.compile(r"Memory pool end\. avail mem=" + _NUM)),
    ("graph_begin", re.compile(r"Capture (.*?)graph begin.*?(?:avail mem=" + _NUM + r")?\s*(?:GB)?$",
                               re.IGNORECASE)),
    ("graph_end", re.compile(r"Capture (.*?)graph end\..*?mem usage=" + _NUM + r"\s*GB[.,] avail mem=" + _NUM,
                             re.IGNORECASE)),
    ("summary", re.compile(r"max_total_num_tokens=(\d+),.*?max_running_requests=(\d+)")),
    ("ready", re.compile(r"The server is fired up and ready to roll")),
    # 0.5.9: "Capture cuda graph failed: ..."; 0.5.23: the same from the decode and draft runners,
    # "Capture prefill CUDA graph failed" (runner/prefill_cuda_graph_runner.py:521)
    ("graph_failed", re.compile(r"Capture (?:[\w-]+ )*(?:cuda|CUDA) graph failed", re.IGNORECASE)),
    ("kv_empty", re.compile(r"Not enough memory\. Please try to increase --mem-fraction-static"
                            r"|Loaded weights leave no GPU memory for the KV cache")),
    ("mamba_fail", re.compile(r"Not enough GPU memory for hybrid|Hybrid \(mamba/linear-attention\) "
                              r"state cache is too small")),
]
_UNIT = r"(B|KiB|MiB|GiB|TiB)"
# torch's CUDACachingAllocator: "CUDA out of memory. Tried to allocate X. GPU N has a total capacity of
# T of which F is free. [Process P has U memory in use. | Including non-PyTorch memory, this process has
# U memory in use.] Of the allocated memory A is allocated by PyTorch, and R is reserved by PyTorch but
# unallocated."
_OOM_PARTS = {
    "tried": re.compile(r"Tried to allocate " + _NUM + " " + _UNIT),
    "capacity": re.compile(r"GPU (\d+) has a total capac(?:i|)ty of " + _NUM + " " + _UNIT),
    "free": re.compile(r"of which " + _NUM + " " + _UNIT + " is free"),
    "in_use": re.compile(r"(?:this process has|Process \d+ has) " + _NUM + " " + _UNIT + " memory in use"),
    "allocated": re.compile(_NUM + " " + _UNIT + " is allocated by PyTorch"),
    "reserved": re.compile(_NUM + " " + _UNIT + " is reserved by PyTorch"),
}
_SUMMARY_LINE = re.compile(r"max_total_num_tokens=\d+, chunked_prefill_size=")
_WARMUP = re.compile(r"Uvicorn running on|Application startup complete|Start of (?:co-located )?warmup"
                     r"|Started server process")


def parse_oom(text: str) -> dict[str, float | int]:
    """The figures of torch's out-of-memory text (GiB; ``gpu`` the device index), those present."""
    out: dict[str, float | int] = {}
    for key, pat in _OOM_PARTS.items():
        m = pat.search(text)
        if not m:
            continue
        if key == "capacity":
            out["gpu"] = int(m.group(1))
            out["capacity"] = _size(m.group(2), m.group(3))
        else:
            out[key] = _size(m.group(1), m.group(2))
    return out


def _family(name: str) -> str:
    """Which graphs a capture line is about: "draft", "prefill" (0.5.23 prefill, 0.5.10 piecewise),
    "verify" (0.5.23's target verify) or "decode"."""
    low = name.lower()
    if "draft" in low:
        return "draft"
    if "prefill" in low or "piecewise" in low:
        return "prefill"
    if "verify" in low:
        return "verify"
    return "decode"


def parse_memory_log(lines: Iterable[str]) -> Measured:
    """Read one run's startup log into measured figures (rank 0 only where ranks are tagged; an
    out-of-memory text is read from whichever rank printed it, with the phase rank 0 was in).

    A speculative run loads and sizes its draft after the target: the first "Load weight end"
    and KV line are the target's, later ones the draft's. Graph lines are kept apart by family
    (decode or target verify, draft, prefill), so the decode figure is what the decode graphs took.
    """
    v: dict[str, Any] = {}
    phase = 0
    stage = "target"                    # "draft" once a second "Load weight begin" is seen
    family = ""                         # the graphs being captured
    graphs = {"decode": 0.0, "draft": 0.0, "prefill": 0.0}
    seen: set[str] = set()
    begin_avail: float | None = None
    failure: str | None = None
    oom_at: str | None = None
    oom: dict[str, float | int] = {}
    loads = 0

    def reach(name: str) -> None:
        nonlocal phase
        phase = max(phase, PHASES.index(name))

    def where() -> str:
        name = PHASES[phase]
        if stage == "draft" and name != "ready" and phase < PHASES.index("warmup"):
            return "draft"
        return f"{name}:{family}" if name == "graph-capture" and family else name

    for raw in lines:
        line = raw.rstrip("\n")
        rank = _RANK.search(line[:120])
        other_rank = bool(rank and rank.group(1) != "0")
        if "out of memory" in line.lower() or "OutOfMemoryError" in line:
            got = parse_oom(line)
            if got and "tried" in got and "tried" not in oom:
                oom = got
                oom_at = oom_at or where()
            elif oom_at is None:
                oom_at = where()
        if other_rank:
            if failure is None and ("Capture" in line and "graph failed" in line.lower()):
                failure = "oom-in-graph-capture"
            continue
        if _SUMMARY_LINE.search(line) or _WARMUP.search(line):
            reach("warmup")
        for kind, pat in _PATTERNS:
            m = pat.search(line)
            if not m:
                continue
            if kind == "load_begin":
                loads += 1
                if loads == 1:
                    v.setdefault("preload_free_gib", float(m.group(1)))
                    reach("loading-weights")
                elif PHASES[phase] in ("graph-capture", "graphs-captured", "memory-pool"):
                    stage = "draft"
            elif kind == "load_end":
                if "weights_gib" in v:
                    v["draft_weights_gib"] = float(m.group(2))
                else:
                    v["after_load_avail_gib"] = float(m.group(1))
                    v["weights_gib"] = float(m.group(2))
                reach("weights-loaded")
            elif kind == "kv":
                size = (float(m.group(2)) + float(m.group(3))) if m.group(2) else float(m.group(4))
                if "kv_tokens" in v or "draft" in line[:200].lower():
                    v["draft_kv_gib"] = size
                else:
                    v["kv_tokens"] = int(m.group(1))
                    v["kv_gib"] = size
                reach("kv-allocated")
            elif kind == "mamba":
                v.setdefault("mamba_slots", int(m.group(1)))
                v.setdefault("state_gib", float(m.group(2)) + float(m.group(3)))
            elif kind == "pool_end":
                v.setdefault("pool_end_avail_gib", float(m.group(1)))
                reach("memory-pool")
            elif kind == "graph_begin":
                begin_avail = float(m.group(2)) if m.group(2) else begin_avail
                family = _family(m.group(1))
                reach("graph-capture")
            elif kind == "graph_end":
                fam = _family(m.group(1))
                graphs["decode" if fam == "verify" else fam] += float(m.group(2))
                seen.add("decode" if fam == "verify" else fam)
                begin_avail = None
                family = ""
                if fam in ("decode", "verify"):
                    v["graph_end_avail_gib"] = float(m.group(3))
                    reach("graphs-captured")
            elif kind == "summary":
                v["max_running_requests"] = int(m.group(2))
            elif kind == "ready":
                reach("ready")
            elif kind == "graph_failed":
                failure = "oom-in-graph-capture"
            elif kind == "kv_empty":
                failure = failure or "kv-pool-empty"
            elif kind == "mamba_fail":
                failure = failure or "mamba-state-does-not-fit"
    for fam, key in (("decode", "graph_gib"), ("draft", "draft_graph_gib"), ("prefill", "prefill_graph_gib")):
        if fam in seen:
            v[key] = round(graphs[fam], 4)
    if oom:
        v["oom_tried_gib"] = oom.get("tried")
        v["oom_free_gib"] = oom.get("free")
        v["oom_capacity_gib"] = oom.get("capacity")
        v["oom_gpu"] = int(oom["gpu"]) if "gpu" in oom else None
        v["oom_in_use_gib"] = oom.get("in_use")
        v["oom_allocated_gib"] = oom.get("allocated")
        v["oom_reserved_gib"] = oom.get("reserved")
    if oom_at is not None:
        v["oom_phase"] = oom_at
        # the phase decides what an OOM means; SGLang's own wrapper line, when it came, says the same
        failure = failure or OOM_MEANS[oom_at.split(":")[0]]
    if failure == "oom-in-graph-capture" and begin_avail is not None and v.get("oom_tried_gib") is not None \
            and v.get("oom_free_gib") is not None:
        # what the failing capture had used, plus what it asked for, plus the families done before it
        v["graph_begin_avail_gib"] = begin_avail
        v["graph_floor_gib"] = round(begin_avail - v["oom_free_gib"] + v["oom_tried_gib"] + sum(graphs.values()), 4)
    return Measured(failure=failure, phase_reached=PHASES[phase], **v)
