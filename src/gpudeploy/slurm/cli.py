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


def deploy(inventory: str, *, check: bool, timeout_s: float | None, keep_on_failure: bool) -> None:
    """Plan first (a problem submits nothing), then submit and gate through the login node."""
    from ..remote import connect
    from .job import Options
    from .job import deploy as run_deploy
    from .plan import load_slurm_plan

    sp = load_slurm_plan(inventory, store=None if check else calibration())
    with connect(sp.inv.target.login) as login:
        out = run_deploy(sp, login, Options(timeout_s=timeout_s, check=check, keep_on_failure=keep_on_failure),
                         say=lambda text: print(text, flush=True))
    print(("OK: " if out.ok else "FAILED: ") + out.message)
    if not out.ok:
        raise Exit(code=1)


def status(inventory: str, *, json_: bool, watch: bool = False) -> None:
    from ..remote import connect
    from .plan import load_slurm_plan
    from .status import status_text

    sp = load_slurm_plan(inventory, memory=False)
    if watch:
        from .watch import watch as run_watch

        with connect(sp.inv.target.login) as login:  # ONE connection for the whole watch
            run_watch(sp, login, sys.stdout)
        return
    with connect(sp.inv.target.login) as login:
        text, ok = status_text(sp, login)
    if json_:
        json.dump({"deployment": sp.deployment, "healthy": ok, "text": text}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(text)
    if not ok:
        raise Exit(code=1)


def teardown(inventory: str) -> None:
    from ..remote import connect
    from .plan import load_slurm_plan
    from .status import teardown as run_teardown

    sp = load_slurm_plan(inventory, memory=False)
    with connect(sp.inv.target.login) as login:
        got = run_teardown(sp, login)
    print(got.words)
    if not got.clean:
        raise Exit(code=1)
