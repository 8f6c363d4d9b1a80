"""Issue 14's benchmark: gpudeploy and Ansible, alternately in one run, on 1, 3, 8 and 64 lab hosts.

    .venv/bin/python bench/fleet.py [--rounds 3] [--ns 1,3,8,64] [--rounds-at-64 2] [--f5-rounds-at-64 1]
                                    [--tools gpudeploy,ansible] [--no-ansible-at-64] [--profile]
                                    [--out bench/results]

Issue 26's floor, in gpudeploy's turn of every round, right before its status (units running): N
parallel ``ssh host true`` (the lab's ssh options, OpenSSH's defaults otherwise), fresh and over control
masters opened beforehand, and one ``systemctl show`` of each host's unit both ways; every gpudeploy
figure is printed as a multiple of the floor it compares with, with the issue's targets. Beside it,
the bounds (``bench/bound_client.py``): ``import invoke`` and then the same N ``ssh host true``, or
paramiko's N connections each running ``true`` (the least any command on invoke pays), or the host's
python instead of ``true`` (the least one whose work on a host is a python there). ``--profile``
keeps, per N, cProfile of a redeploy and a status and ``ssh -v`` of one host (``<out>/fleet-<date>-profile-N*.txt``).

Needs root (the lab) and ansible-core + matplotlib in .bench-venv (``python3 -m venv .bench-venv &&
.bench-venv/bin/pip install ansible-core matplotlib``). Brings up lab1..lab<max N> (the hosts above
N idle while N hosts are measured), and takes the lab down at the end if it brought it up.

Every host runs one stand-in SGLang engine (TP1, ``standin_role(None, tp=1)``, ~1 s nominal start at
speed 0.3), one deployment per host (``bf-labK``, so one host's failure is its own, as for Ansible).
Both tools deploy the very same files: the Ansible playbook copies the unit and env file that
``invoke plan --json`` renders. Each round runs, per N, every tool in turn (the order rotates each
round), from a clean fleet:

  first deploy        gpudeploy ``invoke deploy``; Ansible: env dir + copy unit + copy env (0600) +
                      systemd_service (daemon-reload when the unit changed; restarted when a file
                      changed, else started) + ``uri`` /health until 200 (retries 20, delay 1 s,
                      delegated to localhost, as in test-lab.md)
  ready -> return     the command's return minus the moment the last host's /health could first answer
                      200: the latest journal timestamp of a host's "The server is fired up and ready to
                      roll!" line (realtime clock; the lab hosts share this machine's kernel) plus the
                      stand-in's 1 s /health (SGLang 0.5.23's health_generate sleeps 1 s before its first
                      look); "ready_line" is the same without that second
  redeploy            the same command again, nothing changed (checked: no unit restarted)
  status              gpudeploy ``invoke status``, first call after the deploys and again at once
                      (warm); Ansible ad-hoc ``-m command -a "systemctl show -p ... <unit>"``
  teardown            gpudeploy ``invoke teardown --purge``; Ansible: stop + remove unit and env file
                      + daemon-reload (checked: no unit file, nothing active)
  crash               the same first deploy, but lab1's engine fails ~2.2 s after its start
                      (stand-in fault ``oom-graph`` at speed 1.0: rank 0 logs "Capture cuda graph
                      failed: CUDA out of memory" mid CUDA-graph capture and the server exits 1);
                      the other N-1 hosts start normally. Measured from the server's death: the
                      earlier of that OOM line (the journal's monotonic timestamp) and its process
                      exit (systemd's ExecMainExitTimestampMonotonic; CLOCK_MONOTONIC is shared with
                      the hosts) to the first line of the command's output that reports lab1's failure
                      (gpudeploy: ``lab1/bad: FAILED``; Ansible: ``fatal: [lab1``), and to the
                      command's exit; "cause" = the report names CUDA out of memory.

Ansible runs at its default forks (5) and at forks = N (at N <= 5 the two are the same thing and
are measured once). Its configuration is otherwise the default (ssh with ControlPersist=60s, no
pipelining), ``ansible_python_interpreter`` set (no interpreter discovery). Every command's wall
time, CPU seconds (user + system of the process and every child it waited for: Ansible's forks,
gpudeploy's ssh clients) and peak RSS (``wait4``) are kept. Then the CLI's cold start: wall time of
``invoke --list`` and ``invoke status`` (1 host) and their ``python -X importtime`` (heaviest imports).

Output: a table on stdout, raw results in ``<out>/fleet-<date>.json`` and one plot per figure,
``<out>/fleet-<date>-<figure>.png``.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import datetime
import io
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "lab"))
sys.path.insert(0, str(REPO / "src"))

from deploytools import NUMA, standin_role, write_inventory  # noqa: E402

import gpudeploy_lab as labctl  # noqa: E402

BENCH_VENV = REPO / ".bench-venv"
ANSIBLE = BENCH_VENV / "bin" / "ansible"
READY_LINE = "The server is fired up and ready to roll!"
# The stand-in's /health, once ready, answers after exactly this long (gpudeploy_lab/standin/api.py
# sleeps 1.0 s, as SGLang 0.5.23's health_generate waits `asyncio.sleep(1)` before its first look): a
# /health asked at the ready line turns 200 this much later, and no sooner.
HEALTH_ANSWER_S = 1.0
CRASH_HOST = "lab1"
# The engines of even hosts on the machine's other core: NUMA node 0 (the TP1 unit's GPU 0) gets
# CPU 1 there, so N engines start on both cores, not all pinned to CPU 0.
NUMA_SWAPPED = [{**NUMA[0], "cpus": NUMA[1]["cpus"]}, {**NUMA[1], "cpus": NUMA[0]["cpus"]}]
FIGURES = {  # key -> (title, unit)
    "deploy": ("first deploy", "s"),
    "ready": ("/health 200 -> command returns", "s"),
    "ready_line": ("ready line -> command returns (includes the server's own 1 s /health)", "s"),
    "redeploy": ("redeploy, nothing changed", "s"),
    "status": ("status (first call after the deploys)", "s"),
    "status_warm": ("status (again at once)", "s"),
    "teardown": ("teardown", "s"),
    "crash_report": ("engine dies -> failure reported", "s"),
    "crash_exit": ("engine dies -> command exits", "s"),
}
# The floor: what plain OpenSSH does on the same hosts in the same round (issue 26), measured right
# before gpudeploy's status, with its units running. key -> title
FLOOR = {
    "floor_ssh": "N parallel `ssh host true`, fresh connections",
    "floor_ssh_master": "the same over an already-open control master",
    "floor_state": "N parallel `ssh host systemctl show` of the unit, fresh connections",
    "floor_state_master": "the same over an already-open control master",
    # bench/bound_client.py: no command on invoke that runs anything on the hosts is quicker
    "bound_openssh": "bound: `import invoke`, then N parallel `ssh host true`",
    "bound_paramiko": "bound: `import invoke`, paramiko, N threads each connecting and running `true`",
    "bound_paramiko_python": "bound: the same running the host's `python3 -c pass` (what gpudeploy's host work is)",
}
FLOOR_SHORT = {"floor_ssh": "N x `ssh host true`", "floor_state": "N x `ssh host systemctl show`"}
# gpudeploy figure -> (the floor it is a ratio to, the target ratio or None)
RATIO_TO = {"redeploy": ("floor_ssh", 1.5), "status": ("floor_state", 1.2), "status_warm": ("floor_state", 1.2),
            "teardown": ("floor_ssh", None), "deploy": ("floor_ssh", None)}
ABSOLUTE = {"ready": 0.25, "crash_report": 0.25}  # gpudeploy figure -> target, s, at every N
COLD_START_TARGET_S = 0.15
TARGET_3X = ("redeploy", "status", "status_warm", "teardown")  # >= 3x faster than Ansible forks=N at N >= 3


# --- running commands ------------------------------------------------------------------------------

@dataclass
class Run:
    argv: list[str]
    rc: int
    wall_s: float
    cpu_s: float
    maxrss_mib: float
    out: str
    started: float  # time.monotonic() at start
    host_cpu_s: float = 0.0  # CPU the lab hosts used meanwhile (their cgroups: sshd, probes, modules, engines)
    lines: list[tuple[float, str]] = field(default_factory=list)  # (monotonic, line) as they came


def run(argv: list[str], *, env: dict[str, str] | None = None, timeout: float = 900, cwd: Path = REPO) -> Run:
    """Run ``argv``; stdout and stderr together, each line timestamped as it arrives; rusage from wait4."""
    hosts0 = lab_cpu_s()
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            cwd=cwd, env=env)
    lines: list[tuple[float, str]] = []
    assert proc.stdout is not None

    def read() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            lines.append((time.monotonic(), raw.decode(errors="replace").rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = t0 + timeout
    while True:  # bounded: the command's own timeout
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            proc.kill()  # only the process this function started, by its PID
            pid, status, usage = os.wait4(proc.pid, 0)
            lines.append((time.monotonic(), f"[bench: killed after {timeout:g} s]"))
            break
        time.sleep(0.005)
    wall = time.monotonic() - t0
    host_cpu = lab_cpu_s() - hosts0
    proc.returncode = os.waitstatus_to_exitcode(status)
    reader.join(timeout=10)
    return Run(argv, proc.returncode, wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024,
               "\n".join(text for _, text in lines), t0, host_cpu, lines)


def lab_cpu_s() -> float:
    """CPU seconds every lab host has used so far (cgroup v2 ``cpu.stat`` of the lab's cgroup)."""
    try:
        text = (labctl.config.CGROUP_ROOTS[0] / "cpu.stat").read_text()
    except OSError:
        return 0.0
    return next((int(line.split()[1]) / 1e6 for line in text.splitlines() if line.startswith("usage_usec ")), 0.0)


def gd_env(state: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", "GPUDEPLOY_STATE": str(state / "gd-state"),
            "GPUDEPLOY_CALIBRATION": str(state / "calibration.json"),
            "GPUDEPLOY_FLAGS_CACHE": str(state / "flags"), "GPUDEPLOY_DEFAULTS_CACHE": str(state / "defaults")}


def ansible_env(state: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    return {**env, "PYTHONUNBUFFERED": "1", "ANSIBLE_LOCALHOST_WARNING": "False",
            "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False", "ANSIBLE_LOCAL_TEMP": str(state / "ansible-tmp"),
            "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_DEPRECATION_WARNINGS": "False"}


def gd_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "invoke", "--search-root", str(REPO), *args]


# --- the lab's hosts ----------------------------------------------------------------------------

def address(i: int) -> str:
    return labctl.Host(i).address


def on_hosts(hosts: Iterable[str], fn: Callable[[str], Any], workers: int = 16) -> dict[str, Any]:
    names = list(hosts)
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(names)))) as pool:
        return dict(zip(names, pool.map(fn, names), strict=True))


