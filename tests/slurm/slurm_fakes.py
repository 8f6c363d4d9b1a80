"""What the Slurm tests share: a deployment's inventory and roles written to a folder and planned;
a batch script run by bash under a fake ``srun``; a fake login node that answers with the outputs
Slurm 22.05 printed in the lab (shared/reference/slurm-lab.md); a clock whose sleeps move time on
without waiting."""

from __future__ import annotations

import base64
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

from gpudeploy.remote.base import Result
from gpudeploy.slurm import queue
from gpudeploy.slurm.job import Clock
from gpudeploy.slurm.plan import SlurmPlan, load_slurm_plan

# engine: command on one GPU at the given port; its server is never run (the login node is fake)
COMMAND_ROLE = """\
engine: command
gpus: 1
ports: {http: %d}
argv: ["/bin/server"]
health: {timeout_s: 5}
"""


def inventory(hosts: str, *, nodes: int = 1, time: str = "00:30:00", output_dir: str = "/shared/gd",
              slurm: str = "", defaults: str = "") -> str:
    """Deployment t1 on the lab cluster (login 10.232.0.10, partition gpu, 8 GPUs a node): the test
    gives its ``hosts:`` entries and any more ``slurm:`` or ``defaults:`` lines, each indented."""
    return f"""\
deployment: t1
roles_dir: roles
slurm:
  login: {{address: 10.232.0.10}}
  partition: gpu
{slurm}  time: "{time}"
  gpus_per_node: 8
  nodes: {nodes}
  output_dir: {output_dir}
defaults:
  gpu_memory_gib: 96
{defaults}hosts:
{hosts}"""


def write_plan(folder: Path, inventory_text: str, roles: Mapping[str, str]) -> SlurmPlan:
    """Write hosts.yml and roles/<name>.yml into ``folder`` (again: the files are replaced), and plan them."""
    (folder / "roles").mkdir(exist_ok=True)
    (folder / "hosts.yml").write_text(inventory_text)
    for name, text in roles.items():
        (folder / "roles" / f"{name}.yml").write_text(text)
    return load_slurm_plan(str(folder / "hosts.yml"), memory=False)


def run_batch_script(script: str, folder: Path, nodes: list[str], nodelist: str) -> list[list[str]]:
    """Run ``script`` with bash in ``folder`` as the job on ``nodes`` (SLURM_JOB_NODELIST ``nodelist``),
    with a fake ``scontrol`` (show hostnames: ``nodes``) and ``srun`` on PATH; each srun's argv."""
    bin_ = folder / "bin"
    bin_.mkdir()
    hostnames = "".join(f"{node}\\n" for node in nodes)  # printf's escapes, one node a line
    (bin_ / "scontrol").write_text(f"#!/bin/sh\nprintf '{hostnames}'\n")
    (bin_ / "srun").write_text('#!/bin/bash\nprintf "%s\\0" "$@" > "$CALLS/$$"\n')
    for f in bin_.iterdir():
        f.chmod(0o755)
    calls = folder / "calls"
    calls.mkdir()
    (folder / "job.sh").write_text(script)
    env = {"PATH": f"{bin_}:/usr/bin:/bin", "CALLS": str(calls), "SLURM_JOB_NODELIST": nodelist, "HOME": "/nonexistent"}
    subprocess.run(["/bin/bash", str(folder / "job.sh")], cwd=folder, env=env, check=True, timeout=30)
    return [c.read_bytes().decode().split("\0")[:-1] for c in calls.iterdir()]


class FakeLogin:
    """A login node: each command's answer comes from ``answer(argv)``; files put are kept."""

    def __init__(self, answer: Callable[[list[str]], tuple[int, str]]) -> None:
        self.answer = answer
        self.files: dict[str, bytes] = {}
        self.ran: list[list[str]] = []

    def run(self, argv: list[str], *, stdin: bytes | None = None, timeout: float = 60.0,
            check: bool = True) -> Result:
        self.ran.append(argv)
        if argv[:2] == ["bash", "-c"] and argv[3] == "gpudeploy-look":
            return Result(0, self.look(argv[4], argv[6:]), "")
        if argv[0] == "cat" and argv[1] in self.files:
            return Result(0, self.files[argv[1]].decode(), "")
        if argv[0] == "rm":
            self.files.pop(argv[-1], None)
            return Result(0, "", "")
        rc, out = self.answer(argv)
        return Result(rc, out, "")

    def put(self, path: str, data: bytes, mode: int) -> None:
        self.files[path] = data

    def look(self, job: str, outputs: list[str]) -> str:
        """The look's one command (slurm/look.py), answered from the separate commands it runs."""
        def out(argv: list[str]) -> str:
            rc, text = self.answer(argv)
            return text if rc == 0 else ""
        parts = ["@job", out(queue.job_argv(job)), "@steps", out(queue.steps_argv(job)),
                 "@sacct", out(queue.sacct_argv(job))]
        for i, (path, offset) in enumerate(zip(outputs[::2], outputs[1::2], strict=True)):
            rc, text = self.answer(["tail", "-c", f"+{int(offset) + 1}", path])
            data = text.encode() if rc == 0 else b""
            parts += [f"@out {i} {int(offset) + len(data) if rc == 0 else -1}", base64.b64encode(data).decode()]
        return "\n".join(p.rstrip("\n") for p in parts) + "\n"


class Ticks(Clock):
    """Each sleep moves time on: the loops run to their deadlines without waiting."""

    def __init__(self) -> None:
        self.t = 0.0
        super().__init__(now=lambda: self.t, sleep=self._sleep)

    def _sleep(self, s: float) -> None:
        self.t += s
