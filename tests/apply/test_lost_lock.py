"""A host lock lost in the middle of a deploy (issue 43, item 7): a network stall of over 10 s ends the
holder on the host, another operator's deploy takes the lock, and this one must not go on uploading,
restarting and recording there as if it still held it. Its next step there fails the host with
"lost the host lock", and the report says so."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpudeploy.apply import deploy as d
from gpudeploy.apply import deployment, sessions
from gpudeploy.apply import lock as lockmod
from gpudeploy.errors import RemoteError
from gpudeploy.fanout import Cancel
from gpudeploy.model import Host
from gpudeploy.plan import load_plan
from gpudeploy.remote.base import Result
from gpudeploy.report import deploy_summary
from gpudeploy.supervisor import systemd

REPO = Path(__file__).resolve().parents[2]


def _until(done: Any, what: str, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not done():
        assert time.monotonic() < deadline, f"not within {within:g} s: {what}"
        time.sleep(0.01)


class _HolderChannel:
    """The lock holder's ssh channel: it answers "locked"; once ``cut``, a heartbeat can no longer
    be sent (paramiko's "Socket is closed"), and the holder's end has not come back to us."""

    def __init__(self) -> None:
        self.answer = b"locked\n"
        self.beats = 0
        self.cut = threading.Event()

    def settimeout(self, timeout: float | None) -> None:
        pass

    def recv(self, n: int) -> bytes:
        if self.answer:
            out, self.answer = self.answer, b""
            return out
        raise TimeoutError

    def recv_stderr(self, n: int) -> bytes:
        return b""

    def sendall(self, data: bytes) -> None:
        if self.cut.is_set():
            raise OSError("Socket is closed")
        self.beats += 1

    def exit_status_ready(self) -> bool:
        return False

    def close(self) -> None:
        pass


class _Remote:
    """A host that records every step that reached it."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.holder = _HolderChannel()
        self.reached: list[str] = []

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    def stream(self, argv: list[str]) -> _HolderChannel:
        return self.holder

    def put(self, path: str, data: bytes, mode: int) -> None:
        self.reached.append(f"put {path}")

    def run(self, argv: list[str], *, stdin: bytes | None = None, timeout: float = 60.0,
            check: bool = True) -> Result:
        self.reached.append(" ".join(argv[:2]))
        return Result(0, "", "")

    def open_tcp(self, address: str, port: int, timeout: float) -> Any:
        self.reached.append(f"tcp {address}:{port}")
        raise ConnectionRefusedError


def test_a_lock_lost_mid_deploy_fails_the_host_before_its_next_upload_or_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    plan = load_plan(str(REPO / "lab" / "inventory" / "lab.yml"), host="lab1", memory=False)
    decode = next(u for u in plan.units if u.role.name == "decode")
    remote = _Remote(decode.host)
    monkeypatch.setattr(sessions, "connect", lambda host: remote)
    monkeypatch.setattr(lockmod, "HEARTBEAT_S", 0.01)
    files = {decode.name: {decode.unit_path: (b"x", 0o644)}}
    states = systemd.SYSTEMD.states({"units": {decode.name: {"props": {"ActiveState": "active"}}}})
    with ExitStack() as stack:
        opened, errors = sessions.open_sessions([decode.host], 1.0, None, stack)
        assert not errors
        s = opened["lab1"]
        assert s.lock is not None and s.lock.beat is not None
        s.remote.put(decode.unit_path, b"x", 0o644)  # under the lock: done
        _until(lambda: remote.holder.beats >= 2, "the heartbeat went on")

        remote.holder.cut.set()  # the link under the holder's channel broke: the next beat fails
        s.lock.beat.join(30)  # the heartbeat gives up on it
        assert not s.lock.beat.is_alive()

        with pytest.raises(RemoteError, match="lab1: lost the host lock"):
            s.remote.put(decode.env_path, b"y", 0o600)
        # deploy's wave on that host: the start fails the host as a whole, not the unit alone
        session = deployment.HostSession(s.host, s.remote, systemd.SYSTEMD, [decode], files=files, states=states)
        result = deployment.DeployResult({}, {decode.deployment: deployment.DeploymentOutcome(decode.deployment)})

        def wave(host: Host) -> None:
            d.start_and_gate(session.remote, session.supervisor, [decode], files, states, d.Options(), None)

        deployment._phase({"lab1": session}, wave, [decode], result, Cancel())
    assert remote.reached == [f"put {decode.unit_path}"]  # nothing reached the host after the loss
    text, ok = deploy_summary(result)
    assert not ok
    assert "lab1: FAILED: lab1: lost the host lock (its heartbeat could not be sent: OSError: Socket is closed)" in text
    assert "host lab1 failed: lab1: lost the host lock" in result.deployments[decode.deployment].failure


def _here(tmp_path: Path) -> Host:
    """This machine as a ``connection: local`` host that runs our own python."""
    plan = load_plan(str(REPO / "lab" / "inventory" / "lab.yml"), host="lab1", memory=False)
    return replace(plan.units[0].host, python=sys.executable, connection="local")


def test_after_a_stall_that_let_another_run_take_the_lock_the_next_write_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real holder on a real host (this one): no beat reaches it (a stall), it lets go, another
    run's holder takes the lock; this run's next write there is refused, not made."""
    monkeypatch.setattr(lockmod, "LOCK_PATH", str(tmp_path / "host.lock"))
    monkeypatch.setattr(lockmod, "HEARTBEAT_S", 0.05)
    monkeypatch.setattr(lockmod, "HEARTBEAT_TIMEOUT_S", 0.5)  # the holder lets go after 0.5 s without a beat
    with ExitStack() as stack:
        opened, errors = sessions.open_sessions([_here(tmp_path)], 1.0, None, stack)
        assert not errors
        s = opened["lab1"]
        s.remote.put(str(tmp_path / "before"), b"a", 0o644)
        assert s.lock is not None
        s.lock.stopped.set()  # the stall: from now on no beat reaches the holder
        other = subprocess.Popen([sys.executable, "-c", lockmod.HOLDER, str(tmp_path / "host.lock"),
                                  '{"by": "another operator"}', "30", "30"],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert other.stdout is not None
            lines: list[str] = []
            reader = threading.Thread(target=lambda: lines.extend(iter(other.stdout.readline, "")), daemon=True)
            reader.start()
            _until(lambda: "locked\n" in lines, "the other run took the lock")
            with pytest.raises(RemoteError, match="lab1: lost the host lock"):
                s.remote.put(str(tmp_path / "after"), b"b", 0o644)
            assert not (tmp_path / "after").exists()
        finally:
            assert other.stdin is not None
            other.stdin.close()  # the other run ends: its holder lets go
            other.wait(timeout=10)
    assert (tmp_path / "before").read_bytes() == b"a"


def test_a_routers_worker_list_is_not_changed_over_http_once_the_lock_is_lost() -> None:
    """A roll changes the router's workers over HTTP (through the host's ssh connection): after the
    loss that request is not made, and it says "lost the host lock", not "no answer", so the roll
    stops there and the host fails (apply/deployment.py) instead of the roll going on."""
    from gpudeploy.apply.held import HeldTransport
    from gpudeploy.verify import router_api
    from gpudeploy.verify.smoke import smoke_test

    plan = load_plan(str(REPO / "lab" / "inventory" / "lab.yml"), host="lab1", memory=False)
    router = next(u for u in plan.units if u.role.engine == "sglang_router")
    engines = [u for u in plan.units if u.role.engine == "sglang"]
    remote = _Remote(router.host)
    held = lockmod.HostLock(remote, 0)  # type: ignore[arg-type]
    held.lost = "its heartbeat could not be sent: OSError: Socket is closed"
    via = HeldTransport(remote, held)  # type: ignore[arg-type]
    with pytest.raises(RemoteError, match="lab1: lost the host lock"):
        router_api.remove(router, via, "worker-1")
    with pytest.raises(RemoteError, match="lab1: lost the host lock"):
        smoke_test(router, engines, via=via)
    assert remote.reached == []


def test_a_roll_that_meets_a_lost_lock_fails_that_host_and_the_deploy_goes_on_to_its_report(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, the LockLost of a roll's step left deploy altogether: no report, the other
    deployments not deployed."""
    from gpudeploy.apply import rolling
    from gpudeploy.errors import LockLost

    plan = load_plan(str(REPO / "lab" / "inventory" / "lab.yml"), host="lab1", memory=False)
    units = list(plan.units)
    host = units[0].host
    states = systemd.SYSTEMD.states({"units": {u.name: {"props": {"ActiveState": "active"}} for u in units}})
    session = deployment.HostSession(host, _Remote(host), systemd.SYSTEMD, units,  # type: ignore[arg-type]
                                     files={u.name: {u.unit_path: (b"new", 0o644)} for u in units},
                                     facts={"files": {}}, states=states, healthy={u.name: True for u in units})
    monkeypatch.setattr(rolling, "room", lambda plan, unit, views, mine: (unit, ""))
    monkeypatch.setattr(deployment.pair_roll, "crossings", lambda units, changed, states: [])

    def roll(*a: Any, **kw: Any) -> Any:  # its first step there found the lock lost
        raise LockLost("lab1", "its holder on the host exited")

    monkeypatch.setattr(rolling, "roll", roll)
    sessions_ = {"lab1": session}
    result = deployment.DeployResult({}, {"lab": deployment.DeploymentOutcome("lab")})
    done = deployment._roll_serving(plan, sessions_, units, {}, None, d.Options(), Cancel(), result, {},  # type: ignore[arg-type]
                                    set())
    assert done == {"lab"} and sessions_ == {}  # dealt with here; the host is out of the run
    text, ok = deploy_summary(result)
    assert not ok and "lab1: FAILED: lab1: lost the host lock (its holder on the host exited)" in text
    assert "lost the host lock" in result.deployments["lab"].failure