def ssh(host: str, cmd: str) -> str:
    """The benchmark's own look at a host (never timed): the lab's ssh and trust, no shared connection
    (so no login of the benchmark outlives the check), the cheapest key exchange."""
    h = labctl.Host(int(host.removeprefix("lab")))
    argv = labctl.ssh_argv(h.address, cmd)
    argv[1:1] = ["-o", "KexAlgorithms=curve25519-sha256"]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"ssh {host} {cmd!r}: exit {res.returncode}: {res.stderr.strip()}")
    return res.stdout


@dataclass
class Fleet:
    """One N: the gpudeploy inventories (good, crash) and Ansible's files for the same units."""

    n: int
    root: Path
    good: Path
    crash: Path
    units: dict[str, dict[str, Any]]  # inventory kind -> host -> plan unit (unit, env path, health, files)

    @property
    def hosts(self) -> list[str]:
        return [f"lab{i}" for i in range(1, self.n + 1)]


def make_fleet(root: Path, n: int, state: Path) -> Fleet:
    hosts = {f"lab{i}": address(i) for i in range(1, n + 1)}
    settings = {h: {"deployment": f"bf-{h}", **({"numa_nodes": NUMA_SWAPPED} if i % 2 == 0 else {})}
                for i, h in enumerate(hosts, 1)}
    good_role = standin_role(None, tp=1)
    bad_role = standin_role("oom-graph", tp=1, speed=1.0)
    good = write_inventory(root / "good", deployment="bf", hosts={h: (a, ["srv"]) for h, a in hosts.items()},
                           roles={"srv": good_role}, host_settings=settings)
    crash = write_inventory(root / "crash", deployment="bf",
                            hosts={h: (a, ["bad" if h == CRASH_HOST else "srv"]) for h, a in hosts.items()},
                            roles={"srv": good_role, "bad": bad_role}, host_settings=settings)
    units: dict[str, dict[str, Any]] = {}
    for kind, inv in (("good", good), ("crash", crash)):
        res = run(gd_argv("plan", "--inventory", str(inv), "--json"), env=gd_env(state), timeout=120)
        if res.rc != 0:
            raise RuntimeError(f"invoke plan failed: {res.out[-2000:]}")
        doc = json.loads(res.out[res.out.index("{"):])
        units[kind] = {u["host"]: u for u in doc["units"]}
        files = root / f"ansible-{kind}" / "files"
        lines = ["[lab]"]
        for h, u in units[kind].items():
            (unit_path,) = [p for p in u["files"] if p.startswith("/etc/systemd/system/")]
            (env_path,) = [p for p in u["files"] if p != unit_path]
            (files / h).mkdir(parents=True, exist_ok=True)
            (files / h / "unit").write_text(u["files"][unit_path])
            (files / h / "env").write_text(u["files"][env_path])
            lines.append(f"{h} ansible_host={u['address']} unit={u['unit']} env_path={env_path} "
                         f"health_url={u['health']['url']}")
        key, known = labctl.SSH_KEY, labctl.KNOWN_HOSTS
        lines += ["[lab:vars]", "ansible_user=root", f"ansible_ssh_private_key_file={key}",
                  f"ansible_ssh_common_args=-F /dev/null -o UserKnownHostsFile={known} "
                  "-o GlobalKnownHostsFile=/dev/null",
                  "ansible_python_interpreter=/usr/bin/python3", f"files={files}"]
        (root / f"ansible-{kind}" / "hosts.ini").write_text("\n".join(lines) + "\n")
    return Fleet(n, root, good, crash, units)


