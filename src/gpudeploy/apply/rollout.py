"""Rolling deploys across a fleet: batches of deployments, a canary first, a failure budget.

``--serial 1,25%,100%`` as Ansible's ``serial``: a count or a share of all the deployments for each
batch in turn, the last one repeated until every deployment had its turn. A PD deployment (its
prefill, decode and router, on however many hosts) is one item: it succeeds or fails as a whole.
``--max-fail-percent P``: after a batch, when more than P % of the deployments tried so far have
failed, the rollout stops and the rest of the fleet is left untouched (default 0 with --serial: one
failure stops it, which is what a canary is for).
"""

from __future__ import annotations

import math
import re

from ..errors import InputError, Problem


def parse_serial(text: str) -> list[int | float]:
    """``"1,25%,100%"`` -> [1, 0.25, 1.0]; an InputError for anything else."""
    out: list[int | float] = []
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+(?:\.\d+)?)%", part)
        if m and 0 < float(m.group(1)) <= 100:
            out.append(float(m.group(1)) / 100)
        elif part.isdigit() and int(part) > 0:
            out.append(int(part))
        else:
            raise InputError([Problem(f"--serial {text!r}: {part!r} is neither a count (1, 2, ...) nor a share "
                                      "(25%, 100%) of the deployments", key="--serial")])
    return out


def batches(names: list[str], serial: list[int | float] | None) -> list[list[str]]:
    """The deployments, in order, cut into the batches ``serial`` asks for (one batch without it)."""
    if not serial:
        return [list(names)] if names else []
    out: list[list[str]] = []
    i, step = 0, 0
    while i < len(names):
        spec = serial[min(step, len(serial) - 1)]
        size = spec if isinstance(spec, int) else max(1, math.ceil(spec * len(names)))
        out.append(names[i:i + size])
        i += size
        step += 1
    return out


def over_budget(failed: int, tried: int, max_fail_percent: float) -> bool:
    return tried > 0 and 100.0 * failed / tried > max_fail_percent
