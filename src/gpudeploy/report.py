"""Human and JSON views of a plan. Secrets are already masked in the plan; nothing here unmasks."""

from __future__ import annotations

import json
from typing import Any

from .model import Plan, Unit
from .plan.build import SECRET_MASK


def plan_json(plan: Plan) -> dict[str, Any]:
    """The documented ``invoke plan --json`` shape (see README, "plan --json")."""
    return {
        "inventory": plan.inventory.path,
        "deployment": plan.inventory.deployment,
        "units": [unit_json(u) for u in plan.units],
    }


def unit_json(u: Unit) -> dict[str, Any]:
    return {
        "host": u.host.name,
        "address": u.host.address,
        "role": u.role.name,
        "engine": u.role.engine,
        "engine_version": u.engine_version,
        "unit": u.name,
        "gpus": list(u.gpus),
        "numa_node": u.numa_node,
        "cpus": u.cpus,
        "ports": dict(u.ports),
        "argv": list(u.argv),
        "env": {**u.env, **{s: SECRET_MASK for s in u.secret_names}},
        "secrets": list(u.secret_names),
        "health": {"url": u.health_url, "timeout_s": u.role.health.timeout_s},
        "files": dict(u.files),
        "memory": u.memory,
    }


def plan_text(plan: Plan, *, show_files: bool = True) -> str:
    if not plan.units:
        return "nothing to run for this selection\n"
    out: list[str] = []
    for u in plan.units:
        out.append(f"== {u.host.name} ({u.host.address}) / {u.role.name}: {u.name}")
        gpus = ",".join(map(str, u.gpus)) or "-"
        numa = "-" if u.numa_node is None else str(u.numa_node)
        out.append(f"   engine   {u.role.engine} {u.engine_version or ''}".rstrip())
        out.append(f"   gpus     {gpus}   numa node {numa}   cpus {u.cpus or '-'}")
        out.append("   ports    " + "  ".join(f"{k}={v}" for k, v in u.ports.items()))
        out.append(f"   health   {u.health_url}")
        out.append("   command  " + " ".join(u.argv))
        env = {**u.env, **{s: SECRET_MASK for s in u.secret_names}}
        out.append("   env      " + ("  ".join(f"{k}={v}" for k, v in env.items()) or "-"))
        if u.memory:
            out.append(memory_line(u.memory))
        if show_files:
            for path, text in u.files.items():
                out.append(f"   --- {path}")
                out.extend("   | " + line for line in text.rstrip("\n").splitlines())
        out.append("")
    return "\n".join(out)


def memory_line(mem: dict[str, Any]) -> str:
    return "   memory   " + json.dumps(mem, sort_keys=True)
