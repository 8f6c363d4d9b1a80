"""deploy, status and teardown of a Slurm deployment against a fake login node that answers with
the outputs Slurm 22.05 printed in the lab (shared/reference/slurm-lab.md): what is submitted,
what is said while the job pends, how steps are found (by name: their numbers follow no script
order), how a dead step is named, and that teardown cancels the recorded job id and nothing else."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from slurm_fakes import COMMAND_ROLE, FakeLogin, Ticks, inventory, write_plan

from gpudeploy.slurm import job as jobmod
from gpudeploy.slurm.job import Options, deploy
from gpudeploy.slurm.plan import SlurmPlan
from gpudeploy.slurm.status import status_text, teardown

INVENTORY = inventory("""\
  node0:
    numa_nodes: [{id: 0, gpus: [0, 1, 2, 3], cpus: "0"}]
    roles: [a, b]
""")


@pytest.fixture
def planned(tmp_path: Path) -> SlurmPlan:
    return write_plan(tmp_path, INVENTORY, {"a": COMMAND_ROLE % 9000, "b": COMMAND_ROLE % 9001})


def running_job(argv: list[str], *, submitted: str, steps: str,
                state: str = "RUNNING|None|x|slurmn1\n") -> tuple[int, str] | None:
    """Slurm's words for a job running on slurmn1: sbatch's ``submitted``, the node, ``steps`` (squeue -s)
    and the job's ``state`` (squeue); None for any other command."""
    if argv[0] == "sbatch":
        return 0, submitted
    if argv[:3] == ["scontrol", "show", "hostnames"]:
        return 0, "slurmn1\n"
    if argv[0] == "squeue":
        return 0, steps if "-s" in argv else state
    return None


def test_a_pending_job_says_slurms_reason_and_is_cancelled_by_id_at_the_timeout(planned: SlurmPlan) -> None:
    def answer(argv: list[str]) -> tuple[int, str]:
        if argv[0] == "sbatch":
            return 0, "41\n"
        if argv[:2] == ["squeue", "-h"] and "-s" not in argv:
            return 0, "PENDING|QOSMaxGRESPerUser|2026-12-08T01:00:00|\n"
        return 0, ""
    login = FakeLogin(answer)
    said: list[str] = []
    out = deploy(planned, login, Options(timeout_s=3), said.append, clock=Ticks())  # type: ignore[arg-type]
    assert not out.ok
    assert "job 41 pending: QOSMaxGRESPerUser (estimated start 2026-12-08T01:00:00)" in said
    assert said.count("job 41 pending: QOSMaxGRESPerUser (estimated start 2026-12-08T01:00:00)") == 1
    assert "still pending: QOSMaxGRESPerUser" in out.message and "cancelled job 41" in out.message
    assert ["scancel", "41"] in login.ran
    assert [a for a in login.ran if a[0] == "scancel"] == [["scancel", "41"]]
    # the job id was recorded at submission, before any wait
    assert b'"job": "41"' in login.files["/shared/gd/t1/run.json"]


def test_a_killed_step_is_named_with_its_id_state_and_output(planned: SlurmPlan,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobmod, "status_of", lambda *a, **k: None)
    polls = {"n": 0}

    def answer(argv: list[str]) -> tuple[int, str]:
        if argv[0] == "squeue" and "-s" in argv:
            polls["n"] += 1
        if argv[0] == "sacct":
            return 0, ("7|gpudeploy-t1|RUNNING|0:0|slurmn1\n7.0|gpudeploy-t1.b|RUNNING|0:0|slurmn1\n"
                       + ("7.1|gpudeploy-t1.a|CANCELLED|0:9|slurmn1\n" if polls["n"] >= 3 else ""))
        if argv[0] == "tail" and argv[-1] == "/shared/gd/7.t1.a.out":
            return 0, "starting\n"
        # step numbers follow the order sruns reached slurmctld: b is 7.0 here
        steps = "7.0|gpudeploy-t1.b|slurmn1\n7.batch|batch|slurmn1\n"
        steps += "7.1|gpudeploy-t1.a|slurmn1\n" if polls["n"] < 3 else ""
        return running_job(argv, submitted="7;lab\n", steps=steps,
                           state="RUNNING|None|2026-12-07T19:00:00|slurmn1\n") or (1, "")
    login = FakeLogin(answer)
    said: list[str] = []
    out = deploy(planned, login, Options(), said.append, clock=Ticks())  # type: ignore[arg-type]
    assert not out.ok
    assert out.message.startswith("step 7.1 gpudeploy-t1.a of job 7 on slurmn1: CANCELLED: killed by signal 9; "
                                  "its output: /shared/gd/7.t1.a.out")
    assert "cause: the server exited (CANCELLED: killed by signal 9)" in out.message
    assert polls["n"] == 3  # named at the first poll that saw it gone
    assert ["scancel", "7"] in login.ran


