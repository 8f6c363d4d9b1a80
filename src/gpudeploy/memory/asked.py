"""The defaults an installed SGLang release gave for one launch on one GPU, asked of the release itself.

Deploy's host probe resolves the release's own ServerArgs with the unit's arguments and the GPU's
memory (:func:`gpudeploy.facts.remote_probe.release_defaults`); ``gpudeploy.defaultscache`` keeps the
answer per release, GPU memory and arguments. Where there is one, the memory model takes the
release's ``mem_fraction_static``, ``chunked_prefill_size``, decode ``cuda_graph_max_bs`` and
``max_running_requests`` for every setting the role leaves unset, instead of the captured rules'
reading of them (:mod:`.defaults`): those moved between releases, and a release between two
captured ones has its own. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from .settings import EngineSettings

# what is asked, and the range a real answer lies in (an answer outside it is not kept)
FIELDS: dict[str, tuple[type, float, float]] = {
    "mem_fraction_static": (float, 0.05, 1.0),
    "chunked_prefill_size": (int, -1, 1 << 24),
    "cuda_graph_max_bs": (int, 1, 1 << 16),
    "max_running_requests": (int, 1, 1 << 24),
}


@dataclass(frozen=True)
class AskedDefaults:
    """One release's answer for one launch on one GPU."""

    release: str
    source: str                          # "asked of sglang 0.5.17 on lab2 on 2026-12-07 10:43 UTC"
    values: tuple[tuple[str, float | int], ...]   # the fields it set (a None answer is left out)

    def get(self, name: str) -> float | int | None:
        return dict(self.values).get(name)


def checked_values(answer: Mapping[str, Any]) -> tuple[tuple[str, float | int], ...]:
    """The fields of a probe's answer, each a number in its range; ValueError naming the first that
    is not (a release that printed something else is not taken at its word)."""
    out: list[tuple[str, float | int]] = []
    for name, (kind, low, high) in FIELDS.items():
        v = answer.get(name)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise ValueError(f"{name} is {v!r}, not a number")
        if kind is int and float(v) != int(v):
            raise ValueError(f"{name} is {v!r}, not a whole number")
        if not low <= v <= high:
            raise ValueError(f"{name} is {v!r}, outside {low:g} - {high:g}")
        out.append((name, int(v) if kind is int else float(v)))
    return tuple(out)


def filled(s: EngineSettings, asked: AskedDefaults | None) -> EngineSettings:
    """``s`` with every asked field the role leaves unset taken from the release's answer."""
    if asked is None:
        return s
    given: dict[str, Any] = {name: v for name, v in asked.values if getattr(s, name) is None}
    chunk = given.get("chunked_prefill_size")
    if chunk and chunk > 0 and s.enable_dp_attention and s.dp_size > 1:
        # the release's resolved chunk is one DP rank's (0.5.10 server_args.py:2641, 0.5.23
        # arg_groups/parallel_hook.py:331 divide it by the DP size); the model takes the whole chunk
        # and divides it itself (.defaults.resolved_defaults, .budget)
        given["chunked_prefill_size"] = chunk * s.dp_size
    # a chunk of -1 is SGLang's own "off": kept as it is
    return replace(s, **given) if given else s
