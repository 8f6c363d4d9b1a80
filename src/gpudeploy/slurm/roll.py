"""A changed engine of a running Slurm deployment, rolled as a new step of the same job.

What may roll: the running job's script (Slurm's copy, or the one the last roll applied) and the
plan's differ only in engines' step blocks (the ``# ...`` comment and its srun lines). A changed
sbatch option, node list, router, or an added or removed step is refused as "no room" (a new job).

Room: the engine's slot must have as many GPUs free as the engine needs (the job holds every GPU of
the node; free = used by no running step of this deployment's record: the applied script's GPUs,
or a rolled step's own) and one CPU for a new ``--exact`` step (each engine step holds one; the
router's step overlaps). The node's CPU count is ``scontrol show node``'s CPUTot.

The roll of one engine, in order (the SSH path's surge, in spirit): the new copy's environment file
and its request file (script.request_text) into the deployment's requests folder, which the job's
batch script starts as a step of its own; gated like a start; added to the router and listed
healthy; the old step taken out of the router and drained; the old step cancelled by its exact id
(``scancel JOB.STEP``) and proven ended (sacct); then the run record. A failure at any point before
the old step left the router cancels the new step by its exact id and leaves the old one serving.

A copy's generation g names it (``<role>-g<g>``: its step name, output and environment file); odd
generations run on the surge's shifted ports, even ones on the plan's own (the previous generation
holds the other set), so two copies never share a port.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, replace

from ..apply.surges import shifted
from ..errors import InputError
from ..model import PlacementRequest, Unit
from ..plan.build import build_plan
from ..remote.base import Transport
from . import queue
from .plan import SlurmPlan
from .record import RunRecord, write_record
from .script import Step, deployment_dir, env_text, output_file, request_name, request_text, requests_dir, step_of

Say = Callable[[str], None]
BLOCK_RE = re.compile(r"^# (?P<comment>[^\n]*)\nsrun (?P<body>.*?) &\n", re.M | re.S)
NAME_RE = re.compile(r" -J (\S+)")
GPUS_RE = re.compile(r", GPUs ([0-9,]+|none); environment file")
CPUTOT_RE = re.compile(r"\bCPUTot=(\d+)")
REGISTER_S = 60.0
END_S = 30.0  # scancel JOB.STEP -> sacct calls it ended (measured: 0.35 s)


@dataclass(frozen=True)
class Block:
    name: str
    text: str
    gpus: tuple[int, ...]


def blocks(script: str) -> tuple[str, dict[str, Block]]:
    """The script without its step blocks (sbatch options, nodes, the loop), and each step's block by
    step name."""
    found: dict[str, Block] = {}
    for m in BLOCK_RE.finditer(script):
        name = NAME_RE.search(m.group("body"))
        gpus = GPUS_RE.search(m.group("comment"))
        if name is None:
            continue
        words = shlex.split(name.group(1))
        g = gpus.group(1) if gpus else "none"
        found[words[0] if words else ""] = Block(words[0] if words else "", m.group(0),
                                                 () if g == "none" else tuple(int(x) for x in g.split(",")))
    return BLOCK_RE.sub("", script), found


def changed_engines(sp: SlurmPlan, old: str) -> tuple[list[Step], str]:
    """The plan's engine steps whose blocks differ from the running script's, or ([], why not a roll)."""
    old_head, old_blocks = blocks(old)
    new_head, new_blocks = blocks(sp.script)
    if "gpudeploy_requests=" not in old_head:
        return [], "the running job's batch script starts no new steps (submitted by an older gpudeploy)"
    if old_head != new_head:
        return [], "the job's own settings (sbatch options, nodes) changed: only a new job has them"
    if set(old_blocks) != set(new_blocks):
        return [], "steps were added or removed: only a new job has them"
    changed = [s for s in sp.steps if old_blocks[s.name].text != new_blocks[s.name].text]
    routers = [s.unit.role.name for s in changed if not s.unit.gpus or s.unit.role.engine == "sglang_router"]
    if routers:
        return [], f"{', '.join(routers)} changed: only engines roll (a router or a step without GPUs does not)"
    return changed, ""


def used_gpus(sp: SlurmPlan, old: str, record: RunRecord) -> dict[int, set[int]]:
    """Slot -> the GPUs this deployment's running steps hold (a rolled step's own, else the running
    script's)."""
    _, old_blocks = blocks(old)
    out: dict[int, set[int]] = {}
    for s in sp.steps:
        gpus = record.gpus.get(s.name)
        out.setdefault(s.slot, set()).update(gpus if gpus is not None else old_blocks[s.name].gpus)
    return out


