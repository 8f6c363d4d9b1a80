"""Whether a rolling update would let the router pair a new prefill with an old decode the plan refuses.

A roll swaps one engine at a time behind one router (rolling.py): prefill first, then decode. The
real sglang-router pairs any prefill it lists with any decode it lists
(../shared/reference/sglang-router.md: "the same request goes to prefill and decode at once"), so
from the moment the first new prefill joins until the last old decode leaves, every request may
cross a *new prefill* with an *old decode*. Where the change is one the plan's pair rule refuses
(plan/pd.py: another checkpoint, another KV transfer backend, InfiniBand on one side, other TP
sizes without the staging buffer), that crossing hangs requests or, worse, answers them from a
decode that received KV of another model. No order of single-engine swaps avoids it, and clients
reach one router address, so a second router cannot take over without their help: such a change
cannot be rolled. It is refused before anything is touched, with the downtime a plain restart
costs; ``--allow-downtime`` restarts it plainly, its engines all stopped before any starts again,
so that no old and new engine ever serve side by side.

The old decode's facts come from its run record on the host (written at each start with
``pair``); a run recorded before there was such a record cannot be checked and counts as crossing.
"""

from __future__ import annotations

from ..model import Unit
from ..plan.pd import mismatches, pair_facts
from ..supervisor.base import UnitState
from .order import upstreams_of


def crossings(units: list[Unit], changed: list[Unit], states: dict[str, UnitState]) -> list[str]:
    """What a roll of ``changed`` in this deployment would pair that must not be paired, one line each;
    [] when every pair the roll makes on its way is one the plan accepts."""
    moved = {u.key for u in changed}
    out: list[str] = []
    for router in (u for u in units if u.role.engine == "sglang_router"):
        ups = upstreams_of(router, units)
        prefills = [u for u, kind in ups if kind == "prefill" and u.key in moved]
        decodes = [u for u, kind in ups if kind == "decode" and u.key in moved]
        # An unchanged side runs as planned, and the plan checked every planned pair: only a new
        # prefill beside a decode still on its old run can cross.
        for d in decodes:
            old = (states[d.name].record or {}).get("pair") if d.name in states else None
            for p in prefills:
                if not isinstance(old, dict):
                    out.append(f"new prefill {p.key} with decode {d.key} as it runs now: its run record does not "
                               "say what it serves (started by an earlier gpudeploy), so the pair cannot be checked")
                    continue
                out += [f"new prefill {p.key} with decode {d.key} as it runs now{what}"
                        for _, _, what in mismatches(pair_facts(p), old)]
    return out


def refusal_text(dep: str, lines: list[str], cost: str) -> str:
    """Why this deployment's change cannot be rolled, and what a plain restart would cost."""
    out = [f"deployment {dep} serves now, but its change cannot be rolled through its router: the router pairs "
           "any prefill with any decode it lists, so while engines are swapped one at a time requests would cross "
           "pairs the plan refuses:"]
    out += [f"  - {line}" for line in lines]
    out.append(f"nothing was touched. A plain restart (every engine of it stopped, then started on its new files) "
               f"takes it down for {cost}: `invoke deploy --allow-downtime` does that")
    return "\n".join(out)
