"""A deploy keeps every engine's measured figures in one read and one write of the store (one put
per unit read and rewrote the whole file per unit: 0.3 s after the last of 64 servers was ready)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpudeploy.apply import deploy as d
from gpudeploy.plan.calibrate import CalibrationStore, Measured


def runs(n: int) -> list[tuple[str, str, dict[str, Any], Measured]]:
    return [(f"lab{i}", "/models/tiny", {"tp_size": 1, "mem_fraction_static": 0.8}, Measured(weights_gib=16.0 + i,
             phase_reached="ready")) for i in range(1, n + 1)]


def test_put_many_keeps_what_puts_one_by_one_keep(tmp_path: Path) -> None:
    one, many = CalibrationStore(tmp_path / "one.json"), CalibrationStore(tmp_path / "many.json")
    one.put("lab9", "/models/tiny", {"tp_size": 1}, Measured(weights_gib=1.0))
    many.put("lab9", "/models/tiny", {"tp_size": 1}, Measured(weights_gib=1.0))
    for run in runs(5):
        one.put(*run)
    many.put_many(runs(5))
    assert json.loads(one.path.read_text()) == json.loads(many.path.read_text())
    latest = many.latest("lab5", "/models/tiny")
    assert latest is not None and latest[1].weights_gib == 21.0
    assert many.get("lab3", "/models/tiny", {"mem_fraction_static": 0.8, "tp_size": 1}) == runs(3)[-1][3]


def test_a_fleet_of_measured_runs_is_one_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = CalibrationStore(tmp_path / "cal.json")
    writes: list[Path] = []
    replace = Path.replace
    monkeypatch.setattr(Path, "replace", lambda self, target: (writes.append(Path(target)), replace(self, target))[1])
    store.put_many(runs(64))
    store.put_many([])
    assert writes == [store.path] and len(json.loads(store.path.read_text())) == 64


def test_deploy_calibrates_all_outcomes_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[Any]] = []

    class Store:
        def put_many(self, batch: Any) -> None:
            seen.append(list(batch))

    unit = type("U", (), {"host": type("H", (), {"name": "lab1"})(),
                          "role": type("R", (), {"engine": "sglang", "model": {"path": "/m"}, "settings": {},
                                                 "name": "srv"})()})()
    gate = type("G", (), {"lines": ["[2026-12-01 10:00:00 TP0] Load weight end. type=LlamaForCausalLM, "
                                    "dtype=torch.bfloat16, avail mem=78.9 GB, mem usage=16.00 GB."]})()
    outcomes = [d.UnitOutcome(unit, "started", True, gate=gate) for _ in range(3)]  # type: ignore[arg-type]
    d.calibrate(Store(), outcomes)  # type: ignore[arg-type]
    assert len(seen) == 1 and len(seen[0]) == 3 and seen[0][0][3].weights_gib == 16.0
