"""A Slurm inventory's mistakes as data (like tests/plan/mistakes): each folder under mistakes/ holds
``hosts.yml`` and ``expected.txt`` (blocks of output lines, ``#`` comments); ``gpudeploy plan``
must refuse it, every problem at once with file and line, and nothing is submitted."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpudeploy.cli import main

MISTAKES = Path(__file__).parent / "mistakes"
CASES = sorted(p for p in MISTAKES.iterdir() if (p / "expected.txt").is_file())


def blocks(expected: str) -> list[str]:
    lines = [line for line in expected.splitlines() if not line.startswith("#")]
    return [b.strip("\n") for b in "\n".join(lines).split("\n\n") if b.strip()]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_mistake(case: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                 capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copytree(case, tmp_path / "project")
    monkeypatch.chdir(tmp_path / "project")
    with pytest.raises(SystemExit) as exit_:
        main(["gpudeploy", "plan", "-i", "hosts.yml"])
    out = capsys.readouterr()
    output = out.out + out.err
    assert exit_.value.code == 1, output
    assert "Traceback" not in output
    for block in blocks((case / "expected.txt").read_text()):
        assert block in output, f"{block!r} not in:\n{output}"
