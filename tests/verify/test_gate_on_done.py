"""A unit's failure is said the moment its gate ends, not when the wave's slowest unit is ready
(in a fleet deploy the summary waits for the last of 64 hosts)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from gpudeploy.apply import deploy as d
from gpudeploy.plan import load_plan
from gpudeploy.remote.base import Result
from gpudeploy.supervisor import systemd
from gpudeploy.supervisor.base import Run, Sink
from gpudeploy.verify import gate
from gpudeploy.verify.causes import Cause
from gpudeploy.verify.gate import GateResult

REPO = Path(__file__).resolve().parents[2]
OOM = ["[2026-12-01 10:00:00 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=20.1 GB",
       "Capture cuda graph failed: CUDA out of memory. Tried to allocate 7.50 GiB. GPU 0 has a total capacity of "
       "95.00 GiB of which 2.30 GiB is free.", "Possible solutions:"]


def two_units() -> tuple[Any, Any]:
    plan = load_plan(str(REPO / "lab" / "inventory" / "lab.yml"), host="lab1", memory=False)
    prefill, decode = (u for u in plan.units if u.role.name in ("prefill", "decode"))
    return prefill, decode


class _DiesAtOnce:
    """A supervisor whose watch says that ``dying`` printed a CUDA OOM and exited."""

    def __init__(self, dying: str) -> None:
        self.dying = dying

    @contextmanager
    def watch(self, remote: Any, runs: list[Run], sinks: dict[str, Sink]) -> Iterator[None]:
        def feed() -> None:
            for line in OOM:
                sinks[self.dying].line(line)
            sinks[self.dying].exited("Main process exited, code=exited, status=1/FAILURE", from_log=True)

        threading.Thread(target=feed, daemon=True).start()
        yield None

    def run_lines(self, remote: Any, run: Run) -> list[str]:
        return []


def test_a_death_is_heard_while_the_rest_of_the_wave_still_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    dies, waits = two_units()
    release = threading.Event()  # the other unit turns ready only once the death was heard
    monkeypatch.setattr(gate, "status_of", lambda url, timeout, via: 200 if url == waits.health_url
                        and release.is_set() else None)
    heard: list[tuple[str, bool, str | None, bool]] = []

    def on_done(u: Any, res: GateResult) -> None:
        heard.append((u.name, res.ok, res.cause.kind if res.cause else None, release.is_set()))
        release.set()

    runs = [(dies, Run(dies.name, "inv-a", 41, 1, False)), (waits, Run(waits.name, "inv-b", 42, 1, False))]
    results = gate.gate_runs(None, _DiesAtOnce(dies.name), runs, on_phase=lambda *a: None,  # type: ignore[arg-type]
                             flag_name=lambda u: (lambda name: "--" + name.replace("_", "-")), timeout_s=20,
                             on_done=on_done)
    assert heard[0] == (dies.name, False, "oom-in-graph-capture", False)  # before the other was ready
    assert heard[1][:2] == (waits.name, True)
    assert results[waits.name].ok and not results[dies.name].ok


class _Host:
    def __init__(self, name: str) -> None:
        self.host = type("H", (), {"name": name, "python": "python3"})()
        self.records: dict[str, dict[str, Any]] = {}

    def put(self, path: str, data: bytes, mode: int) -> None:
        self.records[path] = json.loads(data)

    def run(self, argv: list[str], stdin: bytes | None = None, **kw: Any) -> Result:
        procs = [{"pid": 7, "start_ticks": 99}]
        if argv[0] == "sh":  # apply/ready_record.py: the record on stdin, its pids filled in and back
            assert stdin is not None
            self.records[argv[-1]] = json.loads(stdin.decode().replace('"@PIDS@"', json.dumps(procs)))
            return Result(0, json.dumps(procs), "")
        spec = json.loads(argv[3])
        for w in spec.get("records", []):  # the probe writes a ready run's record (remote_probe.write_records)
            self.records[w["path"]] = {**w["record"], "pids": procs}
        return Result(0, json.dumps({"units": {u: {"procs": procs} for u in spec["units"]},
                                     "recorded": {w["unit"]: {"pids": procs} for w in spec.get("records", [])}}), "")


def test_deploy_says_the_failure_and_its_cause_when_the_gate_hears_it(monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    dies, waits = two_units()
    said_before_the_wave_ended: list[str] = []

    def gate_runs(remote: Any, supervisor: Any, runs: Any, **kw: Any) -> dict[str, GateResult]:
        failed = GateResult(False, "capturing CUDA graphs", 2.3, Cause(
            "oom-in-graph-capture", "CUDA out of memory while capturing CUDA graphs", tuple(OOM[1:2]), "lower it"),
            OOM, died_at=1.0)
        kw["on_done"](dies, failed)
        said_before_the_wave_ended.append(capsys.readouterr().out)
        kw["on_done"](waits, GateResult(True, "ready", 3.0))
        return {dies.name: failed, waits.name: GateResult(True, "ready", 3.0)}

    monkeypatch.setattr(systemd, "restart", lambda remote, unit, **kw: Run(unit, "inv", 42, 1_000, False))
    monkeypatch.setattr(gate, "gate_runs", gate_runs)
    states = systemd.SYSTEMD.states({"units": {u.name: {"props": {"ActiveState": "active", "LoadState": "loaded"}}
                                               for u in (dies, waits)}})
    files = {u.name: {u.unit_path: (b"x", 0o644)} for u in (dies, waits)}
    out = d.start_and_gate(_Host("lab1"), systemd.SYSTEMD, [dies, waits], files, states,  # type: ignore[arg-type]
                           d.Options(), None)
    assert [o.ok for o in out] == [False, True]
    [said] = said_before_the_wave_ended
    assert ("[lab1/prefill] FAILED after 2.3 s (capturing CUDA graphs): CUDA out of memory while capturing CUDA "
            "graphs") in said
    assert "[lab1/decode] FAILED" not in said + capsys.readouterr().out