DEPLOY_YML = """\
- hosts: lab
  gather_facts: false
  tasks:
    - name: env directory
      ansible.builtin.file: {path: /etc/gpudeploy, state: directory, mode: "0755"}
    - name: unit file
      ansible.builtin.copy:
        {src: "{{ files }}/{{ inventory_hostname }}/unit", dest: "/etc/systemd/system/{{ unit }}", mode: "0644"}
      register: unit_file
    - name: env file
      ansible.builtin.copy: {src: "{{ files }}/{{ inventory_hostname }}/env", dest: "{{ env_path }}", mode: "0600"}
      register: env_file
    - name: started
      ansible.builtin.systemd_service:
        name: "{{ unit }}"
        state: "{{ 'restarted' if (unit_file.changed or env_file.changed) else 'started' }}"
        daemon_reload: "{{ unit_file.changed }}"
    - name: healthy
      ansible.builtin.uri: {url: "{{ health_url }}", status_code: 200}
      register: health
      until: health.status == 200
      retries: 20
      delay: 1
      delegate_to: localhost
"""

TEARDOWN_YML = """\
- hosts: lab
  gather_facts: false
  tasks:
    - name: stopped
      ansible.builtin.systemd_service: {name: "{{ unit }}", state: stopped}
    - name: no unit file
      ansible.builtin.file: {path: "/etc/systemd/system/{{ unit }}", state: absent}
    - name: no env file
      ansible.builtin.file: {path: "{{ env_path }}", state: absent}
    - name: daemon-reload
      ansible.builtin.systemd_service: {daemon_reload: true}
"""


# --- one tool's commands ----------------------------------------------------------------------------

@dataclass
class Tool:
    name: str  # gpudeploy | ansible-f5 | ansible-fN
    forks: int | None = None  # Ansible's -f (None: its default, 5)

    def deploy(self, fleet: Fleet, kind: str, state: Path) -> Run:
        if self.name == "gpudeploy":
            inv = fleet.good if kind == "good" else fleet.crash
            return run(gd_argv("deploy", "--inventory", str(inv)), env=gd_env(state))
        return self._playbook(fleet, kind, "deploy.yml", state)

    def status(self, fleet: Fleet, state: Path, control: Path | None = None) -> Run:
        """``control``: gpudeploy's folder of shared ssh connections (its default is the user's)."""
        if self.name == "gpudeploy":
            env = gd_env(state) | ({"GPUDEPLOY_SSH_CONTROL_DIR": str(control)} if control is not None else {})
            return run(gd_argv("status", "--inventory", str(fleet.good)), env=env)
        return run([str(ANSIBLE), "lab", "-i", str(fleet.root / "ansible-good" / "hosts.ini"), *self._forks(),
                    "-m", "command", "-a", "systemctl show -p MainPID,ActiveState,SubState {{ unit }}"],
                   env=ansible_env(state))

    def teardown(self, fleet: Fleet, kind: str, state: Path) -> Run:
        if self.name == "gpudeploy":
            inv = fleet.good if kind == "good" else fleet.crash
            return run(gd_argv("teardown", "--inventory", str(inv), "--purge"), env=gd_env(state))
        return self._playbook(fleet, kind, "teardown.yml", state)

    def _forks(self) -> list[str]:
        return ["-f", str(self.forks)] if self.forks is not None else []

    def _playbook(self, fleet: Fleet, kind: str, book: str, state: Path) -> Run:
        return run([str(ANSIBLE) + "-playbook", "-i", str(fleet.root / f"ansible-{kind}" / "hosts.ini"),
                    *self._forks(), str(fleet.root / book)], env=ansible_env(state))


def tools_for(n: int) -> list[Tool]:
    tools = [Tool("gpudeploy"), Tool("ansible-f5")]
    if n > 5:
        tools.append(Tool("ansible-fN", forks=n))
    return tools


# --- checks on the hosts ----------------------------------------------------------------------------

def runs_now(fleet: Fleet) -> dict[str, tuple[str, float]]:
    """host -> (InvocationID, realtime of its ready line) of its unit's current run, which must be active."""

    def one(host: str) -> tuple[str, float]:
        unit = fleet.units["good"][host]["unit"]
        out = ssh(host, f"inv=$(systemctl show -p InvocationID --value {unit}); echo \"$inv\"; "
                  f"systemctl is-active -q {unit} || echo NOT-ACTIVE; "
                  f"journalctl -o json --no-pager _SYSTEMD_INVOCATION_ID=$inv | grep -F 'ready to roll'; true")
        inv, *rest = out.splitlines()
        if "NOT-ACTIVE" in rest:
            raise RuntimeError(f"{host}: {unit} is not active after the deploy")
        for line in rest:
            rec = json.loads(line)
            if READY_LINE in str(rec.get("MESSAGE", "")):
                return inv, int(rec["__REALTIME_TIMESTAMP"]) / 1e6
        raise RuntimeError(f"{host}: no ready line in {unit}'s journal")

    return on_hosts(fleet.hosts, one)


def leftovers(fleet: Fleet) -> list[str]:
    """Units of the benchmark still loaded or with files on the hosts."""

    def one(host: str) -> str:
        return ssh(host, "ls /etc/systemd/system/ | grep '^gpudeploy-bf-' ; "
                   "systemctl list-units --all --plain --no-legend 'gpudeploy-bf-*' | "
                   "grep -v ' not-found ' | awk '{print $1\" \"$3}' | grep -v ' inactive$' ; true").strip()

    return [f"{h}: {out}" for h, out in on_hosts(fleet.hosts, one).items() if out]


def fatal_line_time(host: str, unit: str, text: str) -> float | None:
    """CLOCK_MONOTONIC seconds of the first line with ``text`` in the unit's current run (journal)."""
    out = ssh(host, f"inv=$(systemctl show -p InvocationID --value {unit}); "
              f"journalctl -o json --no-pager _SYSTEMD_INVOCATION_ID=$inv | grep -F '{text}' | head -1; true")
    return int(json.loads(out)["__MONOTONIC_TIMESTAMP"]) / 1e6 if out.strip() else None


def start_and_exit(host: str, unit: str) -> tuple[float | None, float | None]:
    """CLOCK_MONOTONIC seconds of the unit's main process start and exit (None: not known)."""
    out = ssh(host, f"systemctl show -p ExecMainStartTimestampMonotonic -p ExecMainExitTimestampMonotonic {unit}")
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    values = [props.get(k, "0").strip() for k in ("ExecMainStartTimestampMonotonic", "ExecMainExitTimestampMonotonic")]
    start, end = (int(v) / 1e6 if v.isdigit() and v != "0" else None for v in values)
    return start, end


