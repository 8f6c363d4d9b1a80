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
    plan = load_plan(str(REPO / "inventory" / "lab.yml"), host="lab1", memory=False)
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
