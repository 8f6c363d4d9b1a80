"""Choosing what to measure next, and what was best. Pure.

Per variant: climb the concurrency ladder in order and stop at the first level that misses the SLO;
then bisect between the highest level that met it and that one (at most ``bisect`` extra levels), so
the answer is "the highest concurrency that meets the SLO" to within one step, not to within a
ladder rung. Without an SLO every rung is measured.

Across variants: the named variants, then the grid in order. With ``stop_when_gain_below_percent``,
a grid dimension stops paying once one step along it (the other dimensions held) raised the
variant's score by less than that: its further values (for those other values) are skipped.

A variant's score is output tok/s per GPU at its best level: the highest concurrency meeting the
SLO, or without an SLO the level with the most tok/s per GPU.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from .spec import Variant


def misses(fig: dict[str, Any], slo: dict[str, float]) -> list[str]:
    """The SLO bounds a run (its figures) misses; a run with failed requests misses by definition."""
    out = []
    if fig.get("failed"):
        out.append(f"{fig['failed']} requests failed")
    if not fig.get("completed"):
        out.append("no request completed")
    for key, bound in slo.items():
        value = fig.get(key)
        if value is None:
            out.append(f"{key} not reported")
        elif value > bound:
            out.append(f"{key} {value:.1f} > {bound:g}")
    return out


def aggregate(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Repeats of one level -> one set of figures: the median of each (failures summed)."""
    if len(runs) == 1:
        return dict(runs[0])
    out: dict[str, Any] = {}
    for key in {k for r in runs for k in r}:
        values = [r[key] for r in runs if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]
        if key in ("failed",):
            out[key] = sum(values)
        elif values:
            out[key] = statistics.median(values)
        else:  # a flag or a text the repeats agree on (power_standin) stays; else none
            seen = [r.get(key) for r in runs]
            out[key] = seen[0] if all(v == seen[0] for v in seen) else None
    return out


def next_level(ladder: Sequence[int], met: dict[int, bool], slo: bool, bisect: int) -> int | None:
    """The next concurrency to measure, or None when this variant is done.

    ``met``: concurrency -> whether its (aggregated) run met the SLO (all True without an SLO).
    """
    for c in ladder:
        if c in met:
            continue
        if slo and any(not ok for cc, ok in met.items() if cc < c):
            break
        return c
    if not slo:
        return None
    failing = sorted(c for c, ok in met.items() if not ok)
    if not failing:
        return None
    hi = failing[0]
    lo = max((c for c, ok in met.items() if ok and c < hi), default=0)
    extra = sum(1 for c in met if c not in ladder)
    if extra >= bisect:
        return None
    mid = (lo + hi) // 2
    if mid <= lo or mid >= hi or mid < 1 or mid in met:
        return None
    return mid


def best_level(levels: dict[int, dict[str, Any]], slo: dict[str, float]) -> int | None:
    """The level a variant is judged at: the highest concurrency meeting the SLO (below any that missed)."""
    if not levels:
        return None
    if not slo:
        return max(levels, key=lambda c: (levels[c].get("output_tok_s_per_gpu") or 0.0, -c))
    ok = [c for c in sorted(levels) if not misses(levels[c], slo)]
    return ok[-1] if ok else None


def score(levels: dict[int, dict[str, Any]], slo: dict[str, float]) -> float | None:
    c = best_level(levels, slo)
    if c is None:
        return None
    value = levels[c].get("output_tok_s_per_gpu")
    return float(value) if value is not None else None


def stop_reason(v: Variant, variants: Sequence[Variant], scores: dict[str, float | None],
                skipped: dict[str, str], min_gain_percent: float | None) -> str | None:
    """Why grid point ``v`` need not run: a dimension stopped paying on the way to it."""
    if min_gain_percent is None or not v.grid_index:
        return None
    by_index = {p.grid_index: p for p in variants if p.grid_index}
    for d, i in enumerate(v.grid_index):
        if i < 1:
            continue
        prev = by_index.get((*v.grid_index[:d], i - 1, *v.grid_index[d + 1:]))
        if prev is None:
            continue
        if prev.name in skipped and skipped[prev.name].startswith("dimension"):
            return skipped[prev.name]
        if i < 2:
            continue
        before = by_index.get((*v.grid_index[:d], i - 2, *v.grid_index[d + 1:]))
        if before is None:
            continue
        a, b = scores.get(before.name), scores.get(prev.name)
        if a is None or b is None:
            continue
        gain = (b - a) / a * 100 if a > 0 else float("inf")
        if gain < min_gain_percent:
            dim = v.grid[d][0]
            return (f"dimension {dim} stopped paying: {before.name} -> {prev.name} gained {gain:+.1f}% "
                    f"(< {min_gain_percent:g}%)")
    return None


def pareto(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both axes (higher is better on both)."""
    front = []
    for i, (x, y) in enumerate(points):
        if not any((x2 >= x and y2 >= y) and (x2 > x or y2 > y) for j, (x2, y2) in enumerate(points) if j != i):
            front.append(i)
    return front