def test_a_failed_deployments_clean_up_does_not_call_units_stopped_where_the_lock_was_lost() -> None:
    from gpudeploy.apply.held import HeldTransport

    plan = load_plan(str(REPO / "lab" / "inventory" / "lab.yml"), host="lab1", memory=False)
    decode = next(u for u in plan.units if u.role.name == "decode")
    remote = _Remote(decode.host)
    held = lockmod.HostLock(remote, 0)  # type: ignore[arg-type]
    held.lost = "its holder on the host exited"
    session = deployment.HostSession(decode.host, HeldTransport(remote, held),  # type: ignore[arg-type]
                                     systemd.SYSTEMD, [decode])
    result = deployment.DeployResult({}, {decode.deployment: deployment.DeploymentOutcome(decode.deployment)})
    result.deployments[decode.deployment].fail("lab1/lab-router failed its gate")
    outcomes = {decode.key: d.UnitOutcome(decode, "started", True, 42)}
    deployment._clean_up_failures({"lab1": session}, [decode], d.Options(), result, outcomes, Cancel())
    assert remote.reached == []
    assert result.deployments[decode.deployment].stopped == []  # it was not stopped: not said so
    assert "lab1: lost the host lock (its holder on the host exited)" in str(result.hosts["lab1"])
    assert outcomes[decode.key].message == ""


