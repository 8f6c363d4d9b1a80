"""The scripts gpudeploy runs on hosts, run here on real processes (no root, no lab)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpudeploy.apply.hostscripts import kill_exact_argv
from gpudeploy.apply.lock import HOLDER
from gpudeploy.model import Host


def _start_ticks(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[19])


def _gone(proc: subprocess.Popen[bytes], within: float = 5.0) -> bool:
    try:
        proc.wait(timeout=within)
        return True
    except subprocess.TimeoutExpired:
        return False


def _run_kill(targets: list[tuple[int, int | None]]) -> list[str]:
    argv = kill_exact_argv(sys.executable, targets)
    res = subprocess.run(argv, capture_output=True, text=True, check=True)
    return res.stdout.splitlines()


def test_exact_kill_needs_the_recorded_start_time() -> None:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        ticks = _start_ticks(proc.pid)
        # No start time: refused (a recorded PID may have been reused by now).
        assert _run_kill([(proc.pid, None)]) == [f"refused {proc.pid} (no start time)"]
        # Another start time: the PID belongs to another process now; spared.
        assert _run_kill([(proc.pid, ticks + 1)])[0].startswith(f"spared {proc.pid}")
        assert proc.poll() is None
        assert _run_kill([(proc.pid, ticks)]) == [f"killed {proc.pid}"]
        assert _gone(proc)
    finally:
        proc.kill()
        proc.wait()


def _holder(path: Path, wait_s: float, beat_s: float) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", HOLDER, str(path), '{"by": "test"}', str(wait_s), str(beat_s)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _first_line(proc: subprocess.Popen[str], within: float = 30.0) -> str:
    """The next line the process writes; a holder that says nothing fails the test, never hangs it."""
    assert proc.stdout is not None
    stdout, got = proc.stdout, []
    reader = threading.Thread(target=lambda: got.append(stdout.readline().strip()), daemon=True)
    reader.start()
    reader.join(within)
    assert got, f"no line within {within:g} s"
    return got[0]


def test_a_waiter_that_gives_up_never_takes_the_lock_later(tmp_path: Path) -> None:
    lock = tmp_path / "host.lock"
    first = _holder(lock, 5, 30)
    try:
        assert _first_line(first) == "locked"
        waiter = _holder(lock, 0.5, 30)
        assert _first_line(waiter).startswith("busy")
        assert _first_line(waiter) == "timeout"
        assert waiter.wait(timeout=5) == 3
        # The first holder lets go; a new holder gets the lock at once: nobody else took it.
        assert first.stdin is not None
        first.stdin.close()
        assert first.wait(timeout=5) == 0
        third = _holder(lock, 0.5, 30)
        assert _first_line(third) == "locked"
        assert third.stdin is not None
        third.stdin.close()
        third.wait(timeout=5)
    finally:
        for p in (first,):
            p.kill()
            p.wait()


def test_a_holder_without_heartbeat_lets_go(tmp_path: Path) -> None:
    # The client vanished without closing the channel (sshd has not noticed): no heartbeat for
    # beat_s seconds frees the lock, instead of holding it until sshd's TCP keepalive (hours).
    lock = tmp_path / "host.lock"
    silent = _holder(lock, 5, 0.5)
    try:
        assert _first_line(silent) == "locked"
        waiter = _holder(lock, 10, 30)
        lines = [_first_line(waiter), _first_line(waiter)]
        assert lines[0].startswith("busy") and lines[1] == "locked", lines
        assert silent.wait(timeout=5) == 0
        assert waiter.stdin is not None
        waiter.stdin.close()
        waiter.wait(timeout=5)
    finally:
        silent.kill()
        silent.wait()


def test_a_heartbeat_keeps_the_lock(tmp_path: Path) -> None:
    lock = tmp_path / "host.lock"
    holder = _holder(lock, 5, 0.5)
    assert holder.stdin is not None
    stdin = holder.stdin
    done = threading.Event()

    def beat() -> None:  # a beat every 0.1 s until the waiter has answered (its start may be slow)
        while not done.wait(0.1):
            stdin.write(".")
            stdin.flush()

    beats = threading.Thread(target=beat, daemon=True)
    try:
        assert _first_line(holder) == "locked"
        beats.start()
        done.wait(1.5)  # three heartbeat timeouts of beats (the poll's pause; nothing is awaited)
        assert holder.poll() is None
        waiter = _holder(lock, 0.3, 30)
        assert _first_line(waiter).startswith("busy") and _first_line(waiter) == "timeout"
        waiter.wait(timeout=5)
    finally:
        done.set()
        if beats.is_alive():
            beats.join(5)
        holder.kill()
        holder.wait()
    assert os.path.exists(lock)


def test_host_scripts_run_the_hosts_own_python(tmp_path: Path) -> None:
    # A host whose python3 on PATH is another one (or none): the inventory's `python` runs the
    # lock holder and the exact kill, as it runs the probe and the process supervisor.
    from dataclasses import replace

    from gpudeploy.apply.lock import HostLock
    from gpudeploy.inventory import load_inventory

    inv = load_inventory(str(Path(__file__).resolve().parents[2] / "lab" / "inventory" / "lab.yml"))
    host = replace(next(iter(inv.hosts.values())), python="/opt/venvs/py311/bin/python3")
    seen: list[list[str]] = []

    class Refusing:
        def __init__(self) -> None:
            self.host = host

        def stream(self, argv: list[str]) -> object:
            seen.append(argv)
            raise OSError("no host here")

    with contextlib.suppress(OSError):
        HostLock(Refusing(), wait_s=0).__enter__()  # type: ignore[arg-type]
    assert seen and seen[0][0] == "/opt/venvs/py311/bin/python3"
    assert kill_exact_argv(host.python, [(1, 2)])[0] == "/opt/venvs/py311/bin/python3"


def test_a_holder_with_a_probe_reads_the_facts_once_it_holds_the_lock(tmp_path: Path) -> None:
    """Deploy's probe rides on the lock's round trip (issue 26); what it reads must be what the host
    looks like under the lock, not before another run let go of it."""
    import hashlib
    import json

    from gpudeploy.apply.lock import _facts, holder_argv

    lock, marker = tmp_path / "host.lock", tmp_path / "unit-file"
    first = _holder(lock, 5, 30)
    assert _first_line(first) == "locked"
    argv = holder_argv(sys.executable, 10, '{"by": "test"}', {"units": [], "files": [str(marker)]})
    argv[3] = str(lock)
    waiter = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert _first_line(waiter).startswith("busy")
        marker.write_text("written by the run that holds the lock")  # that run's last change
        assert first.stdin is not None
        first.stdin.close()
        line = _first_line(waiter)
        assert line.startswith("locked ")
        facts = _facts(line.removeprefix("locked "))
        assert facts is not None
        assert facts["files"][str(marker)] == hashlib.sha256(marker.read_bytes()).hexdigest()
        assert _facts(json.dumps({"probe_error": "ValueError: x"})) is None  # deploy then probes on its own
    finally:
        for p in (first, waiter):
            p.kill()
            p.wait()


def _let_go(proc: subprocess.Popen[str]) -> None:
    """The client ends: the holder sees its stdin close and lets go of the lock."""
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(timeout=10)


def _later_holder(lock: Path) -> subprocess.Popen[str]:
    from gpudeploy.apply.lock import LATER, holder_argv

    argv = holder_argv(sys.executable, 10, '{"by": "test"}', LATER)
    argv[3] = str(lock)
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def test_a_holder_started_before_the_plan_probes_with_the_spec_sent_later(tmp_path: Path) -> None:
    """Deploy's head start (apply/early_locks.py): the holder takes the lock while the client still
    plans, and probes with the spec that comes on stdin after heartbeat dots."""
    import hashlib
    import json

    from gpudeploy.apply.lock import _facts

    lock, marker = tmp_path / "host.lock", tmp_path / "unit-file"
    holder = _later_holder(lock)
    assert holder.stdin is not None
    try:
        holder.stdin.write("..")  # heartbeats before the plan is done
        holder.stdin.flush()
        # It holds the lock while the client still plans: another run is told "busy".
        deadline = time.monotonic() + 30
        while True:
            waiter = _holder(lock, 0, 30)
            first = _first_line(waiter)
            _let_go(waiter)
            if first.startswith("busy"):
                break
            assert time.monotonic() < deadline, "the early holder never took the lock"
        marker.write_text("x")  # what the host looks like once the plan is done: read then, under the lock
        holder.stdin.write(".." + json.dumps({"units": [], "files": [str(marker)]}) + "\n.")
        holder.stdin.flush()
        line = _first_line(holder)
        if line.startswith("busy"):  # a waiter above came first, for a moment
            line = _first_line(holder)
        facts = _facts(line.removeprefix("locked "))
        assert facts is not None, line
        assert facts["files"][str(marker)] == hashlib.sha256(b"x").hexdigest()
        waiter = _holder(lock, 0, 30)  # it holds the lock after probing, as long as the client is there
        assert _first_line(waiter).startswith("busy") and _first_line(waiter) == "timeout"
        waiter.wait(timeout=5)
    finally:
        holder.kill()
        holder.wait()


def test_a_holder_started_before_a_plan_that_failed_lets_go_without_probing(tmp_path: Path) -> None:
    lock = tmp_path / "host.lock"
    holder = _later_holder(lock)
    assert holder.stdin is not None
    holder.stdin.write("...")
    holder.stdin.close()  # the client ends what it started: no spec comes
    try:
        assert holder.wait(timeout=10) == 0
        assert holder.stdout is not None and holder.stdout.read() == ""  # no probe ran, nothing said
        free = _holder(lock, 0, 30)
        assert _first_line(free) == "locked"
        _let_go(free)
    finally:
        holder.kill()
        holder.wait()


def test_a_holder_told_null_holds_the_lock_without_probing(tmp_path: Path) -> None:
    lock = tmp_path / "host.lock"
    holder = _later_holder(lock)
    assert holder.stdin is not None
    try:
        holder.stdin.write("null\n")
        holder.stdin.flush()
        assert _first_line(holder) == "locked"
    finally:
        holder.kill()
        holder.wait()


def _here() -> Host:
    """This machine as a ``connection: local`` host that runs our own python."""
    from dataclasses import replace

    from gpudeploy.inventory import load_inventory

    inv = load_inventory(str(Path(__file__).resolve().parents[2] / "lab" / "inventory" / "lab.yml"))
    return replace(next(iter(inv.hosts.values())), python=sys.executable, connection="local")


def test_a_probes_second_stage_is_read_only_when_asked_and_under_the_lock(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Deploy's probe in two stages (apply/probe_stages.py): the holder answers the first at once and
    reads the spec's ``later`` only when the client asks, still holding the lock, as the host is then."""
    import hashlib

    from gpudeploy.apply import lock as lockmod
    from gpudeploy.remote.local import LocalTransport

    monkeypatch.setattr(lockmod, "LOCK_PATH", str(tmp_path / "host.lock"))
    early, late = tmp_path / "unit-file", tmp_path / "gpu-file"
    early.write_text("a")
    remote = LocalTransport(_here())
    held = lockmod.HostLock(remote, 0, probe={"units": [], "files": [str(early)], "later": {"files": [str(late)]}})
    with held:
        assert held.facts is not None and held.facts["files"] == {str(early): hashlib.sha256(b"a").hexdigest()}
        waiter = _holder(tmp_path / "host.lock", 0, 30)
        assert _first_line(waiter).startswith("busy") and _first_line(waiter) == "timeout"
        late.write_text("b")  # written after the first stage: the second reads it
        more = held.more()
        assert more is not None and more["files"] == {str(late): hashlib.sha256(b"b").hexdigest()}
        asked = time.monotonic()
        assert held.more() is None and time.monotonic() - asked < 5  # answered once; not waited for again
        waiter = _holder(tmp_path / "host.lock", 0, 30)  # still held after the second stage
        assert _first_line(waiter).startswith("busy") and _first_line(waiter) == "timeout"
    free = _holder(tmp_path / "host.lock", 0, 30)
    assert _first_line(free) == "locked"
    _let_go(free)


