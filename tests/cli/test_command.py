"""The `gpudeploy` command and `invoke` in this repository: one task collection, every task listed
by --help, --list and both docstrings, every task wrapped for errors and Ctrl-C, and the inventory
found by --inventory, $GPUDEPLOY_INVENTORY or ./inventory/hosts.yml."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpudeploy.cli import program
from gpudeploy.cli import tasks as cli_tasks
from gpudeploy.cli.tasks import collection

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TASKS = sorted(collection().task_names)  # e.g. deploy, experiment.run, experiment.show, ...


def test_every_task_is_named_by_help_list_and_both_docstrings(capsys: pytest.CaptureFixture[str]) -> None:
    assert {"init", "roles", "plan", "deploy", "status", "teardown", "logs", "facts", "render",
            "experiment.run", "experiment.show"} <= set(TASKS)
    for argv in (["gpudeploy", "--help"], ["gpudeploy", "--list"]):
        with pytest.raises(SystemExit) as done:
            program().run(argv)
        assert done.value.code in (0, None)
        shown = capsys.readouterr().out
        assert all(f"  {t} " in shown for t in TASKS), (argv, shown)
        assert "lab." not in shown  # the lab is not part of the installed command
    repo_doc = ast.get_docstring(ast.parse((REPO / "tasks.py").read_text())) or ""
    for doc in (repo_doc, cli_tasks.__doc__ or ""):
        listed = {t for t in TASKS if (t.replace(".run", "") if t == "experiment.run" else t) in doc.split()}
        assert listed == set(TASKS), set(TASKS) - listed


def test_every_task_turns_errors_and_ctrl_c_into_an_exit() -> None:
    # user_errors (functools.wraps) installs gpudeploy's Ctrl-C handling and maps its errors to exit 1
    for name in TASKS:
        body = collection()[name].body
        assert getattr(body, "__wrapped__", None) is not None and body.__module__ == "gpudeploy.cli.tasks", name


def run(cwd: Path, *args: str, env: dict[str, str] | None = None,
        binary: str = "gpudeploy") -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k != "GPUDEPLOY_INVENTORY"}
    return subprocess.run([str(BIN / binary), *args], cwd=cwd, capture_output=True, text=True, timeout=60,
                          env={**clean, **(env or {})})


def test_the_command_runs_in_any_folder_without_a_tasks_file(tmp_path: Path) -> None:
    res = run(tmp_path, "--list")
    assert res.returncode == 0, res.stderr
    assert "Can't find any collection" not in res.stderr and "deploy" in res.stdout and "lab.up" not in res.stdout
    inside = run(REPO, "--list", binary="invoke")  # this repository: the same tasks plus the lab's
    assert inside.returncode == 0, inside.stderr
    assert all(f"  {t} " in inside.stdout for t in TASKS) and "lab.up" in inside.stdout


def write_inventory(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({
        "deployment": "d", "defaults": {"gpu_memory_gib": 96, "engine_versions": {"sglang": "0.5.23",
                                                                                "sglang_router": "0.3.2"}},
        "hosts": {"n1": {"address": "192.0.2.1", "numa_nodes": [{"id": 0, "gpus": [0, 1, 2, 3], "cpus": "0-7"},
                                                                {"id": 1, "gpus": [4, 5, 6, 7], "cpus": "8-15"}],
                         "roles": ["prefill", "decode", "router"]}}}))
    return path


def test_the_inventory_is_the_flag_else_the_environment_else_the_folders(tmp_path: Path) -> None:
    missing = run(tmp_path, "plan")
    assert missing.returncode == 1 and "no inventory at inventory/hosts.yml (the default)" in missing.stderr
    assert "gpudeploy init --host ADDRESS" in missing.stderr and "Traceback" not in missing.stderr
    write_inventory(tmp_path / "inventory" / "hosts.yml")
    here = run(tmp_path, "plan")  # ./inventory/hosts.yml, with the packaged roles and templates
    assert here.returncode == 0, here.stderr
    assert "gpudeploy-d.prefill.service" in here.stdout and "gpudeploy-d.router.service" in here.stdout
    other = write_inventory(tmp_path / "elsewhere" / "x.yml")
    other.write_text(other.read_text().replace("deployment: d", "deployment: e"))
    by_env = run(tmp_path, "plan", env={"GPUDEPLOY_INVENTORY": str(other)})
    assert by_env.returncode == 0 and "gpudeploy-e.prefill.service" in by_env.stdout, by_env.stderr
    by_flag = run(tmp_path, "plan", "--inventory", "inventory/hosts.yml", env={"GPUDEPLOY_INVENTORY": str(other)})
    assert by_flag.returncode == 0 and "gpudeploy-d.prefill.service" in by_flag.stdout, by_flag.stderr
    gone = run(tmp_path, "plan", env={"GPUDEPLOY_INVENTORY": str(tmp_path / "nope.yml")})
    assert gone.returncode == 1 and "($GPUDEPLOY_INVENTORY)" in gone.stderr, gone.stderr


def test_roles_lists_the_packaged_library_and_what_an_inventory_overrides(tmp_path: Path) -> None:
    res = run(tmp_path, "roles")
    assert res.returncode == 0, res.stderr
    rows = {line.split()[0]: line for line in res.stdout.splitlines()[1:] if line and not line.startswith("packaged")}
    assert set(rows) == {"prefill", "decode", "router", "vllm", "command"}
    assert all(line.rstrip().endswith("packaged") for line in rows.values())
    inv = write_inventory(tmp_path / "inventory" / "hosts.yml")
    (tmp_path / "roles").mkdir()
    (tmp_path / "roles" / "decode.yml").write_text("engine: sglang\ndescription: my decode\ntp_size: 4\n"
                                                   "model: {path: /models/mine}\n")
    (tmp_path / "roles" / "mine.yml").write_text("engine: command\nargv: [/bin/true]\n")
    res = run(tmp_path, "roles", "--inventory", str(inv))
    assert res.returncode == 0, res.stderr
    rows = {line.split()[0]: line for line in res.stdout.splitlines()[1:] if line and not line.startswith("packaged")}
    assert rows["decode"].rstrip().endswith(f"{tmp_path / 'roles' / 'decode.yml'}  (overrides the packaged one)")
    assert "my decode" in rows["decode"] and rows["mine"].rstrip().endswith(str(tmp_path / "roles" / "mine.yml"))
    assert rows["prefill"].rstrip().endswith("packaged")
