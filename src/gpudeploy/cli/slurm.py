"""The CLI tasks' Slurm side: cli/tasks.py hands a Slurm inventory over here, and nothing else."""

from __future__ import annotations

import json
import sys

from invoke.exceptions import Exit

from .args import REFUSES, calibration


def plan(inventory: str, *, json_: bool, suggest: bool, files: bool) -> None:
    from ..report import plan_json
    from ..slurm.plan import load_slurm_plan
    from ..slurm.report import plan_text, refuses

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
    from ..slurm.job import Options
    from ..slurm.job import deploy as run_deploy
    from ..slurm.plan import load_slurm_plan

    sp = load_slurm_plan(inventory, store=None if check else calibration())
    with connect(sp.inv.target.login) as login:
        out = run_deploy(sp, login, Options(timeout_s=timeout_s, check=check, keep_on_failure=keep_on_failure),
                         say=lambda text: print(text, flush=True))
    print(("OK: " if out.ok else "FAILED: ") + out.message)
    if not out.ok:
        raise Exit(code=1)


def status(inventory: str, *, json_: bool, watch: bool = False) -> None:
    from ..remote import connect
    from ..slurm.plan import load_slurm_plan
    from ..slurm.status import status_text

    sp = load_slurm_plan(inventory, memory=False)
    if watch:
        from ..slurm.watch import watch as run_watch

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
    from ..slurm.plan import load_slurm_plan
    from ..slurm.status import teardown as run_teardown

    sp = load_slurm_plan(inventory, memory=False)
    with connect(sp.inv.target.login) as login:
        got = run_teardown(sp, login)
    print(got.words)
    if not got.clean:
        raise Exit(code=1)


def logs(inventory: str, *, host: str | None, role: str, follow: bool, lines: int = 500) -> None:
    """The step's own output file of the recorded job (its name carries the job id: never an older
    job's lines), its last ``lines``, then with ``follow`` every new one (``tail -F`` on the login
    node, over the one connection, ended by Ctrl-C)."""
    from ..errors import GpudeployError
    from ..remote import connect
    from ..slurm.plan import load_slurm_plan
    from ..slurm.record import read_record
    from ..slurm.roll import live_steps
    from ..slurm.script import output_file
    from ..verify.logs import copy_lines

    sp = load_slurm_plan(inventory, memory=False)
    mine = [s for s in sp.steps if s.unit.role.name == role and (host is None or s.unit.host.name == host)]
    if len(mine) != 1:
        known = ", ".join(f"-H {s.unit.host.name} -r {s.unit.role.name}" for s in sp.steps)
        raise Exit(f"gpudeploy: {inventory}: {'no' if not mine else 'more than one'} step of role {role}"
                   + (f" on slot {host}" if host else "") + f"; the steps: {known}", code=1)
    with connect(sp.inv.target.login) as login:
        record = read_record(login, sp.inv.target, sp.deployment)
        if record is None:
            raise GpudeployError(f"deployment {sp.deployment}: no job recorded in {sp.inv.target.output_dir} "
                                 "(not deployed)")
        live = live_steps(sp, record)[sp.steps.index(mine[0])]  # a rolled engine: its serving copy's output
        path = output_file(sp.inv.target, live.unit, record.job)
        stream = login.stream(["tail", "-n", str(lines), *(["-F"] if follow else []), path])
        try:
            copy_lines(stream.recv, sys.stdout)
        finally:
            stream.close()
