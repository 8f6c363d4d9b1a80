"""The lab's Slurm cluster does what a Slurm target will rely on: disjoint GPUs (and CPUs) for two
``--exact`` steps of one job, an engine started as a step reachable at its node's address from the
login node, a step killed on its node shown as CANCELLED by ``sacct``, and ``scancel`` leaving no job.

One cluster for the whole file (the session's ``slurm_lab``); every wait is a condition polled
against a deadline.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import pytest

if TYPE_CHECKING:
    from conftest import SlurmLab

pytestmark = pytest.mark.lab

T = TypeVar("T")


def poll(what: str, probe: Callable[[], T | None], timeout: float, interval: float = 0.1) -> T:
    """``probe()`` until it returns something other than None; fail naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(interval)  # the poll's pause; the deadline bounds the wait


def submit(slurm: SlurmLab, script: str) -> str:
    """sbatch ``script`` (on stdin) on the login node; the job id."""
    out = slurm.ssh("sbatch --parsable", input=script, check=True).stdout
    return out.strip().split(";")[0]


def step_state(slurm: SlurmLab, job: str, **want: str) -> dict[str, str] | None:
    """The job's steps (name -> State) once every step named in ``want`` is in its wanted state."""
    seen = steps(slurm, job)
    return seen if all(seen.get(name) == state for name, state in want.items()) else None


