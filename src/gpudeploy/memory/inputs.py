"""What the estimate knows and what it assumes: each input, grounded or assumed, and its share of
the error band (GiB of headroom).

Grounded: read from the model's config.json, a release whose rules were read from its wheel, a
measurement (a previous run's log, NVML at deploy). Assumed: a shape given as a guess or left to
defaults, a model kind the terms were not fitted on, speculative decoding's draft and verify graphs
of a guessed shape or an unread release, a vision tower, DP attention, a release whose rules were not
read, the free memory of a GPU class.

The widths come from the misses seen where such an input was in play:

* shape assumed: :data:`SHAPE_SHARE_OF_WEIGHTS` x the per-rank weights. The field's TP4 FP8 MoE (its
  shape guessed as DeepSeek-V3's) died in graph capture at 0.85 with 14.0 GiB of headroom where the
  terms add to 4.6 GiB: >= 9.4 GiB unexplained, 0.28 x its 33.4 GiB per rank; Kimi-K2 at DP32
  (sgl-project/sglang#24453) logged "~20 GB" of graphs where the terms, SGLang's own DP-attention
  reserve included, give 12.5 GiB: 7.5 GiB, 0.21 x its ~35 GiB per rank.
* speculative decoding, where its graphs are not the release's own arithmetic (a guessed model
  shape, whose draft is guessed with it, or a release outside the wheels read,
  :mod:`.speculative`): :data:`SPEC_GIB_PER_VERIFY_TOKEN` per token of the largest verify graph
  (captured batch x draft tokens), at most :data:`SPEC_SHARE_OF_FREE` of the free memory. The field's
  MTP run at 0.70 ("Tried to allocate 7.50 GiB. GPU 1 has a total capacity of 94.97 GiB of which
  2.30 GiB is free") held 27.2 GiB beyond its static memory and wanted 7.5 more: >= 34.7 GiB of
  headroom where SGLang's own arithmetic for the DeepSeek-V3 shape it was guessed as gives 4-7 GiB
  (0.5.9 - 0.5.23: verify and draft graphs of 48 x 2 tokens, their kv indices and masks, the draft's
  weights and KV), 30 GiB unexplained: what that arithmetic cannot see is the model's real shape.
  Less the shape's share (10 GiB, above) that is 20 GiB over its 48 x 2 verify tokens. The same model
  booted at 0.60 with graphs capped at bs 16 (32 tokens: 6.7 GiB by this rate, inside its 37 GiB of
  headroom). With the shape read from config.json and a release read, the speculative graphs are
  grounded and only the graph terms' measured error applies.
* a vision tower: SGLang's own allowance for image processing, 5 % of the free memory (the 0.95 of
  ``adjust_mem_fraction_for_vlm``); sgl-project/sglang#7693 ran out of memory serving images.
* DP attention, DeepEP, torch.compile, LoRA: the graph terms x2 (:data:`.graphs.UNGROUNDED_REL_ERROR`).
* release rules not read, between two read ones: how far the two read releases either side move the
  headroom need for these very settings (the one below's rules are the unread one's), at least
  :data:`RELEASE_DRIFT_FLOOR_GIB`. Where no read release is above (newer than 0.5.23) or below (older
  than 0.4.5): :data:`RELEASE_DRIFT_GIB`, the largest change of the headroom need between two
  neighbouring checked releases over the validation table's cases: 7.75 GiB for Nemotron-3-Super with
  MTP between 0.5.10 and 0.5.23 (the draft's KV pool of 16M tokens and its weights moved from the
  headroom into the static memory), 3.54 GiB for the field's MoE between 0.5.9 and 0.5.10 (piecewise
  prefill graphs), 3.44 GiB for Kimi-K2 between 0.5.10 and 0.5.23 (DeepEP's reserve, prefill graphs);
  tests/memory asserts it still covers them.
* free memory before load at plan time: the GPU class's range (:mod:`.gpuclass`).

A measured graph figure from a previous run of these settings grounds the shape and speculative
shares (what they guessed is then known); a floor from an OOM replaces as much of them as it proves.
A verdict inside the band is "uncertain" only when the assumed shares make the band wide: at least
1 GiB and at least as wide as the measured error of the terms themselves (:data:`WIDE_GIB`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SHAPE_SHARE_OF_WEIGHTS = 0.3
SPEC_GIB_PER_VERIFY_TOKEN = 0.21
SPEC_SHARE_OF_FREE = 0.3
MULTIMODAL_SHARE_OF_FREE = 0.05
RELEASE_DRIFT_GIB = 7.8
RELEASE_DRIFT_FLOOR_GIB = 0.5
WIDE_GIB = 1.0


@dataclass(frozen=True)
class Input:
    """One input of the estimate."""

    name: str                 # "model shape", "speculative graphs", "free memory before load", ...
    grounded: bool
    source: str               # where it came from
    band_gib: float = 0.0     # how far it can move the headroom need (0 when grounded)
    certain_by: str = ""      # what would make it certain

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "grounded": self.grounded, "source": self.source,
                "band_gib": round(self.band_gib, 3), "certain_by": self.certain_by}


def assumed(inputs: tuple[Input, ...]) -> tuple[Input, ...]:
    return tuple(i for i in inputs if not i.grounded)


def band_of(inputs: tuple[Input, ...]) -> float:
    return sum(i.band_gib for i in inputs)


def describe(inputs: tuple[Input, ...]) -> str:
    """One sentence: what is assumed, and what would make each certain."""
    parts = [f"{i.name} ({i.source}; +-{i.band_gib:.1f} GiB; certain with {i.certain_by})"
             for i in assumed(inputs) if i.band_gib >= 0.05]
    return "; ".join(parts)
