"""What SGLang does with memory, per release range: the rules the memory preflight follows.

Read from SGLang's released wheels (0.4.5, 0.4.6.post5, 0.4.7, 0.4.8, 0.4.9.post6, 0.4.10.post2,
0.5.1, 0.5.2, 0.5.3, 0.5.9, 0.5.10, 0.5.23: :data:`CHECKED`) and sglang PR #8567. A release between
two of them follows the rules of the one below it, and says so (its rules are then an assumed input
of the estimate, :mod:`.inputs`). Each rule names where it lives:

* default ``mem_fraction_static`` (``server_args.__post_init__`` / ``_handle_gpu_memory_settings``,
  ``arg_groups/memory_hook.py`` in 0.5.23), three eras:
  - ``tp-table`` (<= 0.4.7): 0.79 / 0.81 / 0.85 / 0.87 / 0.88 for TP >= 16 / 8 / 4 / 2 / 1 on GPUs up to
    81920 MiB, else 0.88; over 96 GiB raised to min(f + 48 GiB (1 - f) / C, (C - 18 GiB) / C) (0.4.7:
    20 GiB with speculative decoding, 0.79 over 180 000 MB, and x 0.95 with speculative decoding on
    smaller GPUs);
  - ``class-table`` (0.4.8 - 0.5.2): (C - reserved) / C with reserved by GPU class: (2.8 + TP/10) GiB
    under 35 GiB, (9.5 + TP/2) under 90, (12 + TP/2) under 160, else 32 GiB; + 2 GiB speculative
    (STANDALONE 6 GiB from 0.5.2), + 4 GiB DP attention;
  - ``formula`` (0.5.3 on): reserved = 512 + max(chunk, 2048) x 1.5 + max_bs x 2 + TP/8 x 1024 MiB (+ DP
    attention padding), at least 10 GiB over 60 GiB; speculative +2048 (STANDALONE +6144) to 0.5.9, +4096 /
    +6144 in 0.5.10, none in 0.5.23; 0.5.10 adds 8 MiB per piecewise size (1.5 GiB for MLA), 0.5.23 the same
    for prefill graphs, 2 GiB for DeepEP, and a PD decode server sizes activations by running x draft tokens.
* multimodal models (``is_multimodal``): 0.4.5 - 0.4.7 multiply ANY fraction by 0.90 (model_runner);
  0.4.8 nothing; from 0.4.9 the default fraction only, by 0.95 x a ViT factor (``adjust_mem_fraction_for_vlm``:
  1 - 0.1 (L x H^2 / (24 x 1024^2) - 1), clamped to 0.8 - 1.05; 0.5.23 not on a PD decode server).
* GPU tiers: chunked_prefill_size and the decode cuda_graph_max_bs by GPU memory and TP; before 0.5.3
  no max_bs default above 25/35 GiB, the capture list stops at 160 (+ 160-256 over 96 GiB, over 90 GiB
  from 0.4.8, + 256-512 over 160 000 MB from 0.4.8).
* EAGLE defaults (``auto_choose_speculative_params``): (steps, topk, draft tokens) = (5, 4, 8) for every
  model to 0.4.9; 0.4.10 (3, 1, 4) for DeepSeek V2/V3; from 0.5 (5, 4, 8) for Llama only, (3, 1, 4) else;
  EAGLE/STANDALONE/NGRAM set max_running_requests to 48 when it is not given (all ranges).
* capture batch sizes: 0.5.10 and 0.5.23 append max_bs; the runner drops sizes above the request pool.
* attention backend: 0.4.6 - 0.4.9 pick FA3 on Hopper for Llama, Llama 4, Qwen2/3, Gemma 2/3 and MLA
  models (no speculative decoding or topk 1), flashinfer else; before PR #8567 (after 0.4.9.post6) FA3
  copied a page table of bs x context per captured graph, the others keep one of max_bs x context.
* before 0.4.10 every captured graph kept its own fp32 logits (0.4.10 adds ``next_token_logits_buffer``).
* draft weights: up to 0.5.10 the draft worker is built after the target sized its KV pool, so its
  weights come out of the headroom; 0.5.23 counts them as static memory (kv_cache_configurator.py).
* mamba state (:mod:`.hybrid`, with file:line per release): the speculative intermediate states off
  the top to 0.5.12, solved together with the slots from 0.5.13, with a padding slot from 0.5.17;
  ``auto`` becomes extra_buffer from 0.5.14; no_buffer + speculative + radix cache refused to 0.5.13.
  Slots per request: 3, +2 extra_buffer with the overlap scheduler, +1 without it (speculative
  decoding turns overlap off to 0.5.10; spec v2, the default from 0.5.11, keeps it), +1 extra_buffer_lazy.

A release between two checked ones takes the rules below it, except the terms :data:`MOVES` names:
those were read from every wheel 0.5.9 - 0.5.23 and are exact for it (``Release.read_terms``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

# (GPU memory below this many MiB, chunked_prefill_size, max_bs for tp < 4, max_bs for tp >= 4);
# max_bs 0 = no default: the capture list's own end (160, or 256/512 on big GPUs)
Tier = tuple[float, int, int, int]
_TIERS_046: tuple[Tier, ...] = ((25_000, 2048, 8, 80), (float("inf"), 8192, 0, 0))
_TIERS_048: tuple[Tier, ...] = ((35 * 1024, 2048, 8, 80), (160 * 1024, 8192, 0, 0), (float("inf"), 16384, 0, 0))
_TIERS_059: tuple[Tier, ...] = (
    (20 * 1024, 2048, 8, 8), (35 * 1024, 2048, 24, 80), (60 * 1024, 4096, 32, 160),
    (160 * 1024, 8192, 256, 512), (float("inf"), 16384, 512, 512))
_TIERS_0523: tuple[Tier, ...] = (
    (20 * 1024, 2048, 8, 8), (35 * 1024, 4096, 48, 160), (60 * 1024, 4096, 32, 160),
    (160 * 1024, 8192, 256, 512), (float("inf"), 16384, 512, 512))


@dataclass(frozen=True)
class Release:
    """One release range's memory rules (see the module docstring for the sources)."""

    name: str
    tiers: tuple[Tier, ...]
    fraction_rule: str                    # "tp-table" | "class-table" | "formula"
    multimodal_rule: str                  # "times-0.9" | "none" | "vit"
    spec_params: str                      # "all-548" | "deepseek-314" | "llama-548"
    capture_list: str                     # "to-160" (<= 0.4.7) | "to-160-big" (0.4.8 - 0.5.2) | "tiered"
    eagle_reserve_mib: int
    standalone_reserve_mib: int
    append_max_bs: bool                   # the capture list always ends at max_bs
    prefill_graphs: str                   # "none" | "piecewise" (0.5.10) | "breakable" (0.5.23)
    deepep_reserve: bool                  # 0.5.23 reserves 2 GiB for DeepEP buffers
    cap_decode_bs_at_running: bool        # 0.5.23: default max_bs <= a given max_running_requests
    draft_weights_static: bool            # draft weights counted before the KV pool is sized
    spec_keeps_overlap: bool              # speculative decoding keeps the overlap scheduler
    shared_logits_buffer: bool            # graphs copy logits into one persistent buffer
    per_graph_page_table: bool            # FA3 kept a page-table copy per captured graph
    fa3_default: bool = False             # 0.4.6 - 0.4.9: FA3 by default on Hopper for some models
    spec_tp_table_adjust: bool = False    # 0.4.7's speculative tweaks of the tp-table fraction
    mamba_sizing: str = "off-top"         # "off-top" (<= 0.5.12) | "joint" (0.5.13-0.5.16) | "joint-padded"
    lazy_strategy: bool = False           # extra_buffer_lazy exists (0.5.13 on)
    auto_extra_buffer: bool = False       # mamba strategy auto becomes extra_buffer (0.5.14 on)
    # no_buffer + speculative + radix cache: "radix-off" (0.5.9 turns it off), "refused" (0.5.10 - 0.5.13),
    # "kept" (0.5.14 on: 3 slots per request)
    spec_no_buffer: str = "radix-off"
    checked: bool = True                  # read from this release's own wheel
    checked_as: str = ""                  # the checked release whose rules an unchecked one borrows
    read_terms: tuple[str, ...] = ()      # an unchecked release's terms read from its own wheel (MOVES)

    @property
    def legacy_capture_list(self) -> bool:
        """Before 0.5.3 the decode capture list was fixed (to 160, more on big GPUs)."""
        return self.capture_list != "tiered"

    def tier(self, gpu_mib: float, tp: int) -> tuple[int, int]:
        """(chunked_prefill_size, decode cuda_graph_max_bs or 0 for none) for a GPU of this size."""
        for below, chunk, small, large in self.tiers:
            if gpu_mib < below:
                return chunk, small if tp < 4 else large
        raise AssertionError("the last tier is unbounded")


