"""status --watch over Slurm (slurm/watch.py), round by round: a step that leaves squeue -s is named
at that very round with sacct's words and the cause its own output shows; when sacct lags, it is
named within GRACE_S anyway; the whole status's first look is not repeated."""

from __future__ import annotations

import base64
import io
import threading
from collections import deque
from pathlib import Path
from typing import Any

from slurm_fakes import COMMAND_ROLE, inventory, write_plan

from gpudeploy.errors import HostUnreachable
from gpudeploy.remote.base import Result
from gpudeploy.slurm import watch as watchmod
from gpudeploy.slurm.look import Look, Reader
from gpudeploy.slurm.queue import JobState, StepRow

INVENTORY = inventory("""\
  node0:
    numa_nodes: [{id: 0, gpus: [0, 1, 2, 3], cpus: "0"}]
    roles: [a]
""")
RUNNING = JobState("RUNNING", "None", "x", "slurmn1")


def planned(tmp_path: Path) -> Any:
    return write_plan(tmp_path, INVENTORY, {"a": COMMAND_ROLE % 9000})


def follow(tmp_path: Path) -> watchmod.Watch:
    sp = planned(tmp_path)
    return watchmod.Watch("7", [watchmod.Followed(s, Reader(f"/shared/gd/7.t1.{s.unit.role.name}.out"), deque())
                                for s in sp.steps])


def running(new: bytes | None = None) -> Look:
    return Look(RUNNING, {"gpudeploy-t1.a": StepRow("7.0", "gpudeploy-t1.a", "slurmn1")},
                {"7.0": StepRow("7.0", "gpudeploy-t1.a", "slurmn1", "RUNNING", "0:0")}, [new])


def test_a_killed_step_is_named_at_the_round_that_sees_it_gone_with_its_cause(tmp_path: Path) -> None:
    w = follow(tmp_path)
    assert w.update(running(b"Load weight begin\n"), 0.0) == ["step 7.0 gpudeploy-t1.a: - -> RUNNING on slurmn1"]
    assert w.update(running(), 0.25) == []
    dead = Look(RUNNING, {}, {"7.0": StepRow("7.0", "gpudeploy-t1.a", "slurmn1", "CANCELLED", "0:9")}, [None])
    [said] = w.update(dead, 0.35)
    assert said.startswith("step 7.0 gpudeploy-t1.a: RUNNING -> CANCELLED: killed by signal 9; "
                           "its output: /shared/gd/7.t1.a.out\ncause: the server exited (CANCELLED: killed "
                           "by signal 9)")
    assert "    | Load weight begin" in said
    assert w.update(dead, 0.6) == []  # said once


def test_when_sacct_lags_the_death_is_still_said_within_the_grace(tmp_path: Path) -> None:
    w = follow(tmp_path)
    w.update(running(b"serving\n"), 0.0)
    lagging = Look(RUNNING, {}, {"7.0": StepRow("7.0", "gpudeploy-t1.a", "slurmn1", "RUNNING", "0:0")}, [None])
    assert w.update(lagging, 1.0) == []
    [said] = w.update(lagging, 1.0 + watchmod.GRACE_S)
    assert said.startswith("step 7.0 gpudeploy-t1.a: RUNNING -> ended (no longer in squeue -s")
    assert "cause: the server exited" in said


class Login:
    """A login node whose step dies at the third look (the look's one command, framed as look.py's)."""

    def __init__(self) -> None:
        self.looks = 0
        self.files = {"/shared/gd/t1/run.json": '{"job": "7", "deployment": "t1", "submitted_at": 1, '
                                                '"nodes": ["slurmn1"]}'}

    def run(self, argv: list[str], **_: object) -> Result:
        if argv[0] == "cat":
            return Result(0, self.files.get(argv[1], ""), "") if argv[1] in self.files else Result(1, "", "")
        if argv[:2] == ["bash", "-c"]:
            self.looks += len(argv) > 6  # the watch's rounds (status's own look asks for no output)
            alive = self.looks < 3
            steps = "7.0|gpudeploy-t1.a|slurmn1\n" if alive else ""
            acct = "7.0|gpudeploy-t1.a|" + ("RUNNING|0:0" if alive else "CANCELLED|0:9") + "|slurmn1\n"
            data = base64.b64encode(b"Load weight begin\n" if self.looks == 1 else b"").decode()
            out = f"@out 0 18\n{data}\n" if len(argv) > 6 else ""
            return Result(0, f"@job\nRUNNING|None|x|slurmn1\n@steps\n{steps}@sacct\n{acct}{out}", "")
        if argv[0] == "squeue" and "-s" in argv:
            return Result(0, "7.0|gpudeploy-t1.a|slurmn1\n", "")
        if argv[0] == "squeue":
            return Result(0, "RUNNING|None|x|slurmn1\n", "")
        return Result(1, "", "")


