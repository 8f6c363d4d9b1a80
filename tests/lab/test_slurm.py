"""gpudeploy on the lab's real Slurm cluster (slurm_lab): a PD pair and the real router deployed as
one job answer a generation through the router; status shows the job, its steps and their health; logs
shows a step's own output; a step killed on its node while status --watch runs is named by the watch
with its cause (the seconds from the kill printed); a job that cannot get its GPUs says Slurm's reason;
teardown of one deployment leaves no job, step or server of it and never touches another's job; a
bad inventory gets file:line errors and submits nothing.

One deployment (lab/inventory/lab-slurm.yml) is shared by the file; a second one (the same roles,
deployment slurmb) takes the other node. Every wait is a condition polled against a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from deploytools import poll

if TYPE_CHECKING:
    from conftest import SlurmLab

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
INVENTORY = REPO / "lab" / "inventory" / "lab-slurm.yml"


def gpudeploy(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run([sys.executable, "-m", "gpudeploy.cli", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, check=False, cwd=REPO)


def other(tmp: Path, deployment: str) -> Path:
    """lab-slurm.yml as another deployment (its own job), in ``tmp``."""
    text = INVENTORY.read_text().replace("deployment: slurmpd", f"deployment: {deployment}")
    text = text.replace("roles_dir: ../roles", f"roles_dir: {REPO / 'lab' / 'roles'}")
    path = tmp / f"{deployment}.yml"
    path.write_text(text)
    return path


def record(slurm: SlurmLab, deployment: str) -> dict[str, object]:
    data: dict[str, object] = json.loads((slurm.shared / "gpudeploy" / deployment / "run.json").read_text())
    return data


def job_state(slurm: SlurmLab, job: object) -> str:
    return slurm.ssh(f"squeue -h -j {job} -o %T").stdout.strip()


@pytest.fixture(scope="module")
def deployed(slurm_lab: SlurmLab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """slurmpd deployed (and checked by deploy's own gate and smoke generation); torn down at the end."""
    started = time.monotonic()
    got = gpudeploy("deploy", "-i", str(INVENTORY))
    took = time.monotonic() - started
    print(f"deploy of slurmpd: {took:.2f} s\n{got.stdout}{got.stderr}", file=sys.stderr)
    assert got.returncode == 0, got.stdout + got.stderr
    yield {"output": got.stdout, "took": took, "tmp": tmp_path_factory.mktemp("slurm")}
    gpudeploy("teardown", "-i", str(INVENTORY))


def test_bad_inventory_gets_file_line_errors_and_submits_nothing(slurm_lab: SlurmLab, tmp_path: Path) -> None:
    bad = INVENTORY.read_text().replace("roles_dir: ../roles", f"roles_dir: {REPO / 'lab' / 'roles'}")
    bad = bad.replace("  node0:\n", "  node0:\n    address: 10.232.0.11\n").replace('"00:20:00"', '"20:99"')
    (tmp_path / "hosts.yml").write_text(bad)
    before = slurm_lab.ssh("squeue -h -o %i").stdout.split()
    got = gpudeploy("deploy", "-i", str(tmp_path / "hosts.yml"))
    assert got.returncode == 1
    out = got.stdout + got.stderr
    assert "hosts.yml:15: key slurm.time: time limit '20:99'" in out, out
    assert "hosts.yml:29: host node0, key address: address on a node slot" in out, out
    assert "Traceback" not in out
    assert slurm_lab.ssh("squeue -h -o %i").stdout.split() == before
    assert not (slurm_lab.shared / "gpudeploy" / "slurmpd" / "run.json").exists() or \
        record(slurm_lab, "slurmpd")["job"] in before


def test_the_pd_pair_answers_through_the_router(deployed: dict[str, object], slurm_lab: SlurmLab) -> None:
    out = str(deployed["output"])
    assert "lab-router: smoke generation /generate answered" in out
    assert "OK: ready" in out
    rec = record(slurm_lab, "slurmpd")
    assert sorted(rec["steps"]) == ["gpudeploy-slurmpd.decode", "gpudeploy-slurmpd.lab-router",  # type: ignore[call-overload]
                                    "gpudeploy-slurmpd.prefill"]


def test_status_shows_job_steps_and_health(deployed: dict[str, object], slurm_lab: SlurmLab) -> None:
    got = gpudeploy("status", "-i", str(INVENTORY))
    assert got.returncode == 0, got.stdout + got.stderr
    lines = got.stdout.splitlines()
    job = record(slurm_lab, "slurmpd")["job"]
    assert lines[0].startswith(f"job {job} RUNNING on slurmn")
    rows = {line.split()[3]: line.split() for line in lines[2:5]}
    for name in ("gpudeploy-slurmpd.prefill", "gpudeploy-slurmpd.decode", "gpudeploy-slurmpd.lab-router"):
        assert rows[name][5:7] == ["RUNNING", "ok"], got.stdout
        assert rows[name][2].startswith(f"{job}.")
    assert rows["gpudeploy-slurmpd.lab-router"][7:] == ["2/2", "workers", "healthy"]


def test_logs_shows_the_steps_own_output(deployed: dict[str, object], slurm_lab: SlurmLab) -> None:
    got = gpudeploy("logs", "-i", str(INVENTORY), "-r", "decode")
    assert got.returncode == 0, got.stdout + got.stderr
    assert "The server is fired up and ready to roll!" in got.stdout, got.stdout
    assert ":30010" in got.stdout  # decode's port: its own file, not prefill's


def test_a_job_that_cannot_get_its_gpus_says_why_and_a_second_deployment_survives(
        deployed: dict[str, object], slurm_lab: SlurmLab) -> None:
    tmp = Path(str(deployed["tmp"]))
    second = other(tmp, "slurmb")
    got = gpudeploy("deploy", "-i", str(second))
    assert got.returncode == 0, got.stdout + got.stderr
    job_b = record(slurm_lab, "slurmb")["job"]
    try:
        # both nodes are taken: a third deployment's job pends for its GPUs, and says so
        third = other(tmp, "slurmc")
        got = gpudeploy("deploy", "-i", str(third), "--timeout", "3")
        out = got.stdout + got.stderr
        assert got.returncode == 1
        job_c = record(slurm_lab, "slurmc")["job"]
        assert f"job {job_c} pending: Resources" in out, out
        assert "still pending: Resources" in out and f"cancelled job {job_c}" in out, out
        assert job_state(slurm_lab, job_c) in ("", "CANCELLED")
        assert job_state(slurm_lab, job_b) == "RUNNING"
    finally:
        down = gpudeploy("teardown", "-i", str(second))
    assert down.returncode == 0, down.stdout
    assert job_state(slurm_lab, job_b) == ""
    # the first deployment's job was never touched
    assert job_state(slurm_lab, record(slurm_lab, "slurmpd")["job"]) == "RUNNING"


def test_a_killed_step_is_named_with_its_cause_by_the_watch(deployed: dict[str, object], slurm_lab: SlurmLab) -> None:
    """kill -9 of a step's process (its PID from scontrol listpids on its node) while ``status --watch``
    runs: the watch names that step, how Slurm saw it end and the cause from its output; status
    then says the same. The seconds from the kill to the watch's line are printed, never asserted."""
    rec = record(slurm_lab, "slurmpd")
    job, step = rec["job"], rec["steps"]["gpudeploy-slurmpd.decode"]  # type: ignore[index]
    node = rec["nodes"][0]  # type: ignore[index]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    watcher = subprocess.Popen([sys.executable, "-m", "gpudeploy.cli", "status", "--watch", "-i", str(INVENTORY)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=lambda: lines.extend((time.monotonic(), x) for x in watcher.stdout or ()),
                              daemon=True)
    reader.start()
    started = time.monotonic()
    try:
        listed = slurm_lab.ssh(f"scontrol listpids {step}", host=node, check=True).stdout.splitlines()[1:]
        pids = [line.split()[0] for line in listed if line.split() and line.split()[0].isdigit()]
        assert pids, listed
        poll("the watch's first look", lambda: any("watching job" in x for _, x in lines) or None, 60)
        print(f"status --watch: its first look after {time.monotonic() - started:.2f} s", file=sys.stderr)
        sent = time.monotonic()  # the ssh to the node that runs kill is a new connection: its time counts
        slurm_lab.ssh(f"kill -9 {' '.join(pids)}", host=node, check=True)
        returned = time.monotonic()
        named = poll("the watch naming the killed step",
                     lambda: next((t for t, x in lines if f"step {step} gpudeploy-slurmpd.decode: RUNNING ->" in x),
                                  None), 30)
        poll("its cause", lambda: any("cause: " in x for t, x in lines if t >= named) or None, 5)
    finally:
        stopping = time.monotonic()
        watcher.send_signal(signal.SIGINT)
        try:
            watcher.wait(10)
        except subprocess.TimeoutExpired:
            watcher.kill()
        print(f"status --watch: ended {time.monotonic() - stopping:.2f} s after Ctrl-C", file=sys.stderr)
    text = "".join(x for _, x in lines)
    print(text, file=sys.stderr)
    print(f"kill -9 -> status --watch naming step {step}: {named - sent:.2f} s from sending the kill "
          f"(ssh to the node), {named - returned:.2f} s from its ssh returning", file=sys.stderr)
    assert f"step {step} gpudeploy-slurmpd.decode: RUNNING -> CANCELLED: killed by signal 9" in text, text
    assert "cause: the server exited (CANCELLED: killed by signal 9)" in text, text
    assert "stopped watching (Ctrl-C)" in text, text
    from gpudeploy.remote import connect
    from gpudeploy.slurm.plan import load_slurm_plan
    from gpudeploy.slurm.status import status_text

    sp = load_slurm_plan(str(INVENTORY), memory=False)
    with connect(sp.inv.target.login) as login:
        text, ok = status_text(sp, login)
    assert not ok
    assert f"step {step} gpudeploy-slurmpd.decode: CANCELLED: killed by signal 9" in text, text
    assert f"job {job} RUNNING" in text  # the other steps live on


