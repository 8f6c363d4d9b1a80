"""Interleaved rounds at one host (or ``--hosts N``): what one command costs against the floor, and
against another build of gpudeploy, measured in the same sitting (issue 26).

One run of ``bench/fleet.py`` cannot show a change of 0.05-0.1 s on this 2-core VM: round to round a
one-host redeploy varies by ~0.1 s and a 3-host one by ~0.3 s. Here every round runs each arm once,
in turn, on a quiet machine (fleet.settle), so slow and fast moments fall on every arm alike:

    floor       ``ssh host true`` and ``ssh host systemctl show <unit>`` (fresh connections; at N
                hosts, N of each at once, timed until the last exits)
    status      first call (a fresh control folder: its own handshake), then again (warm)
    redeploy    nothing changed

``--bounds`` adds what any Python command on invoke pays on the way, with no gpudeploy code:
``python -c pass``, ``python -c "import invoke"``, and ``bench/bound_client.py``'s two ways to run
``true`` on the host over a fresh connection once invoke is imported (OpenSSH's ``ssh``; paramiko,
imported then), and paramiko's way with the host's python instead of ``true``: no redeploy can be
quicker than the quicker of the first two here, none that runs a python on the host (gpudeploy's
lock holder and probe do) quicker than the third.

Each line also gives the CPU seconds the whole machine used meanwhile (``/proc/stat``: the command,
the ssh clients, the lab's hosts, the kernel) and, for gpudeploy's arms, the command's own: the lab's
hosts share this machine's cores, so where the CPU a command needs is near twice its wall time on 2
cores, it is bound by CPU, and only less work makes it quicker.

``--without-bytecode`` adds a second gpudeploy arm: the same source, copied without any ``.pyc``
and put first on ``PYTHONPATH``, as a checkout without bytecode runs under PYTHONDONTWRITEBYTECODE.
``--baseline REV`` adds instead the gpudeploy of another commit (its ``src``, from ``git archive``,
compiled as setup.sh does). Lab: N hosts (booted if needed, left as found).

    .venv/bin/python bench/ab.py [--rounds 10] [--hosts N] [--bounds] [--without-bytecode | --baseline REV]
                                 [--out DIR]
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import datetime
import functools
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import fleet as F  # noqa: E402


def _without_bytecode(dest: Path) -> Path:
    src = dest / "src"
    shutil.copytree(F.REPO / "src", src, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return src


def _at_revision(rev: str, dest: Path) -> Path:
    data = subprocess.run(["git", "-C", str(F.REPO), "archive", rev, "src"], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")
    compileall.compile_dir(str(dest / "src"), quiet=1)
    return dest / "src"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--hosts", type=int, default=1, help="hosts in the fleet (default 1)")
    other = ap.add_mutually_exclusive_group()
    other.add_argument("--without-bytecode", action="store_true")
    other.add_argument("--baseline", metavar="REV")
    ap.add_argument("--bounds", action="store_true", help="time the parts any Python command on invoke pays")
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--date", default=datetime.date.today().isoformat())
    args = ap.parse_args()
    n = args.hosts
    up = {s.host.name for s in F.labctl.status() if s.up and s.ssh_ok}
    brought_up = not {f"lab{i}" for i in range(1, n + 1)} <= up
    doc: dict[str, Any] = {"date": args.date, "machine": F.machine(), "bytecode": F.precompile(),
                           "command": " ".join(["bench/ab.py", *sys.argv[1:]]), "rounds": args.rounds,
                           "hosts": n}
    try:
        if brought_up:
            with contextlib.redirect_stdout(io.StringIO()):
                F.labctl.up(n)
        with tempfile.TemporaryDirectory(prefix="gd-ab-") as tmp:
            root, state = Path(tmp), Path(tmp) / "state"
            state.mkdir()
            fl = F.make_fleet(root / f"n{n}", n, state)
            F.clean(fl, state)
            env = F.gd_env(state)
            arms: dict[str, dict[str, str]] = {"gpudeploy": env}
            if args.without_bytecode:
                arms["gpudeploy without bytecode"] = {**env, "PYTHONPATH": str(_without_bytecode(root / "nopyc"))}
            elif args.baseline:
                base = _at_revision(args.baseline, root / "base")
                arms[f"gpudeploy at {args.baseline}"] = {**env, "PYTHONPATH": str(base)}
            if F.run(F.gd_argv("deploy", "--inventory", str(fl.good)), env=env).rc != 0:
                raise SystemExit("bench/ab.py: the first deploy failed")
            good = fl.units["good"]
            addresses = [good[h]["address"] for h in fl.hosts]
            # each floor: one argv per host, all started at once, timed until the last exits
            floors = {"floor: ssh true": [F.labctl.ssh_argv(good[h]["address"], "true") for h in fl.hosts],
                      "floor: ssh systemctl show": [F.labctl.ssh_argv(
                          good[h]["address"], f"systemctl show -p MainPID,ActiveState,SubState,InvocationID "
                                              f"{good[h]['unit']}") for h in fl.hosts]}
            if args.bounds:
                py = sys.executable
                lab = [str(F.labctl.config.SSH_KEY), str(F.labctl.config.KNOWN_HOSTS), *addresses]
                client = [py, str(HERE / "bound_client.py")]
                floors |= {"bound: python -c pass": [[py, "-c", "pass"]],
                           "bound: import invoke": [[py, "-c", "import invoke"]],
                           "bound: import invoke, then ssh true": [[*client, "openssh", *lab]],
                           "bound: import invoke, paramiko, true": [[*client, "paramiko", *lab]],
                           "bound: import invoke, paramiko, host python": [[*client, "paramiko-python", *lab]]}
            times: dict[str, list[float]] = {}
            busy: dict[str, list[float]] = {}  # the whole machine's CPU seconds meanwhile (hosts, ssh, kernel)
            own: dict[str, list[float]] = {}  # the command's own CPU seconds (gpudeploy's arms)

            def measured(name: str, run: Callable[[], float]) -> None:
                """Once the machine is quiet: ``run``'s seconds, and the machine's CPU seconds meanwhile."""
                F.settle(name, engines=n, limit_s=30)
                before = F.machine_busy_s()
                times.setdefault(name, []).append(run())
                busy.setdefault(name, []).append(F.machine_busy_s() - before)

            def command(name: str, argv: list[str], e: dict[str, str] | None) -> float:
                r = F.run(argv, env=e)
                if r.rc != 0:
                    raise SystemExit(f"bench/ab.py: {name} failed (rc {r.rc}):\n{r.out[-1500:]}")
                own.setdefault(name, []).append(r.cpu_s)
                return r.wall_s

            def timed(name: str, argv: list[str], e: dict[str, str] | None) -> None:
                measured(name, functools.partial(command, name, argv, e))

            for rnd in range(args.rounds):
                for name, argvs in floors.items():
                    measured(name, functools.partial(F.parallel_wall, argvs))
                for arm, e in arms.items():
                    ctl = root / f"ctl-{rnd}-{len(times)}"
                    e = {**e, "GPUDEPLOY_SSH_CONTROL_DIR": str(ctl)}
                    timed(f"{arm}: status, first call", F.gd_argv("status", "--inventory", str(fl.good)), e)
                    timed(f"{arm}: status, warm", F.gd_argv("status", "--inventory", str(fl.good)), e)
                    timed(f"{arm}: redeploy", F.gd_argv("deploy", "--inventory", str(fl.good)), e)
                    if ctl.is_dir():
                        F.close_masters(ctl)  # the masters this round's status opened
                print(f"round {rnd + 1}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in times.items()), flush=True)
            F.run(F.gd_argv("teardown", "--inventory", str(fl.good), "--purge"), env=env)
    finally:
        if brought_up:
            with contextlib.redirect_stdout(io.StringIO()):
                F.labctl.down()
    med = {k: statistics.median(v) for k, v in times.items()}
    doc["seconds"] = times
    doc["medians"] = med
    doc["machine_cpu_s"], doc["command_cpu_s"] = busy, own
    floor_show, floor_true = med["floor: ssh systemctl show"], med["floor: ssh true"]
    lines = [f"{args.date}, {n} host{'s' if n > 1 else ''}, {args.rounds} interleaved rounds (medians, seconds; "
             "CPU: the whole machine's meanwhile, and the command's own)"]
    for k, v in med.items():
        base = floor_true if k.endswith("redeploy") or k.startswith("bound:") or k == "floor: ssh true" else floor_show
        cpu = f"  CPU {statistics.median(busy[k]):.3f}" + (f", own {statistics.median(own[k]):.3f}" if k in own else "")
        lines.append(f"  {k:45s} {v:.3f}  ({v / base:.2f}x the floor){cpu}")
    text = "\n".join(lines)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    suffix = f"-{n}hosts" if n > 1 else ""
    suffix += "-without-bytecode" if args.without_bytecode else f"-vs-{args.baseline}" if args.baseline else ""
    suffix += "-bounds" if args.bounds else ""
    path = out / f"ab-{args.date}{suffix}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(path)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