def watch_until_cancelled(sp: Any, login: Login) -> str:
    """What the watch printed until it said a step CANCELLED (or about 4 s went by)."""
    out, stop = io.StringIO(), threading.Event()
    worker = threading.Thread(target=watchmod.watch, args=(sp, login, out, stop))
    worker.start()
    try:
        deadline = 200
        while "CANCELLED" not in out.getvalue() and deadline:
            stop.wait(0.02)
            deadline -= 1
    finally:
        stop.set()
        worker.join(10)
    return out.getvalue()


def test_the_watch_prints_the_whole_status_then_the_death_with_its_cause(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(watchmod, "POLL_S", 0.01)
    monkeypatch.setattr(watchmod, "status_of", lambda *a, **k: 200)
    monkeypatch.setattr("gpudeploy.slurm.status.status_of", lambda *a, **k: 200)
    text = watch_until_cancelled(planned(tmp_path), Login())
    assert text.startswith("job 7 RUNNING on slurmn1\n")
    assert "watching job 7" in text
    changes = [line for line in text.splitlines() if line[:2].isdigit()]  # "HH:MM:SS step ..."
    assert len(changes) == 1, text
    assert "step 7.0 gpudeploy-t1.a: RUNNING -> CANCELLED: killed by signal 9" in changes[0]
    assert "cause: the server exited (CANCELLED: killed by signal 9)" in text
    assert "    | Load weight begin" in text


class Flaky(Login):
    """A login node whose connection breaks at the second round and opens again on the next try."""

    def __init__(self) -> None:
        super().__init__()
        self.broke = False
        self.opened = 0

    def run(self, argv: list[str], **kw: object) -> Result:
        if argv[:2] == ["bash", "-c"] and len(argv) > 6 and self.looks == 1 and not self.broke:
            self.broke = True
            raise HostUnreachable("login", "connection lost")
        return super().run(argv, **kw)

    def close(self) -> None:
        pass

    def open(self) -> None:
        self.opened += 1


def test_a_broken_connection_is_said_opened_again_and_the_death_still_named(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(watchmod, "POLL_S", 0.01)
    monkeypatch.setattr(watchmod, "RECONNECT_S", (0.01, 0.01))
    monkeypatch.setattr(watchmod, "status_of", lambda *a, **k: 200)
    monkeypatch.setattr("gpudeploy.slurm.status.status_of", lambda *a, **k: 200)
    login = Flaky()
    text = watch_until_cancelled(planned(tmp_path), login)
    assert "login node 10.232.0.10: login: connection lost; trying again" in text, text
    assert "login node 10.232.0.10: reachable again" in text
    assert login.opened == 1
    assert "step 7.0 gpudeploy-t1.a: RUNNING -> CANCELLED: killed by signal 9" in text


def test_a_router_that_drops_a_worker_is_said(tmp_path: Path) -> None:
    w = follow(tmp_path)
    w.update(running(), 0.0)
    w.routers["gpudeploy-t1.a"] = "2/2 workers healthy"
    assert w.update(running(), 0.25) == []  # the first view: the whole status said it
    w.routers["gpudeploy-t1.a"] = "1/2 workers healthy"
    assert w.update(running(), 0.5) == ["step 7.0 gpudeploy-t1.a: router: 2/2 workers healthy -> 1/2 workers healthy"]