def parallel_wall(argvs: list[list[str]], timeout: float = 120) -> float:
    """Start every argv at once; seconds until the last has exited (each must exit 0)."""
    t0 = time.monotonic()
    procs = [subprocess.Popen(a, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for a in argvs]
    failed = []
    for a, proc in zip(argvs, procs, strict=True):
        _, err = proc.communicate(timeout=timeout)
        if proc.returncode != 0:
            failed.append(f"{a[-2]}: exit {proc.returncode}: {err.decode(errors='replace').strip()[-200:]}")
    wall = time.monotonic() - t0
    if failed:
        raise RuntimeError("floor: " + "; ".join(failed[:3]))
    return wall


def floor(fleet: Fleet, masters: Path, before_each: Callable[[], None] = lambda: None) -> dict[str, float]:
    """What plain OpenSSH does on these hosts now (the lab's ssh options, OpenSSH's defaults otherwise:
    its own key exchange): N parallel ``ssh host true`` on fresh connections, the same over control
    masters opened beforehand (untimed), and one ``systemctl show`` of each host's unit (what status
    must read at the least) both ways. The hosts here all run systemd; a host under the process
    supervisor would read its state file instead (``cat`` of one file, the same single round trip)."""
    addrs = {h: fleet.units["good"][h]["address"] for h in fleet.hosts}
    show = {h: f"systemctl show -p MainPID,ActiveState,SubState,InvocationID {fleet.units['good'][h]['unit']}"
            for h in fleet.hosts}

    def via_master(h: str) -> list[str]:
        return ["-o", "ControlMaster=no", "-o", f"ControlPath={masters / h}"]

    def argv(h: str, cmd: str, master: bool) -> list[str]:
        a = labctl.ssh_argv(addrs[h], cmd)
        if master:
            a[1:1] = via_master(h)
        return a

    before_each()
    out = {"floor_ssh": parallel_wall([argv(h, "true", False) for h in fleet.hosts])}
    before_each()
    out["floor_state"] = parallel_wall([argv(h, show[h], False) for h in fleet.hosts])
    masters.mkdir(parents=True, exist_ok=True)
    opened = []
    try:
        for h in fleet.hosts:  # untimed: ssh -f returns once the master is authenticated
            a = labctl.ssh_argv(addrs[h], "true")
            a[1:1] = ["-o", "ControlMaster=yes", "-o", f"ControlPath={masters / h}", "-o", "ControlPersist=60",
                      "-f", "-N"]
            a.pop()  # no command with -N
            # (no pipes: the backgrounded master would hold them open until it exits)
            subprocess.run(a, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=60, check=True)
            opened.append(h)
        before_each()
        out["floor_ssh_master"] = parallel_wall([argv(h, "true", True) for h in fleet.hosts])
        before_each()
        out["floor_state_master"] = parallel_wall([argv(h, show[h], True) for h in fleet.hosts])
        # What a Python command on invoke pays at the least to run anything on these hosts (no
        # gpudeploy code): invoke's import, then the floor's ssh or paramiko's connections.
        bound = [sys.executable, str(REPO / "bench" / "bound_client.py")]
        lab = [str(labctl.config.SSH_KEY), str(labctl.config.KNOWN_HOSTS), *addrs.values()]
        before_each()
        out["bound_openssh"] = parallel_wall([[*bound, "openssh", *lab]])
        before_each()
        out["bound_paramiko"] = parallel_wall([[*bound, "paramiko", *lab]])
        before_each()
        out["bound_paramiko_python"] = parallel_wall([[*bound, "paramiko-python", *lab]])
    finally:
        for h in opened:  # the masters this function started, each by its own control socket
            a = labctl.ssh_argv(addrs[h], "true")
            a[1:1] = [*via_master(h), "-O", "exit"]
            a.pop()
            subprocess.run(a, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=30, check=False)
    return out


def close_masters(control: Path) -> None:
    """End the ssh masters gpudeploy's status opened in ``control``, each by its own socket."""
    for sock in control.iterdir():
        if sock.is_socket():
            subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "lab"], capture_output=True,
                           check=False, timeout=30)


def clean(fleet: Fleet, state: Path) -> None:
    """Whatever a failed step left: gpudeploy's teardown --purge of both inventories removes any unit of
    the benchmark's deployments, also those Ansible wrote."""
    for inv in (fleet.crash, fleet.good):
        run(gd_argv("teardown", "--inventory", str(inv), "--purge"), env=gd_env(state), timeout=600)
    left = leftovers(fleet)
    if left:
        raise RuntimeError("could not clean the hosts: " + "; ".join(left))


# --- one round of one tool at one N -------------------------------------------------------------------

def measure(tool: Tool, fleet: Fleet, state: Path, log: Callable[[str], None]) -> dict[str, Any]:
    rec: dict[str, Any] = {"tool": tool.name, "n": fleet.n, "forks": tool.forks}
    cmds: dict[str, Any] = {}

    def keep(name: str, r: Run, ok: bool) -> float:
        cmds[name] = {"wall_s": r.wall_s, "cpu_s": r.cpu_s, "host_cpu_s": r.host_cpu_s, "maxrss_mib": r.maxrss_mib,
                      "rc": r.rc, "ok": ok}
        if not ok:
            cmds[name]["tail"] = r.out[-3000:]
            log(f"    {tool.name} {name}: FAILED (rc {r.rc}):\n" + r.out[-1500:])
        return r.wall_s

    gd = tool.name == "gpudeploy"
    waits: dict[str, Any] = {}

    def quiet(before: str, engines: int) -> None:
        waits[before] = settle(before, engines, limit_s=30)

    # first deploy, and when readiness was noticed
    quiet("deploy", 0)
    r = tool.deploy(fleet, "good", state)
    end_real = time.time() - (time.monotonic() - (r.started + r.wall_s))
    ok = r.rc == 0
    rec["deploy"] = keep("deploy", r, ok)
    if ok and gd:
        rec["memory_with_engines"] = lab_memory(fleet.n)
    before = runs_now(fleet) if ok else {}
    if ok:
        ready = [t for _, t in before.values()]
        rec["ready_line"] = end_real - max(ready)
        # from the earliest moment the last host's /health could answer 200 (see HEALTH_ANSWER_S)
        rec["ready"] = end_real - (max(ready) + HEALTH_ANSWER_S)
        rec["ready_spread_s"] = max(ready) - min(ready)
    # redeploy, nothing changed: no unit restarted
    quiet("redeploy", fleet.n)
    r = tool.deploy(fleet, "good", state)
    same = ok and runs_now(fleet) == before
    recap = [int(x) for x in re.findall(r"\bchanged=(\d+)", r.out)]
    # gpudeploy says so per unit (a single deployment prints no summary line); Ansible's recap: changed=0
    unchanged = (r.out.count("unchanged and healthy") == fleet.n) if gd else (len(recap) == fleet.n and not any(recap))
    rec["redeploy"] = keep("redeploy", r, r.rc == 0 and same and unchanged)
    # the floor, right before status, with the same units running (measured in gpudeploy's turn)
    if gd and ok:
        parts = iter(("floor_ssh", "floor_state", "floor_ssh_master", "floor_state_master", "bound_openssh",
                      "bound_paramiko", "bound_paramiko_python"))
        rec.update(floor(fleet, state / "masters", lambda: quiet(next(parts), fleet.n)))
    # status, twice. Its first call makes its own connections: a control folder of this round's own
    # (the user's default one still held the last round's masters, alive for 120 s after its status,
    # so at 1-8 hosts, whose rounds take 25-40 s, a "first" call was warm in runs A-H).
    control = Path(tempfile.mkdtemp(prefix="ctl-", dir=state))
    quiet("status", fleet.n)
    r = tool.status(fleet, state, control)
    rec["status"] = keep("status", r, r.rc == 0)
    quiet("status_warm", fleet.n)
    r = tool.status(fleet, state, control)
    rec["status_warm"] = keep("status_warm", r, r.rc == 0)
    close_masters(control)
    # teardown: nothing of it left
    quiet("teardown", fleet.n)
    r = tool.teardown(fleet, "good", state)
    left = leftovers(fleet)
    rec["teardown"] = keep("teardown", r, r.rc == 0 and not left)
    if left:
        log(f"    {tool.name} teardown left: {left}")
        clean(fleet, state)
    # a server that dies ~2 s after its start
    quiet("crash", 0)
    r = tool.deploy(fleet, "crash", state)
    unit = fleet.units["crash"][CRASH_HOST]["unit"]
    # gpudeploy: "[lab1/bad] FAILED after ..." as it happens, or the summary's "lab1/bad: FAILED"
    marker = re.compile(rf"{CRASH_HOST}/bad(: |\] )FAILED" if gd else rf"fatal: \[{CRASH_HOST}[ \]]")
    born, exited = start_and_exit(CRASH_HOST, unit)
    # The server is dead from its fatal line on (rank 0's CUDA OOM); its process exits ~40 ms later,
    # up to 0.6 s later while 63 other engines boot on these 2 cores: the earlier of the two counts.
    fatal = fatal_line_time(CRASH_HOST, unit, "Capture cuda graph failed: CUDA out of memory")
    died = min((t for t in (fatal, exited) if t is not None), default=None)
    rec["crash_fatal_to_exit_s"] = exited - fatal if exited is not None and fatal is not None else None
    reported = next((t for t, line in r.lines if marker.search(line)), None)
    if reported is not None and exited is not None:
        rec["crash_report_from_exit"] = reported - exited
    crash_ok = r.rc != 0 and died is not None and reported is not None
    keep("crash", r, crash_ok)
    if died is not None:
        rec["crash_exit"] = r.started + r.wall_s - died
        rec["crash_after_start_s"] = died - born if born is not None else None
        if reported is not None:
            rec["crash_report"] = reported - died
    # the cause counts as reported with the failure when it comes with it (within 0.2 s of that line)
    rec["crash_cause"] = reported is not None and any(
        "CUDA out of memory" in line for t, line in r.lines if t <= reported + 0.2)
    rec["crash_cause_anywhere"] = "CUDA out of memory" in r.out
    rec["crash_report_line"] = next((line for _, line in r.lines if marker.search(line)), None)
    # untimed: clean up the crash run
    t = tool.teardown(fleet, "crash", state)
    if t.rc != 0 or leftovers(fleet):
        clean(fleet, state)
    rec["commands"] = cmds
    rec["settled"] = waits
    return rec


