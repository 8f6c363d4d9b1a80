"""Deploy's head start (apply/early_locks.py, issue 26): each host's connection and lock holder
start while deploy is still imported and planned. It must be the very connection and holder deploy
then uses (a host is never dialled twice), and nothing it started may outlive a deploy that did not
need it."""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from invoke.context import Context
from invoke.exceptions import Exit

from gpudeploy.apply import early_locks, sessions
from gpudeploy.errors import HostUnreachable, InputError, Problem
from gpudeploy.inventory import load_inventory
from gpudeploy.model import Host

REPO = Path(__file__).resolve().parents[2]


def _hosts(n: int) -> list[Host]:
    lab1 = load_inventory(str(REPO / "lab" / "inventory" / "lab.yml")).hosts["lab1"]
    return [replace(lab1, name=f"lab{i}") for i in range(1, n + 1)]


class _Remote:
    def __init__(self, host: Host, log: list[str]) -> None:
        self.host, self.log = host, log

    def open(self) -> None:
        self.log.append(f"dial {self.host.name}")

    def close(self) -> None:
        self.log.append(f"close {self.host.name}")


class _Holder:
    """A lock holder as deploy drives it: started before the spec is known, finished with it."""

    def __init__(self, remote: _Remote, wait_s: float, *a: Any) -> None:
        self.remote, self.facts = remote, None

    def start(self, probe_later: bool = False) -> _Holder:
        assert probe_later and not isinstance(self.remote, str)
        self.remote.log.append(f"holder {self.remote.host.name}")
        return self

    def __enter__(self) -> _Holder:  # deploy's own holder, where the head start has none
        self.remote.log.append(f"lock {self.remote.host.name}")
        return self

    def finish(self, probe: dict[str, Any] | None, cancel: Any = None) -> _Holder:
        self.remote.log.append(f"spec {self.remote.host.name} {probe}")
        self.facts = {"probed": probe}  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        self.remote.log.append(f"unlock {self.remote.host.name}")


