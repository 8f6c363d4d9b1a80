"""The host probe writes deploy's record of a ready run with the processes it found (issue 26: one
round trip after the gate, not a probe and then a write)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from gpudeploy.facts.remote_probe import write_records


def test_the_record_gets_the_processes_of_the_units_supervisor(tmp_path: Path) -> None:
    units = {"u": {"procs": [{"pid": 7, "start_ticks": 70, "cmd": "python -m sglang"}]}}
    process_units = {"p": {"procs": [{"pid": 8, "start_ticks": 80, "cmd": "server"}]}}
    wanted = [{"unit": "u", "supervisor": "systemd", "path": str(tmp_path / "runs" / "u.json"),
               "record": {"state": "ready", "invocation": "abc"}},
              {"unit": "p", "supervisor": "process", "path": str(tmp_path / "runs" / "p.json"),
               "record": {"state": "ready"}}]
    out = write_records(wanted, units, process_units)
    assert out == {"u": {"pids": [{"pid": 7, "start_ticks": 70}]}, "p": {"pids": [{"pid": 8, "start_ticks": 80}]}}
    assert json.loads((tmp_path / "runs" / "u.json").read_text()) == {
        "state": "ready", "invocation": "abc", "pids": [{"pid": 7, "start_ticks": 70}]}
    assert stat.S_IMODE((tmp_path / "runs" / "u.json").stat().st_mode) == 0o644
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["p.json", "u.json"]  # no temp file left


def test_a_record_that_cannot_be_written_says_why(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    out = write_records([{"unit": "u", "path": str(tmp_path / "file" / "u.json"), "record": {}}], {}, {})
    assert "error" in out["u"] and str(tmp_path / "file") in out["u"]["error"]
