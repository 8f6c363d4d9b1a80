"""A command's objects are frozen out of the interpreter's last collection (issue 26): without it,
finalization walked everything the imports made, 35-50 ms after the report of every command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_task_freezes_its_objects_before_the_interpreter_ends() -> None:
    # registered first, this handler runs last of all: after every handler the command registered
    probe = ("import atexit, gc\n"
             "atexit.register(lambda: print('FROZEN', gc.get_freeze_count()))\n"
             "from gpudeploy.cli import program\n"
             "program().run(['gpudeploy', 'roles'])\n")
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=REPO,
                         check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    frozen = int(next(x for x in res.stdout.splitlines() if x.startswith("FROZEN ")).split()[1])
    assert frozen > 10_000, res.stdout  # the imports' objects: invoke, the task modules, yaml

