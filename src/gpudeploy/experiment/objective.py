"""A measured variant -> the search's objective values and how far it is from feasible. Pure.

A variant is feasible when some level of its ladder met the SLO (every level without an SLO) and
every objective has its figure. Its values are read at its best level (choose.best_level: the highest
concurrency that met the SLO), or at the level an objective names. What the sampler is told of a
variant that is not feasible is a constraint vector (Optuna's: each entry <= 0 is met), so it learns
where not to look, and a penalty value that ranks it last for a sampler that reads no constraints.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import choose
from .search_space import AT_BEST, Objective

# a figure to minimise (ms) of a trial without one: far beyond any latency an SLO would allow
MINIMISE_PENALTY = 1e6
# The constraint vector's entries, in order: each 0 when met.
CONSTRAINTS = ("refused_by_memory_preflight", "inside_a_failed_region", "launch_failed", "slo_violation",
               "figure_missing")


@dataclass(frozen=True)
class Evaluation:
    values: tuple[float | None, ...]  # per objective; None: no figure
    best_concurrency: int | None
    slo_violation: float  # 0: a level met the SLO; else how far the lowest level missed it (relative)
    missing: tuple[str, ...] = ()  # objectives without a figure

    @property
    def feasible(self) -> bool:
        return self.slo_violation == 0 and not self.missing and all(v is not None for v in self.values)


def evaluate(levels: dict[int, dict[str, Any]], slo: dict[str, float],
             objectives: Sequence[Objective]) -> Evaluation:
    best = choose.best_level(levels, slo)
    values: list[float | None] = []
    missing = []
    for o in objectives:
        fig = levels.get(o.concurrency) if o.concurrency is not None else levels.get(best) if best is not None \
            else None
        name = o.name if o.concurrency is not None else AT_BEST[o.name][0]
        v = (fig or {}).get(name)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            values.append(float(v))
        else:
            values.append(None)
            missing.append(o.label)
    return Evaluation(tuple(values), best, 0.0 if best is not None else violation(levels, slo), tuple(missing))


def violation(levels: dict[int, dict[str, Any]], slo: dict[str, float]) -> float:
    """How far the lowest level missed the SLO: the sum over its bounds of value / bound - 1 where it is
    over, plus 1 where requests failed or none completed (1 with no level at all)."""
    if not levels:
        return 1.0
    fig = levels[min(levels)]
    out = 1.0 if fig.get("failed") or not fig.get("completed") else 0.0
    for key, bound in slo.items():
        v = fig.get(key)
        if not isinstance(v, (int, float)):
            out += 1.0
        elif v > bound:
            out += v / bound - 1.0
    return round(out, 6) or 1.0  # a level that misses by a rounding error still misses


def penalty(o: Objective) -> float:
    return 0.0 if o.direction == "maximize" else MINIMISE_PENALTY


def told_values(ev: Evaluation | None, objectives: Sequence[Objective]) -> list[float]:
    """The values the sampler is told: the figures, a penalty for each one missing."""
    if ev is None:
        return [penalty(o) for o in objectives]
    return [v if v is not None else penalty(o) for v, o in zip(ev.values, objectives, strict=True)]


def constraints(*, refused: bool = False, learned: bool = False, failed: bool = False,
                ev: Evaluation | None = None) -> list[float]:
    """The constraint vector (CONSTRAINTS' order); all 0: feasible."""
    return [float(refused), float(learned), float(failed), ev.slo_violation if ev else 0.0,
            float(bool(ev.missing)) if ev else 0.0]


def better(a: float, b: float, o: Objective) -> bool:
    return a > b if o.direction == "maximize" else a < b


def front(points: Sequence[Sequence[float]], objectives: Sequence[Objective]) -> list[int]:
    """Indices of the points no other point dominates (at least as good on every objective, better on one)."""
    def dominates(p: Sequence[float], q: Sequence[float]) -> bool:
        return all(not better(y, x, o) for x, y, o in zip(p, q, objectives, strict=True)) and \
            any(better(x, y, o) for x, y, o in zip(p, q, objectives, strict=True))

    return [i for i, p in enumerate(points) if not any(dominates(q, p) for j, q in enumerate(points) if j != i)]
