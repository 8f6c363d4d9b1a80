"""Where a fleet deploy's last second goes: from the last server's first possible ``/health`` 200 to
the command's exit (issue 26's "ready -> return"), step by step, with what the lab's hosts did meanwhile.

    .venv/bin/python bench/tail.py [--n 64] [--rounds 3] [--out bench/results]

Needs root (the lab). Brings up lab1..labN if they are not up (and takes them down again), deploys
``bench/fleet.py``'s fleet (one stand-in engine per host, one deployment per host) ``--rounds`` times,
each from a clean fleet, and tears it down after each round. The deploy runs ``invoke deploy`` in a
process of its own, as a user runs it, with time stamps (realtime) written at the entry and exit of
the steps after the gates: each host's last ``/health`` poll, the ready record, the release of each
host lock, the close of each connection, the calibration store's write, the report, the
interpreter's exit. Meanwhile a thread of this process samples the lab's cgroups every 20 ms (all
hosts' CPU) and every 250 ms (per cgroup of a host: sshd, the sessions, the engines, systemd,
journald, logind, dbus), and the command's own CPU from ``/proc``.

Output: per round, the steps' times from the moment the last host's ``/health`` could first answer 200
(its ready line's journal time + the stand-in's 1 s ``/health``), the CPU of the hosts and of the
command in that window, and which of the hosts' cgroups used it; raw data in ``<out>/tail-<date>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import io
import json
import os
import re
import runpy
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _instrumented(out: str, argv: list[str]) -> None:
    """In the deploy's own process: time stamps around its last steps, then ``invoke`` as usual."""
    events: list[tuple[float, str, dict[str, Any]]] = []

    def log(what: str, **kw: Any) -> None:
        events.append((time.time(), what, kw))

    def wrap(owner: Any, name: str, who: Any = None) -> None:
        fn = getattr(owner, name)

        @functools.wraps(fn)
        def timed(*a: Any, **k: Any) -> Any:
            extra = who(*a) if who else {}
            log(f"{name}:start", **extra)
            try:
                return fn(*a, **k)
            finally:
                log(f"{name}:end", **extra)

        setattr(owner, name, timed)

    from gpudeploy import report
    from gpudeploy.apply import deploy, deployment, lock
    from gpudeploy.plan import calibrate
    from gpudeploy.remote import ssh
    from gpudeploy.verify import gate

    wrap(gate, "_poll_health", lambda unit, *a: {"host": unit.host.name})
    wrap(deploy, "write_ready", lambda remote, *a: {"host": remote.host.name})
    wrap(deployment, "_batch")
    wrap(deployment, "deploy")
    wrap(lock.HostLock, "__exit__")
    wrap(ssh.Remote, "close")
    wrap(calibrate.CalibrationStore, "put_many")
    wrap(report, "deploy_summary")

    def dump() -> None:
        log("atexit")
        Path(out).write_text(json.dumps(events))

    import atexit

    atexit.register(dump)  # registered before invoke's and paramiko's: it runs after them
    sys.argv = ["invoke", *argv]
    runpy.run_module("invoke", run_name="__main__", alter_sys=True)


def _cgroup_cpu(root: Path) -> dict[str, float]:
    """CPU seconds per kind of cgroup, summed over the hosts (``labN`` and session numbers folded)."""
    out: dict[str, float] = {}
    for d, _, files in os.walk(root):
        rel = d[len(str(root)):]
        if "cpu.stat" not in files or not 3 <= rel.count("/") <= 5:
            continue
        try:
            usec = int(Path(d, "cpu.stat").read_text().split()[1])
        except (OSError, ValueError, IndexError):
            continue
        key = re.sub(r"session-\d+", "session-K", re.sub(r"lab\d+", "labN", rel))
        out[key] = out.get(key, 0.0) + usec / 1e6
    return out


def _children() -> list[int]:
    """The processes this process's main thread started (fleet.run's Popen runs there)."""
    try:
        return [int(x) for x in Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split()]
    except OSError:
        return []


