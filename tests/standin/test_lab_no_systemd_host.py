"""A real lab host without systemd (``up(0, no_systemd=[...])``), booted, used and taken down by this test.

Marked ``lab`` (root, systemd-nspawn, mmdebstrap); it boots only lab29, beside whatever lab runs, and
takes only lab29 down again (``down(["lab29"])``), so it never disturbs the lab tier's hosts.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import pytest
from standin_support import wait_for

import gpudeploy_lab as labctl
from gpudeploy_lab import config, host
from gpudeploy_lab.config import Host

pytestmark = pytest.mark.lab

H = Host(29)  # 10.231.0.39: far above the lab tier's hosts


def sh(cmd: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(labctl.ssh_argv(H.address, cmd), capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def bare() -> Iterator[float]:
    problem = labctl.precondition_problem()
    if problem:
        pytest.skip(f"lab tests skipped: {problem}")
    started = time.monotonic()
    try:
        statuses = labctl.up(0, no_systemd=[H.name])
        booted = time.monotonic() - started
        assert next(st.line() for st in statuses if st.host == H).split()[5:7] == ["no", "systemd"]
        yield booted
    finally:
        labctl.down([H.name])
    assert H not in [st.host for st in labctl.status()]


def test_ssh_works_and_there_is_no_systemd(bare: float) -> None:
    assert bare < 30
    r = sh("hostname; cat /proc/1/comm; ps -o comm= -p 2; test -d /run/systemd/system && echo systemd || echo none; "
           "systemctl is-system-running")
    assert r.stdout.split() == [H.name, "(sd-stubinit)", "sshd", "none", "offline"], r.stdout + r.stderr
    st = next(st for st in labctl.status() if st.host == H)
    assert st.up and st.ssh_ok and not st.has_systemd and st.systemd == labctl.NO_SYSTEMD
    assert host.boots_systemd(H) is False


def test_stand_in_and_fake_nvml_work_and_orphans_are_reaped(bare: float) -> None:
    r = sh("SGLANG_STANDIN_SPEED=0.1 CUDA_VISIBLE_DEVICES=2,3 setsid python3 -m sglang.launch_server "
           "--model-path /m --tp-size 2 --host 0.0.0.0 --port 30000 </dev/null >/tmp/engine.log 2>&1 & echo $!")
    pid = int(r.stdout.strip())
    try:
        wait_for(lambda: (http_get_remote() or (0,))[0] == 200, 20)
        nvml = sh('python3 -c "import pynvml; pynvml.nvmlInit(); '
                  'print([len(pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(i))) '
                  'for i in range(8)])"')
        assert nvml.stdout.strip() == "[0, 0, 1, 1, 0, 0, 0, 0]", nvml.stdout + nvml.stderr
    finally:
        sh(f"kill -9 {pid}")
    # the workers follow their launcher; PID 1 (nspawn's stub init) reaps them all: no zombie stays
    wait_for(lambda: sh("ps -eo stat=,comm= | grep -c python3 || true").stdout.strip() == "0", 10)
    assert "Z" not in sh("ps -eo stat=").stdout


def http_get_remote() -> tuple[int, bytes] | None:
    import http.client
    conn = http.client.HTTPConnection(H.address, 30000, timeout=2)
    try:
        conn.request("GET", "/health")
        resp = conn.getresponse()
        return resp.status, resp.read()
    except OSError:
        return None
    finally:
        conn.close()


def test_release_and_nvml_switches(bare: float) -> None:
    version = 'python3 -c "import sglang; print(sglang.__version__)"'
    init = 'python3 -c "import pynvml; pynvml.nvmlInit(); print(pynvml.nvmlDeviceGetCount())" 2>&1 | tail -1'
    labctl.set_sglang_release(H.name, "0.5.99", "0.5.10")
    try:
        assert sh(version).stdout.strip() == "0.5.99"
        help_text = sh("python3 -m sglang.launch_server --help").stdout
        assert help_text == (config.repo_root() / "src/gpudeploy/data/sglang-0.5.10-launch_server-help.txt").read_text()
    finally:
        labctl.clear_sglang_release(H.name)
    assert sh(version).stdout.strip() == "0.5.23"
    labctl.remove_nvml(H.name)
    try:
        assert sh(init).stdout.strip() == "pynvml.NVMLError_LibraryNotFound: NVML Shared Library Not Found"
        labctl.remove_nvml(H.name, driver_not_loaded=True)
        assert sh(init).stdout.strip() == "pynvml.NVMLError_DriverNotLoaded: Driver Not Loaded"
    finally:
        labctl.restore_nvml(H.name)
    assert sh(init).stdout.strip() == "8"


def test_a_crashed_host_without_systemd_is_swept_and_boots_again(bare: float) -> None:
    pid = host.nspawn_pid(H)
    assert pid is not None
    subprocess.run(["kill", "-9", str(pid)], check=True)
    wait_for(lambda: not host.is_running(H), 5)
    st = next(st for st in labctl.status() if st.host == H)
    assert not st.up
    labctl.up(0, no_systemd=[H.name])  # sweeps what the crash left (stub init, sshd) and boots it again
    assert sh("true").returncode == 0 and host.boots_systemd(H) is False
