"""invoke tasks: ``invoke lab.up --hosts 3 [--private lab2:lab3]``, ``invoke lab.down``, ``invoke lab.status``,
``invoke lab.engine``, ``invoke lab.router``, ``invoke lab.private --bastion lab2 --host lab3 [--remove]``,
``invoke lab.up --no-systemd lab3``, ``invoke lab.sglang --host lab2 --version 0.5.99 --flags-like 0.5.10
[--clear]``, ``invoke lab.nvml --host lab2 [--driver-not-loaded] [--restore]``,
``invoke lab.xid --host lab2 --gpu 0 --xid 79``, ``invoke lab.gpu --host lab2 --gpu 0 --remap pending``
(``--restore``), ``invoke lab.slurm-up``, ``invoke lab.slurm-down``, ``invoke lab.slurm-status``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

from invoke.collection import Collection
from invoke.context import Context
from invoke.exceptions import Exit
from invoke.tasks import task

from gpudeploy_lab.system import LabError

# control and engine are imported by the task that runs: `invoke --list` and `invoke deploy` load this
# module and need neither (~20 ms of a cold start, issue 26).


@contextmanager
def _exit_on_failure(task_name: str, *, bad_input: bool = False) -> Iterator[None]:
    """A LabError (with ``bad_input``, also a ValueError: a flag the task could not use) ends the task
    with ``lab <task_name> failed: <why>`` and exit status 1, not a traceback."""
    errors: tuple[type[Exception], ...] = (LabError, ValueError) if bad_input else (LabError,)
    try:
        yield
    except errors as exc:
        raise Exit(f"lab {task_name} failed: {exc}", code=1) from exc


@task(help={"hosts": "how many hosts: lab1..labN (default 3; 0 with --extra/--no-systemd: only those)",
            "private": "BASTION:HOST[,...]: HOST reachable at 10.232.<N>.2 only through BASTION",
            "no_systemd": "HOST[,...]: boot these without systemd (sshd under nspawn's stub init, like a "
                          "rented GPU container), also beyond lab1..labN",
            "extra": "HOST[,...]: boot these too, beyond lab1..labN"})
def up(c: Context, hosts: int = 3, private: str = "", no_systemd: str = "", extra: str = "") -> None:
    """Boot lab hosts (systemd + sshd), with the real engines they run (SGLang, vLLM, the router), and wait."""
    from gpudeploy_lab import control, engine

    with _exit_on_failure("up", bad_input=True):
        # once (~3 min on a fresh machine), then cached: lab/inventory/lab-sglang.yml runs the real SGLang
        # and the real router; lab/inventory/lab.yml's router is the real one too
        engine.ensure_all()
        control.up(hosts, private=control.parse_pairs(private), no_systemd=control.parse_names(no_systemd),
                   extra=control.parse_names(extra))


@task(name="sglang",
      help={"host": "a running lab host", "version": "the release the stand-in reports (e.g. 0.5.99)",
            "flags_like": "the captured release whose flags and --help it has (0.5.10 or 0.5.23)",
            "clear": "back to the default (0.5.23)"})
def sglang_release(c: Context, host: str, version: str = "", flags_like: str = "", clear: bool = False) -> None:
    """Make a host's stand-in SGLang a release gpudeploy has not captured (/etc/gpudeploy-lab/sglang.json)."""
    from gpudeploy_lab import control

    with _exit_on_failure("sglang", bad_input=True):
        if clear:
            control.clear_sglang_release(host)
        elif version:
            control.set_sglang_release(host, version, flags_like or None)
        else:
            raise ValueError("give --version [--flags-like], or --clear")


@task(help={"host": "a running lab host", "restore": "give the host its GPUs back",
            "driver_not_loaded": "library there, driver not (NVMLError_DriverNotLoaded)"})
def nvml(c: Context, host: str, restore: bool = False, driver_not_loaded: bool = False) -> None:
    """Take a host's (fake) NVIDIA driver away: nvmlInit raises NVMLError_LibraryNotFound; --restore undoes."""
    from gpudeploy_lab import control

    with _exit_on_failure("nvml", bad_input=True):
        if restore:
            control.restore_nvml(host)
        else:
            control.remove_nvml(host, driver_not_loaded=driver_not_loaded)


@task(help={"host": "a running lab host", "gpu": "the GPU's index", "xid": "the Xid to log (79, 48, 94, ...)",
            "text": "what the driver says after the number (default: its words for that Xid)"})