def _proc_cpu(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


STEPS = (("last /health 200 seen", "_poll_health:end"), ("its ready record written", "write_ready:end"),
         ("host locks released", "__exit__:end"), ("calibration store written", "put_many:end"),
         ("connections closed", "close:end"), ("report made", "deploy_summary:end"),
         ("interpreter exit begins", "atexit"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--date", default=datetime.date.today().isoformat())
    ap.add_argument("--instrumented", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.instrumented:
        _instrumented(args.instrumented[0], args.instrumented[1:])
        return
    sys.path.insert(0, str(HERE))
    import fleet as F

    n = args.n
    up = {s.host.name for s in F.labctl.status() if s.up and s.ssh_ok}
    brought_up = not {f"lab{i}" for i in range(1, n + 1)} <= up
    root_cg = F.labctl.config.CGROUP_ROOTS[0]
    doc: dict[str, Any] = {"date": args.date, "n": n, "machine": F.machine(), "bytecode": F.precompile(),
                           "rounds": []}
    try:
        if brought_up:
            F.labctl.down()
            with contextlib.redirect_stdout(io.StringIO()):
                F.labctl.up(n)
        with tempfile.TemporaryDirectory(prefix="gd-tail-") as tmp:
            state = Path(tmp) / "state"
            state.mkdir()
            fl = F.make_fleet(Path(tmp) / f"n{n}", n, state)
            F.clean(fl, state)
            for rnd in range(args.rounds):
                events_path = Path(tmp) / f"events-{rnd}.json"
                sampler = _Sampler(F.lab_cpu_s, root_cg)
                argv = [sys.executable, __file__, "--instrumented", str(events_path), "--search-root", str(F.REPO),
                        "deploy", "--inventory", str(fl.good)]
                res = F.run(argv, env=F.gd_env(state), timeout=600)
                end = time.time() - (time.monotonic() - (res.started + res.wall_s))
                sampler.stop(after_s=0.3)  # what the hosts did right after the exit, too
                hosts_cpu, own_cpu, groups = sampler.hosts_cpu, sampler.own_cpu, sampler.groups
                if res.rc != 0:
                    print(f"round {rnd + 1}: deploy failed (rc {res.rc}):\n{res.out[-2000:]}")
                    F.clean(fl, state)
                    continue
                ready = F.runs_now(fl)
                t0 = max(t for _, t in ready.values()) + F.HEALTH_ANSWER_S
                events = json.loads(events_path.read_text())
                rec = _round(rnd + 1, t0, end, events, hosts_cpu, own_cpu, groups)
                doc["rounds"].append(rec)
                _show(rec)
                F.run(F.gd_argv("teardown", "--inventory", str(fl.good), "--purge"), env=F.gd_env(state), timeout=600)
    finally:
        if brought_up:
            with contextlib.redirect_stdout(io.StringIO()):
                F.labctl.down()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"tail-{args.date}-N{n}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {path}")


class _Sampler:
    """The lab's CPU every 20 ms, its cgroups' every 250 ms, the command's own from /proc."""

    def __init__(self, lab_cpu: Any, root: Path) -> None:
        self.lab_cpu, self.root = lab_cpu, root
        self.hosts_cpu: list[tuple[float, float]] = []
        self.own_cpu: list[tuple[float, float]] = []
        self.groups: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        k = 0
        while not self._stop.wait(0.02):  # bounded: stop() ends it
            now = time.time()
            self.hosts_cpu.append((now, self.lab_cpu()))
            for pid in _children():  # the deploy: this process's only child while it runs
                self.own_cpu.append((now, _proc_cpu(pid)))
            if k % 12 == 0:
                self.groups.append((now, _cgroup_cpu(self.root)))
            k += 1

    def stop(self, after_s: float) -> None:
        self._stop.wait(after_s)
        self._stop.set()
        self._thread.join(timeout=5)


def _at(series: list[tuple[float, float]], t: float) -> float:
    """The last reading at or before ``t`` (the command's /proc is gone once it exited)."""
    before = [v for at, v in series if at <= t and v == v]
    return before[-1] if before else float("nan")


def _round(number: int, t0: float, end: float, events: list[Any], hosts_cpu: list[tuple[float, float]],
           own_cpu: list[tuple[float, float]], groups: list[tuple[float, dict[str, float]]]) -> dict[str, Any]:
    steps: dict[str, float] = {}
    for label, what in STEPS:
        times = [t for t, w, _ in events if w == what]
        if times:
            steps[label] = max(times) - t0
    steps["process exit"] = end - t0
    window = end - t0
    rec: dict[str, Any] = {"round": number, "ready_to_return_s": window, "steps_s": steps,
                           "hosts_cpu_s": _at(hosts_cpu, end) - _at(hosts_cpu, t0),
                           "command_cpu_s": _at(own_cpu, end) - _at(own_cpu, t0)}
    rec["hosts_cores"] = rec["hosts_cpu_s"] / window if window > 0 else None
    rec["hosts_cores_before"] = _at(hosts_cpu, t0) - _at(hosts_cpu, t0 - 1.0)
    if groups:
        a = min(groups, key=lambda g: abs(g[0] - t0))
        b = min(groups, key=lambda g: abs(g[0] - end))
        rec["groups_window_s"] = [a[0] - t0, b[0] - t0]
        rec["groups_cpu_s"] = dict(sorted(((k, round(v - a[1].get(k, 0.0), 3)) for k, v in b[1].items()
                                           if k.count("/") >= 4), key=lambda kv: -kv[1])[:10])
    return rec


def _show(rec: dict[str, Any]) -> None:
    print(f"round {rec['round']}: /health 200 possible -> exit {rec['ready_to_return_s']:.3f} s; hosts used "
          f"{rec['hosts_cpu_s']:.2f} CPU-s ({rec['hosts_cores']:.2f} cores; {rec['hosts_cores_before']:.2f} in the "
          f"second before), the command {rec['command_cpu_s']:.2f} CPU-s", flush=True)
    for label, t in rec["steps_s"].items():
        print(f"    {t:+.3f}  {label}")
    if "groups_cpu_s" in rec:
        a, b = rec["groups_window_s"]
        print(f"    hosts' CPU by cgroup, {a:+.2f}..{b:+.2f} s: " + ", ".join(
            f"{k.split('/')[-1]} {v:.2f}" for k, v in rec["groups_cpu_s"].items()))


if __name__ == "__main__":
    main()
