"""invoke tasks: ``invoke lab.up --hosts 3 [--private lab2:lab3]``, ``invoke lab.down``, ``invoke lab.status``,
``invoke lab.engine``, ``invoke lab.router``, ``invoke lab.private --bastion lab2 --host lab3 [--remove]``."""

from __future__ import annotations

from invoke.collection import Collection
from invoke.context import Context
from invoke.exceptions import Exit
from invoke.tasks import task

from gpudeploy_lab import control, engine
from gpudeploy_lab.system import LabError


@task(help={"hosts": "how many hosts: lab1..labN (default 3)",
            "private": "BASTION:HOST[,...]: HOST reachable at 10.232.<N>.2 only through BASTION"})
def up(c: Context, hosts: int = 3, private: str = "") -> None:
    """Boot lab hosts (systemd + sshd), with the real sglang-router they run, and wait until ready."""
    try:
        engine.ensure_router()  # ~8 s once, then cached: inventory/lab.yml's router is the real one
        control.up(hosts, private=control.parse_pairs(private))
    except (LabError, ValueError) as exc:
        raise Exit(f"lab up failed: {exc}", code=1) from exc


@task(help={"bastion": "the host that relays (e.g. lab2)", "host": "the host behind it (e.g. lab3)",
            "remove": "take the private link away again"})
def private(c: Context, bastion: str, host: str, remove: bool = False) -> None:
    """Put a running host behind a bastion: reachable at 10.232.<N>.2 (labN-private) only through it."""
    try:
        if remove:
            control.remove_private_link(bastion, host)
        else:
            control.add_private_link(bastion, host)
    except (LabError, ValueError) as exc:
        raise Exit(f"lab private failed: {exc}", code=1) from exc


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
    for lk in control.private_links():
        print(f"{lk.private.name:<6} private {lk.private_address} ({lk.private_name}) only through {lk.bastion.name}")


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


lab_collection = Collection("lab", up, down, status, engine_, router, private)
ns = lab_collection