def test_a_host_that_refuses_port_forwarding_is_said_once_though_the_gate_reads_through_the_bare_transport(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from gpudeploy.apply.held import HeldTransport, reading
    from gpudeploy.remote.base import ForwardingRefused
    from gpudeploy.verify import http

    said: list[str] = []
    monkeypatch.setattr(http, "say", said.append)
    monkeypatch.setattr(http.onhost, "request", lambda via, mode, url, body, timeout, **kw: http.onhost.Answer(200))
    plan = load_plan(str(REPO / "lab" / "inventory" / "lab.yml"), host="lab1", memory=False)
    remote = _Remote(plan.units[0].host)

    def refused(address: str, port: int, timeout: float) -> Any:
        remote.reached.append("tcp")
        raise ForwardingRefused("the ssh server of lab1 refuses port forwarding")

    monkeypatch.setattr(remote, "open_tcp", refused)
    held = HeldTransport(remote, lockmod.HostLock(remote, 0))  # type: ignore[arg-type]
    assert http.status_of("http://10.231.0.11:30000/health", 1, via=reading(held)) == 200  # the gate's ask
    assert http.status_of("http://10.231.0.11:30000/health", 1, via=held) == 200  # the smoke's, later
    assert remote.reached == ["tcp"] and len(said) == 1
