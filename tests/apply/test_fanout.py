"""Per-host fan-out: one host's surprise is that host's error, the others' results are kept."""

from __future__ import annotations

import http.client
import threading

import paramiko
import pytest

from gpudeploy.errors import GpudeployError, RemoteError
from gpudeploy.fanout import Cancel, for_each_host
from gpudeploy.model import Host, SshConfig


def _host(name: str) -> Host:
    return Host(name=name, address="192.0.2.1", ssh=SshConfig(), numa_nodes=(), gpu_memory_gib={},
                engine_versions={}, python="python3", bind_address="0.0.0.0", numa_policy="none", env={},
                placements=())


@pytest.mark.parametrize("exc", [paramiko.SSHException("Channel closed."), http.client.BadStatusLine("x"),
                                 ValueError("bug")], ids=["ssh", "http", "bug"])
def test_any_exception_is_a_per_host_failure(exc: Exception) -> None:
    def fn(host: Host) -> str:
        if host.name == "bad":
            raise exc
        return f"ok {host.name}"

    results = for_each_host([_host("a"), _host("bad"), _host("b")], fn)
    assert results["a"] == "ok a" and results["b"] == "ok b"
    err = results["bad"]
    assert isinstance(err, RemoteError) and type(exc).__name__ in str(err)


def test_gpudeploy_errors_pass_through_unchanged() -> None:
    boom = RemoteError("bad", "preflight failed")
    results = for_each_host([_host("bad")], lambda h: (_ for _ in ()).throw(boom))
    assert results["bad"] is boom and isinstance(results["bad"], GpudeployError)


def test_cancel_wakes_every_registered_waiter_and_later_ones_too() -> None:
    cancel = Cancel()
    early = threading.Event()
    cancel.watch(early)
    cancel.set()
    late = threading.Event()
    cancel.watch(late)
    assert early.is_set() and late.is_set() and cancel.is_set()
