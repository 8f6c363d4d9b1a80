"""Benchmarks on the lab: print medians of several runs; no assertions (targets live here as figures).

    .venv/bin/python bench/run.py [--runs 5]

Brings the lab up (3 hosts) if needed, measures, tears its deployments down, and leaves the lab as
it found it. Figures:
  crash -> deploy exits with the cause     (engine process exit: systemd's ExecMainExitTimestampMonotonic)
  /health 200 -> deploy returns            (from the journal timestamp of the ready line)
  invoke status of 3 hosts                 (wall time of the command) vs 3 parallel plain ssh
  redeploy of 3 hosts, nothing changed     (wall time of the command)
  Ansible on the same hosts (the anchor)   when ansible-playbook is installed (see --ansible)
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "lab"))
sys.path.insert(0, str(REPO / "src"))

from deploytools import gd, standin_role, write_inventory  # noqa: E402

import gpudeploy_lab as labctl  # noqa: E402

HOSTS = {"lab1": "10.231.0.11", "lab2": "10.231.0.12", "lab3": "10.231.0.13"}


def ssh(address: str, cmd: str) -> str:
    return subprocess.run(labctl.ssh_argv(address, cmd), capture_output=True, text=True, check=True).stdout


def show(address: str, unit: str, prop: str) -> str:
    return ssh(address, f"systemctl show -p {prop} --value --timestamp=unix {unit}").strip()


def median(xs: list[float]) -> str:
    return f"median {statistics.median(xs):.3f} s  (runs: {', '.join(f'{x:.3f}' for x in xs)})"


def timed(*args: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.time()
    res = gd(*args)
    return time.time() - t0, res


def crash_latency(root: Path, runs: int) -> list[float]:
    out = []
    for i in range(runs):
        inv = write_inventory(root / f"crash{i}", deployment="bcrash", hosts={"lab2": (HOSTS["lab2"], ["srv"])},
                              roles={"srv": standin_role("oom-graph", timeout_s=60)})
        gd("deploy", "--inventory", str(inv), "--host", "lab2")
        end = time.monotonic()
        # Lab hosts share this machine's kernel, so their CLOCK_MONOTONIC is ours (microseconds;
        # the realtime property is printed in whole seconds only).
        died = int(show(HOSTS["lab2"], "gpudeploy-bcrash.srv.service", "ExecMainExitTimestampMonotonic")) / 1e6
        out.append(end - died)
        gd("teardown", "--inventory", str(inv), "--purge")
    return out


def ready_latency(root: Path, runs: int) -> list[float]:
    out = []
    for i in range(runs):
        inv = write_inventory(root / f"ready{i}", deployment="bready", hosts={"lab2": (HOSTS["lab2"], ["srv"])},
                              roles={"srv": standin_role(None, settings={"max_running_requests": 100 + i})})
        res = gd("deploy", "--inventory", str(inv), "--host", "lab2")
        end = time.time()
        assert res.returncode == 0, res.stdout
        inv_id = show(HOSTS["lab2"], "gpudeploy-bready.srv.service", "InvocationID")
        lines = ssh(HOSTS["lab2"], f"journalctl -o json _SYSTEMD_INVOCATION_ID={inv_id} --no-pager").splitlines()
        ready = next(json.loads(x) for x in lines if "ready to roll" in json.loads(x).get("MESSAGE", ""))
        out.append(end - int(ready["__REALTIME_TIMESTAMP"]) / 1e6)
    gd("teardown", "--inventory", str(inv), "--purge")
    return out


def three_hosts(root: Path) -> Path:
    return write_inventory(root / "three", deployment="bthree",
                           hosts={h: (a, ["srv"]) for h, a in HOSTS.items()},
                           roles={"srv": standin_role(None, tp=1)})


def plain_ssh(runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.time()
        procs = [subprocess.Popen(labctl.ssh_argv(a, "systemctl show -p MainPID,ActiveState ssh.service"),
                                  stdout=subprocess.DEVNULL) for a in HOSTS.values()]
        for p in procs:
            p.wait()
        out.append(time.time() - t0)
    return out


def ansible(root: Path, runs: int) -> dict[str, list[float]] | None:
    exe = shutil.which("ansible") or str(REPO / ".bench-venv/bin/ansible")
    if not Path(exe).exists():
        return None
    hosts = root / "ansible-hosts"
    state = labctl.config.STATE_DIR
    hosts.write_text("[lab]\n" + "\n".join(f"{h} ansible_host={a} ansible_user=root" for h, a in HOSTS.items())
                     + f"\n[lab:vars]\nansible_ssh_private_key_file={state}/id_ed25519\n"
                     f"ansible_ssh_common_args=-F /dev/null -o UserKnownHostsFile={state}/known_hosts\n"
                     "ansible_python_interpreter=/usr/bin/python3\n")
    adhoc = []
    for _ in range(runs):
        t0 = time.time()
        subprocess.run([exe, "lab", "-i", str(hosts), "-m", "command", "-a",
                        "systemctl show -p MainPID,ActiveState ssh.service"], capture_output=True, check=False)
        adhoc.append(time.time() - t0)
    # The usual playbook for "redeploy, nothing changed": same unit file, service started, /health 200.
    unit = "gpudeploy-bthree.srv.service"
    text = ssh(HOSTS["lab1"], f"cat /etc/systemd/system/{unit}")
    (root / "unit").write_text(text)
    book = root / "redeploy.yml"
    book.write_text(f"""- hosts: lab
  gather_facts: false
  tasks:
    - copy: {{src: {root / 'unit'}, dest: /etc/systemd/system/{unit}, mode: "0644"}}
    - systemd_service: {{name: {unit}, state: started}}
    - uri: {{url: "http://{{{{ ansible_host }}}}:30000/health", status_code: 200}}
      register: r
      until: r.status == 200
      retries: 20
      delay: 1
      delegate_to: localhost
