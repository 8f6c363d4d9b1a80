"""Deploy's probe asks each engine interpreter for its packages' versions (which release's flags to
render): a python started on the host, ~70 ms of a ~140 ms probe there. It is begun before the other
facts are read and collected last (issue 26), and still answers what it answered: each interpreter's
versions, or its error, never the probe's failure."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from gpudeploy.facts import remote_probe


def _started(monkeypatch: pytest.MonkeyPatch, programs: list[str] | None = None) -> list[subprocess.Popen[str]]:
    """The processes the probe starts, as it started them (every subprocess of it goes through Popen);
    ``programs``, if given, gets each one's program as it is started, in order."""
    started: list[subprocess.Popen[str]] = []
    real = subprocess.Popen

    class Keeping(real):  # type: ignore[misc,valid-type]
        def __init__(self, args: Any, *rest: Any, **kw: Any) -> None:
            if programs is not None:
                programs.append(str(args[0]))
            super().__init__(args, *rest, **kw)
            started.append(self)

    monkeypatch.setattr(subprocess, "Popen", Keeping)
    return started


def test_engine_versions_are_asked_before_the_other_facts_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    _started(monkeypatch, events)
    monkeypatch.setattr(remote_probe, "systemctl_show", lambda units: events.append(f"state of {units}") or {})
    facts = remote_probe.main({"units": ["gpudeploy-x.a.service"],
                               "versions": {sys.executable: ["pytest", "no-such-pkg-gd"]}})
    # the interpreter was started before the unit's state was read, and asked once
    assert events == [sys.executable, "state of ['gpudeploy-x.a.service']"]
    assert facts["versions"] == {sys.executable: {"pytest": importlib.metadata.version("pytest"),
                                                  "no-such-pkg-gd": None}}


def test_an_interpreter_that_is_missing_or_fails_is_its_own_error(tmp_path: Path) -> None:
    broken = tmp_path / "python3"
    broken.write_text("#!/bin/sh\necho 'no site-packages here' >&2\nexit 2\n")
    broken.chmod(0o755)
    missing = str(tmp_path / "nope" / "python3")
    facts = remote_probe.main({"units": [], "versions": {missing: ["sglang"], str(broken): ["sglang"],
                                                        sys.executable: ["pytest"]}})
    got = facts["versions"]
    assert "error" in got[missing] and "nope" in got[missing]["error"]
    assert got[str(broken)] == {"error": "no site-packages here"}
    assert got[sys.executable] == {"pytest": importlib.metadata.version("pytest")}


def test_an_interpreter_that_hangs_is_stopped_at_the_deadline(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    hangs = tmp_path / "python3"
    hangs.write_text("#!/bin/sh\nexec sleep 30\n")
    hangs.chmod(0o755)
    started = _started(monkeypatch)
    answers = remote_probe.versions_start({str(hangs): ["sglang"]}, timeout=0.2)()
    assert answers[str(hangs)] == {"error": "no answer within 0.2 s"}
    assert [p.returncode for p in started] == [-signal.SIGKILL]  # stopped and reaped, not left running


def test_an_answer_that_came_in_time_counts_when_it_is_read_late(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe reads every other fact before it collects the versions: that may outlast the
    interpreters' deadline, which an interpreter that answered long before must not fail."""
    started = _started(monkeypatch)
    collect = remote_probe.versions_start({sys.executable: ["pytest"]}, timeout=0.0)
    started[0].wait()  # it has answered; the deadline is long past
    assert collect() == {sys.executable: {"pytest": importlib.metadata.version("pytest")}}


def test_a_wrapper_whose_child_holds_the_pipes_does_not_hold_the_probe(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """An interpreter behind a wrapper script that does not exec: stopping the wrapper leaves its child
    (here a sleep) holding the pipes. The probe answers anyway, as subprocess.run did."""
    pid_file = tmp_path / "child.pid"
    wrapper = tmp_path / "python3"
    wrapper.write_text(f"#!/bin/sh\nsleep 60 &\necho $! > {pid_file}\nwait\n")
    wrapper.chmod(0o755)
    started = _started(monkeypatch)
    collect = remote_probe.versions_start({str(wrapper): ["sglang"]}, timeout=0.0)
    answered: list[dict[str, Any]] = []
    reader = threading.Thread(target=lambda: answered.append(collect()), daemon=True)
    try:
        reader.start()
        reader.join(30)  # it waited for the sleep (60 s) before
        assert answered == [{str(wrapper): {"error": "no answer within 0 s"}}]
    finally:
        started[0].kill()
        started[0].wait()
        if pid_file.exists() and pid_file.read_text().strip():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)  # the sleep this test's wrapper started