def test_a_holder_asked_for_a_second_stage_it_was_not_given_answers_none_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpudeploy.apply import lock as lockmod
    from gpudeploy.remote.local import LocalTransport

    monkeypatch.setattr(lockmod, "LOCK_PATH", str(tmp_path / "host.lock"))
    remote = LocalTransport(_here())
    with lockmod.HostLock(remote, 0, probe={"units": []}) as held:
        started = time.monotonic()
        assert held.more() is None  # deploy then probes on its own
        assert time.monotonic() - started < lockmod.PROBE_S


def test_a_holder_gone_before_the_second_stage_is_a_lost_lock_not_a_probe_of_our_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its lock went with it: deploy must not go on to change the host (review of the two stages)."""
    from gpudeploy.apply import lock as lockmod
    from gpudeploy.errors import RemoteError
    from gpudeploy.remote.local import LocalStream, LocalTransport

    monkeypatch.setattr(lockmod, "LOCK_PATH", str(tmp_path / "host.lock"))
    remote = LocalTransport(_here())
    with lockmod.HostLock(remote, 0, probe={"units": [], "later": {"ports": True}}) as held:
        assert held.facts is not None
        assert isinstance(held.chan, LocalStream)
        held.chan.proc.kill()  # our own holder, by its PID (its heartbeat stopped, or someone killed it)
        held.chan.proc.wait()
        with pytest.raises(RemoteError, match="lost the host lock"):
            held.more()