# --- profiles ---------------------------------------------------------------------------------------

def profile(fleet: Fleet, state: Path, stem: Path, log: Callable[[str], None]) -> None:
    """Where the time of a redeploy and of a status goes: cProfile of each (deploy first, untimed), the
    20 heaviest functions by cumulative time, and ``ssh -v`` of one host with each debug line's time."""
    env = gd_env(state)
    r = run(gd_argv("deploy", "--inventory", str(fleet.good)), env=env)
    if r.rc != 0:
        log(f"profile N={fleet.n}: deploy failed: {r.out[-500:]}")
        return
    texts = []
    for name, args in (("redeploy", ("deploy",)), ("status", ("status",)), ("status-warm", ("status",))):
        prof = stem.with_name(stem.name + f"-{name}.prof")
        res = run([sys.executable, "-m", "cProfile", "-o", str(prof), "-m", "invoke", "--search-root", str(REPO),
                   *args, "--inventory", str(fleet.good)], env=env)
        buf = io.StringIO()
        import pstats

        pstats.Stats(str(prof), stream=buf).sort_stats("cumulative").print_stats(25)
        prof.unlink()
        texts.append(f"== {name} (N={fleet.n}): wall {res.wall_s:.3f} s under cProfile, rc {res.rc}\n"
                     + buf.getvalue())
    argv = labctl.ssh_argv(fleet.units["good"][fleet.hosts[0]]["address"], "true")
    argv[argv.index("LogLevel=ERROR")] = "LogLevel=DEBUG1"
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    lines = [f"{time.monotonic() - t0:7.3f}  {raw.decode(errors='replace').rstrip()}" for raw in proc.stderr]
    proc.wait(timeout=60)
    texts.append(f"== ssh -v {fleet.hosts[0]} true (N={fleet.n}): {time.monotonic() - t0:.3f} s\n" + "\n".join(lines))
    run(gd_argv("teardown", "--inventory", str(fleet.good), "--purge"), env=env)
    path = stem.with_suffix(".txt")
    path.write_text("\n\n".join(texts) + "\n")
    log(f"profile N={fleet.n}: {path}")


# --- cold start -------------------------------------------------------------------------------------

