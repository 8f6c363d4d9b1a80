"""A Slurm inventory -> the ordinary plan (argv, ports, flags, memory, PD pairing) + its batch script."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import InputError, Problem
from ..model import Plan
from ..plan.build import build_plan
from ..plan.render import Renderer
from .inventory import SlurmInventory, load_slurm_inventory
from .script import Step, batch_script, env_text, steps_of

if TYPE_CHECKING:
    from ..plan.calibrate import CalibrationStore


@dataclass(frozen=True)
class SlurmPlan:
    inv: SlurmInventory
    plan: Plan
    steps: tuple[Step, ...]
    script: str  # the batch script, as sbatch gets it

    @property
    def deployment(self) -> str:
        return self.inv.inventory.deployment

    def files(self, secrets: dict[str, str] | None = None) -> dict[str, str]:
        """path -> text: each step's environment file (secrets masked without ``secrets``)."""
        return {s.env_file: env_text(s.unit, secrets) for s in self.steps}


def load_slurm_plan(path: str, *, store: CalibrationStore | None = None, memory: bool = True,
                    suggest: bool = False, offline_flags: bool = False) -> SlurmPlan:
    """Parse and plan a Slurm inventory, reporting every problem of both steps together."""
    problems: list[Problem] = []
    inv = load_slurm_inventory(path, problems)
    plan = build_plan(inv.inventory, problems=problems, store=store, memory=memory, suggest=suggest,
                      offline_flags=offline_flags)
    steps = steps_of(inv, plan.units)
    script = batch_script(inv, inv.inventory.deployment, steps, Renderer(inv.inventory.templates_dir), problems)
    if problems or script is None:
        raise InputError(problems)
    return SlurmPlan(inv=inv, plan=plan, steps=tuple(steps), script=script)