_OLD = dict(eagle_reserve_mib=2048, standalone_reserve_mib=6144, append_max_bs=False, prefill_graphs="none",
            deepep_reserve=False, cap_decode_bs_at_running=False, draft_weights_static=False,
            spec_keeps_overlap=False)
R045 = Release("0.4.5", _TIERS_046, "tp-table", "times-0.9", "all-548", "to-160", shared_logits_buffer=False,
               per_graph_page_table=True, **_OLD)  # type: ignore[arg-type]
R046 = replace(R045, name="0.4.6", fa3_default=True)
R047 = replace(R046, name="0.4.7", spec_tp_table_adjust=True)
R048 = replace(R047, name="0.4.8", tiers=_TIERS_048, fraction_rule="class-table", multimodal_rule="none",
               capture_list="to-160-big", spec_tp_table_adjust=False)
R049 = replace(R048, name="0.4.9", multimodal_rule="vit")
# sglang PR #8567 (2025-07-30, after 0.4.9.post6): FA3's per-graph page table becomes a view; the
# logits stay per graph at that commit, which is where the PR measured its "after" figure
PR8567 = replace(R049, name="0.4.9+pr8567", per_graph_page_table=False, checked_as="0.4.9")
R0410 = replace(R049, name="0.4.10", spec_params="deepseek-314", shared_logits_buffer=True,
                per_graph_page_table=False, fa3_default=False)