def importtime(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    """``python -X importtime``: total, and the heaviest top-level imports (cumulative us)."""
    # (the console script is a python file: run it under the same interpreter)
    rest = argv[1:] if argv[0] == sys.executable else argv
    res = subprocess.run([sys.executable, "-X", "importtime", *rest], capture_output=True, text=True,
                         env=env, cwd=REPO, timeout=120, check=False)
    rows = []
    for line in res.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
        if m:
            rows.append((int(m.group(1)), int(m.group(2)), len(m.group(3)), m.group(4)))
    top = [r for r in rows if r[2] == 1]
    heaviest = sorted(top, key=lambda r: -r[1])[:10]
    return {"total_ms": sum(r[0] for r in rows) / 1000,
            "heaviest": [{"module": r[3], "cumulative_ms": r[1] / 1000} for r in heaviest]}


def cold_start(fleet: Fleet, state: Path, runs: int = 7) -> dict[str, Any]:
    env = gd_env(state)
    out: dict[str, Any] = {}
    gpudeploy = [str(Path(sys.executable).parent / "gpudeploy")]
    for name, argv in (("invoke --list", gd_argv("--list")), ("gpudeploy --help", [*gpudeploy, "--help"]),
                       ("invoke status (1 host)", gd_argv("status", "--inventory", str(fleet.good)))):
        walls = [run(argv, env=env, timeout=120).wall_s for _ in range(runs)]
        out[name] = {"wall_s": statistics.median(walls), "walls": walls, **importtime(argv, env)}
    return out


# --- results ----------------------------------------------------------------------------------------

def med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def summarize(records: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """figure -> N -> tool -> {median, values}."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for fig in [*FIGURES, *FLOOR]:
        for rec in records:
            if rec.get(fig) is None:
                continue
            cell = out.setdefault(fig, {}).setdefault(str(rec["n"]), {}).setdefault(rec["tool"], {"values": []})
            cell["values"].append(rec[fig])
    for per_n in out.values():
        for per_tool in per_n.values():
            for cell in per_tool.values():
                cell["median"] = med(cell["values"])
    return out


def anchor(per_tool: dict[str, Any]) -> dict[str, Any] | None:
    """Ansible at forks = N (the same as its default at N <= 5)."""
    return per_tool.get("ansible-fN") or per_tool.get("ansible-f5")


def targets(summary: dict[str, Any], records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    checks: list[dict[str, Any]] = []
    for fig in TARGET_3X:
        for n, per_tool in summary.get(fig, {}).items():
            gd, an = per_tool.get("gpudeploy"), anchor(per_tool)
            if int(n) >= 3 and gd and an:
                ratio = an["median"] / gd["median"]
                checks.append({"target": f"{fig} at N={n}: >= 3x faster than Ansible (forks = N)",
                               "value": f"{ratio:.1f}x", "met": ratio >= 3})
        per_n = summary.get(fig, {})
        if "1" in per_n and "64" in per_n and "gpudeploy" in per_n["1"] and "gpudeploy" in per_n["64"]:
            growth = per_n["64"]["gpudeploy"]["median"] / per_n["1"]["gpudeploy"]["median"]
            checks.append({"target": f"{fig}: N=64 <= 3x the N=1 time", "value": f"{growth:.2f}x", "met": growth <= 3})
    for fig, what in (("crash_report", "crash reported with its cause within 1 s"),
                      ("ready", "readiness noticed within 1 s")):
        for n, per_tool in summary.get(fig, {}).items():
            gd = per_tool.get("gpudeploy")
            if not gd:
                continue
            worst = max(gd["values"])
            cause = all(r.get("crash_cause") for r in records if r["tool"] == "gpudeploy" and str(r["n"]) == n) \
                if fig == "crash_report" else True
            checks.append({"target": f"{what} at N={n}", "value": f"median {gd['median']:.2f} s, worst {worst:.2f} s"
                           + ("" if cause else ", cause NOT named"), "met": worst <= 1 and cause})
    return checks


def floor_targets(summary: dict[str, Any], cold: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 26's targets: ratios to the floor of the same run, absolute times, cold start."""
    checks: list[dict[str, Any]] = []
    for fig, (base, goal) in RATIO_TO.items():
        if goal is None:
            continue
        for n, per_tool in sorted(summary.get(fig, {}).items(), key=lambda kv: int(kv[0])):
            gd = per_tool.get("gpudeploy")
            fl = summary.get(base, {}).get(n, {}).get("gpudeploy")
            if gd and fl:
                ratio = gd["median"] / fl["median"]
                checks.append({"target": f"{fig} at N={n}: <= {goal:g}x the floor ({base})",
                               "value": f"{gd['median']:.2f} s / {fl['median']:.2f} s = {ratio:.2f}x",
                               "met": ratio <= goal})
    for fig, goal in ABSOLUTE.items():
        for n, per_tool in sorted(summary.get(fig, {}).items(), key=lambda kv: int(kv[0])):
            gd = per_tool.get("gpudeploy")
            if gd:
                worst = max(gd["values"])
                checks.append({"target": f"{fig} at N={n}: <= {goal:g} s",
                               "value": f"median {gd['median']:.2f} s, worst {worst:.2f} s", "met": worst <= goal})
    for name, c in cold.items():
        if name in ("invoke --list", "gpudeploy --help"):
            checks.append({"target": f"{name} cold start <= {COLD_START_TARGET_S:g} s",
                           "value": f"{c['wall_s']:.3f} s", "met": c["wall_s"] <= COLD_START_TARGET_S})
    return checks


def floor_table(summary: dict[str, Any]) -> str:
    """Each gpudeploy figure beside the floor it is compared with, and the ratio."""
    ns = sorted({int(n) for per_n in summary.values() for n in per_n})
    lines = ["| figure | N | gpudeploy | floor | gpudeploy / floor | Ansible forks N |", "|---|---|---|---|---|---|"]
    for fig, (base, _goal) in RATIO_TO.items():
        for n in ns:
            per_tool = summary.get(fig, {}).get(str(n), {})
            gd = per_tool.get("gpudeploy", {}).get("median")
            fl = summary.get(base, {}).get(str(n), {}).get("gpudeploy", {}).get("median")
            an = (anchor(per_tool) or {}).get("median")
            ratio = f"{gd / fl:.2f}x" if gd and fl else "-"
            lines.append(f"| {FIGURES[fig][0]} | {n} | {fmt(gd)} | {fmt(fl)} ({base}) | {ratio} | {fmt(an)} |")
    for key, title in FLOOR.items():
        for n in ns:
            fl = summary.get(key, {}).get(str(n), {}).get("gpudeploy", {}).get("median")
            lines.append(f"| floor: {title} | {n} | | {fmt(fl)} | | |")
    return "\n".join(lines)


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def table(summary: dict[str, Any], records: list[dict[str, Any]]) -> str:
    ns = sorted({int(n) for per_n in summary.values() for n in per_n})
    lines = ["| figure | N | gpudeploy | Ansible forks 5 | Ansible forks N | ratio (Ansible forks N / gpudeploy) |",
             "|---|---|---|---|---|---|"]
    for fig, (title, _unit) in FIGURES.items():
        for n in ns:
            per_tool = summary.get(fig, {}).get(str(n), {})
            gd = per_tool.get("gpudeploy", {}).get("median")
            f5 = per_tool.get("ansible-f5", {}).get("median")
            fn = per_tool.get("ansible-fN", {}).get("median") if n > 5 else f5
            ratio = f"{fn / gd:.1f}x" if gd and fn else "-"
            if fig.startswith("crash"):
                causes = {t: any(r.get("crash_cause") for r in records if r["tool"] == t and r["n"] == n)
                          for t in ("gpudeploy", "ansible-f5", "ansible-fN")}
                note = {t: "" if t not in per_tool else " (cause)" if causes[t] else " (no cause)" for t in causes}
                lines.append(f"| {title} | {n} | {fmt(gd)}{note['gpudeploy']} | {fmt(f5)}{note['ansible-f5']} | "
                             f"{fmt(fn)}{note['ansible-fN' if n > 5 else 'ansible-f5']} | {ratio} |")
            else:
                lines.append(f"| {title} | {n} | {fmt(gd)} | {fmt(f5)} | {fmt(fn)} | {ratio} |")
    return "\n".join(lines)


def resources(records: list[dict[str, Any]], n: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for rec in records:
        if rec["n"] != n:
            continue
        for cmd, c in rec["commands"].items():
            cell = out.setdefault(rec["tool"], {}).setdefault(cmd, {"wall_s": [], "cpu_s": [], "host_cpu_s": [],
                                                                    "maxrss_mib": []})
            for k in ("wall_s", "cpu_s", "host_cpu_s", "maxrss_mib"):
                cell[k].append(c[k])
    for per_cmd in out.values():
        for cell in per_cmd.values():
            for k in ("wall_s", "cpu_s", "host_cpu_s"):
                cell[f"{k}_median"] = med(cell[k])
            cell["maxrss_mib_max"] = max(cell["maxrss_mib"])
    return out


def plot(summary: dict[str, Any], out: Path, stem: str) -> list[Path]:
    try:
        import matplotlib
        import matplotlib.ticker

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plots: matplotlib is not installed for this python; run under .bench-venv/bin/python "
              "or install it", file=sys.stderr)
        return []
    paths = []
    styles = {"gpudeploy": ("gpudeploy", "o-"), "ansible-f5": ("Ansible, forks 5", "s--"),
              "ansible-fN": ("Ansible, forks = N", "^:")}
    for fig, (title, unit) in FIGURES.items():
        per_n = summary.get(fig)
        if not per_n:
            continue
        f, ax = plt.subplots(figsize=(6, 4))
        for tool, (label, style) in styles.items():
            xs = sorted(int(n) for n, per_tool in per_n.items()
                        if tool in per_tool or (tool == "ansible-fN" and "ansible-f5" in per_tool and int(n) <= 5))
            ys = [(per_n[str(n)].get(tool) or per_n[str(n)]["ansible-f5"])["median"] for n in xs]
            if xs:
                ax.plot(xs, ys, style, label=label)
        base = RATIO_TO.get(fig, (None, None))[0]
        floors = summary.get(base, {}) if base else {}
        if fig in ("status", "status_warm", "redeploy", "teardown", "deploy"):
            for key, (label, style) in ((base, (f"floor: {FLOOR_SHORT[base]}", "k-")),
                                        (f"{base}_master", (f"floor: {FLOOR_SHORT[base]}, control master", "k--"))):
                per = summary.get(key, {}) if key else {}
                xs = sorted(int(n) for n, pt in per.items() if "gpudeploy" in pt)
                if xs and floors:
                    ax.plot(xs, [per[str(n)]["gpudeploy"]["median"] for n in xs], style, label=label, alpha=0.6)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        plain = matplotlib.ticker.FuncFormatter(lambda v, _pos: f"{v:g}")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(
            lambda v, _pos: f"{v:g}" if f"{v:.0e}"[0] in "25" else ""))
        ax.set_xticks(sorted(int(n) for n in per_n), [str(n) for n in sorted(int(n) for n in per_n)])
        ax.set_xlabel("hosts (N)")
        ax.set_ylabel(f"median, {unit} (log)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        f.tight_layout()
        path = out / f"{stem}-{fig}.png"
        f.savefig(path, dpi=110)
        plt.close(f)
        paths.append(path)
    return paths


def machine_busy_s() -> float:
    """CPU seconds this machine has been busy so far, every core and the kernel's own threads too
    (``/proc/stat``: all but idle and iowait)."""
    # user nice system idle iowait irq softirq steal (guest and guest_nice are in user and nice already)
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    busy = sum(fields) - fields[3] - fields[4]
    return busy / os.sysconf("SC_CLK_TCK")


def settle(what: str, engines: int = 0, window_s: float = 0.25, windows: int = 4, limit_s: float = 300
           ) -> dict[str, Any]:
    """Waits until this machine is quiet: ``windows`` windows of ``window_s`` in a row in which it was
    busy under 0.1 cores plus 0.01 for each of ``engines`` idle engines (an idle stand-in uses
    ~0.006), at most ``limit_s``. Every lab host's work shares our 2 cores: 64 hosts just booted use
    most of them for ~15 s; after each command the hosts' ends of its ssh sessions (sshd, logind,
    dbus, journald) go on for a second or so (bench/tail.py); after 64 engines stop, the kernel
    reclaims their memory. A command timed then is timed against them; on a real fleet each host
    does that on its own CPUs. So every timed command, the floor's too, starts on a quiet machine,
    and what the wait found is kept with the results."""
    quiet_cores = 0.1 + 0.01 * engines
    t0 = time.monotonic()
    calm, used = 0, machine_busy_s()
    levels: list[float] = []
    while calm < windows and time.monotonic() - t0 < limit_s:
        time.sleep(window_s)
        now = machine_busy_s()
        levels.append((now - used) / window_s)
        calm, used = (calm + 1 if levels[-1] < quiet_cores else 0), now
    return {"what": what, "waited_s": round(time.monotonic() - t0, 2), "quiet": calm >= windows,
            "cores": [round(x, 3) for x in levels[-windows:]]}


def precompile() -> dict[str, Any]:
    """gpudeploy's modules as an installed package has them: compiled to bytecode once. ``pip install``
    writes every module's .pyc; this repository's editable install does not, and where
    PYTHONDONTWRITEBYTECODE is set (as on this machine and the GPU machine) Python then compiles
    every module from source on every command: ~0.13 s of a status at one host (cProfile, 67 modules),
    more of a deploy. The lab's hosts read the same src folder (its shims and stand-ins), so they get
    them too. A module changed later is compiled from source again (its .pyc no longer matches)."""
    t = time.monotonic()
    ok = compileall.compile_dir(str(REPO / "src"), quiet=1)
    return {"precompiled": bool(ok), "compile_s": round(time.monotonic() - t, 2),
            "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE")}


def machine() -> dict[str, Any]:
    mem = Path("/proc/meminfo").read_text().split("\n")[0].split()[1]
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "?")
    ver = "not installed"  # runs of gpudeploy alone (bench/ab.py) need no Ansible
    if Path(ANSIBLE).exists():
        ver = subprocess.run([str(ANSIBLE), "--version"], capture_output=True, text=True, check=False
                             ).stdout.split("\n")[0]
    return {"cpus": os.cpu_count(), "cpu": cpu, "mem_gib": round(int(mem) / 2**20, 1), "kernel": platform.release(),
            "python": platform.python_version(), "ansible": ver}


