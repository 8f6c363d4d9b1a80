"""The batch script of a Slurm deployment, and each step's environment file, rendered from the plan.

Every word reaching the shell is quoted with shlex.quote; the one thing that expands is a slot's
node (``${GPUDEPLOY_NODE_<slot>}``), which the script sets from ``scontrol show hostnames``. An
environment file is sourced by its step on the compute node (``set -a; . FILE``): its values are
quoted the same way, and its secrets never appear in the script (the file is 0600).
"""

from __future__ import annotations

import hashlib
import shlex
from dataclasses import dataclass

from ..errors import Problem
from ..model import Unit
from ..plan.build import SECRET_MASK, unit_stem
from ..plan.render import Renderer
from .inventory import PLACEHOLDER_RE, SlurmInventory, node_variable
from .target import SlurmTarget

TEMPLATE = "slurm.batch.j2"


def shell_word(text: str) -> str:
    """``text`` as one shell word: every part quoted, each slot placeholder as ``"${GPUDEPLOY_NODE_N}"``."""
    out: list[str] = []
    last = 0
    for m in PLACEHOLDER_RE.finditer(text):
        if m.start() > last:
            out.append(shlex.quote(text[last:m.start()]))
        out.append(f'"${{{node_variable(int(m.group(1)))}}}"')
        last = m.end()
    if last < len(text) or not out:
        out.append(shlex.quote(text[last:]))
    return "".join(out)


def step_name(unit: Unit) -> str:
    """The step's name (srun -J): how gpudeploy finds its step id, which follows no script order."""
    return f"gpudeploy-{unit_stem(unit.deployment, unit.role.name)}"


def job_name(deployment: str) -> str:
    return f"gpudeploy-{deployment}"


def deployment_dir(target: SlurmTarget, deployment: str) -> str:
    return f"{target.output_dir}/{deployment}"


def requests_dir(target: SlurmTarget, deployment: str) -> str:
    """Where deploy puts a new step's request for the running batch script (0700, the user's own)."""
    return f"{deployment_dir(target, deployment)}/requests"


def env_path(target: SlurmTarget, unit: Unit) -> str:
    return f"{deployment_dir(target, unit.deployment)}/{unit_stem(unit.deployment, unit.role.name)}.env"


def output_pattern(target: SlurmTarget, unit: Unit) -> str:
    """srun -o: ``%j`` is the job id, so a step's output file is never a stale run's."""
    return f"{target.output_dir}/%j.{unit_stem(unit.deployment, unit.role.name)}.out"


def output_file(target: SlurmTarget, unit: Unit, job_id: str) -> str:
    return output_pattern(target, unit).replace("%j", job_id)


@dataclass(frozen=True)
class Step:
    unit: Unit
    slot: int
    name: str
    options: tuple[str, ...]  # srun's options, each already one shell word
    env_file: str
    cpus: str  # the CPU list the step binds itself to ("": none)


def sbatch_options(target: SlurmTarget, deployment: str, slots: int) -> list[str]:
    """The ``#SBATCH`` lines: one exclusive allocation of the nodes asked for, with all their GPUs
    (exclusive: every CPU of the node is the job's, so each step's NUMA CPU mask is its to bind)."""
    out = [f"-J {job_name(deployment)}", f"-N {target.nodes or slots}", f"--gres=gpu:{target.gpus_per_node}",
           f"-p {target.partition}", f"-t {target.time}", "--exclusive", "--no-requeue",
           f"-o {target.output_dir}/%j.batch.out", f"-D {target.output_dir}"]
    if target.account:
        out.append(f"-A {target.account}")
    if target.qos:
        out.append(f"--qos={target.qos}")
    if target.nodelist:
        out.append(f"--nodelist={','.join(target.nodelist)}")
    if target.constraint:
        out.append(f"-C {shlex.quote(target.constraint)}")
    return out


