"""The gate asks /health as soon as the log says the server is ready (issue 26: deploy returns within
0.25 s of /health 200), not at its backoff's next step, which may be up to the role's interval later."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpudeploy.plan import load_plan
from gpudeploy.supervisor.base import Run
from gpudeploy.verify import gate

REPO = Path(__file__).resolve().parents[2]
POLLS_BEFORE = 7  # the backoff (50 ms doubling) polls at ~3.15 s for the 7th time, then sleeps 6.4 s


def test_the_ready_line_wakes_the_health_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = load_plan(str(REPO / "lab" / "inventory" / "lab.yml"), host="lab1", memory=False)
    unit = next(u for u in plan.units if u.role.name == "decode")
    slow = dataclasses.replace(unit.role, health=dataclasses.replace(unit.role.health, interval_s=30.0))
    unit = dataclasses.replace(unit, role=slow)
    ready = threading.Event()
    polls: list[float] = []
    became_ready: list[float] = []
    watch = gate._Watch(unit, Run(unit.name, "inv", 42, 0, False), lambda *a: None)

    def server() -> None:  # ready just after the gate's 7th poll, while its backoff sleeps
        time.sleep(0.05)
        became_ready.append(time.monotonic())
        ready.set()
        watch.line("[2026-12-02 01:00:00] The server is fired up and ready to roll!")

    def status_of(url: str, timeout: float, via: Any) -> int | None:
        polls.append(time.monotonic())
        if len(polls) == POLLS_BEFORE:
            threading.Thread(target=server, daemon=True).start()
        return 200 if ready.is_set() else None

    monkeypatch.setattr(gate, "status_of", status_of)
    ready_at: Any = gate._poll_health(unit, watch, 60.0, None)  # type: ignore[arg-type]
    assert ready_at is not None and became_ready
    assert ready_at - became_ready[0] < 2.0  # was ~6.4 s: the poll slept through the ready line


def test_a_warming_server_is_asked_often_so_its_200_is_seen_without_the_ready_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """While /health answers 503 (HTTP up, warmup running), the gate asks every 50 ms instead of
    backing off: the ready line reaches it through journald up to 250 ms late, or not at all."""
    plan = load_plan(str(REPO / "lab" / "inventory" / "lab.yml"), host="lab1", memory=False)
    unit = next(u for u in plan.units if u.role.name == "decode")
    slow = dataclasses.replace(unit.role, health=dataclasses.replace(unit.role.health, interval_s=30.0))
    unit = dataclasses.replace(unit, role=slow)
    polls: list[float] = []
    became_ready: list[float] = []
    watch = gate._Watch(unit, Run(unit.name, "inv", 42, 0, False), lambda *a: None)

    def status_of(url: str, timeout: float, via: Any) -> int | None:
        polls.append(time.monotonic())
        if len(polls) == POLLS_BEFORE and not became_ready:
            became_ready.append(time.monotonic())  # its warmup ends now; no log line says so
        return 200 if len(polls) > POLLS_BEFORE else 503

    monkeypatch.setattr(gate, "status_of", status_of)
    ready_at: Any = gate._poll_health(unit, watch, 60.0, None)  # type: ignore[arg-type]
    assert ready_at is not None and became_ready
    assert ready_at - became_ready[0] < 2.0  # was ~6.4 s: the backoff's step after the 7th poll
    assert not gate.WARMING.gates  # the gate that ended no longer counts as warming


def test_many_warming_gates_together_ask_at_most_the_warmup_rate() -> None:
    warming = gate.Warming(rate=160.0)
    gates = [object() for _ in range(64)]
    for g in gates[:8]:
        warming.mark(g, True)
    assert warming.interval(0.25) == gate.WARMUP_POLL_S  # 8 hosts: every 50 ms, 160 a second
    for g in gates[8:16]:
        warming.mark(g, True)
    assert warming.interval(0.25) == pytest.approx(0.1)  # 16 hosts: still 160 a second together
    for g in gates[16:]:
        warming.mark(g, True)
    assert warming.interval(0.25) == 0.25  # 64: never slower than the role's interval
    for g in gates:
        warming.mark(g, False)
    assert warming.interval(0.25) == gate.WARMUP_POLL_S
