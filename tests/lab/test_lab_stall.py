"""A start that hangs is named while it hangs (issue 23): "stalled in <phase> for N s", its last lines and,
where py-spy is on the host, the Python stacks of the server's processes; then the role's
``health.on_stall`` decides: ``wait`` (report it, keep waiting to health.timeout_s) or ``stop``.

The stand-in test runs on the default lab hosts (no py-spy there: the report says so); the real
SGLang test on lab4, as tests/lab/test_sglang.py's faults do, with the real engine's venv, which has
py-spy (SGLang depends on it). Every wait is a condition polled against a deadline.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import PurePosixPath

import pytest
from conftest import Lab
from deploytools import REPO, Deployments, gd, standin_role, unit_pids
from test_sglang import INVOKE, fault_host, real_role  # noqa: F401 - fault_host is a fixture

from gpudeploy.plan import unit_name
from gpudeploy_lab import engine

pytestmark = pytest.mark.lab

PY_SPY = str(PurePosixPath(engine.SGLANG_GUEST_PYTHON).parent / "py-spy")  # the real engine's venv has it


def test_a_stand_in_stuck_capturing_graphs_is_reported_stalled_then_waited_out(deployments: Deployments,
                                                                              lab: Lab) -> None:
    # The stand-in's "hang" stops after "Capture target decode CUDA graph begin" (0.5.23's words) with its
    # tqdm bar open: under
    # systemd no further line reaches the journal, as with a real capture that deadlocks.
    role = standin_role("hang", timeout_s=20)
    role["health"] = {"timeout_s": 20, "stall_s": {"capturing_cuda_graphs": 4}, "on_stall": "wait"}
    inv = deployments.inventory("stallw", {"srv": role})
    t0 = time.monotonic()
    res = gd("deploy", "--inventory", str(inv), "--host", "lab2", timeout=120)
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    m = re.search(r"\[lab2/srv\] STALLED: stalled in capturing CUDA graphs for (\d+) s: no log line, phase or "
                  r"progress step since; still waiting, up to health.timeout_s", out)
    assert m and int(m.group(1)) >= 4, out
    assert "Capture target decode CUDA graph begin" in out.split("STALLED", 1)[1], out  # its last lines come with it
    assert "no Python stacks: no py-spy on the host" in out, out  # Debian's python3 on the stand-in hosts
    assert re.search(r"cause: not ready after 20 s; last phase reached: capturing CUDA graphs \(nothing moved "
                     r"there for the last \d+ s\)", out), out
    assert "the unit was stopped so its GPUs are free again" in out
    assert unit_pids(lab, "lab2", unit_name("stallw", "srv")) == []
    print(f"stand-in stall reported, deploy returned after {time.monotonic() - t0:.1f} s")


@pytest.mark.sglang
def test_a_sigstopped_real_server_is_reported_stalled_with_its_phase_and_stacks(fault_host: str,  # noqa: F811
                                                                                deployments: Deployments,
                                                                                lab: Lab) -> None:
    # SIGSTOP of every process of the unit once it is loading: nothing moves, nothing dies. With
    # on_stall: stop the gate gives up after the phase's stall_s (not the 300 s timeout), with the stacks of each
    # process read by py-spy --nonblocking (which reads a stopped process as well as a running one).
    # "starting" keeps its 300 s: torch's imports alone take a while on two busy cores, with no line
    later = {p: 20 for p in ("loading_weights", "allocating_kv_cache", "capturing_cuda_graphs",
                             "starting_http_server", "warmup")}
    health = {"timeout_s": 300, "stall_s": later, "on_stall": "stop", "py_spy": PY_SPY}
    inv = deployments.inventory("rstall", {"srv": real_role(health=health)}, host=fault_host)
    unit = unit_name("rstall", "srv")
    proc = subprocess.Popen([*INVOKE, "deploy", "--inventory", str(inv)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    stopped: list[int] = []
    assert proc.stdout is not None
    seen: list[str] = []
    stopped_at = reported_at = 0.0
    try:
        for line in proc.stdout:
            seen.append(line)
            if not stopped and "loading weights" in line:
                stopped.extend(unit_pids(lab, fault_host, unit))
                lab.ssh(fault_host, "kill -STOP " + " ".join(map(str, stopped)), check=True)
                stopped_at = time.monotonic()
            if stopped and not reported_at and "stalled in" in line:
                reported_at = time.monotonic()
        proc.wait(timeout=600)
    finally:
        if stopped:
            lab.ssh(fault_host, "kill -CONT " + " ".join(map(str, stopped)))
    out = "".join(seen)
    assert stopped, out
    assert proc.returncode == 1, out
    phases = re.findall(r"\[lab4/srv\]\s+[\d.]+s  ([a-z A-Z]+?)(?:  |$)", out, re.M)
    assert phases, out
    m = re.search(rf"cause: stalled in {re.escape(phases[-1])} for (\d+) s", out)
    assert m and int(m.group(1)) >= 20, out
    # the stacks: one block per process of the unit, with py-spy's own thread and frame lines
    assert len(re.findall(r"\| pid \d+ \(", out)) >= 3, out  # launcher, scheduler, detokenizer
    assert re.search(r"\|\s+Thread \S+ \((?:idle|active)[^)]*\)", out), out
    assert re.search(r"\|\s+\S+ \(\S+\.py:\d+\)", out), out  # a frame: function (file.py:line)
    assert "the unit was stopped so its GPUs are free again" in out, out
    assert unit_pids(lab, fault_host, unit) == []
    print(f"SIGSTOP -> 'stalled in {phases[-1]}' reported after {reported_at - stopped_at:.1f} s (stall_s 20)")
