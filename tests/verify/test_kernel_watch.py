"""`status --watch`'s kernel-log follower (verify/kernel_watch.py) running facts/gpu_health.py's ``follow``
as it runs on a host: here through the local transport, the kernel log the lab's stand-in file."""

from __future__ import annotations

import json
import queue
import time
from pathlib import Path
from typing import Any

import pytest

from gpudeploy.model import Host, SshConfig
from gpudeploy.remote.local import LocalTransport
from gpudeploy.verify.kernel_watch import KernelWatch
from gpudeploy_lab import gpu_faults

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A host's root with 2 stand-in GPUs; the follower's python finds the stand-in NVML that names its log."""
    (tmp_path / "etc/gpudeploy-lab").mkdir(parents=True)
    (tmp_path / gpu_faults.GUEST_GPUS_JSON).write_text(json.dumps({"driver_version": "580.159.04", "gpus": [
        {"index": i, "name": "NVIDIA H100", "uuid": f"GPU-{i}", "memory_total_bytes": 80 * 2**30, "numa_node": 0,
         "pci_bus_id": f"00000000:4{i + 1}:00.0"} for i in range(2)]}))
    monkeypatch.setenv("PYTHONPATH", f"{REPO / 'lab' / 'shims'}:{REPO / 'src'}")
    monkeypatch.setenv("GPUDEPLOY_LAB_GPUS", str(tmp_path / gpu_faults.GUEST_GPUS_JSON))
    monkeypatch.setenv("GPUDEPLOY_LAB_KERNEL_LOG", str(tmp_path / gpu_faults.GUEST_KERNEL_LOG))
    return tmp_path


def _host() -> Host:
    return Host(name="here", address="127.0.0.1", ssh=SshConfig(), numa_nodes=(), gpu_memory_gib={},
                engine_versions={}, python="/usr/bin/python3", bind_address="127.0.0.1", numa_policy="none", env={},
                placements=(), connection="local")


def test_an_xid_reaches_the_watch_within_a_second_and_none_written_since_the_look_is_missed(root: Path) -> None:
    looked_at = time.time()
    early = gpu_faults.inject_xid(root, "here", 0, 63)  # after the whole look, before the follower runs
    got: queue.Queue[tuple[float, dict[str, Any]]] = queue.Queue()
    remote = LocalTransport(_host())
    kw = KernelWatch(remote, looked_at, lambda x: got.put((time.time(), x)), lambda why: got.put((0.0, {"err": why})))
    try:
        _, first = got.get(timeout=10)
        assert first["xid"] == 63 and first["text"] == early.split(" kernel: ", 1)[1]
        line = gpu_faults.inject_xid(root, "here", 1, 48, pid=7)
        logged = float(line.split(" ", 1)[0])
        came, x = got.get(timeout=10)
        assert (x["xid"], x["bus"], x["pid"]) == (48, "0000:42:00", 7)
        assert came - logged < 1.0, came - logged
        assert kw.source == str(root / gpu_faults.GUEST_KERNEL_LOG)
    finally:
        kw.close()
    stream: Any = kw.stream
    assert stream.proc.poll() is not None  # the host's follower ended with it