def test_a_killed_step_whose_sacct_row_lags_is_still_named_with_sacct_s_words(
        planned: SlurmPlan, monkeypatch: pytest.MonkeyPatch) -> None:
    """squeue -s drops a killed step before slurmdbd has its end: the gate waits for sacct's words
    (a short grace) rather than naming it a bare "ended"."""
    monkeypatch.setattr(jobmod, "status_of", lambda *a, **k: None)
    polls = {"n": 0}

    def answer(argv: list[str]) -> tuple[int, str]:
        if argv[0] == "squeue" and "-s" in argv:
            polls["n"] += 1
        if argv[0] == "sacct":  # its end reaches sacct two polls after squeue -s dropped it
            return 0, "7.1|gpudeploy-t1.a|" + ("CANCELLED|0:9" if polls["n"] >= 5 else "RUNNING|0:0") + "|slurmn1\n"
        steps = "7.0|gpudeploy-t1.b|slurmn1\n" + ("7.1|gpudeploy-t1.a|slurmn1\n" if polls["n"] < 3 else "")
        return running_job(argv, submitted="7\n", steps=steps) or (1, "")
    out = deploy(planned, FakeLogin(answer), Options(), lambda s: None, clock=Ticks())  # type: ignore[arg-type]
    assert out.message.startswith("step 7.1 gpudeploy-t1.a of job 7 on slurmn1: CANCELLED: killed by signal 9"), \
        out.message
    assert polls["n"] == 5


