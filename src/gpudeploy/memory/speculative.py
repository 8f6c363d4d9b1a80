"""Speculative decoding's CUDA graphs (EAGLE, EAGLE3, MTP/NextN), as the release captures them.

Read from the wheels 0.5.9, 0.5.13, 0.5.17 and 0.5.23 (sglang/srt/..., file:line at the release
named; the index dtypes and widths below were checked in every wheel 0.5.9 - 0.5.23). Three families,
each over the same batch sizes: the decode capture list up to ``cuda_graph_max_bs``, clamped to the
request pool (max_running_requests, 48 when not given), the pool's size added when the list passes
it (0.5.9 model_executor/cuda_graph_runner.py:190-222, 0.5.23
model_executor/runner/base_cuda_graph_runner.py:65-108):

* **target verify** (the target model, ``bs x D`` tokens, D = ``speculative_num_draft_tokens``): the
  target's attention backend is set up once for ``max_bs x D`` tokens.
* **draft decode** (``eagle_draft_cuda_graph_runner.py``: ``topk`` tokens a request, the draft's
  layers run ``speculative_num_steps`` times; 0.5.23 :157-164): the multi-step draft backend keeps one
  KV index row per step of ``max_bs x topk x context`` (``draft_kv_indices_buffer_width``, 0.5.23
  speculative/spec_utils.py:298-309; triton_backend.py:2762-2790, flashinfer_backend.py:2630-2645).
* **draft extend** (``eagle_draft_extend_cuda_graph_runner.py``, the draft model runner's own
  backend): ``steps + 1`` tokens a request up to 0.5.12 (0.5.9 :73), ``D`` from 0.5.13 (0.5.13 :113,
  0.5.23 spec_utils.py:100-103 and the runner's :153-157); its logits buffer has one row a request
  (0.5.23 :249-252).

What each backend keeps per captured request and position of the context (bytes; the context is
the model's, or ``--context-length``):

========== ================================================ =========================== ==================
backend    target verify                                    draft decode (all steps)    draft extend (W)
========== ================================================ =========================== ==================
triton     D x 8 (int64 kv indices) + D x 1 (uint8 mask)    steps x topk x 8            W x 8 (+ W mask
                                                                                        before 0.5.17)
flashinfer D x 4 (int32 kv indices) + D x 1 (custom mask)   steps x topk x 4            W x 5
fa3        4 page tables x 4 (decode, draft decode,         (steps - 1) backends x 4    4 tables x 4
           verify, draft extend), + 1 with local attention  tables x 4
========== ================================================ =========================== ==================

Sources: triton 0.5.23 triton_backend.py:1224-1244 (kv indices, the verify mask
``tree_mask_numel`` FULL_MASK = D x (context + D), layers/attention/verify_mask.py:11-26; 0.5.9 - 0.5.16
a ``cuda_graph_custom_mask`` of tokens x context, 0.5.9 triton_backend.py:467-481); flashinfer 0.5.23
flashinfer_backend.py:1100-1140 (0.5.17 :1007-1037); FA3 0.5.23 flashattention_backend.py:2423-2690
(``decode_cuda_graph_metadata`` with ``page_table_draft_decode``, ``target_verify_metadata``,
``draft_extend_metadata``; the multi-step draft backend builds ``steps - 1`` of them, :3511-3513).

The fixed buffers of the draft runners (0.5.23 eagle_draft_cuda_graph_runner.py:173-224: ids,
positions, ``topk_p``/``topk_index``, the draft's hidden states; ``draft_probs`` of max_bs x vocab fp32
only under rejection sampling, off on CUDA unless asked for, arg_groups/speculative_hook.py:41-60) are
:func:`fixed_buffer_bytes`; triton's split-KV logits (``max_tokens x heads x kv splits x head dim``
fp32) are a few MiB and left out.

Speculative graphs are the release's own arithmetic from 0.5.9 to 0.5.23 (:data:`READ`): their error
is the graph terms' measured error. Outside that range, or with a guessed model shape, they stay an
assumed input of the band (:mod:`.inputs`).
"""

from __future__ import annotations

from .graphs import Capture
from .modelfacts import ModelFacts
from .releases import Release, version_key

READ = ((0, 5, 9), (0, 5, 23))      # the wheels whose speculative graph code was read

# bytes per captured request per context position of the target verify backend, by backend
_VERIFY_ROW_BYTES = {"triton": 9, "flashinfer": 5}
_DRAFT_INDEX_BYTES = {"triton": 8, "flashinfer": 4}
FA3_SPEC_TABLES = 4             # decode, draft decode, target verify, draft extend page tables
PAGE_TABLE_BYTES = 4


def read(rel: Release) -> bool:
    """Whether this release's speculative graph arithmetic was read from its wheel."""
    return READ[0] <= version_key(rel.name) <= READ[1]


def extend_width(rel: Release, steps: int, draft_tokens: int) -> int:
    """Tokens a request of the draft extend graphs: steps + 1 to 0.5.12, the draft tokens from 0.5.13."""
    return draft_tokens if version_key(rel.name) >= (0, 5, 13) else steps + 1


def spec_captures(model: ModelFacts, rel: Release, backend: str, sizes: tuple[int, ...],
                  spec: tuple[int, int, int], draft_layers: int, local_attention: bool) -> dict[str, Capture]:
    """The three captured families of one speculative rank (``verify``, ``draft_decode``, ``draft_extend``)."""
    steps, topk, d = spec
    width = extend_width(rel, steps, d)
    local = 1 if local_attention else 0
    if backend == "fa3":
        verify = Capture(sizes, d, model.layers, d, metadata_tables=FA3_SPEC_TABLES + local)
        decode = Capture(sizes, topk, draft_layers * steps, topk,
                         metadata_tables=FA3_SPEC_TABLES * max(0, steps - 1))
        extend = Capture(sizes, width, draft_layers, 1, metadata_tables=FA3_SPEC_TABLES)
        return {"verify": verify, "draft_decode": decode, "draft_extend": extend}
    name = backend if backend in _VERIFY_ROW_BYTES else "flashinfer"
    verify_row = d * _VERIFY_ROW_BYTES[name] + local * PAGE_TABLE_BYTES
    decode_row = steps * topk * _DRAFT_INDEX_BYTES[name]
    # flashinfer keeps a custom mask in every backend; triton did until 0.5.17 kept it for verify only
    extend_mask = 1 if name == "flashinfer" or version_key(rel.name) < (0, 5, 17) else 0
    extend_row = width * (_DRAFT_INDEX_BYTES[name] + extend_mask)
    return {"verify": Capture(sizes, d, model.layers, d, metadata_row_bytes=verify_row),
            "draft_decode": Capture(sizes, topk, draft_layers * steps, topk, metadata_row_bytes=decode_row),
            "draft_extend": Capture(sizes, width, draft_layers, 1, metadata_row_bytes=extend_row)}


def fixed_buffer_bytes(model: ModelFacts, max_bs: int, spec: tuple[int, int, int]) -> int:
    """The draft runners' own static buffers: hidden states of max_bs x (D + 1) x hidden bf16, and
    per step and branch the ids, positions and cache locations (int64) and top-k scores."""
    steps, topk, d = spec
    return max_bs * ((d + 1) * model.hidden_size * 2 + (steps + 2) * topk * 32)
