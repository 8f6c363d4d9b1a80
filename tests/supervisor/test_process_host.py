"""The process supervisor's pure parts: env files read back as systemd would, states from facts."""

from __future__ import annotations

import os
import signal

from gpudeploy.plan.render import env_value
from gpudeploy.supervisor.process import unit_state
from gpudeploy.supervisor.process_host import parse_env


def test_env_files_read_back_exactly_what_was_rendered() -> None:
    values = {"A": "plain", "B": 'say "hi" for $5 or `date`', "C": "back\\slash", "D": "multi\nline secret",
              "E": "tab\there", "F": "", "G": "ünï", "TQDM_BAR_FORMAT": "{l_bar}{bar}{r_bar}\n"}
    text = "# Environment of a unit\n" + "".join(f"{k}={env_value(v)}\n" for k, v in values.items())
    assert parse_env(text) == values
    assert parse_env("X='single $quoted'\nY=unquoted tail  \n; comment\n") == {"X": "single $quoted",
                                                                               "Y": "unquoted tail"}


RUN = {"run_id": "r1", "pid": 41, "start_ticks": 900, "log": "/var/log/gpudeploy/u/r1.log"}


def test_states_use_the_words_systemd_would() -> None:
    spec = {"unit": "u", "deployment": "d"}
    running = unit_state("u", {"spec": spec, "run": RUN, "alive": True, "procs": [{"pid": 41}]})
    assert (running.state, running.main_pid, running.run_id, running.active) == ("active", 41, "r1", True)
    stopped = unit_state("u", {"spec": spec, "run": RUN, "alive": False,
                               "exit": {"code": "killed", "status": "TERM", "stopped": True}})
    assert (stopped.state, stopped.failed) == ("inactive", False)
    crashed = unit_state("u", {"spec": spec, "run": RUN, "alive": False, "exit": {"code": "exited", "status": "1"}})
    assert (crashed.state, crashed.failed, crashed.exit_words) == ("failed", True, "code=exited, status=1")
    # The monitor itself was killed (or the host rebooted): no exit was written, the server is gone.
    gone = unit_state("u", {"spec": spec, "run": RUN, "alive": False})
    assert (gone.state, gone.failed, gone.main_pid) == ("failed", True, 0)
    never = unit_state("u", {"spec": None})
    assert (never.installed, never.state) == (False, "inactive")


def _ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    return int(stat[stat.rindex(")") + 2:].split()[19])


def test_processes_of_a_run_are_found_by_session_and_ancestry_never_by_a_reused_pid() -> None:
    import subprocess
    import sys

    from gpudeploy.supervisor.process_host import run_processes

    # A "server": the leader of its own session, with a worker below it.
    server = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); "
                               "print('up', flush=True); time.sleep(30)"],
                              start_new_session=True, stdout=subprocess.PIPE, text=True)
    bystander = subprocess.Popen(["sleep", "30"], start_new_session=True)
    mine: set[int] = set()
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "up"
        run = {"pid": server.pid, "start_ticks": _ticks(server.pid), "recorded": []}
        mine = {p["pid"] for p in run_processes(run)}
        assert server.pid in mine and len(mine) == 2 and bystander.pid not in mine
        # The bystander's PID named with another start time (a PID reused since): nothing of it is ours.
        reused = {"pid": bystander.pid, "start_ticks": 1, "recorded": [{"pid": bystander.pid, "start_ticks": 1}]}
        assert run_processes(reused) == []
    finally:
        for pid in mine - {server.pid}:  # the worker we started through the server, by its PID
            os.kill(pid, signal.SIGKILL)
        for p in (server, bystander):
            p.kill()
            p.wait()
