"""What Slurm's commands print, parsed (pure: a command's argv here, its output in, typed values out).

Formats as measured on Slurm 22.05 (shared/reference/slurm-lab.md):

  * ``sbatch --parsable`` -> ``JOBID`` or ``JOBID;CLUSTER``;
  * ``squeue -h -j J -o '%T|%r|%S|%N'`` -> ``PENDING|Resources|2026-12-07T20:01:02|`` or
    ``RUNNING|None|2026-12-07T19:59:00|slurmn[1-2]``; nothing (or rc 1, "Invalid job id") once gone;
  * ``squeue -h -s -j J -o '%i|%j|%N'`` -> ``9.0|gpudeploy-pd.prefill|slurmn1`` per step (``9.batch``
    too); step numbers follow the order the sruns reached slurmctld, so steps are found by name;
  * ``sacct -n -P -j J --format=JobID,JobName,State,ExitCode,NodeList`` -> ``9.0|gpudeploy-pd.decode|
    CANCELLED|0:9|slurmn2`` (a kill -9: CANCELLED 0:9; an exit 1: FAILED 1:0; scancel: ``CANCELLED by 0``).
"""

from __future__ import annotations

from dataclasses import dataclass

# A job or step in one of these has ended (and gave back its nodes, unless still COMPLETING).
TERMINAL = ("BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
            "PREEMPTED", "TIMEOUT", "REVOKED")


def terminal(state: str) -> bool:
    """``CANCELLED by 0`` and ``CANCELLED+`` are CANCELLED."""
    return state.split(" ")[0].rstrip("+") in TERMINAL


def sbatch_argv(script_path: str) -> list[str]:
    return ["sbatch", "--parsable", script_path]


def job_argv(job: str) -> list[str]:
    return ["squeue", "-h", "-j", job, "-o", "%T|%r|%S|%N"]


def steps_argv(job: str) -> list[str]:
    return ["squeue", "-h", "-s", "-j", job, "-o", "%i|%j|%N"]


def sacct_argv(job: str) -> list[str]:
    return ["sacct", "-n", "-P", "-j", job, "--format=JobID,JobName,State,ExitCode,NodeList"]


def parse_sbatch(stdout: str) -> str:
    """The job id; ValueError when sbatch printed something else."""
    first = stdout.strip().splitlines()[0] if stdout.strip() else ""
    job = first.split(";")[0]
    if not job.isdigit():
        raise ValueError(f"sbatch printed {stdout.strip()[:200]!r}, not a job id")
    return job


@dataclass(frozen=True)
class JobState:
    state: str  # PENDING, RUNNING, COMPLETING, ...
    reason: str  # Slurm's reason: Resources, Priority, QOSMaxGRESPerUser, ... ("None" when running)
    start: str  # the (estimated, while pending) start time, or "N/A"
    nodelist: str  # e.g. slurmn[1-2]; "" while pending


def parse_job(stdout: str) -> JobState | None:
    """squeue's line for the job; None when it is not listed (ended and forgotten, or never there)."""
    for line in stdout.splitlines():
        parts = line.split("|")
        if len(parts) >= 4:
            return JobState(state=parts[0], reason=parts[1], start=parts[2], nodelist=parts[3])
    return None


@dataclass(frozen=True)
class StepRow:
    id: str  # JOB.STEP, e.g. 9.0
    name: str
    node: str
    state: str = "RUNNING"  # squeue lists running steps only; sacct says more
    exit_code: str = ""


def parse_steps(stdout: str) -> dict[str, StepRow]:
    """squeue -s: the running steps by name (the batch step and unnamed ones included, by their name)."""
    out: dict[str, StepRow] = {}
    for line in stdout.splitlines():
        parts = line.split("|")
        if len(parts) >= 3 and "." in parts[0]:
            out[parts[1]] = StepRow(id=parts[0], name=parts[1], node=parts[2])
    return out


def parse_sacct(stdout: str) -> dict[str, StepRow]:
    """sacct's lines by job or step id (``9``, ``9.batch``, ``9.0``)."""
    out: dict[str, StepRow] = {}
    for line in stdout.splitlines():
        parts = line.split("|")
        if len(parts) >= 5 and parts[0]:
            out[parts[0]] = StepRow(id=parts[0], name=parts[1], node=parts[4], state=parts[2], exit_code=parts[3])
    return out


def step_death(row: StepRow) -> str:
    """How sacct saw a step end, in words: ``CANCELLED 0:9`` is "killed by signal 9"."""
    code, _, signal = row.exit_code.partition(":")
    state = row.state.split(" ")[0]
    if signal and signal != "0":
        return f"{state}: killed by signal {signal}"
    if code and code != "0":
        return f"{state}: exit code {code}"
    return state
