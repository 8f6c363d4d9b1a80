"""The lab's Slurm cluster does what a Slurm target relies on and test_slurm.py does not see from
gpudeploy's side: two ``--exact`` steps of one job get disjoint GPUs (GRES) and CPUs from Slurm itself.
(An engine step answering at its node's address from the login node, a step killed on its node
shown CANCELLED by sacct while the other runs on, and scancel leaving no job are proven end to end
by test_slurm.py: its deploy's gate and smoke generation, its killed step, its teardown.)

One cluster for the whole file (the session's ``slurm_lab``); every wait is a condition polled
against a deadline.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from deploytools import poll

if TYPE_CHECKING:
    from conftest import SlurmLab

pytestmark = pytest.mark.lab


def submit(slurm: SlurmLab, script: str) -> str:
    """sbatch ``script`` (on stdin) on the login node; the job id."""
    out = slurm.ssh("sbatch --parsable", input=script, check=True).stdout
    return out.strip().split(";")[0]


def lines_of(path: Path, count: int) -> list[str] | None:
    """The file's lines once it has ``count`` whole ones (a step writes it on its node), else None."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    lines = text.splitlines()
    return lines if text.endswith("\n") and len(lines) >= count else None


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
        seen[s] = poll(f"step {s}'s output", partial(lines_of, out, 2), 30, interval=0.1)
    gpus = {s: set(lines[0].split(",")) for s, lines in seen.items()}
    cpus = {s: lines[1].split(":")[1].strip() for s, lines in seen.items()}
    assert gpus["a"].isdisjoint(gpus["b"]), seen
    assert gpus["a"] | gpus["b"] == {str(i) for i in range(8)}, seen
    assert len(gpus["a"]) == len(gpus["b"]) == 4
    # --cpu-bind=cores on real CPUs: each step is bound to one CPU of the machine, not the same one
    assert cpus["a"] != cpus["b"] and all(c.isdigit() for c in cpus.values()), seen
