"""gpudeploy's command line: thin invoke tasks that parse flags, call the package, print and exit.

    invoke plan [--host H] [--role R] [--json]
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any

from invoke import Collection, Exit, task

from gpudeploy.errors import GpudeployError
from gpudeploy.plan import load_plan
from gpudeploy.report import plan_json, plan_text

DEFAULT_INVENTORY = "inventory/hosts.yml"


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn gpudeploy's own errors into a message and exit status 1, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except GpudeployError as exc:
            raise Exit(f"gpudeploy: {exc}", code=1) from None
        except KeyboardInterrupt:
            raise Exit("gpudeploy: interrupted", code=130) from None

    return wrapper


@task(help={"inventory": "inventory file", "host": "only this host", "role": "only this role",
            "json": "one JSON document on stdout"})
@user_errors
def plan(c, inventory=DEFAULT_INVENTORY, host=None, role=None, json_=False):  # type: ignore[no-untyped-def]
    """Show what would run where (GPUs, NUMA, ports, command, env, files) without touching anything."""
    p = load_plan(inventory, host=host, role=role)
    if json_:
        json.dump(plan_json(p), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(plan_text(p))


ns = Collection(plan)
