"""``python -m gpudeploy_lab up [--hosts N] [--private A:B] | down | status | engine | router | private A B``:
the lab without invoke."""

from __future__ import annotations

import argparse
import sys

from gpudeploy_lab import control, engine
from gpudeploy_lab.system import LabError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpudeploy_lab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="boot lab hosts and wait until they are ready")
    up.add_argument("--hosts", type=int, default=3, help="how many hosts: lab1..labN (default 3)")
    up.add_argument("--private", action="append", default=[], metavar="BASTION:HOST",
                    help="HOST reachable at 10.232.<N>.2 only through BASTION (repeatable)")
    priv = sub.add_parser("private", help="put a running host behind a bastion (a private link)")
    priv.add_argument("bastion")
    priv.add_argument("host")
    priv.add_argument("--remove", action="store_true", help="take the private link away again")
    sub.add_parser("down", help="stop every lab host and remove everything it left")
    sub.add_parser("status", help="print each lab host's state")
    sub.add_parser("engine", help="build (once, cached) everything the hosts mount read-only: the vLLM CPU "
                   "venv with its tiny model, and the real sglang-router venv")
    sub.add_parser("router", help="build (once, cached) only the real sglang-router venv the hosts mount")
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            control.up(args.hosts, private=[pair for item in args.private for pair in control.parse_pairs(item)])
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
            control.down()
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


if __name__ == "__main__":
    sys.exit(main())
