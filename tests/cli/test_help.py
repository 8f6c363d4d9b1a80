"""Issue 45, items 5 and 6: `gpudeploy TASK --help` (and -h) works on every task; a short flag means
one long option on every task, none skips a safety check, none takes the program's own letters;
numbers are INT in --help and a bad one is a message; invoke's --dry, which ran the task for real,
is no option of `gpudeploy` and is refused by the tasks under `invoke`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import gpudeploy
from gpudeploy.cli import program
from gpudeploy.cli.tasks import collection

REPO = Path(__file__).resolve().parents[2]
SRC = Path(gpudeploy.__file__).resolve().parents[1]  # this checkout's, also in the subprocesses
TASKS = sorted(collection().task_names)
CONTEXTS = {ctx.name: ctx for ctx in collection().to_contexts()}
# what a slip of one letter must never turn on: skipping the memory refusal and the busy-GPU check,
# removing files and state, restarting without a rolling update
DANGEROUS = {"force", "purge", "allow_downtime", "no_rolling"}
RESERVED = {"h", "V", "l"}  # the program's own: --help, --version, --list


def gd(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The gpudeploy command as a user runs it (the console script is `gpudeploy.cli:main`)."""
    env = {k: v for k, v in os.environ.items() if k != "GPUDEPLOY_INVENTORY"}
    return subprocess.run([sys.executable, "-m", "gpudeploy.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60, env={**env, "PYTHONPATH": str(SRC)})


def long_options(task: str) -> set[str]:
    return {f"--{arg.names[0]}" for arg in CONTEXTS[task].args.values()}


@pytest.mark.parametrize("task", TASKS)
def test_every_task_has_help_with_its_options(task: str, tmp_path: Path) -> None:
    # in an empty folder: `render --help` said "no inventory at inventory/hosts.yml", `logs --help`
    # "'logs' did not receive required positional arguments", `experiment --help` "--help: cannot read"
    for flag in ("--help", "-h"):  # -h was --host on every task
        res = gd(task, flag, cwd=tmp_path)
        assert res.returncode == 0, (task, flag, res.stdout + res.stderr)
        assert res.stdout.startswith(f"Usage: gpudeploy [--core-opts] {task} "), res.stdout
        missing = {o for o in long_options(task) if o not in res.stdout}
        assert not missing, (task, flag, missing, res.stdout)
        assert not list(tmp_path.iterdir())  # help runs nothing


def test_the_default_task_of_experiment_has_help_too(tmp_path: Path) -> None:
    res = gd("experiment", "--help", cwd=tmp_path)
    assert res.returncode == 0 and "--dry-run" in res.stdout and "--file" in res.stdout, res.stdout + res.stderr


def test_a_short_flag_means_one_long_option_on_every_task() -> None:
    meaning: dict[str, tuple[str, str]] = {}  # -x -> (--long, the task it was first seen on)
    for task, ctx in CONTEXTS.items():
        for arg in ctx.args.values():
            for short in (n for n in arg.nicknames if len(n) == 1):
                assert short not in RESERVED, f"{task}: -{short} is the program's own (--help, --version, --list)"
                first = meaning.setdefault(short, (arg.name, task))
                assert first[0] == arg.name, f"-{short} is --{arg.name} on {task} but --{first[0]} on {first[1]}"
    assert meaning["f"][0] == "forks" and meaning["H"][0] == "host" and meaning["r"][0] == "role"
    # every short flag of the table is given where its option exists (--json's parameter is json_)
    assert meaning["j"][0] == "json_", meaning  # (invoke names the option after the parameter)


def test_no_option_that_skips_a_check_or_removes_something_has_a_short_flag() -> None:
    seen = set()
    for task, ctx in CONTEXTS.items():
        for arg in ctx.args.values():
            if (arg.attr_name or arg.name) in DANGEROUS:
                seen.add(arg.attr_name or arg.name)
                assert [n for n in arg.nicknames if len(n) == 1] == [], f"{task} --{arg.name}"
    assert seen == DANGEROUS


def test_the_program_lists_only_options_that_mean_something_here(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        program().run(["gpudeploy", "--help"])
    shown = capsys.readouterr().out
    for invokes_own in ("--dry", "--echo", "--pty", "--warn-only", "--hide", "--command-timeout", "--config",
                        "--prompt-for-sudo-password"):
        assert invokes_own not in shown
    assert "-h [STRING], --help" in shown and "-V, --version" in shown


def test_gpudeploy_dry_deploy_is_refused_before_anything_runs(tmp_path: Path) -> None:
    # `gpudeploy --dry deploy` deployed for real: invoke's --dry echoes its run()'s shell commands only
    res = gd("--dry", "deploy", "--inventory", str(tmp_path / "none.yml"), cwd=tmp_path)
    assert res.returncode == 1 and "--dry" in res.stderr and "no inventory" not in res.stderr, res.stderr


def test_invoke_dry_in_this_repository_is_refused_by_every_task() -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    res = subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), "--dry", "deploy", "--inventory",
                          "/nonexistent/hosts.yml"], capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "invoke's --dry" in res.stderr and "nothing was done" in res.stderr and "no inventory" not in res.stderr


def test_numbers_show_as_int_with_an_example_and_a_bad_one_is_a_message(tmp_path: Path) -> None:
    shown = gd("deploy", "--help").stdout
    for option in ("-f INT, --forks=INT", "-t INT, --timeout=INT", "--max-fail-percent=INT"):
        assert option in shown, shown
    assert "e.g. -f 10" in shown and "e.g. -t 900" in shown
    assert "-p INT, --port=INT" in gd("init", "--help").stdout
    for args, message in ((["deploy", "--forks", "x"], "--forks takes a whole number of 1 or more, not 'x'"),
                          (["status", "-f", "0"], "--forks takes a whole number of 1 or more, not '0'"),
                          (["init", "--host", "a", "--port", "70000"], "--port takes a port number (1-65535)"),
                          (["deploy", "--max-fail-percent", "150"], "--max-fail-percent takes a percentage")):
        res = gd(*args, cwd=tmp_path)
        assert res.returncode == 1 and message in res.stderr and "Traceback" not in res.stderr, (args, res.stderr)


def test_a_required_option_left_out_says_which(tmp_path: Path) -> None:
    for args, message in ((["logs"], "logs needs --host HOST and --role ROLE"),
                          (["render"], "render needs --target k8s"),
                          (["experiment"], "experiment needs --file F"),
                          (["tune"], "tune needs --file F")):
        res = gd(*args, cwd=tmp_path)
        assert res.returncode == 1 and message in res.stderr and "Traceback" not in res.stderr, (args, res.stderr)
