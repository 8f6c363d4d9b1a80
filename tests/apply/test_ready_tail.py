"""What a deploy still does after its last server is ready (issue 26, bench/tail.py): at 64 hosts on
2 cores every step there waited behind the hosts and the connections' threads, so as little as
possible is left for that moment, and the report comes before the connections close."""

from __future__ import annotations

import json
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpudeploy.apply import deploy as d
from gpudeploy.apply import deployment, sessions
from gpudeploy.model import Host
from gpudeploy.plan import load_plan
from gpudeploy.remote import closing
from gpudeploy.remote.base import Result
from gpudeploy.supervisor import systemd
from gpudeploy.supervisor.base import Run
from gpudeploy.verify import gate as gate_module  # start_and_gate imports gate_runs from there as it runs
from gpudeploy.verify.gate import GateResult

REPO = Path(__file__).resolve().parents[2]
LOAD_END = ("[2026-12-01 10:00:00 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, "
            "avail mem=78.9 GB, mem usage=16.00 GB.")


class _Host:
    """A host that takes the run records and answers the ready record's one round trip."""

    def __init__(self) -> None:
        self.host = type("H", (), {"name": "lab1", "python": "python3"})()

    def put(self, path: str, data: bytes, mode: int) -> None:
        pass

    def run(self, argv: list[str], stdin: bytes | None = None, **kw: Any) -> Result:
        return Result(0, json.dumps([{"pid": 7, "start_ticks": 99}]), "")


def test_an_engines_memory_figures_are_read_in_its_hosts_thread_not_after_the_last_gate(
        monkeypatch: pytest.MonkeyPatch) -> None:
    plan = load_plan(str(REPO / "lab" / "inventory" / "lab.yml"), host="lab1", memory=False)
    decode = next(u for u in plan.units if u.role.name == "decode")
    monkeypatch.setattr(systemd, "restart", lambda remote, unit, **kw: Run(unit, "inv-d", 42, 1_000, restarted=False))
    monkeypatch.setattr(gate_module, "gate_runs", lambda remote, supervisor, runs, **kw: {
        u.name: GateResult(True, "ready", 1.0, lines=[LOAD_END]) for u, _ in runs})
    states = systemd.SYSTEMD.states({"units": {decode.name: {"props": {"ActiveState": "inactive"}}}})
    (out,) = d.start_and_gate(_Host(), systemd.SYSTEMD, [decode],  # type: ignore[arg-type]
                              {decode.name: {decode.unit_path: (b"x", 0o644)}}, states, d.Options(), None)
    assert out.ok and out.measured is not None and out.measured.weights_gib == 16.0

    def parse_again(lines: Any) -> Any:
        raise AssertionError("the log was read again after the last gate")

    kept: list[Any] = []
    monkeypatch.setattr(d, "parse_memory_log", parse_again)
    d.calibrate(type("S", (), {"put_many": lambda self, runs: kept.extend(runs)})(), [out])  # type: ignore[arg-type]
    assert [(host, m.weights_gib) for host, _, _, m in kept] == [("lab1", 16.0)]


def test_closes_asked_for_inside_after_report_wait_for_its_end_and_all_happen() -> None:
    closed: list[str] = []
    closing.later(lambda: closed.append("outside"))
    assert closed == ["outside"]  # no command around it (tests, the library): at once, as before

    def broken() -> None:
        closed.append("broken")
        raise OSError("socket already gone")

    with pytest.raises(OSError, match="already gone"), closing.after_report():
        closing.later(lambda: closed.append("a"))
        closing.later(broken)
        closing.later(lambda: closed.append("c"))
        assert closed == ["outside"]
    assert closed == ["outside", "a", "broken", "c"]  # in the order asked, one error stops none
    closing.later(lambda: closed.append("after"))
    assert closed[-1] == "after"


def _hosts(n: int) -> list[Host]:
    lab1 = load_plan(str(REPO / "lab" / "inventory" / "lab.yml"), host="lab1", memory=False).units[0].host
    return [replace(lab1, name=f"lab{i}") for i in range(1, n + 1)]


class _Remote:
    def __init__(self, host: Host, closed: list[str]) -> None:
        self.host, self.closed = host, closed

    def open(self) -> None:
        pass

    def close(self) -> None:
        self.closed.append(self.host.name)


class _Lock:
    def __init__(self, remote: _Remote, *a: Any) -> None:
        self.facts = None
        self.remote = remote

    def __enter__(self) -> _Lock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remote.closed.append(f"unlocked {self.remote.host.name}")


def test_a_commands_connections_close_after_its_report_and_its_locks_before(monkeypatch: pytest.MonkeyPatch) -> None:
    closed: list[str] = []
    monkeypatch.setattr(sessions, "connect", lambda host: _Remote(host, closed))
    monkeypatch.setattr(sessions, "HostLock", _Lock)
    hosts = _hosts(2)
    with closing.after_report():
        with ExitStack() as stack:
            opened, errors = sessions.open_sessions(hosts, 1.0, None, stack)
            assert sorted(opened) == ["lab1", "lab2"] and not errors
        assert sorted(closed) == ["unlocked lab1", "unlocked lab2"]  # the locks are free before the report
        closed.append("report")
    assert closed[-3:] == ["report", "lab2", "lab1"]


def test_a_phase_with_nothing_to_do_on_a_host_starts_nothing_there(monkeypatch: pytest.MonkeyPatch) -> None:
    """After the engines' gates, the routers' wave and the smoke ran a thread per host of a 64-host
    fleet that had no router at all, right when the command should return."""
    asked: list[list[str]] = []
    monkeypatch.setattr(deployment, "for_each_host", lambda hosts, fn, cancel: asked.append([h.name for h in hosts])
                        or {})
    live = {h.name: type("S", (), {"host": h})() for h in _hosts(3)}
    deployment._phase(live, lambda h: None, [], deployment.DeployResult({}, {}), None,  # type: ignore[arg-type]
                      only={"lab2"})
    deployment._phase(live, lambda h: None, [], deployment.DeployResult({}, {}), None,  # type: ignore[arg-type]
                      only=set())
    deployment._phase(live, lambda h: None, [], deployment.DeployResult({}, {}), None)  # type: ignore[arg-type]
    assert asked == [["lab2"], [], ["lab1", "lab2", "lab3"]]
