"""`invoke status --watch` on real hosts (issue 23): a killed engine's death shows at once, with the cause
its own log gives and what to change; nothing restarts it; Ctrl-C ends the watch with 130.

The engine is the stand-in: a SIGKILLed TP worker makes its launcher say what 0.5.23's does once
serving ("Subprocess scheduler_1 (pid=N) crashed with exit code -9. Triggering SIGQUIT for cleanup...",
its SIGQUIT words) and SIGKILL itself. The figure printed is the time from the main process's exit (the
journal's own timestamp of systemd's "Main process exited" entry; the lab's hosts share this
machine's clock) to the watch's line, and from the kill itself. Not asserted tight: printed.
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest
from conftest import Lab
from deploytools import REPO, Deployments, gd, main_pid, standin_role, unit_pids

from gpudeploy.plan import unit_name

pytestmark = pytest.mark.lab


def _lines(proc: subprocess.Popen[str]) -> queue.Queue[tuple[float, str]]:
    """Each line of the watch's output with the wall-clock time it was read."""
    out: queue.Queue[tuple[float, str]] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.put((time.time(), line.rstrip("\n")))

    threading.Thread(target=read, daemon=True).start()
    return out


def _next(lines: queue.Queue[tuple[float, str]], want: str, timeout: float, seen: list[str]) -> tuple[float, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            at, line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        seen.append(line)
        if want in line:
            return at, line
    raise AssertionError(f"no line with {want!r} within {timeout} s; the watch said:\n" + "\n".join(seen))


def test_status_watch_shows_a_killed_engines_cause_at_once(deployments: Deployments, lab: Lab) -> None:
    inv = deployments.inventory("watchk", {"srv": standin_role(None)})
    res = gd("deploy", "--inventory", str(inv), "--host", "lab2")
    assert res.returncode == 0, res.stdout + res.stderr
    unit = unit_name("watchk", "srv")
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "--search-root", str(REPO), "status", "--watch",
                             "--inventory", str(inv)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    seen: list[str] = []
    try:
        lines = _lines(proc)
        started = time.monotonic()
        _next(lines, "watching: a death is shown at once", 60, seen)
        first_table_s = time.monotonic() - started
        assert any(line.startswith("watchk") and "active/running" in line and " 200 " in line for line in seen), seen
        launcher = main_pid(lab, "lab2", unit)
        worker = next(p for p in unit_pids(lab, "lab2", unit) if p != launcher)  # a TP rank's worker
        killing = time.time()
        lab.ssh("lab2", f"kill -9 {worker}", check=True)
        killed = time.time()
        # 0.5.23's launcher outlives its dead scheduler by its crash diagnostics (~5 s, /health down
        # meanwhile, which the watch shows as it comes); the death is the line of the failed state
        shown, line = _next(lines, "-> failed/failed", 30, seen)
        assert line.split(" ", 1)[1].startswith("lab2/srv: active/running -> failed/failed"), line
        assert ("FAILED: a TP worker (scheduler) process died, so the server shut itself down (its exit code -9: "
                "killed by SIGKILL); next step: it was killed (SIGKILL)") in line, line
        evidence = []
        while True:  # the run's own lines that show the cause come right after, indented
            try:
                _, more = lines.get(timeout=2)
            except queue.Empty:
                break
            if not more.startswith("    | "):
                seen.append(more)
                break
            evidence.append(more)
        assert any("crashed with exit code -9" in e or "It usually means one child failed" in e
                   for e in evidence), evidence
        exited = _exit_time(lab, unit)
        # nothing restarts it: the unit stays failed (Restart=no; the watch only reads)
        shown_props = lab.ssh("lab2", f"systemctl show -p ActiveState -p NRestarts {unit}", check=True).stdout
        state = dict(line.split("=", 1) for line in shown_props.split())  # systemd picks the order
        assert state == {"ActiveState": "failed", "NRestarts": "0"}, state
        proc.send_signal(signal.SIGINT)
        # the reader thread has stdout; what the watch says last comes through it
        _next(lines, "stopped watching", 30, seen)
        _, err = proc.communicate(timeout=30)
        rest = "\n".join(seen)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, (rest, err)
    assert "stopped watching (Ctrl-C); the watch changed nothing on the hosts" in rest
    assert "Traceback" not in err, err
    print(f"status --watch: first table after {first_table_s:.2f} s; the death shown {shown - exited:.3f} s after "
          f"the main process exited (journal), {shown - killed:.3f}-{shown - killing:.3f} s after the kill")


def _exit_time(lab: Lab, unit: str) -> float:
    """When the unit's main process exited, by the journal's own clock (seconds since the epoch)."""
    out = lab.ssh("lab2", f"journalctl -u {unit} -o json --no-pager -n 50", check=True).stdout
    for raw in reversed(out.splitlines()):
        entry = json.loads(raw)
        msg = entry.get("MESSAGE")
        if isinstance(msg, str) and "Main process exited" in msg:
            return int(entry["__REALTIME_TIMESTAMP"]) / 1e6
    raise AssertionError(f"no 'Main process exited' entry for {unit}:\n{out}")