def room(sp: SlurmPlan, step: Step, used: dict[int, set[int]], cpus_total: int | None) -> tuple[tuple[int, ...], str]:
    """The GPUs the engine's new copy gets on its slot, or ((), what is missing)."""
    need = len(step.unit.gpus)
    taken = used.get(step.slot, set())
    free = [g for g in range(sp.inv.target.gpus_per_node) if g not in taken]
    missing = []
    if len(free) < need:
        missing.append(f"{need} free GPU(s) on slot {step.slot} ({step.unit.host.name}): {len(free)} free, "
                       f"GPUs {','.join(map(str, sorted(taken)))} held by running steps")
    engines = sum(1 for s in sp.steps if s.slot == step.slot and s.unit.gpus)  # each --exact step holds a CPU
    if cpus_total is None:
        missing.append(f"the CPU count of slot {step.slot}'s node (scontrol show node gave no CPUTot)")
    elif engines + 1 > cpus_total:
        missing.append(f"a CPU for a new --exact step on slot {step.slot}: the node has {cpus_total}, "
                       f"{engines} held by engine steps")
    if missing:
        return (), "no room for a new copy of " + step.unit.role.name + ": needs " + "; ".join(missing)
    return tuple(free[:need]), ""


def node_cpus(login: Transport, node: str) -> int | None:
    got = login.run(["scontrol", "-o", "show", "node", node], check=False, timeout=30)
    m = CPUTOT_RE.search(got.stdout) if got.rc == 0 else None
    return int(m.group(1)) if m else None


def copy_unit(sp: SlurmPlan, unit: Unit, generation: int, gpus: tuple[int, ...]) -> Unit:
    """The engine's copy of ``generation`` on ``gpus`` of its slot, planned by the planner itself (its
    argv, CUDA_VISIBLE_DEVICES, CPUs): alone on its slot, so neither the running steps' GPUs nor their
    ports are in its way."""
    inv = sp.plan.inventory
    ports = shifted(unit.ports) if generation % 2 else dict(unit.ports)
    role = replace(unit.role, name=f"{unit.role.name}-g{generation}", ports=ports)
    req = PlacementRequest(role=role.name, gpus=gpus or None, deployment=unit.deployment,
                           role_file=unit.role.instance_of or None)
    hosts = dict(inv.hosts)
    hosts[unit.host.name] = replace(inv.hosts[unit.host.name], placements=(req,))
    planned = build_plan(replace(inv, hosts=hosts, roles={**inv.roles, role.name: role}), memory=False)
    return next(u for u in planned.units if u.role.name == role.name)


def live_unit(sp: SlurmPlan, step: Step, record: RunRecord) -> Unit:
    """The unit a plan step runs as now: its rolled copy when the record says so."""
    g = record.generations.get(step.name, 0)
    if g == 0:
        return step.unit
    return copy_unit(sp, step.unit, g, tuple(record.gpus.get(step.name, ())))


def live_steps(sp: SlurmPlan, record: RunRecord | None) -> list[Step]:
    """The plan's steps as they run: a rolled engine as its copy (its name, output, ports)."""
    if record is None or not record.generations:
        return list(sp.steps)
    return [s if record.generations.get(s.name, 0) == 0 else
            step_of(sp.inv.target, live_unit(sp, s, record), s.slot) for s in sp.steps]


@dataclass(frozen=True)
class Prepared:
    step: Step  # the plan's step (its name keys the record)
    copy: Step
    generation: int
    gpus: tuple[int, ...]


