"""The run record of a Slurm deployment, kept in its folder on the shared output_dir: the job id and
each step's id by name. It is how status and teardown find exactly this run (job id + step id),
never by a job name or pattern, so another deployment's job in the cluster is never touched."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from ..remote.base import Transport
from .script import deployment_dir
from .target import SlurmTarget


@dataclass(frozen=True)
class RunRecord:
    job: str
    deployment: str
    submitted_at: float
    steps: dict[str, str] = field(default_factory=dict)  # step name -> JOB.STEP
    nodes: list[str] = field(default_factory=list)  # slot -> node
    # A rolled engine (roll.py), by its plan step's name: the generation of the copy now serving
    # (its step name, output, ports) and the GPUs it holds. Absent: the step the script started.
    generations: dict[str, int] = field(default_factory=dict)
    gpus: dict[str, list[int]] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"


def record_path(target: SlurmTarget, deployment: str) -> str:
    return f"{deployment_dir(target, deployment)}/run.json"


def read_record(login: Transport, target: SlurmTarget, deployment: str) -> RunRecord | None:
    got = login.run(["cat", record_path(target, deployment)], check=False, timeout=30)
    if got.rc != 0:
        return None
    try:
        raw = json.loads(got.stdout)
        return RunRecord(job=str(raw["job"]), deployment=str(raw["deployment"]),
                         submitted_at=float(raw["submitted_at"]),
                         steps={str(k): str(v) for k, v in dict(raw.get("steps") or {}).items()},
                         nodes=[str(n) for n in raw.get("nodes") or []],
                         generations={str(k): int(v) for k, v in dict(raw.get("generations") or {}).items()},
                         gpus={str(k): [int(g) for g in v] for k, v in dict(raw.get("gpus") or {}).items()})
    except (ValueError, KeyError, TypeError):
        return None


def write_record(login: Transport, target: SlurmTarget, record: RunRecord) -> None:
    login.put(record_path(target, record.deployment), record.to_json().encode(), 0o600)


def forget(login: Transport, target: SlurmTarget, deployment: str) -> None:
    login.run(["rm", "-f", record_path(target, deployment)], check=False, timeout=30)
