"""CUDA-graph memory of one SGLang rank, term by term, as SGLang captures (GiB).

SGLang captures decode graphs largest batch first into ONE shared memory pool, so temporaries
are reused: what a capture costs is (measured on an H200, tests/memory/data/, made by
bench/device_graphs.py; "mem usage" = free before - free after, as SGLang logs it):

  first_use      kernels and library handles loaded by the first capture of a cold process:
                 0.138 GiB (0.132-0.141 over 18 configurations)
  graph_exec     driver memory of the instantiated graphs: graphs x layers x 77 KB for a dense
                 layer, 105 KB for a MoE layer (64-92 KB and 101-106 KB measured)
  input_buffers  exact: max_tokens x (vocab x 4 B, the fp32 next_token_logits_buffer every graph
                 copies its logits into, + hidden x 2 B + 48 B of ids/positions/locations)
  attn_metadata  exact: FA3 (and flashinfer) keep page tables of max_bs x context x 4 B: one for
                 decode, +1 for chunked local attention, +3 with speculative decoding
                 (draft decode, target verify, draft extend)
  pool           0.07 GiB + 1.3 x the largest live activation set of one step at max_tokens:
                 max(logits: tokens x vocab x 2 B x (1 + 1/tp), one layer's temporaries)
                 (1.3 = median of pool / live bytes, 0.94-1.74 measured)
  per_graph      before 0.4.10: every graph's own fp32 logits (sum of captured sizes x vocab x 4 B)
                 and, with the FA3 backend before sglang PR #8567, its own page-table copy (bs x
                 context x 4 B: ``page_table[req_pool_indices, :]`` in 0.4.6's
                 ``init_forward_metadata_capture_cuda_graph``, outside the graph pool, kept per bs);
                 flashinfer, 0.4.5's default and 0.4.6 - 0.4.9's for most models, keeps one
                 ``max_bs x context`` index buffer, which is attn_metadata above
  comm           TP > 1: NCCL allocates a channel's buffers (its defaults: 4 MiB SIMPLE + 4.7 MiB
                 LL128 + 0.5 MiB LL per connection) when a collective first runs on it, and in SGLang
                 that is the capture's warm-up; the connections grow with the peers. Fitted: 0.07 GiB
                 per peer rank (about 8 connections each) on the two public logs at TP > 1 (TP8
                 sgl-project/sglang#8538: 6.19 GB, the other terms 5.60; TP4 PR #8567: 5.16 and
                 3.22 GB, the other terms 5.07 and 3.00), +-50 %. Custom all-reduce's own buffers
                 (three of max_size = 8 MiB, custom_all_reduce.py) are allocated before the weights
                 load, so they are part of the free memory before load, not of this

The graph count and the layer count barely matter (4 vs 80 layers of a Llama-70B TP8 shard:
0.91 vs 1.20 GiB cold, all of the difference graph_exec); what each graph keeps alive on its own
does, which is why the pre-0.5 releases used 3-6 GiB where 0.5.x uses about 1.

The capture's peak is higher than what stays: one eager warm-up of the largest batch runs while
the pool already holds the previous graphs, so the peak is about usage + pool (measured:
peak - usage = 0.9-1.3 x pool).

Error: over the 17 device configurations the sum is within 0.09 GiB or 13 % (the MoE prefill one
is left out: the emulation materialises each token's top-k copies, which SGLang's fused MoE never
does); against the public SGLang logs with a measured "Capture cuda graph end ... mem usage" line
(tests/memory/cases.yaml, "graph_cases") it is 2-15 % low. :data:`REL_ERROR` and
:data:`ABS_ERROR_GIB` state the band the preflight uses. Configurations neither covers (DP
attention, DeepEP, torch.compile, LoRA) get :data:`UNGROUNDED_REL_ERROR`: a shortfall predicted
for them only warns.
"""

from __future__ import annotations

from dataclasses import dataclass

from .modelfacts import GIB, ModelFacts
from .releases import Release

FIRST_USE_GIB = 0.138
EXEC_BYTES_DENSE_LAYER = 77 * 1024
EXEC_BYTES_MOE_LAYER = 105 * 1024
POOL_FIXED_GIB = 0.07
POOL_FACTOR = 1.3
REL_ERROR = 0.25          # the band: 16 % worst seen on public logs, 12 % on the device, rounded up
ABS_ERROR_GIB = 0.5
UNGROUNDED_REL_ERROR = 2.0
COMM_GIB_PER_PEER = 0.07  # TP > 1, fitted on sglang#8538 and PR #8567 (see above)
COMM_REL_ERROR = 0.5


@dataclass(frozen=True)
class Capture:
    """One family of captured graphs (decode, target verify, draft, prefill)."""

    sizes: tuple[int, ...]        # captured batch sizes (prefill: token counts)
    tokens_per_size: int = 1      # tokens per batch entry (verify: draft tokens; draft: topk)
    layers: int = 0               # layers in the captured forward
    logits_rows_per_size: int = 1  # rows of logits per batch entry (prefill: 1 per graph)
    metadata_tables: int = 1      # page tables of max_bs x context
    prefill: bool = False
    # when set: bytes the attention backend keeps per captured request and context position, which
    # replaces the page tables (the speculative families' kv indices and masks, :mod:`.speculative`)
    metadata_row_bytes: int = 0

    @property
    def max_tokens(self) -> int:
        return max(self.sizes) * self.tokens_per_size if self.sizes else 0


