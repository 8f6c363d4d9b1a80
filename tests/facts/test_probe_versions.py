"""Deploy's probe asks each engine interpreter for its packages' versions (which release's flags to
render): a python started on the host, ~70 ms of a ~140 ms probe there. It is begun before the other
facts are read and collected last (issue 26), and still answers what it answered: each interpreter's
versions, or its error, never the probe's failure."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpudeploy.facts import remote_probe


def _spawned(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The programs the probe starts, in order (every subprocess of it goes through Popen)."""
    seen: list[str] = []
    real = subprocess.Popen

    class Recording(real):  # type: ignore[misc,valid-type]
        def __init__(self, args: Any, *rest: Any, **kw: Any) -> None:
            seen.append(str(args[0]))
            super().__init__(args, *rest, **kw)

    monkeypatch.setattr(subprocess, "Popen", Recording)
    return seen


def test_engine_versions_are_asked_before_the_other_facts_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    events = _spawned(monkeypatch)
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


def test_an_interpreter_that_hangs_is_stopped_at_the_deadline(tmp_path: Path) -> None:
    hangs = tmp_path / "python3"
    hangs.write_text("#!/bin/sh\nexec sleep 30\n")
    hangs.chmod(0o755)
    answers = remote_probe.versions_start({str(hangs): ["sglang"]}, timeout=0.2)()
    assert "timed out" in answers[str(hangs)]["error"]