def lab_memory(n: int) -> dict[str, Any]:
    """RAM of lab1..lab<n>: the proportional set size of every process in each host's cgroup (nspawn
    included), and this machine's MemAvailable."""
    from gpudeploy_lab.system import cgroup_pids, pss_kib

    pss = [pss_kib(cgroup_pids(labctl.Host(i).cgroups[0])) / 1024 for i in range(1, n + 1)]
    return {"hosts": n, "pss_mib_median": med(pss), "pss_mib_total": round(sum(pss), 1),
            "mem_available_gib": mem_available_gib()}


def mem_available_gib() -> float:
    line = next(x for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemAvailable:"))
    return round(int(line.split()[1]) / 2**20, 2)


# --- main -------------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rounds-at-64", type=int, default=2,
                    help="rounds of gpudeploy and Ansible forks = N at N = 64 (default 2: a full round there "
                    "takes ~15 min)")
    ap.add_argument("--f5-rounds-at-64", type=int, default=1,
                    help="rounds of Ansible at its default forks (5) at N = 64 (default 1: ~7 min each)")
    ap.add_argument("--ns", default="1,3,8,64")
    ap.add_argument("--tools", default="gpudeploy,ansible",
                    help="gpudeploy and/or ansible (default both; the floor is measured in gpudeploy's turn)")
    ap.add_argument("--no-ansible-at-64", action="store_true",
                    help="no Ansible at N = 64 (its rounds there take ~6 min each)")
    ap.add_argument("--profile", action="store_true",
                    help="after each N's rounds: cProfile of a redeploy and a status, and `ssh -v` timings "
                    "of one host, kept in <out>/fleet-<date>-profile-N*.txt")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--date", default=datetime.date.today().isoformat())
    ap.add_argument("--plot", metavar="JSON", help="only draw the plots of an earlier run's results")
    args = ap.parse_args()
    if args.plot:
        src = Path(args.plot)
        for p in plot(json.loads(src.read_text())["summary"], src.parent, src.stem):
            print(p)
        return
    if not ANSIBLE.exists():
        sys.exit(f"{ANSIBLE} is missing: python3 -m venv .bench-venv && .bench-venv/bin/pip install ansible-core "
                 "matplotlib")
    ns = sorted(int(x) for x in args.ns.split(","))
    wanted = set(args.tools.split(","))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"fleet-{args.date}"
    started = time.monotonic()

    def log(line: str) -> None:
        print(f"[{time.monotonic() - started:7.1f}s] {line}", flush=True)

    up = {s.host.name for s in labctl.status() if s.up and s.ssh_ok}
    brought_up = not {f"lab{i}" for i in range(1, max(ns) + 1)} <= up
    doc: dict[str, Any] = {"date": args.date, "machine": machine(), "bytecode": precompile(), "tools": sorted(wanted),
                           "command": " ".join([".venv/bin/python bench/fleet.py", *sys.argv[1:]]),
                           "rounds": args.rounds, "rounds_at_64": args.rounds_at_64,
                           "ansible_f5_rounds_at_64": args.f5_rounds_at_64, "records": []}
    try:
        if brought_up:
            labctl.down()
            doc["mem_available_gib_before_up"] = mem_available_gib()
            t0 = time.monotonic()
            with contextlib.redirect_stdout(io.StringIO()):
                labctl.up(max(ns))
            doc["lab_boot_s"] = time.monotonic() - t0
            log(f"lab: {max(ns)} hosts up in {doc['lab_boot_s']:.1f} s")
        doc["lab_memory_idle"] = lab_memory(max(ns))
        log(f"lab memory, idle: {doc['lab_memory_idle']}")
        with tempfile.TemporaryDirectory(prefix="gd-fleet-") as tmp:
            root, state = Path(tmp), Path(tmp) / "state"
            state.mkdir()
            fleets = {n: make_fleet(root / f"n{n}", n, state) for n in ns}
            for fl in fleets.values():
                (fl.root / "deploy.yml").write_text(DEPLOY_YML)
                (fl.root / "teardown.yml").write_text(TEARDOWN_YML)
            clean(fleets[max(ns)], state)
            doc["settle"] = []
            for n in ns:
                fl = fleets[n]
                doc["settle"].append(settle(f"N={n}", limit_s=300))
                log(f"lab quiet before N={n}: {doc['settle'][-1]}")
                rounds = args.rounds_at_64 if n == 64 else args.rounds
                for rnd in range(rounds):
                    tools = [t for t in tools_for(n)
                             if not (n == 64 and t.name == "ansible-f5" and rnd >= args.f5_rounds_at_64)
                             and (t.name == "gpudeploy" or "ansible" in wanted)
                             and (t.name != "gpudeploy" or "gpudeploy" in wanted)
                             and not (n == 64 and args.no_ansible_at_64 and t.name != "gpudeploy")]
                    shift = rnd % len(tools)
                    for tool in tools[shift:] + tools[:shift]:
                        t0 = time.monotonic()
                        try:
                            rec = measure(tool, fl, state, log)
                        except Exception as exc:  # one broken step: say it, clean the hosts, go on
                            log(f"N={n} round {rnd + 1} {tool.name}: ERROR {type(exc).__name__}: {exc}")
                            rec = {"tool": tool.name, "n": n, "forks": tool.forks, "error": str(exc), "commands": {}}
                            clean(fl, state)
                        rec["round"] = rnd + 1
                        doc["records"].append(rec)
                        shown = ", ".join(f"{k} {rec[k]:.2f}" for k in FIGURES if rec.get(k) is not None)
                        log(f"N={n} round {rnd + 1} {tool.name}: {shown} ({time.monotonic() - t0:.0f} s)")
                if args.profile:
                    profile(fl, state, out / f"{stem}-profile-N{n}", log)
            doc["settle"].append(settle("the cold starts", limit_s=300))
            doc["cold_start"] = cold_start(fleets[min(ns)], state)
    finally:
        if brought_up:
            with contextlib.redirect_stdout(io.StringIO()):
                labctl.down()
    doc["summary"] = summarize(doc["records"])
    doc["targets"] = targets(doc["summary"], doc["records"]) + floor_targets(doc["summary"], doc["cold_start"])
    doc["resources"] = {str(n): resources(doc["records"], n) for n in ns}
    doc["wall_s"] = time.monotonic() - started
    path = out / f"{stem}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{doc['date']}, {doc['machine']['cpus']} cores ({doc['machine']['cpu']}), {doc['machine']['mem_gib']} GiB, "
          f"{doc['machine']['ansible']}; medians of {args.rounds} rounds"
          + (f" (N=64: {doc['rounds_at_64']} rounds of gpudeploy and Ansible forks = N, {args.f5_rounds_at_64} of "
             "Ansible forks 5: a round at 64 takes ~15 min)" if 64 in ns else ""))
    print(table(doc["summary"], doc["records"]))
    print()
    print(floor_table(doc["summary"]))
    print()
    for c in doc["targets"]:
        print(f"{'met   ' if c['met'] else 'MISSED'} {c['target']}: {c['value']}")
    print()
    big = str(max(ns))
    print(f"N={big}, medians | wall s | CPU s of the command (and children it waited for) | CPU s of the "
          f"{big} hosts meanwhile | floor on {os.cpu_count()} cores: (both) / cores | peak RSS MiB")
    for tool, per_cmd in doc["resources"][big].items():
        for cmd, cell in per_cmd.items():
            floor = (cell["cpu_s_median"] + cell["host_cpu_s_median"]) / (os.cpu_count() or 1)
            print(f"  {tool:11s} {cmd:12s} | {cell['wall_s_median']:7.2f} | {cell['cpu_s_median']:6.2f} | "
                  f"{cell['host_cpu_s_median']:6.2f} | {floor:6.2f} | {cell['maxrss_mib_max']:4.0f}")
    print()
    for name, c in doc["cold_start"].items():
        heavy = ", ".join(f"{h['module']} {h['cumulative_ms']:.0f} ms" for h in c["heaviest"][:6])
        print(f"{name}: {c['wall_s']:.3f} s wall (median), imports {c['total_ms']:.0f} ms; heaviest: {heavy}")
    try:
        import matplotlib  # noqa: F401

        pngs = plot(doc["summary"], out, stem)
    except ImportError:  # this is the project's venv: plot with the benchmark's
        res = subprocess.run([str(BENCH_VENV / "bin" / "python"), __file__, "--plot", str(path)],
                             capture_output=True, text=True, timeout=300, check=False)
        pngs = [Path(x) for x in res.stdout.split()]
        if res.returncode != 0:
            print(f"plots failed: {res.stderr[-2000:]}", file=sys.stderr)
    for p in [path, *pngs]:
        print(f"wrote {p.relative_to(REPO) if p.is_relative_to(REPO) else p}")
    print(f"benchmark took {doc['wall_s'] / 60:.1f} min")


if __name__ == "__main__":
    main()
