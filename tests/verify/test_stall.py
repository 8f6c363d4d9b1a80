"""A start that stops moving is named by the gate: "stalled in <phase> for N s", its last lines and the
Python stacks of its processes; then it stops or keeps waiting, as the role's health.on_stall says."""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpudeploy.model import STALL_DEFAULTS_S, Unit
from gpudeploy.plan import load_plan
from gpudeploy.remote.local import LocalTransport
from gpudeploy.supervisor.base import Run, Sink
from gpudeploy.verify import gate, stacks
from gpudeploy.verify.stall import Clock, Stack, Stacks

REPO = Path(__file__).resolve().parents[2]
LOADING = ["[2026-12-01 10:00:00 TP0] Load weight begin. avail mem=93.20 GB",
           "Loading safetensors checkpoint shards:   0% Completed | 0/4 [00:00<?, ?it/s]"]
STACK = Stack(4242, "sglang::scheduler_TP0", 'Thread 4242 (idle): "MainThread"\n    read_shard (loader.py:88)')


def unit_with(**health: Any) -> Unit:
    plan = load_plan(str(REPO / "lab" / "inventory" / "lab.yml"), host="lab1", memory=False)
    u = next(u for u in plan.units if u.role.name == "prefill")
    return replace(u, role=replace(u.role, health=replace(u.role.health, **health)))


class _Plays:
    """A supervisor whose watch plays ``lines`` at once, then ``later`` once ``go`` is set."""

    def __init__(self, lines: list[str], later: list[str] | None = None, go: threading.Event | None = None) -> None:
        self.lines, self.later, self.go = lines, later or [], go

    @contextmanager
    def watch(self, remote: Any, runs: list[Run], sinks: dict[str, Sink]) -> Iterator[None]:
        sink = next(iter(sinks.values()))

        def feed() -> None:
            for line in self.lines:
                sink.line(line)
            if self.go is not None and self.go.wait(20):
                for line in self.later:
                    sink.line(line)

        threading.Thread(target=feed, daemon=True).start()
        yield None

    def run_lines(self, remote: Any, run: Run) -> list[str]:
        return []


def gate_one(unit: Unit, supervisor: Any, **kw: Any) -> gate.GateResult:
    run = Run(unit.name, "inv-1", 41, 1, False)
    return gate.gate_runs(None, supervisor, [(unit, run)], on_phase=lambda *a: None,  # type: ignore[arg-type]
                          flag_name=lambda u: (lambda name: "--" + name), timeout_s=30, **kw)[unit.name]


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Stall checks every 20 ms; stacks from a fake py-spy; which units' stacks were read."""
    monkeypatch.setattr(gate, "STALL_CHECK_S", 0.02)
    asked: list[str] = []

    def fake_stacks(remote: Any, supervisor: Any, unit: Unit) -> Stacks:
        asked.append(unit.name)
        return Stacks((STACK,))

    monkeypatch.setattr(gate, "python_stacks", fake_stacks)
    return asked


def test_a_run_that_stops_moving_is_stopped_as_stalled_with_its_phase_lines_and_stacks(
        monkeypatch: pytest.MonkeyPatch, fast: list[str]) -> None:
    monkeypatch.setattr(gate, "status_of", lambda url, timeout, via: None)  # never healthy
    unit = unit_with(stall_s={**STALL_DEFAULTS_S, "loading weights": 0.3}, on_stall="stop")
    res = gate_one(unit, _Plays(LOADING))
    assert not res.ok and res.cause is not None
    assert res.cause.kind == "stalled"
    # (how many seconds is the clock's under load: with both cores busy the check ran late once)
    assert re.match(r"stalled in loading weights for \d+ s: no log line", res.cause.summary), res.cause.summary
    assert res.elapsed_s < 5  # not the 30 s timeout
    assert res.cause.evidence[:2] == tuple(LOADING)
    assert "pid 4242 (sglang::scheduler_TP0):" in res.cause.evidence
    assert "    read_shard (loader.py:88)" in "\n".join(res.cause.evidence)
    assert fast == [unit.name]
    assert "health.stall_s" in res.cause.next_step


def test_a_stall_the_role_waits_out_is_reported_once_then_moving_again_and_ready(
        monkeypatch: pytest.MonkeyPatch, fast: list[str]) -> None:
    go, ready = threading.Event(), threading.Event()
    monkeypatch.setattr(gate, "status_of", lambda url, timeout, via: 200 if ready.is_set() else None)
    unit = unit_with(stall_s={**STALL_DEFAULTS_S, "loading weights": 0.3}, on_stall="wait")
    told: list[str] = []

    def tell(u: Unit, text: str) -> None:
        told.append(text)
        if text.startswith("STALLED"):
            go.set()  # the stalled run moves again: one more shard
        else:
            ready.set()

    res = gate_one(unit, _Plays(LOADING, ["Loading safetensors checkpoint shards:  25% Completed | 1/4"], go),
                   on_stall=tell)
    assert res.ok
    stalled, moving = told
    assert stalled.startswith("STALLED: stalled in loading weights for 0 s")
    assert "still waiting, up to health.timeout_s (health.on_stall: wait" in stalled
    assert f"    | {LOADING[1]}" in stalled
    assert "Python stacks of its processes (py-spy dump):" in stalled and "read_shard (loader.py:88)" in stalled
    assert moving.startswith("moving again after 0 s stalled in loading weights")


