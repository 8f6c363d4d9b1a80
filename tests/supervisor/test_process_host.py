"""The process supervisor's pure parts: env files read back as systemd would, states from facts."""

from __future__ import annotations

import contextlib
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
    # a server that ignored the stop's SIGTERM until its stop timeout ran out: systemd's Result=timeout
    outwaited = unit_state("u", {"spec": spec, "run": RUN, "alive": False,
                                 "exit": {"code": "killed", "status": "KILL", "stopped": True}})
    assert (outwaited.state, outwaited.failed) == ("failed", True)
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


def test_a_log_without_newlines_is_cut_into_bounded_lines(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    # tqdm redraws its bar with \r only: the watch kept the whole "line" in memory until a newline
    # that may never come (journald cuts such a line at LineMax=, 48K).
    import json

    from gpudeploy.supervisor import process_host

    monkeypatch.setattr(process_host, "LOG_DIR", str(tmp_path / "log"))
    monkeypatch.setattr(process_host, "RUNS_DIR", str(tmp_path / "run"))
    (tmp_path / "log" / "u").mkdir(parents=True)
    bar = "".join(f"\rCapturing batches (bs={i}): {i}%|" + "#" * 40 for i in range(4000)).encode()
    (tmp_path / "log" / "u" / "r1.log").write_bytes(bar + b"\nready\n")
    process_host.watch([{"unit": "u", "run_id": "r1"}])  # no run file: the run is over, its log is read
    events = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    lines = [e["line"] for e in events if "line" in e]
    assert max(len(x) for x in lines) <= process_host.MAX_LINE
    assert "".join(lines[:-1]).encode() == bar and lines[-1] == "ready"
    assert "exit" in events[-1]


def test_the_process_supervisor_binds_memory_to_the_gpus_numa_node_like_systemd() -> None:
    # systemd units got NUMAPolicy=bind/NUMAMask=, the process spec only the CPU affinity: a decode
    # server's memory could land on the other socket.
    import json
    import subprocess
    import sys
    from pathlib import Path

    from gpudeploy.plan import load_plan
    from gpudeploy.plan.process_spec import spec_text

    repo = Path(__file__).resolve().parents[2]
    plan = load_plan(str(repo / "lab" / "inventory" / "hosts.yml"), memory=False)
    decode = next(u for u in plan.units if u.gpus and u.host.numa_of(u.gpus[0]) == 1)
    assert json.loads(spec_text(decode, "decode"))["numa"] == {"policy": "bind", "nodes": [1]}
    # On the host: the policy set before exec is the server's (numa_maps shows it per mapping).
    child = ("import sys; from gpudeploy.supervisor.process_host import bind_memory; "
             "why = bind_memory({'policy': 'bind', 'nodes': [int(sys.argv[1])]}); "
             "print(why or open('/proc/self/numa_maps').read())")
    bound = subprocess.run([sys.executable, "-c", child, "0"], capture_output=True, text=True, check=True).stdout
    assert "bind:0" in bound, bound[:500]
    # A node the machine does not have: not applied, and the reason is given (deploy says it).
    missing = subprocess.run([sys.executable, "-c", child, "63"], capture_output=True, text=True, check=True).stdout
    assert missing.startswith("set_mempolicy(bind, nodes [63]) failed: Invalid argument"), missing


SURVIVOR = """
import os, signal, subprocess, sys, time
# The "server": leader of its own session; its worker stays in the session, traps SIGTERM, and
# outlives the server, which then dies (as a crashed SGLang main process leaves its TP workers).
worker = subprocess.Popen([sys.executable, "-c", '''
import signal, sys, time
def term(*_):
    open(sys.argv[1], "w").write("TERM")
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
print("up", flush=True)
time.sleep(60)
''', sys.argv[1]], stdout=subprocess.PIPE)
worker.stdout.readline()
print(worker.pid, flush=True)
os._exit(1)
"""


def _sandbox(tmp_path, unit: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    dirs = {name: str(tmp_path / name) for name in ("units", "runs", "logs", "records", "work")}
    for d in dirs.values():
        os.makedirs(d, exist_ok=True)
    return dirs


def _host(dirs: dict[str, str], call: str) -> str:
    """Run process_host with its folders moved into the sandbox, as `python3 -c SOURCE` runs it."""
    import subprocess
    import sys

    code = ("import json, sys; import gpudeploy.supervisor.process_host as ph; "
            f"ph.UNITS_DIR, ph.RUNS_DIR, ph.LOG_DIR, ph.RECORDS_DIR = {dirs['units']!r}, {dirs['runs']!r}, "
            f"{dirs['logs']!r}, {dirs['records']!r}; print(json.dumps({call}))")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          timeout=60).stdout


def _crashed_run_with_a_survivor(tmp_path, dirs: dict[str, str], unit: str) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    import json
    import subprocess
    import sys

    server = subprocess.Popen([sys.executable, "-c", SURVIVOR, str(tmp_path / "got-term")],
                              start_new_session=True, stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    worker = int(server.stdout.readline())
    server_ticks = _ticks(server.pid)
    server.wait(timeout=10)  # the main process is dead; its worker lives on in its session
    with open(f"{dirs['runs']}/{unit}.json", "w") as f:
        json.dump({"unit": unit, "run_id": "old", "pid": server.pid, "start_ticks": server_ticks,
                   "log": f"{dirs['logs']}/old.log", "start_us": 0, "monitor": 0, "monitor_ticks": 0}, f)
    with open(f"{dirs['units']}/{unit}.json", "w") as f:
        json.dump({"unit": unit, "argv": ["sleep", "30"], "env_file": "/nonexistent", "stop_timeout_s": 2,
                   "working_directory": dirs["work"], "cpus": None, "limits": {}}, f)
    return worker, _ticks(worker)


def test_a_crashed_runs_surviving_workers_get_sigterm_before_sigkill(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # stop() signalled only a live main process's group: survivors of a dead main process waited
    # out the stop timeout and were SIGKILLed, never asked to let go of their GPU memory first.
    dirs = _sandbox(tmp_path, "u")
    worker, _ = _crashed_run_with_a_survivor(tmp_path, dirs, "u")
    try:
        _host(dirs, "ph.stop(['u'])")
        assert not os.path.exists(f"/proc/{worker}") or _zombie(worker)
        assert (tmp_path / "got-term").read_text() == "TERM"
    finally:
        _kill(worker)


def test_a_start_ends_what_a_crashed_run_left_behind_first(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # A start after the main process died left its workers alive (holding the port and GPU memory),
    # and the new run file forgot them: the next stop said nothing was left.
    import json

    dirs = _sandbox(tmp_path, "u")
    worker, ticks = _crashed_run_with_a_survivor(tmp_path, dirs, "u")
    new = None
    try:
        new = json.loads(_host(dirs, "ph.start('u')"))
        assert not os.path.exists(f"/proc/{worker}") or _ticks(worker) != ticks or _zombie(worker)
        assert any(f"pids {worker}" in n for n in new["notes"]), new
        assert new["run_id"] != "old" and not new["restarted"]
    finally:
        _kill(worker)
        if new is not None:
            _host(dirs, "ph.stop(['u'])")


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def test_a_watch_with_a_tail_starts_at_the_runs_last_lines(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    # status --watch follows servers that may have logged for days: it reads their last lines, not all
    import json

    from gpudeploy.supervisor import process_host

    monkeypatch.setattr(process_host, "LOG_DIR", str(tmp_path / "log"))
    monkeypatch.setattr(process_host, "RUNS_DIR", str(tmp_path / "run"))
    (tmp_path / "log" / "u").mkdir(parents=True)
    (tmp_path / "log" / "u" / "r1.log").write_text("".join(f"line {i}\n" for i in range(100_000)))
    process_host.watch([{"unit": "u", "run_id": "r1"}], tail=60)
    events = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [e["line"] for e in events if "line" in e] == [f"line {i}" for i in range(100_000 - 60, 100_000)]
    assert "exit" in events[-1]


def test_a_watch_of_a_quiet_server_ends_soon_after_its_reader_went_away(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # It wrote only when its server logged: beside an idle server it outlived every gate and watch
    # that had started it, for as long as the server ran. Its keepalive now meets the broken pipe.
    import sys
    import threading

    from gpudeploy.supervisor import process_host

    monkeypatch.setattr(process_host, "LOG_DIR", str(tmp_path / "log"))
    monkeypatch.setattr(process_host, "RUNS_DIR", str(tmp_path / "run"))
    monkeypatch.setattr(process_host, "KEEPALIVE_S", 0.2)
    monkeypatch.setattr(process_host, "alive", lambda pid, ticks: True)  # the server runs on, silent
    (tmp_path / "run").mkdir()
    (tmp_path / "log" / "u").mkdir(parents=True)
    (tmp_path / "log" / "u" / "r1.log").write_text("")  # nothing to say: only the keepalive writes
    (tmp_path / "run" / "u.json").write_text('{"run_id": "r1", "pid": 1, "start_ticks": 1, "log": "%s"}'
                                             % (tmp_path / "log" / "u" / "r1.log"))

    class Gone:
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self) -> None:
            return None

    ended: list[BaseException] = []

    def run() -> None:
        try:
            process_host.watch([{"unit": "u", "run_id": "r1"}], tail=10)
        except BaseException as exc:  # the test reads what ended it
            ended.append(exc)

    monkeypatch.setattr(sys, "stdout", Gone())
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive() and isinstance(ended[0], BrokenPipeError)


def test_a_run_ended_by_a_stop_says_so_in_its_exit(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    # status --watch must not report a deploy's restart or a teardown as a crash
    import json

    from gpudeploy.supervisor import process_host

    monkeypatch.setattr(process_host, "LOG_DIR", str(tmp_path / "log"))
    monkeypatch.setattr(process_host, "RUNS_DIR", str(tmp_path / "run"))
    (tmp_path / "log" / "u").mkdir(parents=True)
    (tmp_path / "run").mkdir()
    (tmp_path / "log" / "u" / "r1.log").write_text("ready\n")
    (tmp_path / "run" / "u.exit-r1.json").write_text('{"code": "killed", "status": "TERM", "stopped": true}')
    process_host.watch([{"unit": "u", "run_id": "r1"}])
    events = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert events[-1] == {"unit": "u", "exit": "Main process exited, code=killed, status=TERM, stopped"}