def xid(c: Context, host: str, gpu: int, xid: int, text: str = "") -> None:
    """Log a driver Xid for a host's GPU (its kernel-log stand-in) and set the NVML state that goes with it."""
    from gpudeploy_lab import control

    with _exit_on_failure("xid", bad_input=True):
        print(control.inject_xid(host, gpu, xid, text or None))


@task(name="gpu", help={"host": "a running lab host", "gpu": "the GPU's index", "lost": "it fell off the bus",
                        "remap": "pending or failed: a row remap", "ecc": "uncorrected volatile ECC errors",
                        "pcie_width": "its PCIe link's width now (of x16)", "slowdown": "clocks held down by the "
                        "hardware (HW_SLOWDOWN)", "restore": "every GPU of the host healthy, its kernel log empty"})
def gpu_health(c: Context, host: str, gpu: int = 0, lost: bool = False, remap: str = "", ecc: int = 0,
               pcie_width: int = 0, slowdown: bool = False, restore: bool = False) -> None:
    """Make a host's (stand-in) GPU unhealthy as NVML would show it; --restore makes every GPU healthy again."""
    from gpudeploy_lab import control

    with _exit_on_failure("gpu", bad_input=True):
        if restore:
            control.restore_gpu_health(host)
            return
        if remap not in ("", "pending", "failed"):
            raise ValueError(f"--remap pending or failed, not {remap!r}")
        fields: dict[str, object] = {}
        if lost:
            fields["lost"] = True
        if remap:
            fields["remapped_rows"] = [0, 1, int(remap == "pending"), int(remap == "failed")]
        if ecc:
            fields["ecc_uncorrected_volatile"] = ecc
        if pcie_width:
            fields["pcie"] = [5, 5, pcie_width, 16]
        if slowdown:
            fields["clocks_event_reasons"] = 0x8
        print(json.dumps(control.set_gpu_health(host, gpu, **fields)))


@task(help={"bastion": "the host that relays (e.g. lab2)", "host": "the host behind it (e.g. lab3)",
            "remove": "take the private link away again"})
def private(c: Context, bastion: str, host: str, remove: bool = False) -> None:
    """Put a running host behind a bastion: reachable at 10.232.<N>.2 (labN-private) only through it."""
    from gpudeploy_lab import control

    with _exit_on_failure("private", bad_input=True):
        if remove:
            control.remove_private_link(bastion, host)
        else:
            control.add_private_link(bastion, host)


@task(help={"only": "HOST[,...]: only these hosts; the others keep running"})
def down(c: Context, only: str = "") -> None:
    """Stop all lab hosts and remove everything they left behind."""
    from gpudeploy_lab import control

    with _exit_on_failure("down"):
        control.down(control.parse_names(only))


@task
def status(c: Context) -> None:
    """Print each lab host: up/down, address, ssh, systemd state, RAM."""
    from gpudeploy_lab import control

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
    from gpudeploy_lab import engine

    with _exit_on_failure("engine"):
        engine.ensure_all()


@task
def router(c: Context) -> None:
    """Build (once, cached) only the real sglang-router venv (0.3.2) that lab hosts see read-only."""
    from gpudeploy_lab import engine

    with _exit_on_failure("router"):
        engine.ensure_router()


@task
def slurm_up(c: Context) -> None:
    """Boot the Slurm cluster (slurmctl + slurmn1/slurmn2, 10.232.0.0/24) with the engines, replacing one left up."""
    from gpudeploy_lab import engine, slurm

    with _exit_on_failure("slurm-up"):
        engine.ensure_all()  # the compute nodes run the real SGLang and router as job steps, like lab hosts
        slurm.up()


@task
def slurm_down(c: Context) -> None:
    """Stop the Slurm cluster and remove everything it left (the main lab's hosts keep running)."""
    from gpudeploy_lab import slurm

    with _exit_on_failure("slurm-down"):
        slurm.down()


@task
def slurm_status(c: Context) -> None:
    """Print each Slurm cluster host, and sinfo's nodes when the controller answers."""
    from gpudeploy_lab import slurm

    print("\n".join(slurm.status()))


lab_collection = Collection("lab", up, down, status, engine_, router, private, sglang_release, nvml, xid,
                            gpu_health, slurm_up, slurm_down, slurm_status)
ns = lab_collection