""")
    playbook = []
    for _ in range(runs):
        t0 = time.time()
        res = subprocess.run([exe + "-playbook", "-i", str(hosts), str(book)], capture_output=True, text=True,
                             check=False)
        playbook.append(time.time() - t0)
        if res.returncode != 0:
            print("ansible-playbook failed:", res.stdout[-500:])
    return {"adhoc": adhoc, "playbook": playbook}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    brought_up = len([s for s in labctl.status() if s.up and s.ssh_ok]) < 3
    if brought_up:
        labctl.up(3)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            print(f"crash -> deploy exits with the cause (target <= 1 s): {median(crash_latency(root, args.runs))}")
            print(f"/health 200 -> deploy returns (target <= 1 s):       {median(ready_latency(root, args.runs))}")
            inv = three_hosts(root)
            first = gd("deploy", "--inventory", str(inv))
            assert first.returncode == 0, first.stdout + first.stderr
            redeploy = [timed("deploy", "--inventory", str(inv))[0] for _ in range(args.runs)]
            status = [timed("status", "--inventory", str(inv))[0] for _ in range(args.runs)]
            print(f"invoke status, 3 hosts (target <= 0.45 s):          {median(status)}")
            print(f"3 parallel plain ssh (floor):                       {median(plain_ssh(args.runs))}")
            print(f"redeploy 3 hosts, nothing changed (target <= 1 s):  {median(redeploy)}")
            anchor = ansible(root, args.runs)
            if anchor:
                print(f"ansible ad-hoc systemctl show, 3 hosts (anchor):    {median(anchor['adhoc'])}")
                print(f"ansible-playbook redeploy, nothing changed (anchor):{median(anchor['playbook'])}")
            else:
                print("ansible: not installed here (test-lab.md anchor: ad-hoc 1.05 s, playbook re-run 3.1 s)")
            gd("teardown", "--inventory", str(inv), "--purge")
    finally:
        if brought_up:
            labctl.down()


if __name__ == "__main__":
    main()