@pytest.fixture
def log(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    monkeypatch.setattr(early_locks, "connect", lambda host: _Remote(host, seen))
    monkeypatch.setattr(early_locks, "HostLock", _Holder)
    monkeypatch.setattr(sessions, "HostLock", _Holder)

    def second_dial(host: Host) -> None:
        raise AssertionError(f"{host.name} dialled a second time")

    monkeypatch.setattr(sessions, "connect", second_dial)
    return seen


def test_deploy_uses_the_connection_and_holder_its_head_start_made(log: list[str]) -> None:
    hosts = _hosts(2)
    early = early_locks.EarlyLocks(hosts)
    with ExitStack() as stack:
        opened, errors = sessions.open_sessions(hosts, 1.0, None, stack, {"lab1": {"units": ["a"]}}, early)
        assert not errors and sorted(opened) == ["lab1", "lab2"]
        assert opened["lab1"].facts == {"probed": {"units": ["a"]}}  # the probe rode on the early holder
        assert sorted(x for x in log if x.startswith(("dial", "spec"))) == [
            "dial lab1", "dial lab2", "spec lab1 {'units': ['a']}", "spec lab2 None"]
    early.close()
    assert sorted(x for x in log if x.startswith(("unlock", "close"))) == [
        "close lab1", "close lab2", "unlock lab1", "unlock lab2"]  # each once: closing early ends nothing twice


def test_a_dial_that_failed_early_is_the_hosts_error_and_is_not_tried_again(
        log: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(host: Host) -> _Remote:
        if host.name == "lab2":
            raise HostUnreachable("lab2", "ssh to 10.231.0.12 failed: connection refused")
        return _Remote(host, log)

    monkeypatch.setattr(early_locks, "connect", refused)
    hosts = _hosts(2)
    early = early_locks.EarlyLocks(hosts)
    with ExitStack() as stack:
        opened, errors = sessions.open_sessions(hosts, 1.0, None, stack, {}, early)
    assert sorted(opened) == ["lab1"] and "connection refused" in str(errors["lab2"])
    early.close()


def _until(done: Any, what: str, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not done():
        assert time.monotonic() < deadline, f"not within {within:g} s: {what}"
        time.sleep(0.01)


def test_a_holder_that_could_not_start_early_is_started_by_deploy_which_never_hangs(
        log: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever goes wrong in the head start's thread, deploy goes on: e.g. getpass.getuser() raises
    KeyError for a uid without a passwd entry and no USER (a container run as --user 1234). The first
    version left its thread without an answer, and deploy waited for it for ever."""
    def refuse(self: _Holder, probe_later: bool = False) -> _Holder:
        raise KeyError("getpwuid(): uid not found: 1234")

    monkeypatch.setattr(_Holder, "start", refuse)
    hosts = _hosts(1)
    early = early_locks.EarlyLocks(hosts)
    got: list[Any] = []
    opening = threading.Thread(target=lambda: got.append(sessions.open_sessions(hosts, 1.0, None, ExitStack(), {},
                                                                                   early)), daemon=True)
    opening.start()
    opening.join(30)
    assert got, "deploy waited for ever for the head start's thread"
    opened, errors = got[0]
    assert sorted(opened) == ["lab1"] and not errors
    assert log == ["dial lab1", "lock lab1"]  # dialled once; deploy's own holder took the lock
    early.close()


def test_what_a_deploy_did_not_take_is_ended_even_while_its_dial_is_under_way(
        log: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    release, dialling = threading.Event(), threading.Event()

    def slow(host: Host) -> _Remote:
        dialling.set()
        assert release.wait(30)
        return _Remote(host, log)

    monkeypatch.setattr(early_locks, "connect", slow)
    early = early_locks.EarlyLocks(_hosts(1))
    assert dialling.wait(30)
    early.close()  # the plan failed while the host was still being dialled
    release.set()
    _until(lambda: "close lab1" in log, "the connection closed")
    assert log == ["dial lab1", "holder lab1", "unlock lab1", "close lab1"]


def test_a_deploy_whose_plan_fails_lets_go_of_every_host_it_started_on(
        log: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from gpudeploy.cli import tasks

    def failing_plan(*a: Any, **kw: Any) -> Any:
        raise InputError([Problem("role decode: no GPU left on lab2", host="lab2")])

    monkeypatch.setattr(tasks, "plan_learning_flags", failing_plan)
    with pytest.raises(Exit, match="no GPU left"):
        tasks.deploy.body(Context(), inventory=str(REPO / "lab" / "inventory" / "lab.yml"))  # type: ignore[attr-defined]
    lab = load_inventory(str(REPO / "lab" / "inventory" / "lab.yml"))
    placed = sorted(n for n, h in lab.hosts.items() if h.placements)
    assert placed
    # a dial still under way when the plan failed is ended as it finishes, by its own thread
    _until(lambda: sorted(x for x in log if x.startswith("close")) == [f"close {n}" for n in placed],
           "every connection the head start made closed")
    assert sorted(x for x in log if x.startswith("unlock")) == [f"unlock {n}" for n in placed]


def test_a_deploy_that_names_its_hosts_through_the_plan_starts_nothing_early(
        log: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from gpudeploy.cli import tasks

    def started(*a: Any, **kw: Any) -> None:
        raise AssertionError("a head start for a deploy that picks its hosts through the plan")

    monkeypatch.setattr(early_locks, "EarlyLocks", started)
    monkeypatch.setattr(tasks, "plan_learning_flags", lambda *a, **kw: (_ for _ in ()).throw(
        InputError([Problem("stop here")])))
    for selected in ({"host": "lab1"}, {"role": "decode"}, {"deployment": "pd"}, {"serial": "1"},
                     {"only_failed": True}):
        with pytest.raises(Exit, match="stop here"):
            tasks.deploy.body(Context(), inventory=str(REPO / "lab" / "inventory" / "lab.yml"), **selected)  # type: ignore[attr-defined]
    assert log == []


def test_a_connection_that_broke_while_deploy_planned_is_that_hosts_error_and_its_channel_closes() -> None:
    """paramiko raises EOFError, not OSError, writing to a connection that broke: the spec's send let
    it out as "unexpected EOFError", and the holder's channel was left open."""
    from gpudeploy.apply.lock import HostLock
    from gpudeploy.errors import RemoteError

    closed: list[str] = []

    class Broken:
        def settimeout(self, timeout: float | None) -> None:
            pass

        def sendall(self, data: bytes) -> None:
            raise EOFError()

        def recv(self, n: int) -> bytes:
            return b""

        def recv_stderr(self, n: int) -> bytes:
            return b""

        def close(self) -> None:
            closed.append("channel")

    class Remote:
        host = _hosts(1)[0]

        def stream(self, argv: list[str]) -> Broken:
            return Broken()

    held = HostLock(Remote(), 0).start(probe_later=True)  # type: ignore[arg-type]
    with pytest.raises(RemoteError, match="lab1: the lock helper exited"):
        held.finish({"units": []})
    assert closed == ["channel"]
