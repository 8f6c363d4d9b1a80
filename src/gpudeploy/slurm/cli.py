"""The CLI tasks' Slurm side: cli/tasks.py hands a Slurm inventory over here, and nothing else."""

from __future__ import annotations

import json
import sys

from invoke.exceptions import Exit

from ..cli.args import REFUSES, calibration


def plan(inventory: str, *, json_: bool, suggest: bool, files: bool) -> None:
    from ..report import plan_json
    from .plan import load_slurm_plan
    from .report import plan_text, refuses

    sp = load_slurm_plan(inventory, store=calibration(), suggest=suggest, offline_flags=True)
    if json_:
        doc = plan_json(sp.plan)
        doc["slurm"] = {"script": sp.script, "files": sp.files(),
                        "steps": [{"name": s.name, "slot": s.slot, "role": s.unit.role.name} for s in sp.steps]}
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(plan_text(sp, show_files=files))
    if refuses(sp):
        raise Exit(code=REFUSES)
