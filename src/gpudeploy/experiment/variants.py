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
from ..model import Host, Inventory, Plan, Role
from ..plan.build import build_plan, deployments
from ..plan.memcheck import memory_verdicts
from .ship import Bundle
from .spec import Experiment, Variant

if TYPE_CHECKING:
    from ..plan.calibrate import CalibrationStore


@dataclass(frozen=True)
class Planned:
    """One variant, planned: its units, what the memory preflight says of them, and the files each
    host must have before its units start."""

    variant: Variant
    plan: Plan
    refusals: tuple[str, ...]  # the memory preflight predicts it will not boot (deploy would refuse)
    warnings: tuple[str, ...]
    shipped: tuple[tuple[Host, Bundle], ...] = ()  # (host, files), each once

    @property
    def boots(self) -> bool:
        return not self.refusals


def override_role(role: Role, overrides: dict[str, Any], shipped: tuple[Bundle, ...] = ()) -> Role:
    """``role`` with one variant's overrides: settings/env merged (None removes), the model's path and
    facts replaced (a new path without facts drops the old checkpoint's facts), each shipped file's
    variable set to where it lands on the host, the rest replaced."""
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
    for bundle in shipped:
        env[bundle.env] = bundle.target
    model = dict(role.model)
    change = overrides.get("model") or {}
    if "path" in change and change.get("path") != model.get("path"):
        model.pop("facts", None)
    model.update(change)
    out = replace(role, settings=settings, env=env, model=model)
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
        applied: dict[str, list[str]] = {}
        for name, ov in v.overrides.items():
            # a role placed under its name, or a role file whose named instances all get the overrides
            targets = applied[name] = sorted(r for r in base_roles if name in (r, inv.roles[r].file_role))
            if not targets:
                mine.append(Problem(f"variant {v.name}: role {name!r} is not a role of deployment {dep!r} "
                                    f"(its roles: {', '.join(sorted(base_roles))})", file=exp.file, line=v.line,
                                    key=f"variants.{v.name}.{name}"))
                continue
            for target in targets:
                roles[target] = override_role(roles[target], ov, v.shipped.get(name, ()))
                split = tp_split_problem(roles[target].tp_size, roles[target].nnodes) if "tp_size" in ov else None
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
        unused = sorted({f"{name}.settings.{k}" for name, ov in v.overrides.items() for k in (ov.get("settings") or {})
                         for target in applied.get(name, []) if roles[target].engine == "command"
                         and not any(_names(arg, k) for arg in roles[target].argv)})
        if unused:
            problems.append(Problem(f"variant {v.name}: {', '.join(unused)} is not used by the role's argv, so it "
                                    "would change nothing (a command role's settings reach the server only through "
                                    "{{ settings.KEY }} in its argv)", file=exp.file, line=v.line,
                                    key=f"variants.{v.name}"))
            continue
        refusals, warnings = memory_verdicts(plan)
        shipped: dict[tuple[str, str], tuple[Host, Bundle]] = {}
        for u in plan.units:
            for role_name, bundles in v.shipped.items():
                if role_name in (u.role.name, u.role.file_role):
                    for b in bundles:
                        shipped.setdefault((u.host.name, b.digest), (u.host, b))
        out.append(Planned(v, plan, tuple(str(p.message) for p in refusals), tuple(warnings),
                           tuple(shipped.values())))
    if problems:
        raise InputError(problems)
    return out


def _names(template: str, key: str) -> bool:
    """Whether an argv template reads ``settings.KEY`` (or ``settings['KEY']``)."""
    return re.search(rf"settings(\.{re.escape(key)}\b|\[['\"]{re.escape(key)}['\"]\])", template) is not None