ROLL_HOSTS = """\
deployment: slurmroll
roles_dir: {roles}
slurm:
  login:
    address: 10.232.0.10
    ssh: {{user: root, key: /var/lib/gpudeploy-lab/id_ed25519, known_hosts: /var/lib/gpudeploy-lab/slurm_known_hosts}}
  partition: gpu
  time: "00:20:00"
  gpus_per_node: 8
  nodes: 1
  output_dir: /shared/gpudeploy
defaults:
  gpu_memory_gib: 96
  engine_versions: {{sglang: "0.5.23", sglang_router: "0.3.2"}}
  numa_policy: none
  env: {{SGLANG_STANDIN_SPEED: "0.3"}}
hosts:
  node0:
    numa_nodes:
      - {{id: 0, gpus: [0, 1, 2, 3], cpus: "0"}}
      - {{id: 1, gpus: [4, 5, 6, 7], cpus: "1"}}
    roles: [{{role: worker, numa_node: 0}}, router]
"""


def roll_roles(roles: Path, max_running: int) -> None:
    """One TP4 stand-in engine (a regular worker) and the real router: room for a second copy."""
    roles.mkdir(exist_ok=True)
    worker = (REPO / "roles" / "decode.yml").read_text().replace("  disaggregation_mode: decode\n", "")
    worker = worker.replace("  disaggregation_transfer_backend: mooncake\n", "")
    worker = worker.replace("max_running_requests: 128", f"max_running_requests: {max_running}")
    (roles / "worker.yml").write_text(worker)
    router = (REPO / "lab" / "roles" / "lab-router.yml").read_text()
    router = router.replace("  prefill: [prefill]\n  decode: [decode]\n", "  workers: [worker]\n")
    (roles / "router.yml").write_text(router)