def test_a_start_that_keeps_moving_is_not_stalled(monkeypatch: pytest.MonkeyPatch, fast: list[str]) -> None:
    stop = threading.Event()

    class _Ticks(_Plays):
        @contextmanager
        def watch(self, remote: Any, runs: list[Run], sinks: dict[str, Sink]) -> Iterator[None]:
            sink = next(iter(sinks.values()))

            def feed() -> None:
                sink.line(LOADING[0])
                for n in range(1, 12):  # a shard every 0.1 s, each well within the 0.3 s allowed
                    if stop.wait(0.1):
                        return
                    sink.line(f"Loading safetensors checkpoint shards:  {n}% Completed | {n}/12")
                ready.set()

            threading.Thread(target=feed, daemon=True).start()
            yield None

    ready = threading.Event()
    monkeypatch.setattr(gate, "status_of", lambda url, timeout, via: 200 if ready.is_set() else None)
    unit = unit_with(stall_s={**STALL_DEFAULTS_S, "loading weights": 0.3}, on_stall="stop")
    try:
        res = gate_one(unit, _Ticks([]))
    finally:
        stop.set()
    assert res.ok, res.cause
    assert fast == []


def test_the_clock_reports_a_stall_once_and_a_move_after_it() -> None:
    t = [100.0]
    clock = Clock(lambda: t[0])
    t[0] = 104.0
    assert clock.stalled(5) is None
    t[0] = 106.0
    assert clock.stalled(5) == 6.0
    assert clock.stalled(5) is None  # once
    t[0] = 110.0
    assert clock.moved() == 10.0  # it had been reported: the run moves again after 10 s
    assert clock.moved() is None
    t[0] = 114.0
    assert clock.stalled(5) is None and clock.still_for() == 4.0


def test_stacks_come_from_py_spy_by_pid_and_start_time_bounded(tmp_path: Path) -> None:
    # The host script run for real (here, as connection: local), against a py-spy that prints what
    # py-spy 0.3 prints (src/dump.rs: "Process P: CMD", "Python v...", "Thread T (idle): NAME", frames).
    spy = tmp_path / "py-spy"
    spy.write_text("\n".join([
        "#!/bin/sh", 'echo "Process $3: python3 -m sglang.launch_server"', 'echo "Python v3.11.2 (/usr/bin/python3)"',
        "echo", "echo 'Thread 0x7F (idle): \"MainThread\"'",
        'i=0; while [ $i -lt 100 ]; do echo "    f$i (x.py:$i)"; i=$((i+1)); done', ""]))
    spy.chmod(0o755)
    unit = unit_with(py_spy=str(spy))
    me = {"pid": os.getpid(), "start_ticks": _start_ticks(os.getpid()), "cmd": "pytest"}
    reused = {"pid": os.getppid(), "start_ticks": 1, "cmd": "someone else"}  # a PID whose start time is not ours
    got = stacks.dump(LocalTransport(unit.host), unit, [me, reused])
    by_pid = {s.pid: s for s in got.stacks}
    mine, other = by_pid[os.getpid()], by_pid[os.getppid()]
    assert mine.pid == os.getpid() and mine.text.startswith(f"Process {os.getpid()}: python3 -m sglang.launch_server")
    assert 'Thread 0x7F (idle): "MainThread"' in mine.text
    assert mine.text.endswith(f"... {104 - stacks.MAX_LINES} more lines")  # 104 lines, cut to 60
    assert other.text == "" and other.error == "it is gone"  # never pointed at a PID of another process


def test_without_py_spy_the_stall_says_where_it_looked_and_how_to_get_it(tmp_path: Path) -> None:
    unit = unit_with(py_spy=str(tmp_path / "nowhere" / "py-spy"))
    me = {"pid": os.getpid(), "start_ticks": _start_ticks(os.getpid()), "cmd": "pytest"}
    got = stacks.dump(LocalTransport(unit.host), unit, [me])
    assert got.stacks == ()
    assert got.note == (f"no Python stacks: no py-spy on the host (looked at {tmp_path}/nowhere/py-spy); "
                        "the role's health.py_spy names it, but it is not there")


def test_py_spy_is_looked_for_beside_the_engines_python_then_on_path() -> None:
    unit = unit_with()
    unit = replace(unit, role=replace(unit.role, python="/opt/gpudeploy/engines/sglang/venv/bin/python"))
    assert stacks.candidates(unit) == (["/opt/gpudeploy/engines/sglang/venv/bin/py-spy"], True)
    named = replace(unit, role=replace(unit.role, health=replace(unit.role.health, py_spy="/usr/local/bin/py-spy")))
    assert stacks.candidates(named) == (["/usr/local/bin/py-spy"], False)


def test_a_dump_of_many_processes_is_bounded() -> None:
    procs = [{"pid": p, "start_ticks": 1, "cmd": f"p{p}"} for p in range(1, 30)]
    doc = {"py_spy": "/x/py-spy", "stacks": [{"pid": p["pid"], "text": "Thread 1 (idle)\n", "error": ""}
                                             for p in procs[:stacks.MAX_PROCESSES]]}
    got = stacks.parse(json.loads(json.dumps(doc)), procs[:stacks.MAX_PROCESSES], len(procs), None)
    assert len(got.stacks) == stacks.MAX_PROCESSES
    assert got.note == f"({29 - stacks.MAX_PROCESSES} more processes not dumped)"


def _start_ticks(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[19])
