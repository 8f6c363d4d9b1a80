"""The look's one remote command (slurm/look.py), run by a real bash against stand-in squeue and
sacct: it answers the job, its steps, sacct's rows and each output file's new bytes in one go,
and a server's output (frames of its own, bytes that are not UTF-8, a line still being written)
is read exactly, never taken for a frame."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from gpudeploy.slurm.look import Reader, look_argv, parse_look

SQUEUE = """#!/bin/sh
case "$*" in
  *-s*) printf '7.0|gpudeploy-t1.b|slurmn1\\n7.batch|batch|slurmn1\\n' ;;
  *) printf 'RUNNING|None|2026-12-07T19:00:00|slurmn1\\n' ;;
esac
"""
SACCT = """#!/bin/sh
printf '7|gpudeploy-t1|RUNNING|0:0|slurmn1\\n7.1|gpudeploy-t1.a|CANCELLED|0:9|slurmn1\\n'
"""


def run(argv: list[str], bin_dir: Path) -> str:
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return subprocess.run(argv, capture_output=True, text=True, env=env, check=True, timeout=30).stdout


def test_one_command_answers_states_and_each_outputs_new_bytes(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("squeue", SQUEUE), ("sacct", SACCT)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    a, b = tmp_path / "7.t1.a.out", tmp_path / "7.t1.b.out"
    a.write_bytes(b"starting\n@job\n@out 0 99\n\xff not utf-8\nhalf a li")
    b.write_bytes(b"one\ntwo\n")
    missing = tmp_path / "7.t1.c.out"
    outputs = [(str(a), 0), (str(b), 4), (str(missing), 0)]
    seen = parse_look(run(look_argv("7", outputs), bin_dir), len(outputs))
    assert seen.job is not None and (seen.job.state, seen.job.nodelist) == ("RUNNING", "slurmn1")
    assert seen.running["gpudeploy-t1.b"].id == "7.0"
    assert seen.ended()["gpudeploy-t1.a"].state == "CANCELLED"
    assert seen.ended()["gpudeploy-t1.a"].exit_code == "0:9"
    assert seen.new == [a.read_bytes(), b"two\n", None]
    reader = Reader(str(a))
    assert reader.take(seen.new[0]) == ["starting", "@job", "@out 0 99", "\ufffd not utf-8"]
    # the line being written is read whole at the next look, from where this one stopped
    with a.open("ab") as f:
        f.write(b"ne\n")
    again = parse_look(run(look_argv("7", [(str(a), reader.offset)]), bin_dir), 1)
    assert reader.take(again.new[0]) == ["half a line"]


def test_a_path_is_an_argument_never_code(tmp_path: Path) -> None:
    hostile = tmp_path / "x'; touch pwned; '.out"
    hostile.write_text("ok\n")
    argv = look_argv("7", [(str(hostile), 0)])
    subprocess.run(argv, capture_output=True, text=True, check=False, cwd=tmp_path, timeout=30)
    assert not (tmp_path / "pwned").exists()
    assert str(hostile) in argv and str(hostile) not in argv[2]
