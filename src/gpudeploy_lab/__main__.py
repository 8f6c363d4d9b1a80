"""``python -m gpudeploy_lab up [--hosts N] [--private A:B] [--no-systemd H] [--extra H] | down | status | engine
| router | private A B | sglang H VERSION [FLAGS_LIKE] | nvml H [--restore] | slurm up|down|status``: the lab
without invoke. ``down`` (what CI's cleanup runs) also takes the Slurm cluster down; ``down --only`` and
``slurm down`` take only what they name."""

from __future__ import annotations

import argparse
import sys

from gpudeploy_lab import control, engine, slurm
from gpudeploy_lab.system import LabError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpudeploy_lab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="boot lab hosts and wait until they are ready")
    up.add_argument("--hosts", type=int, default=3, help="how many hosts: lab1..labN (default 3)")
    up.add_argument("--private", action="append", default=[], metavar="BASTION:HOST",
                    help="HOST reachable at 10.232.<N>.2 only through BASTION (repeatable)")
    up.add_argument("--no-systemd", action="append", default=[], metavar="HOST[,HOST]",
                    help="boot HOST without systemd (sshd under nspawn's stub init, like a rented GPU "
                    "container); booted also when beyond --hosts (repeatable)")
    up.add_argument("--extra", action="append", default=[], metavar="HOST[,HOST]",
                    help="boot HOST too, beyond lab1..labN (repeatable; --hosts 0 boots only these)")
    rel = sub.add_parser("sglang", help="make a running host's stand-in SGLang report VERSION and take "
                         "the flags of the captured FLAGS_LIKE (or --clear)")
    rel.add_argument("host")
    rel.add_argument("version", nargs="?")
    rel.add_argument("flags_like", nargs="?")
    rel.add_argument("--clear", action="store_true", help="back to the default 0.5.23")
    nvml = sub.add_parser("nvml", help="take a running host's (fake) NVIDIA driver away, or --restore it")
    nvml.add_argument("host")
    nvml.add_argument("--driver-not-loaded", action="store_true",
                      help="library there, driver not: NVMLError_DriverNotLoaded instead of LibraryNotFound")
    nvml.add_argument("--restore", action="store_true", help="give the host its GPUs back")
    priv = sub.add_parser("private", help="put a running host behind a bastion (a private link)")
    priv.add_argument("bastion")
    priv.add_argument("host")
    priv.add_argument("--remove", action="store_true", help="take the private link away again")
    dn = sub.add_parser("down", help="stop every lab host and remove everything it left")
    dn.add_argument("--only", action="append", default=[], metavar="HOST[,HOST]",
                    help="only these hosts; the others keep running (repeatable)")
    sub.add_parser("status", help="print each lab host's state")
    sl = sub.add_parser("slurm", help="the Slurm cluster (slurmctl, slurmn1, slurmn2 on 10.232.0.0/24), "
                        "beside the main lab")
    sl.add_argument("action", choices=("up", "down", "status"))
    sub.add_parser("engine", help="build (once, cached) everything the hosts mount read-only: the vLLM CPU "
                   "venv with its tiny model, and the real sglang-router venv")
    sub.add_parser("router", help="build (once, cached) only the real sglang-router venv the hosts mount")
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            control.up(args.hosts, private=[pair for item in args.private for pair in control.parse_pairs(item)],
                       no_systemd=[n for item in args.no_systemd for n in control.parse_names(item)],
                       extra=[n for item in args.extra for n in control.parse_names(item)])
        elif args.command == "sglang":
            if args.clear:
                control.clear_sglang_release(args.host)
            elif args.version:
                control.set_sglang_release(args.host, args.version, args.flags_like)
            else:
                raise ValueError("give VERSION [FLAGS_LIKE], or --clear")
        elif args.command == "nvml":
            if args.restore:
                control.restore_nvml(args.host)
            else:
                control.remove_nvml(args.host, driver_not_loaded=args.driver_not_loaded)
        elif args.command == "private":
            if args.remove:
                control.remove_private_link(args.bastion, args.host)
            else:
                control.add_private_link(args.bastion, args.host)
        elif args.command == "engine":
            engine.ensure_all()
        elif args.command == "router":
            engine.ensure_router()
        elif args.command == "down":
            only = [n for item in args.only for n in control.parse_names(item)]
            if only:
                control.down(only)
            else:
                down_everything()
        elif args.command == "slurm":
            if args.action == "up":
                slurm.up()
            elif args.action == "down":
                slurm.down()
            else:
                print("\n".join(slurm.status()))
        else:
            statuses = control.status()
            for st in statuses:
                print(st.line())
            if not statuses:
                print("lab: no hosts")
            for lk in control.private_links():
                print(f"{lk.private.name:<6} private {lk.private_address} ({lk.private_name}) "
                      f"only through {lk.bastion.name}")
    except (LabError, ValueError) as exc:
        print(f"lab {args.command} failed: {exc}", file=sys.stderr)
        return 1
    return 0


def down_everything() -> None:
    """The main lab and the Slurm cluster, each whatever the other's fate (CI's cleanup: nothing may stay)."""
    errors = []
    for part in (control.down, slurm.down):
        try:
            part()
        except LabError as exc:
            errors.append(str(exc))
    if errors:
        raise LabError("\n".join(errors))


if __name__ == "__main__":
    sys.exit(main())