def prepare(sp: SlurmPlan, login: Transport, old: str, record: RunRecord) -> tuple[list[Prepared], str]:
    """Each changed engine's copy, or ([], why there is no roll: no room, or not only engines)."""
    changed, why = changed_engines(sp, old)
    if why:
        return [], why
    used = used_gpus(sp, old, record)
    cpus: dict[int, int | None] = {}
    out: list[Prepared] = []
    for s in changed:
        if s.slot not in cpus:
            cpus[s.slot] = node_cpus(login, record.nodes[s.slot]) if len(record.nodes) > s.slot else None
        gpus, why = room(sp, s, used, cpus[s.slot])
        if why:
            return [], why
        if "." not in record.steps.get(s.name, ""):  # its exact id is how the old step is cancelled
            return [], f"the running step of {s.unit.role.name} has no id in the run record"
        if not routers_of(sp, s):
            return [], f"{s.unit.role.name} is behind no router: nothing would move its traffic to a new copy"
        g = record.generations.get(s.name, 0) + 1
        try:
            unit = copy_unit(sp, s.unit, g, gpus)
        except InputError as exc:
            return [], f"the copy of {s.unit.role.name} cannot be planned: {str(exc).splitlines()[-1].strip()}"
        out.append(Prepared(s, step_of(sp.inv.target, unit, s.slot), g, gpus))
        used.setdefault(s.slot, set()).update(gpus)
    return out, ""


KINDS = {"prefill": "prefill", "decode": "decode", "workers": "regular"}


def routers_of(sp: SlurmPlan, s: Step) -> list[tuple[Step, str]]:
    """The router steps that send to engine ``s``, with the kind it is to them."""
    out = []
    for r in sp.steps:
        if r.unit.role.engine != "sglang_router":
            continue
        for key, kind in KINDS.items():
            if s.unit.role.named_in(r.unit.role.upstreams.get(key, ())):
                out.append((r, kind))
    return out


def url_of(unit: Unit) -> str:
    return f"http://{unit.host.address}:{unit.ports['http']}"


def put_request(sp: SlurmPlan, login: Transport, p: Prepared, secrets: dict[str, str]) -> str:
    """The copy's environment file, then its request (the batch script starts it at its next turn)."""
    folder = requests_dir(sp.inv.target, sp.deployment)
    login.run(["mkdir", "-p", folder], timeout=30)
    login.run(["chmod", "0700", folder], timeout=30)
    login.put(p.copy.env_file, env_text(p.copy.unit, secrets).encode(), 0o600)
    path = f"{folder}/{request_name(p.copy)}"
    login.put(path, request_text(p.copy, f"{p.step.unit.role.name} generation {p.generation} on slot "
                                          f"{p.step.slot}, GPUs {','.join(map(str, p.gpus)) or 'none'}").encode(),
              0o600)
    return path


def ended(login: Transport, job: str, step_id: str, now: Callable[[], float], sleep: Callable[[float], None],
          timeout_s: float = END_S) -> str | None:
    """sacct's state of step ``step_id`` once it ended; None at the deadline."""
    deadline = now() + timeout_s
    while True:
        row = queue.parse_sacct(login.run(queue.sacct_argv(job), check=False, timeout=30).stdout).get(step_id)
        if row is not None and queue.terminal(row.state):
            return row.state
        if now() >= deadline:
            return None
        sleep(0.25)


def cancel_step(login: Transport, job: str, step_id: str) -> None:
    """``scancel JOB.STEP``: that one step, never the job or a name."""
    login.run(["scancel", step_id if "." in step_id else f"{job}.{step_id}"], check=False, timeout=30)


def applied_path(sp: SlurmPlan, job: str) -> str:
    """The script a roll made current (the running job's script, with the rolled engines' blocks)."""
    return f"{deployment_dir(sp.inv.target, sp.deployment)}/{job}.applied.sh"


def commit(sp: SlurmPlan, login: Transport, record: RunRecord, p: Prepared, new_id: str) -> RunRecord:
    """The run record (written atomically: put renames over) with the copy as the engine's live step."""
    rec = replace(record, steps={**record.steps, p.step.name: new_id},
                  generations={**record.generations, p.step.name: p.generation},
                  gpus={**record.gpus, p.step.name: list(p.gpus)})
    write_record(login, sp.inv.target, rec)
    return rec


def copy_output(sp: SlurmPlan, p: Prepared, job: str) -> str:
    return output_file(sp.inv.target, p.copy.unit, job)
