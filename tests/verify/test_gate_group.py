"""A multi-node group's cause is the rank that really failed, also when a peer's death is heard first.

When rank 1 runs out of memory, its process exits and rank 0's gloo link breaks; rank 0's death
("Connection closed by peer") can reach the operator before rank 1's own lines do (seen in CI: the
group was reported as failed by rank 0's peer-lost, rank 1 as merely "stopped by the group")."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpudeploy.plan import load_plan
from gpudeploy.supervisor.base import Run, Sink
from gpudeploy.verify import gate
from gpudeploy.verify.group import GroupLinks, root_cause

REPO = Path(__file__).resolve().parents[2]
CASE = REPO / "tests" / "plan" / "cases" / "multinode_tp16.yml"
PEER_LOST = ["[2026-12-01 12:04:15 TP1] Scheduler hit an exception: Traceback (most recent call last):",
             "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by "
             "peer [192.0.2.22]:46034"]
OOM = ["[2026-12-01 12:04:14 TP9] Capture cuda graph begin. This can take up to several minutes. avail mem=13.36 GB",
       "Capture cuda graph failed: CUDA out of memory. Tried to allocate 7.50 GiB. GPU 1 has a total capacity of "
       "139.80 GiB of which 2.30 GiB is free.", "Possible solutions:"]
EXIT = "Main process exited, code=exited, status=1/FAILURE"


class _Feeds:
    """A supervisor whose watch plays ``lines`` then the exit, after ``after`` is set (if given)."""

    def __init__(self, lines: list[str], after: threading.Event | None, done: threading.Event) -> None:
        self.lines, self.after, self.done = lines, after, done

    @contextmanager
    def watch(self, remote: Any, runs: list[Run], sinks: dict[str, Sink]) -> Iterator[None]:
        sink = next(iter(sinks.values()))

        def feed() -> None:
            if self.after is not None:
                self.after.wait(10)
            for line in self.lines:
                sink.line(line)
            sink.exited(EXIT, from_log=True)
            self.done.set()

        threading.Thread(target=feed, daemon=True).start()
        yield None

    def run_lines(self, remote: Any, run: Run) -> list[str]:
        return []


def materialize(case: dict[str, Any], root: Path) -> Path:
    """The case's inventory and roles as files, with the repository's templates."""
    for sub in ("inventory", "roles", "templates"):
        (root / sub).mkdir()
    for path in (REPO / "templates").glob("*.j2"):
        (root / "templates" / path.name).write_text(path.read_text())
    for name, role in case["roles"].items():
        (root / "roles" / f"{name}.yml").write_text(yaml.safe_dump(role, sort_keys=False))
    inv = root / "inventory" / "hosts.yml"
    inv.write_text(yaml.safe_dump(case["inventory"], sort_keys=False))
    return inv


def test_the_rank_that_ran_out_of_memory_is_the_groups_cause_though_its_peer_died_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    case = yaml.safe_load(CASE.read_text())
    plan = load_plan(str(materialize(case, tmp_path)), memory=False)
    leader, follower = sorted((u for u in plan.units if u.group is not None), key=lambda u: u.group.rank)  # type: ignore[union-attr]
    monkeypatch.setattr(gate, "status_of", lambda url, timeout, via: None)  # neither is ever healthy
    links = GroupLinks([leader, follower])
    leader_dead, follower_dead = threading.Event(), threading.Event()
    results: dict[str, gate.GateResult] = {}  # by host: both ranks' units have one name

    def gate_on(unit: Any, sup: _Feeds) -> None:
        results[unit.host.name] = next(iter(gate.gate_runs(None, sup, [(unit, Run(unit.name, "inv", 40, 1, False))],  # type: ignore[arg-type]
                                      on_phase=lambda *a: None, flag_name=lambda u: (lambda n: "--" + n),
                                      timeout_s=20, links=links).values()))

    # The leader's peer-lost death is heard first; the follower's own OOM lines arrive only after it.
    threads = [threading.Thread(target=gate_on, args=(leader, _Feeds(PEER_LOST, None, leader_dead))),
               threading.Thread(target=gate_on, args=(follower, _Feeds(OOM, leader_dead, follower_dead)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    lead, follow = results[leader.host.name], results[follower.host.name]
    assert lead.cause is not None and lead.cause.kind == "peer-lost"
    assert follow.cause is not None and follow.cause.kind == "oom-in-graph-capture", follow.cause
    root = root_cause([(leader, lead.cause, lead.died_at), (follower, follow.cause, follow.died_at)])
    assert root is not None and root[0] is follower and root[1].kind == "oom-in-graph-capture"


class _Silent:
    """A supervisor whose start works and whose watch never reports anything (a server that is
    never healthy and never dies), or whose start fails (``refuse``)."""

    def __init__(self, refuse: str | None = None) -> None:
        self.refuse = refuse
        self.stopped: list[str] = []

    def start(self, remote: Any, unit: str, *, was_active: bool, stop_timeout_s: float) -> Run:
        if self.refuse:
            from gpudeploy.errors import RemoteError

            raise RemoteError("lab2", self.refuse)
        return Run(unit, "inv", 40, 1, False)

    @contextmanager
    def watch(self, remote: Any, runs: list[Run], sinks: dict[str, Sink]) -> Iterator[None]:
        yield None

    def run_lines(self, remote: Any, run: Run) -> list[str]:
        return []

    def stop(self, remote: Any, units: list[str], timeout_s: float) -> None:
        self.stopped += units


class _Host:
    def __init__(self, name: str) -> None:
        self.host = type("H", (), {"name": name, "python": "/usr/bin/python3"})()

    def put(self, path: str, data: bytes, mode: int) -> None:
        pass


def test_a_rank_that_cannot_start_fails_its_group_at_once_with_its_own_cause(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The other ranks waited out the whole health timeout, and the leader was blamed with "timeout".
    import time

    from gpudeploy.apply import deploy as unit_deploy
    from gpudeploy.apply.deploy import Options, start_and_gate

    case = yaml.safe_load(CASE.read_text())
    plan = load_plan(str(materialize(case, tmp_path)), memory=False)
    leader, follower = sorted((u for u in plan.units if u.group is not None), key=lambda u: u.group.rank)  # type: ignore[union-attr]
    monkeypatch.setattr(gate, "status_of", lambda url, timeout, via: None)
    monkeypatch.setattr(unit_deploy, "_after_gate", lambda remote, sup, u, run, g, files, opts: unit_deploy.UnitOutcome(
        u, "failed" if not g.ok else "started", g.ok, run.main_pid, g))
    links = GroupLinks([leader, follower])
    files = {leader.name: {}}
    out: dict[str, Any] = {}

    def rank(unit: Any, sup: _Silent) -> None:
        [out[unit.host.name]] = start_and_gate(_Host(unit.host.name), sup, [unit], files,  # type: ignore[arg-type]
                                               {unit.name: type("S", (), {"active": False})()},  # type: ignore[dict-item]
                                               Options(timeout_s=120), None, links)

    t0 = time.monotonic()
    threads = [threading.Thread(target=rank, args=(leader, _Silent())),
               threading.Thread(target=rank, args=(follower, _Silent(refuse="Job for the unit failed")))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    took = time.monotonic() - t0
    lead, follow = out[leader.host.name], out[follower.host.name]
    assert follow.gate.cause.kind == "start-failed" and "Job for the unit failed" in follow.gate.cause.summary
    assert lead.gate.cause.kind == "group-failed", lead.gate.cause  # not "timeout"
    assert took < 60, took  # the health timeout is 120 s
    root = root_cause([(leader, lead.gate.cause, lead.gate.died_at), (follower, follow.gate.cause,
                                                                       follow.gate.died_at)])
    assert root is not None and root[0] is follower
