"""One unit whose start fails (or times out) is that unit's outcome; the wave goes on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpudeploy.apply import deploy as d
from gpudeploy.errors import RemoteError
from gpudeploy.plan import load_plan
from gpudeploy.remote.base import Result
from gpudeploy.supervisor import systemd
from gpudeploy.supervisor.base import Run
from gpudeploy.verify import gate as gate_module  # start_and_gate imports gate_runs from there as it runs
from gpudeploy.verify.gate import GateResult

REPO = Path(__file__).resolve().parents[2]


class _Host:
    """What _start_and_gate needs of a host: it writes run records and reads the unit's PIDs."""

    def __init__(self, name: str) -> None:
        self.host = type("H", (), {"name": name, "python": "python3"})()
        self.records: dict[str, dict[str, Any]] = {}
        self.trips: list[str] = []  # each round trip: "put <path>" or "probe"

    def put(self, path: str, data: bytes, mode: int) -> None:
        self.trips.append(f"put {path}")
        self.records[path] = json.loads(data)

    def run(self, argv: list[str], stdin: bytes | None = None, **kw: Any) -> Result:
        assert argv[1] == "-c"  # only the host probe and the ready record's script run here
        procs = [{"pid": 7, "start_ticks": 99}]
        if argv[0] == "sh":  # apply/ready_record.py: the record on stdin, its pids filled in and back
            assert stdin is not None
            self.trips.append("record")
            self.records[argv[-1]] = json.loads(stdin.decode().replace('"@PIDS@"', json.dumps(procs)))
            return Result(0, json.dumps(procs), "")
        self.trips.append("probe")
        spec = json.loads(argv[3])
        recorded = {}
        for w in spec.get("records", []):  # as remote_probe.write_records does on a host
            self.records[w["path"]] = {**w["record"], "pids": procs}
            recorded[w["unit"]] = {"pids": procs}
        return Result(0, json.dumps({"units": {u: {"procs": procs} for u in spec["units"]}, "recorded": recorded}), "")


def test_a_start_that_times_out_does_not_leave_the_others_ungated(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = load_plan(str(REPO / "lab" / "inventory" / "lab.yml"), host="lab1", memory=False)
    prefill, decode = (u for u in plan.units if u.role.name in ("prefill", "decode"))

    def restart(remote: Any, unit: str, *, was_active: bool, stop_timeout_s: float) -> Run:
        if unit == prefill.name:  # the old run ignored SIGTERM past the restart's timeout
            raise RemoteError("lab1", f"`systemctl restart {unit}` did not finish within 90 s")
        return Run(unit, "inv-decode", 42, 1_000, restarted=False)

    monkeypatch.setattr(systemd, "restart", restart)
    monkeypatch.setattr(gate_module, "gate_runs", lambda remote, supervisor, runs, **kw: {
        u.name: GateResult(True, "ready", 1.0) for u, _ in runs})
    host = _Host("lab1")
    states = systemd.SYSTEMD.states({"units": {u.name: {"props": {"ActiveState": "active", "LoadState": "loaded"}}
                                               for u in (prefill, decode)}})
    files = {u.name: {u.unit_path: (b"x", 0o644)} for u in (prefill, decode)}
    out = {o.unit.role.name: o for o in d.start_and_gate(host, systemd.SYSTEMD, [prefill, decode],  # type: ignore[arg-type]
                                                          files, states, d.Options(), None)}
    assert not out["prefill"].ok and "did not finish within 90 s" in out["prefill"].message
    assert out["decode"].ok and out["decode"].action == "started" and out["decode"].pids == [7]
    record = host.records[f"{d.RUNS_DIR}/{decode.name}.json"]
    assert record["state"] == "ready" and record["deployment"] == "lab"


def test_the_restart_may_take_the_old_runs_stop_timeout_and_then_some() -> None:
    assert systemd.restart_timeout(1800) >= 1800 + 60  # was a fixed 120 s


def test_a_ready_run_is_recorded_with_its_processes_in_one_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    """Between /health 200 and deploy's return (issue 26): one round trip that finds the processes and
    writes the record, not a probe and then a write (two round trips per host, ~0.65 s at 64 hosts on
    2 cores); on a systemd host a shell's, not the probe's Python (apply/ready_record.py)."""
    plan = load_plan(str(REPO / "lab" / "inventory" / "lab.yml"), host="lab1", memory=False)
    decode = next(u for u in plan.units if u.role.name == "decode")
    monkeypatch.setattr(systemd, "restart", lambda remote, unit, **kw: Run(unit, "inv-d", 42, 1_000, restarted=False))
    monkeypatch.setattr(gate_module, "gate_runs", lambda remote, supervisor, runs, **kw: {
        u.name: GateResult(True, "ready", 1.0) for u, _ in runs})
    host = _Host("lab1")
    states = systemd.SYSTEMD.states({"units": {decode.name: {"props": {"ActiveState": "inactive"}}}})
    (out,) = d.start_and_gate(host, systemd.SYSTEMD, [decode], {decode.name: {decode.unit_path: (b"x", 0o644)}},  # type: ignore[arg-type]
                              states, d.Options(), None)
    path = f"{d.RUNS_DIR}/{decode.name}.json"
    assert out.ok and out.pids == [7]
    assert host.trips == [f"put {path}", "record"]  # the "starting" record, then one trip after the gate
    assert host.records[path]["state"] == "ready" and host.records[path]["pids"] == [{"pid": 7, "start_ticks": 99}]
    assert host.records[path]["invocation"] == "inv-d" and host.records[path]["deployment"] == "lab"
