"""What SGLang does with memory, per release range: the rules the memory preflight follows.

Read from SGLang's source (wheels of 0.5.9, 0.5.10 and 0.5.23; the pre-0.5 behaviour from the
July-2025 ``cuda_graph_runner.py`` and sglang PR #8567). Each rule names where it lives:

* GPU tiers (``server_args._handle_gpu_memory_settings`` <= 0.5.10, ``arg_groups/memory_hook.py``
  0.5.23): chunked_prefill_size and decode cuda_graph_max_bs by GPU memory and TP.
* default ``mem_fraction_static`` = (C - reserved) / C, reserved in MiB as in that function;
  the speculative reserve is +2048 (EAGLE) / +6144 (STANDALONE) up to 0.5.9, +4096 / +6144 in
  0.5.10 and gone in 0.5.23; 0.5.10 adds 8 MiB per piecewise size (1.5 GiB for MLA), 0.5.23 the
  same for prefill graphs plus 2 GiB for DeepEP.
* capture batch sizes (``_generate_cuda_graph_batch_sizes``): 0.5.10 and 0.5.23 append max_bs;
  the runner drops sizes above the request pool (``get_batch_sizes_to_capture``).
* EAGLE/STANDALONE/NGRAM set max_running_requests to 48 when it is not given (all ranges).
* 0.5.23 caps the default decode max_bs at a given max_running_requests (memory_hook.py).
* prefill graphs: 0.5.10 captures piecewise graphs by default unless speculative decoding, DP
  attention, a MoE all-to-all backend or PD disaggregation turns them off
  (``_handle_piecewise_cuda_graph``); 0.5.23 captures breakable prefill graphs on CUDA except
  on a PD decode server (``cuda_graph_config.default_prefill_backend``,
  ``apply_cuda_graph_disaggregation_roles``), and a PD prefill server captures no decode graphs.
* draft weights: up to 0.5.10 the draft worker is built after the target sized its KV pool, so
  its weights come out of the headroom; 0.5.23 counts them as static memory ("If using
  speculative decoding, draft weights are now counted.", kv_cache_configurator.py).
* mamba state slots per running request: 3, +2 extra_buffer with the overlap scheduler, +1
  without it (speculative decoding turns overlap off up to 0.5.10; 0.5.23's spec v2 keeps it),
  +1 extra_buffer_lazy; SGLang caps running requests to what fits and fails only at 0.
* before 0.5 every captured graph kept its own fp32 logits (no shared next_token_logits_buffer)
  and, before PR #8567, its own slice of FA3's page table.
"""

from __future__ import annotations

from dataclasses import dataclass

# (GPU memory below this many MiB, chunked_prefill_size, max_bs for tp < 4, max_bs for tp >= 4)
Tier = tuple[float, int, int, int]
_TIERS_059: tuple[Tier, ...] = (
    (20 * 1024, 2048, 8, 8), (35 * 1024, 2048, 24, 80), (60 * 1024, 4096, 32, 160),
    (160 * 1024, 8192, 256, 512), (float("inf"), 16384, 512, 512))
# mid-2025 (the July-2025 server_args: "H100, A100 ... cuda_graph_max_bs 160"; H20/H200 256)
_TIERS_04: tuple[Tier, ...] = (
    (20 * 1024, 2048, 8, 8), (35 * 1024, 2048, 24, 80), (60 * 1024, 4096, 32, 160),
    (90 * 1024, 8192, 160, 160), (160 * 1024, 8192, 256, 256), (float("inf"), 16384, 512, 512))
_TIERS_0523: tuple[Tier, ...] = (
    (20 * 1024, 2048, 8, 8), (35 * 1024, 4096, 48, 160), (60 * 1024, 4096, 32, 160),
    (160 * 1024, 8192, 256, 512), (float("inf"), 16384, 512, 512))


@dataclass(frozen=True)
class Release:
    """One release range's memory rules (see the module docstring for the sources)."""

    name: str
    tiers: tuple[Tier, ...]
    eagle_reserve_mib: int
    standalone_reserve_mib: int
    append_max_bs: bool                   # the capture list always ends at max_bs
    prefill_graphs: str                   # "none" | "piecewise" (0.5.10) | "breakable" (0.5.23)
    deepep_reserve: bool                  # 0.5.23 reserves 2 GiB for DeepEP buffers
    cap_decode_bs_at_running: bool        # 0.5.23: default max_bs <= a given max_running_requests
    draft_weights_static: bool            # draft weights counted before the KV pool is sized
    spec_keeps_overlap: bool              # speculative decoding keeps the overlap scheduler
    shared_logits_buffer: bool            # graphs copy logits into one persistent buffer
    per_graph_page_table: bool            # FA3 kept a page-table slice per captured graph

    @property
    def legacy_capture_list(self) -> bool:
        """Before 0.5 the decode list stopped at 160 (256 on GPUs over 96 GiB)."""
        return not self.shared_logits_buffer

    def tier(self, gpu_mib: float, tp: int) -> tuple[int, int]:
        """(chunked_prefill_size, decode cuda_graph_max_bs) for a GPU of this size."""
        for below, chunk, small, large in self.tiers:
            if gpu_mib < below:
                return chunk, small if tp < 4 else large
        raise AssertionError("the last tier is unbounded")


LEGACY = Release("0.4", _TIERS_04, 2048, 6144, False, "none", False, False, False, False, False, True)
# assumed: the first release with PR #8567's shared FA3 page table, logits still per graph
LEGACY_FIXED = Release("0.4.10", _TIERS_04, 2048, 6144, False, "none", False, False, False, False, False, False)
R059 = Release("0.5.9", _TIERS_059, 2048, 6144, False, "none", False, False, False, False, True, False)
R0510 = Release("0.5.10", _TIERS_059, 4096, 6144, True, "piecewise", False, False, False, False, True, False)
R0523 = Release("0.5.23", _TIERS_0523, 0, 0, True, "breakable", True, True, True, True, True, False)
RELEASES = {r.name: r for r in (LEGACY, LEGACY_FIXED, R059, R0510, R0523)}


def _key(version: str) -> tuple[int, ...]:
    parts = []
    for p in version.split("."):
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def release_rules(version: str | None) -> Release:
    """The rules of the newest known range at or below ``version`` (None: the newest)."""
    if not version:
        return R0523
    v = _key(version)
    if v < (0, 4, 10):
        return LEGACY
    if v < (0, 5):
        return LEGACY_FIXED
    if v < (0, 5, 10):
        return R059
    if v < (0, 5, 23):
        return R0510
    return R0523