def test_a_changed_engine_rolls_as_a_new_step_under_load_and_a_full_pair_is_refused(
        deployed: dict[str, object], slurm_lab: SlurmLab, tmp_path: Path) -> None:
    """A deployment with room (one TP4 engine and its router on an 8-GPU node of 2 CPUs): a changed
    setting of the engine rolls as a new step of the same job while requests go through the router
    (none fails), the old step ends (sacct) and status shows the new one. The PD pair (8 GPUs, both
    CPUs) has no room: its change is refused as before."""
    from gpudeploy_lab.load import Load

    roles = tmp_path / "roles"
    roll_roles(roles, 128)
    hosts = tmp_path / "roll.yml"
    hosts.write_text(ROLL_HOSTS.format(roles=roles))
    got = gpudeploy("deploy", "-i", str(hosts))
    try:
        assert got.returncode == 0, got.stdout + got.stderr
        rec = record(slurm_lab, "slurmroll")
        job, old = rec["job"], rec["steps"]["gpudeploy-slurmroll.worker"]  # type: ignore[index]
        address = next(n.address for n in slurm_lab.nodes if n.name == rec["nodes"][0])  # type: ignore[index]
        roll_roles(roles, 64)
        with Load(f"http://{address}:8000/generate", clients=2, timeout_s=20, limit_s=60) as load:
            poll("requests answered before the roll", lambda: sum(s.ok for s in load.sent) >= 2 or None, 20)
            t0 = time.monotonic()
            got = gpudeploy("deploy", "-i", str(hosts))
            took = time.monotonic() - t0
            poll("requests answered after the roll", lambda: sum(s.ok for s in load.sent if s.start > t0 + took)
                 >= 2 or None, 20)
        failed = [s for s in load.sent if not s.ok]
        print(f"roll: {took:.2f} s, {len(load.sent)} requests, {len(failed)} failed\n{got.stdout}{got.stderr}",
              file=sys.stderr)
        assert got.returncode == 0, got.stdout + got.stderr
        assert not failed, [(s.status, s.error) for s in failed]
        rec = record(slurm_lab, "slurmroll")
        new = rec["steps"]["gpudeploy-slurmroll.worker"]  # type: ignore[index]
        assert rec["job"] == job and new != old
        acct = slurm_lab.ssh(f"sacct -n -P -j {old} --format=JobID,State").stdout.splitlines()
        assert any(line.startswith(f"{old}|CANCELLED") for line in acct), acct
        status = gpudeploy("status", "-i", str(hosts))
        assert status.returncode == 0, status.stdout + status.stderr
        rows = {line.split()[3]: line.split() for line in status.stdout.splitlines()[2:4]}
        assert rows["gpudeploy-slurmroll.worker-g1"][2] == new and rows["gpudeploy-slurmroll.worker-g1"][5:7] == \
            ["RUNNING", "ok"], status.stdout
        assert rows["gpudeploy-slurmroll.router"][7:] == ["1/1", "workers", "healthy"], status.stdout
        logs = gpudeploy("logs", "-i", str(hosts), "-r", "worker")
        assert ":31000" in logs.stdout, logs.stdout  # the copy's own output (the surge's shifted port)
        # rolled back: generation 2 runs on the plan's own port and the GPUs generation 1 left free
        roll_roles(roles, 128)
        with Load(f"http://{address}:8000/generate", clients=2, timeout_s=20, limit_s=60) as load:
            t0 = time.monotonic()
            got = gpudeploy("deploy", "-i", str(hosts))
            took = time.monotonic() - t0
        failed = [s for s in load.sent if not s.ok]
        print(f"roll back: {took:.2f} s, {len(load.sent)} requests, {len(failed)} failed\n{got.stdout}",
              file=sys.stderr)
        assert got.returncode == 0 and not failed, got.stdout + got.stderr
        assert "GPUs 0,1,2,3, http://slurmn" in got.stdout and ":30000)" in got.stdout, got.stdout
        assert record(slurm_lab, "slurmroll")["generations"] == {"gpudeploy-slurmroll.worker": 2}
    finally:
        down = gpudeploy("teardown", "-i", str(hosts))
        assert down.returncode == 0, down.stdout + down.stderr
    # the PD pair holds all 8 GPUs and both CPUs of its node: no room, refused as before
    pd_roles = tmp_path / "pd"
    pd_roles.mkdir()
    for name in ("prefill", "decode"):
        text = (REPO / "roles" / f"{name}.yml").read_text()
        (pd_roles / f"{name}.yml").write_text(text.replace("max_running_requests: 128", "max_running_requests: 64"))
    (pd_roles / "lab-router.yml").write_text((REPO / "lab" / "roles" / "lab-router.yml").read_text())
    pd = tmp_path / "pd.yml"
    pd.write_text(INVENTORY.read_text().replace("roles_dir: ../roles", f"roles_dir: {pd_roles}"))
    refused = gpudeploy("deploy", "-i", str(pd))
    out = refused.stdout + refused.stderr
    assert refused.returncode == 1, out
    assert "no room" in out and "needs 4 free GPU(s) on slot 0" in out, out
    assert job_state(slurm_lab, record(slurm_lab, "slurmpd")["job"]) == "RUNNING"


def test_teardown_leaves_no_job_step_or_server(deployed: dict[str, object], slurm_lab: SlurmLab) -> None:
    rec = record(slurm_lab, "slurmpd")
    job, node = rec["job"], rec["nodes"][0]  # type: ignore[index]
    got = gpudeploy("teardown", "-i", str(INVENTORY))
    assert got.returncode == 0, got.stdout + got.stderr
    assert f"job {job}: every step ended" in got.stdout
    assert job_state(slurm_lab, job) == ""
    acct = slurm_lab.ssh(f"sacct -n -P -j {job} --format=JobID,State").stdout.splitlines()
    assert acct and all(line.split("|")[1].split()[0] in ("CANCELLED", "COMPLETED", "FAILED") for line in acct), acct
    assert slurm_lab.ssh(f"scontrol listpids {job}", host=node).stdout.splitlines()[1:] == []
    for port in (30000, 30010, 8000):
        assert slurm_lab.ssh(f"curl -s -o /dev/null -m 1 http://{node}:{port}/health").returncode != 0