def step_of(target: SlurmTarget, unit: Unit, slot: int) -> Step:
    # An engine's step takes its GPUs and one CPU of Slurm's count (--exact: disjoint GPUs); a step
    # without GPUs (the router) overlaps the others' CPUs, so it never waits for a CPU an engine holds
    # (measured in the lab: 2 CPUs per node, the router's step waited "Requested nodes are busy").
    options = ["--exact" if unit.gpus else "--overlap", "-N1", "-n1", f"--nodelist=\"${{{node_variable(slot)}}}\"",
               f"--gres=gpu:{len(unit.gpus)}" if unit.gpus else "--gres=none", f"-J {shlex.quote(step_name(unit))}",
               f"-o {shlex.quote(output_pattern(target, unit))}"]
    # Slurm refuses --cpu-bind=mask_cpu outside the CPUs it gave an --exact step ("CPU binding outside
    # of job step allocation", measured in the lab), and which CPUs those are is Slurm's pick: the step
    # is left unbound by Slurm and binds itself to its NUMA node's CPUs (the exclusive job owns them).
    options.append("--cpu-bind=none")
    if target.container_image:
        options.append(f"--container-image={shlex.quote(target.container_image)}")
    return Step(unit=unit, slot=slot, name=step_name(unit), options=tuple(options), env_file=env_path(target, unit),
                cpus=unit.cpus or "" if unit.gpus else "")


def steps_of(inv: SlurmInventory, units: tuple[Unit, ...]) -> list[Step]:
    """Engines before routers, as the script starts them (the router waits for its workers anyway)."""
    ordered = sorted(units, key=lambda u: u.role.engine == "sglang_router")
    return [step_of(inv.target, u, inv.slots[u.host.name]) for u in ordered]


def env_text(unit: Unit, secrets: dict[str, str] | None) -> str:
    """The step's environment file: ``KEY=value`` lines a shell sources; secrets masked when
    ``secrets`` is None (plan, --check)."""
    lines = [f"# Environment of step {step_name(unit)}, rendered by gpudeploy. Mode 0600: it may hold secrets."]
    for key, value in unit.env.items():
        lines.append(f"{key}={shell_word(value)}")
    for key in unit.secret_names:
        lines.append(f"{key}={shell_word(SECRET_MASK if secrets is None else secrets[key])}")
    return "\n".join(lines) + "\n"


def srun_lines(s: Step) -> str:
    """The step's srun command (without ``&``): its options, its environment file and CPUs, the
    plan's argv; every word shell-quoted, only ``${GPUDEPLOY_NODE_N}`` expands."""
    return (f"srun {' '.join(s.options)} \\\n"
            f"  /bin/bash -c \"$gpudeploy_step\" gpudeploy-step {shlex.quote(s.env_file)} {shlex.quote(s.cpus)} \\\n"
            f"  {' '.join(shell_word(a) for a in s.unit.argv)}")


def request_text(s: Step, why: str) -> str:
    """A new step's request file: run once by the job's batch script (``bash FILE``), which exported
    the nodes' variables and ``gpudeploy_step``; the srun is exec'd, so the script waits on it."""
    comment = why.replace("\n", " ")
    return (f"#!/bin/bash\n# Step request of deployment {s.unit.deployment}, rendered by gpudeploy: {comment}\n"
            f"exec {srun_lines(s)}\n")


def request_name(s: Step) -> str:
    return f"{s.name}.step"


def batch_script(inv: SlurmInventory, deployment: str, steps: list[Step], renderer: Renderer,
                 problems: list[Problem]) -> str | None:
    used = sorted({s.slot for s in steps})
    return renderer.render(TEMPLATE, {
        "deployment": deployment,
        "sbatch": sbatch_options(inv.target, deployment, len(inv.slots)),
        "nodes": [(node_variable(n), n) for n in used],
        "steps": [{"comment": f"{s.unit.role.name} on slot {s.slot} ({s.unit.host.name}), GPUs "
                              f"{','.join(map(str, s.unit.gpus)) or 'none'}",
                   "srun": srun_lines(s),
                   # so the script alone says when an engine's environment changed (deploy --check)
                   "env_digest": hashlib.sha256(env_text(s.unit, None).encode()).hexdigest()[:16],
                   } for s in steps],
        "requests": shlex.quote(requests_dir(inv.target, deployment)),
    }, problems, role=None)
