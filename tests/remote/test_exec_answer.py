"""A command request the host never answers ends at the caller's timeout, not never.

paramiko waits for the answer to an exec request with no timeout (Channel._wait_for_event). Loaded
run 7 of the suite: the lab's network cut landed between a state poll's request and its answer,
and the deploy's gate hung past the test's 90 s instead of saying "lost the connection".
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from sshd_servers import ADDRESS, Servers
from test_jump_hosts import _host

from gpudeploy.errors import HostUnreachable, RemoteError
from gpudeploy.remote.ssh import Remote


def _within(seconds: float, call: object) -> tuple[float, BaseException | None]:
    """Run ``call`` in a thread; how long it took and what it raised (a hang fails the test)."""
    got: list[BaseException | None] = []
    t0 = time.monotonic()

    def go() -> None:
        try:
            call()  # type: ignore[operator]
            got.append(None)
        except BaseException as exc:
            got.append(exc)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still waiting for the host's answer after {seconds} s"
    return time.monotonic() - t0, got[0]


@pytest.mark.parametrize("way", ["run", "stream"])
def test_an_unanswered_command_request_ends_at_its_timeout(way: str, servers: Servers, tmp_path: Path) -> None:
    server = servers.start("gpu")
    known = tmp_path / "known_hosts"
    known.write_text(server.known_line())
    host = _host(ADDRESS, port=server.port, known_hosts=known, key=str(servers.client_key))  # connect timeout 5 s
    with Remote(host) as remote:
        assert remote.run(["hostname"], timeout=10).stdout.strip() == "gpu"
        if way == "run":
            took, exc = _within(30, lambda: remote.run(["never-answer"], timeout=1))
            assert isinstance(exc, RemoteError) and "did not finish within 1 s" in str(exc), exc
            assert took < 5
        else:
            took, exc = _within(30, lambda: remote.stream(["never-answer"]))
            assert isinstance(exc, HostUnreachable) and "did not start the command within 5 s" in str(exc), exc
            assert took < 10
