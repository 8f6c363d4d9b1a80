"""A Slurm inventory: ``slurm:`` (target.py) plus ``hosts:`` that are node SLOTS of the allocation.

Slot N (the Nth entry of ``hosts:``) is the Nth node of the job, in the order
``scontrol show hostnames "$SLURM_JOB_NODELIST"`` prints them. A slot has everything a host has
but a way in (address, ssh, connection, supervisor): Slurm picks the node, and gpudeploy reaches it
only through the login node. The slot's node is not known until the job runs, so the plan is built
with a placeholder address per slot (``node_placeholder``), which the batch script fills in.

The rest of the file is an ordinary inventory, read by inventory.py itself (the same keys, roles
and checks): only what a Slurm target changes is checked here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError, Problem
from ..inventory import inventory_file, inventory_from_data
from ..model import Inventory
from ..yamlsrc import Checker, LineMap, load_yaml
from .target import SlurmTarget, slurm_target

# What a slot may not say, and why (everything else of a host it may).
NOT_ON_SLOT = {
    "address": "Slurm picks the node when the job starts (slot {n} is the allocation's node {n}); "
               "remove address",
    "ssh": "the compute nodes are reached only through slurm.login; remove ssh",
    "connection": "the compute nodes are reached only through slurm.login; remove connection",
    "supervisor": "Slurm runs every engine as a job step; remove supervisor",
    "deployment": "a Slurm inventory is one deployment, one job (the top-level deployment:); remove it here",
    "kubernetes": "a Slurm inventory is not rendered for Kubernetes; remove kubernetes",
}
PLACEHOLDER_RE = re.compile(r"__GPUDEPLOY_NODE_(\d+)__")


def node_placeholder(slot: int) -> str:
    """The address a slot's units are planned with; script.py turns it into ``"${GPUDEPLOY_NODE_<slot>}"``."""
    return f"__GPUDEPLOY_NODE_{slot}__"


def node_variable(slot: int) -> str:
    return f"GPUDEPLOY_NODE_{slot}"


@dataclass(frozen=True)
class SlurmInventory:
    inventory: Inventory
    target: SlurmTarget
    slots: dict[str, int]  # slot (host) name -> its place in the allocation's node list


def is_slurm(path: str | Path) -> bool:
    """The inventory at ``path`` says ``slurm:`` (a syntax error is left for the reader to report)."""
    data = load_yaml(Path(inventory_file(path)), [])
    return isinstance(data, dict) and "slurm" in data


def load_slurm_inventory(path: str | Path, problems: list[Problem] | None = None) -> SlurmInventory:
    """Parse a Slurm inventory: with ``problems`` they are collected and the usable part returned
    (for the planner to add its own), else any problem raises InputError."""
    file = Path(inventory_file(path))
    collect = problems is not None
    problems = problems if problems is not None else []
    before = len(problems)
    data = load_yaml(file, problems)
    if len(problems) > before:
        raise InputError(problems)
    top = Checker(data, problems, str(file))
    target = slurm_target(top)
    rest, slots = _slots(top, target, problems, str(file))
    inv = inventory_from_data(rest, file, problems)
    for h in inv.hosts.values():
        for p in h.placements:
            if p.deployment is not None:
                problems.append(Problem(NOT_ON_SLOT["deployment"], file=str(file),
                                        line=p.where.line if p.where else None, host=h.name, role=p.role,
                                        key="roles.deployment"))
    problems[before:] = list(dict.fromkeys(problems[before:]))
    if problems[before:] and not collect:
        raise InputError(problems)
    return SlurmInventory(inventory=inv, target=target, slots=slots)


def _slots(top: Checker, target: SlurmTarget, problems: list[Problem],
           file: str) -> tuple[Any, dict[str, int]]:
    """The inventory's data without ``slurm:``, each slot given its placeholder address, and the slots
    by name; what a slot may not say is a problem at its line."""
    rest = _copy(top.data)
    rest.pop("slurm", None)
    hosts = top.data.get("hosts")
    if not isinstance(hosts, dict):
        return rest, {}
    new_hosts = _copy(hosts)
    slots: dict[str, int] = {}
    for n, (name, raw) in enumerate(hosts.items()):
        line = hosts.line_of(name) if isinstance(hosts, LineMap) else None
        slots[str(name)] = n
        c = Checker(raw, problems, file, host=str(name), line=line)
        for key, why in NOT_ON_SLOT.items():
            if key in c.data:
                c.fail(f"{key} on a node slot: {why.format(n=n)}", key)
        if 0 < target.nodes <= n:
            c.fail(f"slot {n} is beyond the allocation: slurm asks for {target.nodes} node(s) "
                   f"({'nodelist' if target.nodelist else 'nodes'}); ask for more or place fewer slots", None,
                   line=line)
        if target.gpus_per_node > 0:
            _gpus_fit(c, target)
        slot = _copy(raw) if isinstance(raw, dict) else raw
        if isinstance(slot, dict):
            for key in NOT_ON_SLOT:
                slot.pop(key, None)
            slot["address"] = node_placeholder(n)
            if isinstance(slot, LineMap):
                slot.key_lines["address"] = line or 0
        new_hosts[name] = slot
    rest["hosts"] = new_hosts
    return rest, slots


def _gpus_fit(c: Checker, target: SlurmTarget) -> None:
    numa = c.data.get("numa_nodes")
    for i, node in enumerate(numa if isinstance(numa, list) else []):
        gpus = node.get("gpus") if isinstance(node, dict) else None
        beyond = [g for g in (gpus if isinstance(gpus, list) else [])
                  if isinstance(g, int) and not isinstance(g, bool) and g >= target.gpus_per_node]
        if beyond:
            line = node.line_of("gpus") if isinstance(node, LineMap) else None
            c.fail(f"GPU(s) {', '.join(map(str, beyond))} beyond the node's GRES: slurm.gpus_per_node is "
                   f"{target.gpus_per_node} (GPUs 0-{target.gpus_per_node - 1})", f"numa_nodes[{i}].gpus", line=line)


def _copy(value: Any) -> Any:
    """A shallow copy of a YAML mapping that keeps its lines."""
    if not isinstance(value, dict):
        return value
    out = LineMap(value)
    out.line = getattr(value, "line", None)
    out.key_lines = dict(getattr(value, "key_lines", {}))
    return out
