"""The batch script and the steps' environment files, as bash runs them: fake ``scontrol`` and
``srun`` on PATH record what each step would be started with, so the test checks the exact options
and words a step gets, that slot placeholders become the nodes, and that a hostile value in an
argument or the environment stays one literal word (nothing it names runs)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from slurm_fakes import inventory, run_batch_script, write_plan

from gpudeploy.slurm.plan import SlurmPlan, load_slurm_plan

HOSTILE = "a'b\"c $(touch PWNED) `touch PWNED` ${HOME} ; touch PWNED"

INVENTORY = inventory("""\
  node0:
    numa_nodes: [{id: 0, gpus: [0, 1, 2, 3], cpus: "0"}, {id: 1, gpus: [4, 5, 6, 7], cpus: "1"}]
    roles: [{role: echo, numa_node: 1}]
  node1:
    numa_nodes: [{id: 0, gpus: [0, 1, 2, 3], cpus: "0-3"}]
    roles: [peer]
""", nodes=2, slurm="  account: proj\n  qos: high\n", defaults='  env: {HOSTILE: "%s"}\n')
ECHO = """\
engine: command
gpus: 2
ports: {http: 9000}
argv: ["/bin/echo", "--url", "http://{{ address }}:{{ port }}/x", "%s"]
"""
PEER = """\
engine: command
gpus: 0
ports: {http: 9001}
argv: ["/bin/echo", "{{ address }}"]
"""


@pytest.fixture
def planned(tmp_path: Path) -> SlurmPlan:
    escaped = HOSTILE.replace("\\", "\\\\").replace('"', '\\"')
    return write_plan(tmp_path, INVENTORY % escaped, {"echo": ECHO % escaped, "peer": PEER})


def run_script(sp: SlurmPlan, tmp_path: Path) -> list[list[str]]:
    """Run the batch script with fake srun/scontrol; each srun's argv."""
    return run_batch_script(sp.script, tmp_path, ["slurmn1", "slurmn2"], "slurmn[1-2]")


def test_sbatch_options_are_exact(planned: SlurmPlan) -> None:
    heads = [line for line in planned.script.splitlines() if line.startswith("#SBATCH")]
    assert heads == ["#SBATCH -J gpudeploy-t1", "#SBATCH -N 2", "#SBATCH --gres=gpu:8", "#SBATCH -p gpu",
                     "#SBATCH -t 00:30:00", "#SBATCH --exclusive", "#SBATCH --no-requeue",
                     "#SBATCH -o /shared/gd/%j.batch.out", "#SBATCH -D /shared/gd",
                     "#SBATCH -A proj", "#SBATCH --qos=high"]
    assert planned.script.rstrip().endswith("wait")


def test_each_step_gets_its_node_gpus_cpus_and_literal_words(planned: SlurmPlan, tmp_path: Path) -> None:
    calls = {c[c.index("-J") + 1]: c for c in run_script(planned, tmp_path)}
    assert set(calls) == {"gpudeploy-t1.echo", "gpudeploy-t1.peer"}
    echo = calls["gpudeploy-t1.echo"]
    # srun's options, exactly: one node, one task, the slot's node, its GPU count, its NUMA node's CPUs
    assert echo[:echo.index("/bin/bash")] == [
        "--exact", "-N1", "-n1", "--nodelist=slurmn1", "--gres=gpu:2", "-J", "gpudeploy-t1.echo",
        "-o", "/shared/gd/%j.t1.echo.out", "--cpu-bind=none"]
    # the command: the env file sourced, bound to its NUMA node's CPUs, then the plan's argv word for
    # word, the slot's node filled in
    tail = echo[echo.index("/bin/bash"):]
    assert tail[3:6] == ["gpudeploy-step", "/shared/gd/t1/t1.echo.env", "1"]
    assert tail[6:] == ["/bin/echo", "--url", "http://slurmn1:9000/x", HOSTILE]
    peer = calls["gpudeploy-t1.peer"]
    assert peer[:4] == ["--overlap", "-N1", "-n1", "--nodelist=slurmn2"] and "--gres=none" in peer
    assert peer[-3:] == ["", "/bin/echo", "slurmn2"]  # no GPUs: no binding
    assert not list(tmp_path.rglob("PWNED"))


def test_a_step_sources_its_env_and_binds_its_cpus(planned: SlurmPlan, tmp_path: Path) -> None:
    """The step's own command, run as srun would run it on the node: its environment file's values
    and its NUMA node's CPUs (CPU 1 here; every machine the tests run on has two)."""
    call = {c[c.index("-J") + 1]: c for c in run_script(planned, tmp_path)}["gpudeploy-t1.echo"]
    env_file = tmp_path / "step.env"
    env_file.write_text(planned.files()["/shared/gd/t1/t1.echo.env"])
    step = call[call.index("/bin/bash"):call.index("/bin/bash") + 6]
    step[4] = str(env_file)
    probe = ["/bin/sh", "-c", 'printf "%s\\0" "$HOSTILE" "$(grep Cpus_allowed_list /proc/self/status)"']
    out = subprocess.run([*step, *probe], cwd=tmp_path, capture_output=True, check=True, timeout=30,
                         env={"PATH": "/usr/bin:/bin", "GPUDEPLOY_NODE_0": "slurmn1"})
    hostile, cpus = out.stdout.decode().split("\0")[:2]
    assert hostile == HOSTILE
    assert cpus.split() == ["Cpus_allowed_list:", "1"], out.stderr
    assert not list(tmp_path.rglob("PWNED"))


def test_env_file_sources_to_the_exact_values(planned: SlurmPlan, tmp_path: Path) -> None:
    text = planned.files()["/shared/gd/t1/t1.echo.env"]
    env_file = tmp_path / "step.env"
    env_file.write_text(text)
    out = subprocess.run(["/bin/bash", "-c", 'set -a; . "$1"; set +a; printf "%s\\0" "$HOSTILE" '
                          '"$CUDA_VISIBLE_DEVICES"', "x", str(env_file)], cwd=tmp_path, capture_output=True,
                         env={"PATH": "/usr/bin:/bin", "GPUDEPLOY_NODE_0": "slurmn1"}, check=True, timeout=30)
    assert out.stdout.decode().split("\0")[:-1] == [HOSTILE, "4,5"]
    assert not list(tmp_path.rglob("PWNED"))


def test_secrets_are_masked_in_the_plan_and_never_in_the_script(tmp_path: Path) -> None:
    sp = write_plan(tmp_path, INVENTORY % "x", {"echo": ECHO % "x" + "secret_env: [HF_TOKEN]\n", "peer": PEER})
    assert "HF_TOKEN" not in sp.script
    assert "HF_TOKEN='********'" in sp.files()["/shared/gd/t1/t1.echo.env"]
    assert "HF_TOKEN=hf_secret" in sp.files({"HF_TOKEN": "hf_secret"})["/shared/gd/t1/t1.echo.env"]



def test_an_environment_change_changes_the_script(planned: SlurmPlan, tmp_path: Path) -> None:
    """deploy compares the script with the running job's: an engine's new environment must show there
    (as its env file's digest, secrets masked), and the inventory's path must not."""
    text = (tmp_path / "hosts.yml").read_text()
    (tmp_path / "moved.yml").write_text(text)
    assert load_slurm_plan(str(tmp_path / "moved.yml"), memory=False).script == planned.script
    (tmp_path / "moved.yml").write_text(text.replace("env: {HOSTILE:", "env: {OTHER: x, HOSTILE:"))
    changed = load_slurm_plan(str(tmp_path / "moved.yml"), memory=False).script
    assert changed != planned.script
    assert "OTHER" not in changed