def test_each_gate_poll_is_one_remote_command_for_every_step(planned: SlurmPlan,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A dead step is seen one round trip after its death, however many steps: the job, its steps,
    sacct and every output's new lines come from one command per poll (no ssh exec per step)."""
    monkeypatch.setattr(jobmod, "status_of", lambda *a, **k: None)
    per_poll: list[list[str]] = []

    def answer(argv: list[str]) -> tuple[int, str]:
        return running_job(argv, submitted="7\n", steps="7.0|gpudeploy-t1.a|slurmn1\n7.1|gpudeploy-t1.b|slurmn1\n") \
            or (1, "")
    login = FakeLogin(answer)
    ticks = Ticks()
    sleep = ticks.sleep

    def counted(s: float) -> None:
        per_poll.append([a[0] for a in login.ran])
        login.ran.clear()
        sleep(s)
    ticks.sleep = counted
    deploy(planned, login, Options(timeout_s=2), lambda s: None, clock=ticks)  # type: ignore[arg-type]
    polls = per_poll[1:]  # the first holds the submission and the job's first state
    assert len(polls) >= 4
    assert all(commands == ["bash"] for commands in polls), polls


def test_teardown_cancels_the_recorded_job_only_and_proves_it_ended(planned: SlurmPlan) -> None:
    cancelled: set[str] = set()

    def answer(argv: list[str]) -> tuple[int, str]:
        if argv[0] == "scancel":
            cancelled.add(argv[1])
            return 0, ""
        if argv[0] == "squeue":
            return 0, "" if "7" in cancelled else "RUNNING|None|x|slurmn1\n"
        if argv[0] == "sacct":
            return 0, "7|gpudeploy-t1|CANCELLED by 0|0:15|slurmn1\n7.0|gpudeploy-t1.b|CANCELLED|0:15|slurmn1\n"
        return 1, ""
    login = FakeLogin(answer)
    login.files["/shared/gd/t1/run.json"] = b'{"job": "7", "deployment": "t1", "submitted_at": 1, "steps": {}}'
    got = teardown(planned, login, clock=Ticks(), say=lambda s: None)  # type: ignore[arg-type]
    assert got.clean, got.words
    assert [a for a in login.ran if a[0] == "scancel"] == [["scancel", "7"]]
    assert "/shared/gd/t1/run.json" not in login.files


def test_teardown_says_what_is_left_when_the_job_will_not_end(planned: SlurmPlan) -> None:
    def answer(argv: list[str]) -> tuple[int, str]:
        if argv[0] == "squeue":
            return 0, "COMPLETING|None|x|slurmn1\n"
        return 0, ""
    login = FakeLogin(answer)
    login.files["/shared/gd/t1/run.json"] = b'{"job": "8", "deployment": "t1", "submitted_at": 1}'
    got = teardown(planned, login, clock=Ticks(), say=lambda s: None)  # type: ignore[arg-type]
    assert not got.clean and "squeue lists it COMPLETING" in got.words
    assert "/shared/gd/t1/run.json" in login.files  # kept: the job is still there


def test_a_changed_deployment_is_refused_with_no_room(planned: SlurmPlan) -> None:
    def answer(argv: list[str]) -> tuple[int, str]:
        if argv[:2] == ["scontrol", "write"]:
            return 0, planned.script.replace("/bin/server", "/bin/older")
        if argv[0] == "squeue":
            return 0, "RUNNING|None|x|slurmn1\n"
        return 0, ""
    login = FakeLogin(answer)
    login.files["/shared/gd/t1/run.json"] = b'{"job": "9", "deployment": "t1", "submitted_at": 1}'
    out = deploy(planned, login, Options(), lambda s: None)  # type: ignore[arg-type]
    assert not out.ok and out.message.startswith("no room: deployment t1 runs as job 9")
    assert "teardown" in out.message and "-  /bin/bash" not in out.message
    assert not [a for a in login.ran if a[0] in ("sbatch", "scancel")]


def test_status_shows_job_steps_and_health(planned: SlurmPlan, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gpudeploy.slurm.status.status_of", lambda url, *a, **k: 200 if ":9000" in url else None)

    def answer(argv: list[str]) -> tuple[int, str]:
        if argv[0] == "squeue" and "-s" in argv:
            return 0, "5.1|gpudeploy-t1.a|slurmn1\n"
        if argv[0] == "squeue":
            return 0, "RUNNING|None|x|slurmn1\n"
        if argv[0] == "sacct":
            return 0, "5.0|gpudeploy-t1.b|FAILED|1:0|slurmn1\n"
        return 0, ""
    login: Any = FakeLogin(answer)
    login.files["/shared/gd/t1/run.json"] = (b'{"job": "5", "deployment": "t1", "submitted_at": 1, '
                                             b'"nodes": ["slurmn1"]}')
    text, ok = status_text(planned, login)
    assert not ok
    lines = text.splitlines()
    assert lines[0] == "job 5 RUNNING on slurmn1"
    assert lines[1].split() == ["DEPLOYMENT", "JOB", "STEP", "NAME", "NODE", "STATE", "HEALTH", "ROUTER"]
    assert lines[2].split() == ["t1", "5", "5.1", "gpudeploy-t1.a", "slurmn1", "RUNNING", "ok", "-"]
    assert lines[3].split() == ["t1", "5", "5.0", "gpudeploy-t1.b", "slurmn1", "FAILED:", "exit", "code", "1", "-", "-"]
    assert "step 5.0 gpudeploy-t1.b: FAILED: exit code 1; its output: /shared/gd/5.t1.b.out" in text
    assert "cause: the server exited (FAILED: exit code 1)" in text


def test_a_step_whose_output_stops_moving_is_named_stalled(planned: SlurmPlan, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    stalls = "health: {timeout_s: 30, stall_s: 2, on_stall: stop}"
    sp = write_plan(tmp_path, INVENTORY, {"a": (COMMAND_ROLE % 9000).replace("health: {timeout_s: 5}", stalls)})
    monkeypatch.setattr(jobmod, "status_of", lambda *a, **k: None)

    def answer(argv: list[str]) -> tuple[int, str]:
        if argv[0] == "tail" and argv[2] == "+1" and argv[-1].endswith(".a.out"):
            return 0, "Load weight begin\n"  # then nothing more
        return running_job(argv, submitted="3\n", steps="3.0|gpudeploy-t1.a|slurmn1\n3.1|gpudeploy-t1.b|slurmn1\n") \
            or (1, "")
    said: list[str] = []
    out = deploy(sp, FakeLogin(answer), Options(), said.append, clock=Ticks())  # type: ignore[arg-type]
    assert not out.ok
    assert "step 3.0 gpudeploy-t1.a of job 3 on slurmn1: stalled" in out.message
    assert "cause: stalled in loading weights for 2 s" in out.message
    assert any(s.startswith("step 3.0 gpudeploy-t1.a: STALLED: stalled in loading weights") for s in said)


def test_status_asks_every_steps_health_at_once(planned: SlurmPlan, monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang's /health generates a token (about 1 s): status asks the steps side by side, so it takes
    one answer's time, not one per step. (Each answer here waits until the other was asked too.)"""
    both = threading.Barrier(2)

    def health(url: str, *a: object, **k: object) -> int | None:
        try:
            both.wait(timeout=5)
        except threading.BrokenBarrierError:
            return None
        return 200
    monkeypatch.setattr("gpudeploy.slurm.status.status_of", health)

    def answer(argv: list[str]) -> tuple[int, str]:
        if argv[0] == "squeue" and "-s" in argv:
            return 0, "5.0|gpudeploy-t1.a|slurmn1\n5.1|gpudeploy-t1.b|slurmn1\n"
        if argv[0] == "squeue":
            return 0, "RUNNING|None|x|slurmn1\n"
        return 0, ""
    login: Any = FakeLogin(answer)
    login.files["/shared/gd/t1/run.json"] = (b'{"job": "5", "deployment": "t1", "submitted_at": 1, '
                                             b'"nodes": ["slurmn1"]}')
    text, ok = status_text(planned, login)
    assert ok, text