@dataclass(frozen=True)
class GraphMemory:
    """Predicted memory of one capture family, by term (GiB), and its peak during capture."""

    first_use: float
    graph_exec: float
    input_buffers: float
    attn_metadata: float
    pool: float
    per_graph: float
    comm: float = 0.0

    @property
    def usage(self) -> float:
        return (self.first_use + self.graph_exec + self.input_buffers + self.attn_metadata
                + self.pool + self.per_graph + self.comm)

    @property
    def peak_extra(self) -> float:
        """What the capture needs above ``usage`` while it runs (one eager warm-up step)."""
        return self.pool

    def to_json(self) -> dict[str, float]:
        return {k: round(getattr(self, k), 3) for k in
                ("first_use", "graph_exec", "input_buffers", "attn_metadata", "pool", "per_graph", "comm",
                 "usage")}


def layer_live_bytes(model: ModelFacts, tp: int, tokens: int) -> float:
    """One layer's temporaries at ``tokens`` (SGLang's fused kernels: qkv, gate_up, fused-MoE caches)."""
    h = model.hidden_size
    heads_dim = max(1, model.kv_heads // tp) * max(1, model.head_dim) if model.kind != "mla" else 0
    qkv = 2 * (h // tp + 2 * heads_dim)
    if model.num_experts_per_tok and model.moe_intermediate_size:
        k, width = model.num_experts_per_tok, model.moe_intermediate_size // tp
        mlp = 2 * k * (h + 3 * width)
    else:
        mlp = 2 * 3 * (model.intermediate_size or 4 * h) // tp
    return tokens * (2 * 2 * h + qkv + mlp)


def logits_live_bytes(model: ModelFacts, tp: int, rows: int) -> float:
    """The lm_head shard's bf16 output and its all-gather over the full vocabulary."""
    return rows * 2 * model.vocab_size * (1 + 1 / tp)


def comm_gib(tp: int) -> float:
    """NCCL's channel buffers connected during the first capture at TP > 1 (see the module docstring)."""
    return COMM_GIB_PER_PEER * (min(tp, 8) - 1) if tp > 1 else 0.0


def capture_memory(model: ModelFacts, tp: int, context_len: int, cap: Capture, release: Release,
                   *, first: bool = True, moe_layers: bool | None = None,
                   page_table_per_graph: bool | None = None) -> GraphMemory:
    """Memory of one capture family on one GPU; ``first`` adds the cold-process cost (the first family
    only); ``page_table_per_graph`` (default: the release's rule) is FA3's copy per graph. NCCL's
    buffers at TP > 1 (:func:`comm_gib`) are the caller's to add: this is what one GPU captures."""
    if not cap.sizes:
        return GraphMemory(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    per_graph_table = release.per_graph_page_table if page_table_per_graph is None else page_table_per_graph
    moe = bool(model.num_experts_per_tok) if moe_layers is None else moe_layers
    layers = cap.layers or model.layers
    n = len(cap.sizes)
    tokens = cap.max_tokens
    rows = max(cap.sizes) * cap.logits_rows_per_size if not cap.prefill else cap.logits_rows_per_size
    per_layer = EXEC_BYTES_MOE_LAYER if moe else EXEC_BYTES_DENSE_LAYER
    graph_exec = n * layers * per_layer / GIB
    logits_buf = rows * model.vocab_size * 4 if release.shared_logits_buffer else 0
    input_buffers = (logits_buf + tokens * (2 * model.hidden_size + 48)) / GIB
    metadata_rows = 1 if cap.prefill else max(cap.sizes)
    if cap.metadata_row_bytes:
        attn_metadata = metadata_rows * context_len * cap.metadata_row_bytes / GIB
    else:
        attn_metadata = cap.metadata_tables * metadata_rows * context_len * 4 / GIB
    live = max(logits_live_bytes(model, tp, rows), layer_live_bytes(model, tp, tokens))
    pool = POOL_FIXED_GIB + POOL_FACTOR * live / GIB
    per_graph = 0.0
    if not cap.prefill:
        total_rows = sum(cap.sizes) * cap.logits_rows_per_size
        if not release.shared_logits_buffer:
            per_graph += total_rows * model.vocab_size * 4 / GIB
        if per_graph_table and cap.metadata_tables:
            # the decode page table's per-batch-size slice (sglang PR #8567 made it a view)
            per_graph += sum(cap.sizes) * context_len * 4 / GIB
    return GraphMemory(FIRST_USE_GIB if first else 0.0, graph_exec, input_buffers, attn_metadata, pool,
                       per_graph)


def error_band(graphs_gib: float, grounded: bool, comm: float = 0.0) -> float:
    """How far the graph term can be off (GiB), from its measured error (``comm``: its NCCL part)."""
    rel = REL_ERROR if grounded else UNGROUNDED_REL_ERROR
    return max(ABS_ERROR_GIB, rel * (graphs_gib - comm)) + COMM_REL_ERROR * comm