R051 = replace(R0410, name="0.5.1", spec_params="llama-548")
R052 = replace(R051, name="0.5.2")
R053 = Release("0.5.3", _TIERS_059, "formula", "vit", "llama-548", "tiered", shared_logits_buffer=True,
               per_graph_page_table=False, **_OLD)  # type: ignore[arg-type]
R059 = replace(R053, name="0.5.9")
R0510 = replace(R059, name="0.5.10", eagle_reserve_mib=4096, append_max_bs=True, prefill_graphs="piecewise",
                spec_no_buffer="refused")
R0523 = Release("0.5.23", _TIERS_0523, "formula", "vit", "llama-548", "tiered", eagle_reserve_mib=0,
                standalone_reserve_mib=0, append_max_bs=True, prefill_graphs="breakable", deepep_reserve=True,
                cap_decode_bs_at_running=True, draft_weights_static=True, spec_keeps_overlap=True,
                shared_logits_buffer=True, per_graph_page_table=False, mamba_sizing="joint-padded",
                lazy_strategy=True, auto_extra_buffer=True, spec_no_buffer="kept")
CHECKED = (R045, R046, R047, R048, R049, R0410, R051, R052, R053, R059, R0510, R0523)
RELEASES = {r.name: r for r in (*CHECKED, PR8567)}
# the names the validation table used before these eras were read ("0.4": before PR #8567)
ALIASES = {"0.4": "0.4.7", "0.4.10-pre": "0.4.9+pr8567"}


# Terms read from every wheel 0.5.9 - 0.5.23 (file:line in :mod:`.hybrid` and below): the first release
# with each value. A release between two checked ones gets these exactly, whatever it borrows else.
MOVES: tuple[tuple[tuple[int, ...], str, dict[str, object]], ...] = (
    # spec v2 by default (0.5.11 environ.py:459): speculative decoding keeps the overlap scheduler
    ((0, 5, 11), "speculative overlap", {"spec_keeps_overlap": True}),
    # 0.5.13 model_runner_kv_cache_mixin.py:82-170: slots and intermediate states solved together
    ((0, 5, 13), "mamba state", {"mamba_sizing": "joint", "lazy_strategy": True}),
    # 0.5.14: draft weights and draft KV are static memory (model_runner_kv_cache_mixin.py:102,
    # pool_configurator.py:136); auto -> extra_buffer (server_args.py:4385); no_buffer + spec allowed
    ((0, 5, 14), "draft weights and mamba strategy", {"draft_weights_static": True, "auto_extra_buffer": True,
                                                     "spec_no_buffer": "kept"}),
    # 0.5.17 mem_cache/kv_cache_configurator.py:1816-1960: each pool's padding slot
    ((0, 5, 17), "mamba padding slot", {"mamba_sizing": "joint-padded"}),
)


def version_key(version: str) -> tuple[int, ...]:
    """The leading numeric release: 0.5.9-cu128 and 0.5.9+cu128 are (0, 5, 9), never 0.5.9128
    (stdlib only: the same reading as ``gpudeploy.versions.release_tuple``'s fallback)."""
    m = re.match(r"v?(\d+(?:\.\d+){0,2})", version.strip().lower())
    return tuple(int(x) for x in m.group(1).split(".")) if m else ()


def checked_above(rel: Release) -> Release | None:
    """The first checked release above an unread one (None for a checked one, or past the newest)."""
    if rel.checked or not rel.checked_as:
        return None
    key = version_key(rel.name)
    if key < version_key(CHECKED[0].name):
        return None                      # older than any wheel read: nothing either side
    return next((r for r in CHECKED if version_key(r.name) > key), None)


def release_rules(version: str | None) -> Release:
    """The rules of ``version``: its own when its wheel was read, else the newest checked release
    below it (or the oldest, for anything older), marked ``checked=False`` with ``checked_as``.

    None means the newest checked release."""
    if not version:
        return R0523
    if version in RELEASES:
        return RELEASES[version]
    if version in ALIASES:
        return RELEASES[ALIASES[version]]
    key = version_key(version)
    below = [r for r in CHECKED if version_key(r.name) <= key]
    base = below[-1] if below else CHECKED[0]
    if version_key(base.name) == key:        # 0.5.9.post1, 0.4.6.post5: the release the wheel was
        return base
    moved: dict[str, object] = {}
    read: list[str] = []
    if version_key(base.name) >= (0, 5, 9) and key <= (0, 5, 23):   # read from every wheel between
        for since, term, fields in MOVES:
            if version_key(base.name) < since <= key:
                moved.update(fields)
            read.append(term)
    return replace(base, name=version, checked=False, checked_as=base.name, read_terms=tuple(read),
                   **moved)  # type: ignore[arg-type]