def lines_of(path: Path, count: int) -> list[str] | None:
    """The file's lines once it has ``count`` whole ones (a step writes it on its node), else None."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    lines = text.splitlines()
    return lines if text.endswith("\n") and len(lines) >= count else None


def running_node(slurm: SlurmLab, job: str) -> str:
    """The node a job runs on, once squeue says RUNNING."""
    def probe() -> str | None:
        state = slurm.ssh(f"squeue -h -j {job} -o '%T %N'").stdout.split()
        return state[1] if state[:1] == ["RUNNING"] and len(state) == 2 else None
    return poll(f"job {job} RUNNING", probe, 20)


def steps(slurm: SlurmLab, job: str) -> dict[str, str]:
    """sacct's view of a job's steps: step name -> State (the job's own line left out)."""
    out = slurm.ssh(f"sacct -n -P -j {job} --format=JobID,JobName,State").stdout
    return {name: state for jobid, name, state in (line.split("|") for line in out.splitlines() if line.count("|") == 2)
            if "." in jobid}


def test_two_exact_steps_get_disjoint_gpus_and_cpus(slurm_lab: SlurmLab) -> None:
    g = slurm_lab.guest_shared
    job = submit(slurm_lab, f"""#!/bin/bash
#SBATCH -J gres-split -N1 -n2 -c1 --gres=gpu:8 -o {g}/%j.batch.out
for s in a b; do
  srun --exact -n1 -c1 --gres=gpu:4 --cpu-bind=cores -J step-$s -o {g}/%j.$s.out \\
    bash -c 'echo "$CUDA_VISIBLE_DEVICES"; grep Cpus_allowed_list /proc/self/status' &
done
wait
""")
    seen: dict[str, list[str]] = {}
    for s in ("a", "b"):
        out = slurm_lab.shared / f"{job}.{s}.out"
        seen[s] = poll(f"step {s}'s output", partial(lines_of, out, 2), 30)
    gpus = {s: set(lines[0].split(",")) for s, lines in seen.items()}
    cpus = {s: lines[1].split(":")[1].strip() for s, lines in seen.items()}
    assert gpus["a"].isdisjoint(gpus["b"]), seen
    assert gpus["a"] | gpus["b"] == {str(i) for i in range(8)}, seen
    assert len(gpus["a"]) == len(gpus["b"]) == 4
    # --cpu-bind=cores on real CPUs: each step is bound to one CPU of the machine, not the same one
    assert cpus["a"] != cpus["b"] and all(c.isdigit() for c in cpus.values()), seen


def test_the_standin_engine_as_a_step_answers_health_at_its_nodes_address(slurm_lab: SlurmLab) -> None:
    g = slurm_lab.guest_shared
    job = submit(slurm_lab, f"""#!/bin/bash
#SBATCH -J engine -N1 -n1 -c1 --gres=gpu:4 -o {g}/%j.batch.out
export SGLANG_STANDIN_SPEED=0.2
srun --exact -n1 -c1 --gres=gpu:4 -J engine -o {g}/%j.engine.out \\
  python3 -m sglang.launch_server --model-path /models/tiny --host 0.0.0.0 --port 30000 --tp-size 4
""")
    try:
        node = running_node(slurm_lab, job)
        address = next(n.address for n in slurm_lab.nodes if n.name == node)
        # From the login node, by the node's address (as a deployment's gate will reach it)
        check = ("import sys, time, urllib.request\n"
                 "deadline = time.monotonic() + 20\n"
                 "while True:\n"
                 "    try:\n"
                 f"        print(urllib.request.urlopen('http://{address}:30000/health', timeout=2).status); break\n"
                 "    except OSError as exc:\n"
                 "        if time.monotonic() > deadline: print(exc); sys.exit(1)\n"
                 "        time.sleep(0.1)\n")
        res = slurm_lab.ssh(f"python3 -c {shlex.quote(check)}", timeout=40)
        log = (slurm_lab.shared / f"{job}.engine.out")
        assert res.stdout.strip() == "200", (res.stdout, res.stderr, log.read_text() if log.exists() else "")
    finally:
        slurm_lab.ssh(f"scancel {job}")


def test_a_step_killed_on_its_node_is_cancelled_in_sacct(slurm_lab: SlurmLab) -> None:
    g = slurm_lab.guest_shared
    job = submit(slurm_lab, f"""#!/bin/bash
#SBATCH -J kill-one -N1 -n2 -c1 -o {g}/%j.batch.out
srun --exact -n1 -c1 -J victim bash -c 'echo $$ > {g}/'$SLURM_JOB_ID'.victim.pid; exec sleep 600' &
srun --exact -n1 -c1 -J keeper sleep 600 &
wait
""")
    try:
        node = running_node(slurm_lab, job)
        pid = int(poll("the victim's PID", lambda: lines_of(slurm_lab.shared / f"{job}.victim.pid", 1), 20)[0])
        poll("both steps RUNNING in sacct", lambda: step_state(slurm_lab, job, victim="RUNNING", keeper="RUNNING"), 20)
        # the step's own process, killed on its node as a crash would (not through Slurm)
        slurm_lab.ssh(f"kill -9 {pid}", host=node, check=True)
        states = poll("the victim CANCELLED in sacct", lambda: step_state(slurm_lab, job, victim="CANCELLED"), 10)
        assert states["keeper"] == "RUNNING", states
    finally:
        slurm_lab.ssh(f"scancel {job}")


def test_scancel_leaves_no_job_in_squeue(slurm_lab: SlurmLab) -> None:
    g = slurm_lab.guest_shared
    job = submit(slurm_lab, f"""#!/bin/bash
#SBATCH -J to-cancel -N1 -n1 -c1 --gres=gpu:2 -o {g}/%j.batch.out
srun --exact -n1 -c1 --gres=gpu:2 -J server sleep 600
""")
    running_node(slurm_lab, job)
    slurm_lab.ssh(f"scancel {job}", check=True)

    def gone() -> bool | None:
        jobs = slurm_lab.ssh("squeue -h -o %i").stdout.split()
        job_steps = slurm_lab.ssh("squeue -h -s -o %i").stdout.split()
        return True if job not in jobs and not any(s.startswith(f"{job}.") for s in job_steps) else None
    poll(f"job {job} gone from squeue", gone, 15)

    def cancelled() -> str | None:
        state = slurm_lab.ssh(f"sacct -n -X -P -j {job} --format=State").stdout.strip()
        return state if state.startswith("CANCELLED") else None
    poll("the job CANCELLED in sacct", cancelled, 10)
