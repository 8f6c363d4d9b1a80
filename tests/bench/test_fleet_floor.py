"""bench/fleet.py's pure part for issue 26: each gpudeploy figure as a multiple of the floor measured in
the same round, and the issue's targets (1.5x for a redeploy, 1.2x for status, 0.25 s, 0.15 s)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import fleet  # noqa: E402


def _records() -> list[dict[str, Any]]:
    rounds = [{"redeploy": 0.6, "status": 0.5, "status_warm": 0.3, "ready": 0.2, "crash_report": 0.1,
               "floor_ssh": 0.5, "floor_state": 0.4, "floor_ssh_master": 0.05, "floor_state_master": 0.06},
              {"redeploy": 0.8, "status": 0.7, "status_warm": 0.3, "ready": 0.3, "crash_report": 0.1,
               "floor_ssh": 0.5, "floor_state": 0.6, "floor_ssh_master": 0.05, "floor_state_master": 0.06}]
    return [{"tool": "gpudeploy", "n": 3, **r} for r in rounds]


def test_ratios_to_the_floor_of_the_same_run_and_the_targets() -> None:
    summary = fleet.summarize(_records())
    assert summary["floor_ssh"]["3"]["gpudeploy"]["median"] == 0.5
    cold = {"invoke --list": {"wall_s": 0.14}, "gpudeploy --help": {"wall_s": 0.16}, "invoke status (1 host)": {}}
    checks = {c["target"]: c for c in fleet.floor_targets(summary, cold)}
    redeploy = checks["redeploy at N=3: <= 1.5x the floor (floor_ssh)"]
    assert redeploy["met"] and redeploy["value"].endswith("= 1.40x")  # median 0.7 s / 0.5 s
    status = checks["status at N=3: <= 1.2x the floor (floor_state)"]
    assert status["met"] and status["value"].endswith("= 1.20x")
    # the worst round counts for the absolute targets
    assert not checks["ready at N=3: <= 0.25 s"]["met"] and checks["crash_report at N=3: <= 0.25 s"]["met"]
    assert checks["invoke --list cold start <= 0.15 s"]["met"]
    assert not checks["gpudeploy --help cold start <= 0.15 s"]["met"]
    table = fleet.floor_table(summary)
    assert "| redeploy, nothing changed | 3 | 0.70 | 0.50 (floor_ssh) | 1.40x | - |" in table
    assert "| floor: the same over an already-open control master | 3 | | 0.05 | | |" in table
