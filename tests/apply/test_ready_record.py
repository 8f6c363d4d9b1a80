"""A ready run's record on a systemd host is written by a shell (apply/ready_record.py), not the probe's
Python (issue 26: ~50 ms of every host's CPU right after a fleet's gates). It must find what the
probe finds, exactly: the unit's cgroup's processes with their start times."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpudeploy.apply.ready_record import write_ready
from gpudeploy.errors import RemoteError
from gpudeploy.facts.remote_probe import cgroup_procs
from gpudeploy.remote.base import Result
from gpudeploy.supervisor.systemd import SYSTEMD


def my_control_group() -> str:
    """A control group this process is in, as systemctl's ControlGroup names it (v2 or v1's)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        path = line.split(":", 2)[2]
        if any(p["pid"] == os.getpid() for p in cgroup_procs(path)):
            return path
    pytest.skip("no cgroup hierarchy lists this process here")


class _Local:
    """The script run here, with a systemctl that answers the unit's ControlGroup."""

    def __init__(self, tmp: Path, group: str) -> None:
        self.host = type("H", (), {"name": "here"})()
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        fake = bin_dir / "systemctl"
        fake.write_text(f"#!/bin/sh\n[ \"$*\" = 'show -P ControlGroup -- u.service' ] && echo '{group}'\n")
        fake.chmod(0o755)
        self.path = f"{bin_dir}:/usr/bin:/bin"

    def run(self, argv: list[str], stdin: bytes | None = None, check: bool = True, **kw: Any) -> Result:
        res = subprocess.run(argv, input=stdin, capture_output=True, env={"PATH": self.path}, timeout=30)
        return Result(res.returncode, res.stdout.decode(), res.stderr.decode())


def test_the_shell_finds_the_probes_processes_and_writes_the_record(tmp_path: Path) -> None:
    group = my_control_group()
    path = tmp_path / "runs" / "u.service.json"
    record = {"unit": "u.service", "deployment": "d", "state": "ready", "note": '"@PIDS@" stays as it is',
              "files": {"/etc/x": "ab"}}
    unit = type("U", (), {"name": "u.service"})()
    pids = write_ready(_Local(tmp_path, group), SYSTEMD, unit, str(path), record)  # type: ignore[arg-type]
    probe = {p["pid"]: p["start_ticks"] for p in cgroup_procs(group)}
    shell = {p["pid"]: p["start_ticks"] for p in pids}
    assert shell[os.getpid()] == probe[os.getpid()]
    both = set(shell) & set(probe)  # the scripts' own short-lived processes are in one list only
    assert len(both) >= 1 and all(shell[p] == probe[p] for p in both)
    written = json.loads(path.read_text())
    assert written == {**record, "pids": pids}
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert not list(path.parent.glob(".*"))  # no temporary file left


def test_a_unit_without_a_cgroup_is_recorded_without_processes(tmp_path: Path) -> None:
    path = tmp_path / "u.service.json"
    unit = type("U", (), {"name": "u.service"})()
    assert write_ready(_Local(tmp_path, ""), SYSTEMD, unit, str(path), {"unit": "u.service"}) == []  # type: ignore[arg-type]
    assert json.loads(path.read_text()) == {"unit": "u.service", "pids": []}


def test_a_record_that_cannot_be_written_is_an_error_that_says_why(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    unit = type("U", (), {"name": "u.service"})()
    with pytest.raises(RemoteError, match=r"the run record of u\.service could not be written: .*file"):
        write_ready(_Local(tmp_path, "/"), SYSTEMD, unit, str(tmp_path / "file" / "u.json"), {})  # type: ignore[arg-type]

