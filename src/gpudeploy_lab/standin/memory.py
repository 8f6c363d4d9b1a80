"""The stand-in's memory model: what each TP rank would load, allocate and capture, in bytes.

Pure: inputs are the engine settings, the GPUs and the other processes' fake GPU use; the output
is an :class:`EnginePlan` with every number the log lines print and, when the numbers do not fit,
the failure SGLang would hit (following /work/shared/reference/sglang.md "Memory model").
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from gpudeploy_lab.standin.common import CUDA_CONTEXT_BYTES, GIB, MIB, NVML_BASELINE_BYTES

DEFAULT_CONTEXT_LEN = 32768


@dataclass(frozen=True)
class ModelInfo:
    model_class: str = "LlamaForCausalLM"
    model_type: str = "llama"
    context_len: int = DEFAULT_CONTEXT_LEN
    weights_bytes: int = 16 * GIB
    kv_bytes_per_token: int | None = None  # per rank; None = not derivable
    mla: bool = False
    hybrid: bool = False
    mamba_slot_bytes: int = 0  # per request, per rank (conv + ssm states of all linear layers)
    kv_dtype: str = "torch.bfloat16"  # what "KV Cache is allocated. dtype: ..." says


@dataclass(frozen=True)
class EngineSettings:
    tp: int = 1
    pp: int = 1
    base_gpu_id: int = 0
    gpu_id_step: int = 1
    mem_fraction_static: float | None = None
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int = 16384
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
    context_length: int | None = None
    cuda_graph_max_bs: int | None = None
    disable_cuda_graph: bool = False
    speculative_algorithm: str | None = None
    kv_cache_dtype: str = "auto"
    mamba_strategy: str = "auto"


@dataclass(frozen=True)
class RankPlan:
    rank: int
    local_device: int  # torch device ordinal inside the visible set
    physical_gpu: int | None  # NVML index; None = invalid device ordinal
    total_bytes: int  # NVML total of that GPU
    avail_before: int  # "Load weight begin. avail mem"


@dataclass(frozen=True)
class Failure:
    phase: str  # "init" | "weights" | "kv" | "mamba" | "graph"
    rank: int
    message: str  # the exception line, e.g. "RuntimeError: Not enough memory. ..."


@dataclass(frozen=True)
class EnginePlan:
    settings: EngineSettings
    model: ModelInfo
    ranks: tuple[RankPlan, ...]
    mem_fraction_static: float
    chunked_prefill_size: int
    cuda_graph_max_bs: int
    weights_per_rank: int
    kv_bytes_per_token: int
    kv_pool_bytes: int  # "rest": K + V of all tokens
    max_total_num_tokens: int
    max_running_requests: int
    max_mamba_cache_size: int
    mamba_bytes: int
    req_to_token_bytes: int
    graph_bytes: int
    graph_batch_sizes: tuple[int, ...]
    context_len: int
    failure: Failure | None = None
    notes: tuple[str, ...] = field(default=())
    device: str = "cuda"

    @property
    def avail_before(self) -> int:
        return min(r.avail_before for r in self.ranks)

    @property
    def avail_after_weights(self) -> int:
        return self.avail_before - self.weights_per_rank

    @property
    def avail_after_pool(self) -> int:
        return (self.avail_after_weights - self.kv_pool_bytes - self.mamba_bytes
                - self.req_to_token_bytes)

    @property
    def avail_after_graph(self) -> int:
        return self.avail_after_pool - self.graph_bytes


def read_model_info(model_path: str, weights_gib: float | None, kv_bytes_override: int | None,
                    tp: int, kv_cache_dtype: str = "auto") -> ModelInfo:
    """Model facts from ``config.json`` and ``model.safetensors.index.json`` when the path is a dir."""
    root = Path(model_path)
    cfg: dict[str, object] = {}
    try:
        loaded = json.loads((root / "config.json").read_text())
        if isinstance(loaded, dict):
            cfg = loaded
    except (OSError, ValueError):
        pass
    text_cfg = cfg.get("text_config")
    if isinstance(text_cfg, dict):
        cfg = {**text_cfg, **{k: v for k, v in cfg.items() if k == "architectures"}}

    def num(key: str, default: int) -> int:
        v = cfg.get(key)
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else default

    archs = cfg.get("architectures")
    model_class = str(archs[0]) if isinstance(archs, list) and archs else "LlamaForCausalLM"
    model_type = str(cfg.get("model_type") or "llama")
    context_len = num("max_position_embeddings", DEFAULT_CONTEXT_LEN)

    if weights_gib is not None:
        weights = int(weights_gib * GIB)
    else:
        weights = 16 * GIB
        try:
            index = json.loads((root / "model.safetensors.index.json").read_text())
            weights = int(index["metadata"]["total_size"])
        except (OSError, ValueError, KeyError, TypeError):
            # no index: a single-file checkpoint weighs what its files do (the lab's tiny model)
            try:
                files = sum(f.stat().st_size for f in root.glob("*.safetensors"))
            except OSError:
                files = 0
            weights = files or weights

    dtype_bytes = 1 if kv_cache_dtype.startswith(("fp8", "mxfp8")) else 2
    layers = num("num_hidden_layers", 0)
    mla = "kv_lora_rank" in cfg
    layer_types = cfg.get("layer_types")
    hybrid = ("linear_num_value_heads" in cfg or "full_attention_interval" in cfg
              or (isinstance(layer_types, list) and "linear_attention" in layer_types))
    cell: int | None = None
    mamba_slot = 0
    if layers:
        if mla:
            cell = (num("kv_lora_rank", 512) + num("qk_rope_head_dim", 64)) * layers * dtype_bytes
        else:
            heads = num("num_attention_heads", 32)
            kv_heads = num("num_key_value_heads", heads)
            head_dim = num("head_dim", num("hidden_size", 4096) // max(1, heads))
            attn_layers = layers
            if hybrid:
                attn_layers = max(1, layers // max(1, num("full_attention_interval", 4)))
                lin_layers = layers - attn_layers
                kh, kd = num("linear_num_key_heads", 16), num("linear_key_head_dim", 128)
                vh, vd = num("linear_num_value_heads", 32), num("linear_value_head_dim", 128)
                conv_dim = (2 * kh * kd + vh * vd) // max(1, tp)
                conv = conv_dim * (num("linear_conv_kernel_dim", 4) - 1) * 2
                ssm = (vh // max(1, tp)) * kd * vd * 4
                mamba_slot = (conv + ssm) * lin_layers
            cell = 2 * max(1, kv_heads // max(1, tp)) * head_dim * attn_layers * dtype_bytes
    if kv_bytes_override is not None:
        cell = kv_bytes_override
    return ModelInfo(model_class, model_type, context_len, weights, cell, mla, hybrid, mamba_slot,
                     kv_dtype_of(cfg, kv_cache_dtype))


def kv_dtype_of(cfg: dict[str, object], kv_cache_dtype: str) -> str:
    """The KV pool's torch dtype as 0.5.23 logs it: the model's dtype with --dtype auto, float32
    downcast to float16 (bfloat16 for Gemma), as configs/model_config.py _get_and_verify_dtype does;
    an fp8 --kv-cache-dtype as its torch type."""
    if kv_cache_dtype.startswith("fp8_e5m2"):
        return "torch.float8_e5m2"
    if kv_cache_dtype.startswith("fp8"):
        return "torch.float8_e4m3fn"
    raw = cfg.get("torch_dtype", cfg.get("dtype"))
    name = str(raw).removeprefix("torch.") if isinstance(raw, str) else "float32"
    if name in ("float32", "float"):
        return "torch.bfloat16" if str(cfg.get("model_type", "")).startswith("gemma") else "torch.float16"
    return f"torch.{name}"


def _defaults_for_gpu(total_mib: int, tp: int) -> tuple[int, int]:
    """(chunked_prefill_size, cuda_graph_max_bs) SGLang picks for a GPU of this size."""
    gib = total_mib / 1024
    if gib < 20:
        return 2048, 8 if tp < 4 else 80
    if gib < 35:
        return 2048, 24 if tp < 4 else 160
    if gib < 60:
        return 4096, 32 if tp < 4 else 160
    if gib < 160:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def default_mem_fraction(total_mib: int, s: EngineSettings, chunked: int, graph_bs: int) -> float:
    reserved = 512 + max(chunked, 2048) * 1.5 + graph_bs * 2 + s.tp * s.pp / 8 * 1024
    if total_mib > 60 * 1024:
        reserved = max(reserved, 10240)
    algo = (s.speculative_algorithm or "").upper()
    if algo == "STANDALONE":
        reserved += 6144
    elif algo:
        reserved += 2048
    return round((total_mib - reserved) / total_mib, 3)


def graph_batch_sizes(max_bs: int) -> tuple[int, ...]:
    sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, max(max_bs, 272) + 1, 16)]
    out = sorted({b for b in sizes if b <= max_bs} | {max_bs})
    return tuple(out)


def resolve_gpus(visible: list[int] | None, s: EngineSettings,
                 totals: dict[int, int], default_total: int) -> list[tuple[int, int | None, int]]:
    """Per rank: (local device ordinal, physical NVML index or None if out of range, NVML total)."""
    out = []
    for rank in range(s.tp):
        local = s.base_gpu_id + rank * s.gpu_id_step
        if visible is None:
            phys: int | None = local
            if totals and local not in totals:
                phys = None
        else:
            phys = visible[local] if 0 <= local < len(visible) else None
        total = totals.get(phys, default_total) if phys is not None else default_total
        out.append((local, phys, total))
    return out


def plan_engine(s: EngineSettings, model: ModelInfo, gpus: list[tuple[int, int | None, int]],
                others_used: dict[int, int], graph_mib_per_bs: float = 4.0,
                kv_bytes_default: int = 65536) -> EnginePlan:
    """Every number of one start; ``others_used`` = bytes other live processes hold per NVML index."""
    ranks = []
    for rank, (local, phys, total) in enumerate(gpus):
        used = others_used.get(phys, 0) if phys is not None else 0
        avail = total - NVML_BASELINE_BYTES - CUDA_CONTEXT_BYTES - used
        ranks.append(RankPlan(rank, local, phys, total, avail))
    total_mib = min(r.total_bytes for r in ranks) // MIB
    d_chunked, d_bs = _defaults_for_gpu(total_mib, s.tp)
    chunked = s.chunked_prefill_size if s.chunked_prefill_size is not None else d_chunked
    graph_bs = s.cuda_graph_max_bs if s.cuda_graph_max_bs is not None else d_bs
    frac = (s.mem_fraction_static if s.mem_fraction_static is not None
            else default_mem_fraction(total_mib, s, chunked, graph_bs))
    context_len = s.context_length or model.context_len
    weights = model.weights_bytes // max(1, s.tp * s.pp)
    if s.speculative_algorithm and s.speculative_algorithm.upper() != "NGRAM":
        weights += weights // 32  # draft / MTP layer
    cell = model.kv_bytes_per_token or kv_bytes_default

    failure: Failure | None = None
    p = min(r.avail_before for r in ranks)
    for r in ranks:
        if r.physical_gpu is None:
            failure = Failure("init", r.rank, "torch.AcceleratorError: CUDA error: invalid device ordinal\n"
                              "CUDA kernel errors might be asynchronously reported at some other API call, "
                              "so the stacktrace below might be incorrect.")
            break
    if failure is None:
        for r in ranks:
            if r.avail_before * 0.9 > p:
                failure = Failure("init", r.rank, (
                    "ValueError: The memory capacity is unbalanced. Some GPUs may be occupied by other "
                    f"processes. min_per_gpu_memory={p / GIB:.2f}, "
                    f"local_gpu_memory={r.avail_before / GIB:.2f}, "
                    f"local_gpu_memory * 0.9={r.avail_before * 0.9 / GIB:.2f}"))
                break
    if failure is None and weights > p:
        r0 = min(ranks, key=lambda r: r.avail_before)
        failure = Failure("weights", r0.rank, torch_oom(min(weights, 2 * GIB) + weights - p, r0, p))

    rest = int(frac * p) - weights
    mamba_bytes = 0
    mamba_slots = 0
    if model.hybrid and model.mamba_slot_bytes and rest > 0:
        mamba_bytes = int(rest * 0.47)
        mamba_slots = mamba_bytes // model.mamba_slot_bytes
        mamba_bytes = mamba_slots * model.mamba_slot_bytes
        rest -= mamba_bytes
    tokens = max(0, rest) // cell
    if s.max_total_tokens is not None and s.max_total_tokens < tokens:
        tokens = max(0, s.max_total_tokens)  # 0 too: 0.5.23 caps first, then finds the pool empty
    kv_pool = tokens * cell
    if failure is None and (rest <= 0 or tokens <= 0):
        failure = Failure("kv", 0, "RuntimeError: Not enough memory. Please try to increase "
                                   "--mem-fraction-static.")
    max_running = max_running_requests(s, tokens, context_len)
    if model.hybrid and model.mamba_slot_bytes:
        per_req = 3 if s.mamba_strategy.startswith("extra_buffer") else 1
        if failure is None and s.max_running_requests is not None and max_running * per_req > mamba_slots:
            failure = Failure("mamba", 0, "RuntimeError: Not enough GPU memory for hybrid "
                                          "(mamba/linear-attention) state cache. Reduce "
                                          "--max-running-requests or increase --mem-fraction-static.")
        max_running = max(1, min(max_running, mamba_slots // per_req))
    req_to_token = max_running * (context_len + 4) * 4
    sizes: tuple[int, ...] = () if s.disable_cuda_graph else graph_batch_sizes(graph_bs)
    graph = 0
    if sizes:
        graph = int(graph_bs * graph_mib_per_bs * MIB) + 64 * MIB
        if s.speculative_algorithm:
            graph *= 2
    plan = EnginePlan(
        settings=s, model=model, ranks=tuple(ranks), mem_fraction_static=frac,
        chunked_prefill_size=chunked, cuda_graph_max_bs=graph_bs, weights_per_rank=weights,
        kv_bytes_per_token=cell, kv_pool_bytes=kv_pool, max_total_num_tokens=tokens,
        max_running_requests=max_running, max_mamba_cache_size=mamba_slots, mamba_bytes=mamba_bytes,
        req_to_token_bytes=req_to_token, graph_bytes=graph, graph_batch_sizes=sizes,
        context_len=context_len)
    # Activations and workspace need about this much besides the graphs.
    margin = 256 * MIB + chunked * 16 * 1024
    if failure is None and sizes and plan.avail_after_graph < margin:
        want = graph - max(0, plan.avail_after_pool - margin) + GIB // 4
        r0 = plan.ranks[0]
        failure = Failure("graph", 0, "Exception: " + graph_oom_text(want, r0, plan.avail_after_pool))
    if failure is not None:
        plan = replace(plan, failure=failure)
    return plan


def max_running_requests(s: EngineSettings, tokens: int, context_len: int) -> int:
    """0.5.23's mem_cache/kv_cache_configurator.py resolve_max_num_reqs: never more requests than
    half the pool's tokens (16 tokens: 8 requests, kv-below-context.log)."""
    if s.max_running_requests is not None:
        return max(1, min(s.max_running_requests, tokens // 2)) if tokens else s.max_running_requests
    estimated = min(max(int(tokens / max(1, context_len) * 512), 2048), 4096)
    return min(estimated, tokens // 2) if tokens else estimated


def plan_cpu(s: EngineSettings, model: ModelInfo, avail_bytes: int) -> EnginePlan:
    """A --device cpu start (0.5.23 on the CPU build of torch): memory is the host's RAM
    (psutil's available, utils/common.py get_available_gpu_memory), the static "memory baseline" is 0
    so the pool may take all of it (mem_fraction_static leaves no slack), chunked prefill 4096 (the
    default without a GPU size, arg_groups/memory_hook.py), CUDA graphs off. Measured: the real
    server's lines in tests/verify/data/sglang-0.5.23-cpu/normal.log."""
    context_len = s.context_length or model.context_len
    ranks = tuple(RankPlan(r, r, None, avail_bytes, avail_bytes) for r in range(s.tp))
    weights = model.weights_bytes // max(1, s.tp * s.pp)
    cell = model.kv_bytes_per_token or 65536
    rest = avail_bytes - weights
    tokens = max(0, rest) // cell
    if s.max_total_tokens is not None and s.max_total_tokens < tokens:
        tokens = max(0, s.max_total_tokens)
    failure = None
    if tokens <= 0:
        failure = Failure("kv", 0, "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.")
    max_running = max_running_requests(s, tokens, context_len)
    return EnginePlan(
        settings=s, model=model, ranks=ranks,
        mem_fraction_static=s.mem_fraction_static if s.mem_fraction_static is not None else 0.8,
        chunked_prefill_size=s.chunked_prefill_size if s.chunked_prefill_size is not None else 4096,
        cuda_graph_max_bs=0, weights_per_rank=weights, kv_bytes_per_token=cell, kv_pool_bytes=tokens * cell,
        max_total_num_tokens=tokens, max_running_requests=max_running, max_mamba_cache_size=0, mamba_bytes=0,
        req_to_token_bytes=max_running * (context_len + 4) * 4, graph_bytes=0, graph_batch_sizes=(),
        context_len=context_len, failure=failure, device="cpu")


def torch_capacity(total_bytes: int) -> int:
    return total_bytes - NVML_BASELINE_BYTES


def torch_oom(want: int, r: RankPlan, free: int) -> str:
    """The torch OOM text for rank ``r`` wanting ``want`` more bytes with ``free`` left."""
    cap = torch_capacity(r.total_bytes)
    free = max(0, min(free, cap))
    in_use = cap - free
    return (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {want / GIB:.2f} GiB. "
            f"GPU {r.local_device} has a total capacity of {cap / GIB:.2f} GiB of which "
            f"{free / GIB:.2f} GiB is free. Including non-PyTorch memory, this process has "
            f"{in_use / GIB:.2f} GiB memory in use. Of the allocated memory {in_use * 0.97 / GIB:.2f} GiB "
            f"is allocated by PyTorch, and {in_use * 0.02 / GIB:.2f} GiB is reserved by PyTorch but "
            "unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation "
            "for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


GRAPH_HINTS = (
    "Possible solutions:\n"
    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
    "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)\n"
    "3. disable torch compile by not using --enable-torch-compile\n"
    "4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)\n"
    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n"
)


def graph_oom_text(want: int, r: RankPlan, free: int) -> str:
    oom = torch_oom(want, r, free).removeprefix("torch.OutOfMemoryError: ")
    return f"Capture cuda graph failed: {oom}\n{GRAPH_HINTS}"
