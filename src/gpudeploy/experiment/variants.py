"""Variants -> plans: the inventory's roles with a variant's overrides applied, planned like any deploy.

Pure: reads the inventory and role files, touches no host. A variant whose plan has problems is
reported with the variant's name and line in the experiment file, together with every other
variant's problems, before anything runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..errors import InputError, Problem
from ..inventory import load_inventory, tp_split_problem
from ..model import Inventory, Plan, Role
from ..plan.build import build_plan, deployments
from ..plan.memcheck import memory_verdicts
from .spec import Experiment, Variant

if TYPE_CHECKING:
    from ..plan.calibrate import CalibrationStore


@dataclass(frozen=True)
class Planned:
    """One variant, planned: its units, and what the memory preflight says of them."""

    variant: Variant
    plan: Plan
    refusals: tuple[str, ...]  # the memory preflight predicts it will not boot (deploy would refuse)
    warnings: tuple[str, ...]

    @property
    def boots(self) -> bool:
        return not self.refusals


def override_role(role: Role, overrides: dict[str, Any]) -> Role:
    """``role`` with one variant's overrides: settings/env merged (None removes), the rest replaced."""
    settings = dict(role.settings)
    for k, v in (overrides.get("settings") or {}).items():
        if v is None:
            settings.pop(k, None)
        else:
            settings[k] = v
    env = dict(role.env)
    for k, v in (overrides.get("env") or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)
    out = replace(role, settings=settings, env=env)
    if "extra_args" in overrides:
        out = replace(out, extra_args=tuple(overrides["extra_args"]))
    if "tp_size" in overrides:
        out = replace(out, tp_size=int(overrides["tp_size"]))
    return out


def deployment_of(exp: Experiment, inv: Inventory) -> str:
    return exp.deployment or inv.deployment


def plan_variants(exp: Experiment, store: CalibrationStore | None = None) -> list[Planned]:
    """Every variant planned, or InputError with every problem of every variant."""
    problems: list[Problem] = []
    inv = load_inventory(exp.inventory, problems)
    if problems:
        raise InputError(problems)
    dep = deployment_of(exp, inv)
    if dep not in deployments(inv):
        raise InputError([Problem(f"deployment {dep!r} is not in {exp.inventory} (deployments: "
                                  f"{', '.join(sorted(deployments(inv)))})", file=exp.file, key="deployment")])
    try:
        base = build_plan(inv, deployment=dep, store=store)
    except InputError as exc:
        raise InputError([Problem(f"the inventory as it is: {p}", file=exp.file, key="inventory")
                          for p in exc.problems]) from None
    base_roles = {u.role.name for u in base.units}
    out: list[Planned] = []
    for v in exp.variants:
        mine: list[Problem] = []
        roles = dict(inv.roles)
        for name, ov in v.overrides.items():
            if name not in base_roles:
                mine.append(Problem(f"variant {v.name}: role {name!r} is not a role of deployment {dep!r} "
                                    f"(its roles: {', '.join(sorted(base_roles))})", file=exp.file, line=v.line,
                                    key=f"variants.{v.name}.{name}"))
                continue
            roles[name] = override_role(roles[name], ov)
            split = tp_split_problem(roles[name].tp_size, roles[name].nnodes) if "tp_size" in ov else None
            if split:
                mine.append(Problem(f"variant {v.name}: {split}", file=exp.file, line=v.line,
                                    key=f"{'grid' if v.grid else 'variants.' + v.name}.{name}.tp_size"))
        if mine:
            problems += mine
            continue
        try:
            plan = build_plan(replace(inv, roles=roles), deployment=dep, store=store)
        except InputError as exc:
            problems += [Problem(f"variant {v.name}: {p}", file=exp.file, line=v.line, key=f"variants.{v.name}")
                         for p in exc.problems]
            continue
        unused = [f"{name}.settings.{k}" for name, ov in v.overrides.items() for k in (ov.get("settings") or {})
                  if roles[name].engine == "command" and not any(_names(arg, k) for arg in roles[name].argv)]
        if unused:
            problems.append(Problem(f"variant {v.name}: {', '.join(unused)} is not used by the role's argv, so it "
                                    "would change nothing (a command role's settings reach the server only through "
                                    "{{ settings.KEY }} in its argv)", file=exp.file, line=v.line,
                                    key=f"variants.{v.name}"))
            continue
        refusals, warnings = memory_verdicts(plan)
        out.append(Planned(v, plan, tuple(str(p.message) for p in refusals), tuple(warnings)))
    if problems:
        raise InputError(problems)
    return out


def _names(template: str, key: str) -> bool:
    """Whether an argv template reads ``settings.KEY`` (or ``settings['KEY']``)."""
    return re.search(rf"settings(\.{re.escape(key)}\b|\[['\"]{re.escape(key)}['\"]\])", template) is not None
