"""``python -m gpudeploy_lab up [--hosts N] | down | status | engine | router``: the lab without invoke."""

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
    sub.add_parser("down", help="stop every lab host and remove everything it left")
    sub.add_parser("status", help="print each lab host's state")
    sub.add_parser("engine", help="build (once, cached) everything the hosts mount read-only: the vLLM CPU "
                   "venv with its tiny model, and the real sglang-router venv")
    sub.add_parser("router", help="build (once, cached) only the real sglang-router venv the hosts mount")
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            control.up(args.hosts)
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
    except (LabError, ValueError) as exc:
        print(f"lab {args.command} failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
