"""`gpudeploy --help` and `invoke --list` start in <= 0.15 s (issue 26): they import invoke and the task
definitions, nothing that a task needs only when it runs. Measured before the lazy imports (bench/fleet.py,
``python -X importtime``): the planner (jinja2, the inventory's yaml, the model), the report and the fan-out
cost ~60-90 ms of a ~0.25 s start on this 2-core machine, the lab's control code ~20 ms of `invoke --list`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# what only a running task needs (not yaml: invoke.vendor.yaml.cyaml imports the real one)
HEAVY = ("jinja2", "fabric", "paramiko", "tenacity", "gpudeploy.plan", "gpudeploy.report",
         "gpudeploy.fanout", "gpudeploy.model", "gpudeploy.inventory", "gpudeploy_lab.control", "gpudeploy_lab.engine")


def loaded_after(code: str) -> list[str]:
    """The HEAVY modules loaded once ``code`` has run (it may exit: invoke's --help does)."""
    probe = ("import atexit, json, sys\n"
             f"atexit.register(lambda: print('LOADED', json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules))))\n"
             + code)
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=REPO,
                         check=False)
    line = next((x for x in res.stdout.splitlines() if x.startswith("LOADED ")), None)
    assert line is not None, res.stdout + res.stderr
    names: list[str] = json.loads(line.removeprefix("LOADED "))
    return names


def test_gpudeploy_help_imports_no_task_code() -> None:
    assert loaded_after("from gpudeploy.cli import program\nprogram().run(['gpudeploy', '--help'])") == []


def test_invoke_list_in_this_repository_imports_no_task_code() -> None:
    code = (f"sys.argv = ['invoke', '--search-root', {str(REPO)!r}, '--list']\n"
            "from invoke.main import program\nprogram.run()")
    assert loaded_after(code) == []
