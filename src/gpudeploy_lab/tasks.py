"""invoke tasks: ``invoke lab.up --hosts 3``, ``invoke lab.down``, ``invoke lab.status``, ``invoke lab.engine``,
``invoke lab.router``."""

from __future__ import annotations

from invoke.collection import Collection
from invoke.context import Context
from invoke.exceptions import Exit
from invoke.tasks import task

from gpudeploy_lab import control, engine
from gpudeploy_lab.system import LabError


@task(help={"hosts": "how many hosts: lab1..labN (default 3)"})
def up(c: Context, hosts: int = 3) -> None:
    """Boot lab hosts (systemd + sshd) and wait until they are ready."""
    try:
        control.up(hosts)
    except (LabError, ValueError) as exc:
        raise Exit(f"lab up failed: {exc}", code=1) from exc


@task
def down(c: Context) -> None:
    """Stop all lab hosts and remove everything they left behind."""
    try:
        control.down()
    except LabError as exc:
        raise Exit(f"lab down failed: {exc}", code=1) from exc


@task
def status(c: Context) -> None:
    """Print each lab host: up/down, address, ssh, systemd state, RAM."""
    statuses = control.status()
    for st in statuses:
        print(st.line())
    if not statuses:
        print("lab: no hosts")


@task(name="engine")
def engine_(c: Context) -> None:
    """Build (once, cached) what lab hosts see read-only: vLLM CPU + tiny model, and sglang-router."""
    try:
        engine.ensure_all()
    except LabError as exc:
        raise Exit(f"lab engine failed: {exc}", code=1) from exc


@task
def router(c: Context) -> None:
    """Build (once, cached) only the real sglang-router venv (0.3.2) that lab hosts see read-only."""
    try:
        engine.ensure_router()
    except LabError as exc:
        raise Exit(f"lab router failed: {exc}", code=1) from exc


lab_collection = Collection("lab", up, down, status, engine_, router)
ns = lab_collection
