"""Status's head start (issue 26): each host's probe is under way, its ssh handshake made, while
gpudeploy still plans; the real probe and the real OpenSSH client against a fake sshd that runs
commands on this machine. A probe that is not needed after all leaves no process behind."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from invoke.context import Context
from invoke.exceptions import Exit
from sshd_servers import ADDRESS, Server, Servers

from gpudeploy.cli import tasks
from gpudeploy.inventory import load_inventory
from gpudeploy.plan import build
from gpudeploy.verify.head_start import HeadStart

pytestmark = pytest.mark.skipif(shutil.which("ssh") is None, reason="no OpenSSH client")


def inventory(tmp: Path, servers: Servers, server: Server, roles: str = "[idle]") -> Path:
    known = tmp / "known_hosts"
    known.write_text(server.known_line())
    (tmp / "roles").mkdir(exist_ok=True)
    (tmp / "roles" / "idle.yml").write_text("engine: command\nargv: [/bin/sleep, '1000']\n")
    path = tmp / "hosts.yml"
    path.write_text(yaml.safe_dump({
        "deployment": "hs", "roles_dir": "roles",
        "defaults": {"ssh": {"user": "root", "port": server.port, "key": str(servers.client_key),
                             "known_hosts": str(known), "connect_timeout_s": 10},
                     "python": sys.executable},
        "hosts": {"n1": {"address": ADDRESS, "numa_nodes": [{"id": 0, "gpus": [], "cpus": "0"}],
                         "roles": yaml.safe_load(roles)}}}))
    return path


def wait_for(what: str, check: Any, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def run_status(path: Path, **kwargs: Any) -> int:
    """The status task's own body (not the command: no signal handlers in pytest's process)."""
    try:
        tasks.status.body.__wrapped__(Context(), inventory=str(path), **kwargs)
    except Exit as exc:
        return int(exc.code)
    return 0


def test_the_probe_starts_before_the_plan_is_built(servers: Servers, control_dir: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    server = servers.start("n1", run=True)
    path = inventory(tmp_path, servers, server)
    seen: list[bool] = []
    real = build.build_plan

    def planned_late(*args: Any, **kwargs: Any) -> Any:
        # Planning waits until the host has been asked to run the probe: only a head start gets there.
        seen.append(wait_for("the probe's exec", lambda: "exec" in server.output, timeout=20))
        return real(*args, **kwargs)

    monkeypatch.setattr(build, "build_plan", planned_late)
    run_status(path, json_=True)
    doc = json.loads(capsys.readouterr().out)
    assert seen == [True]
    [unit] = doc["hosts"]["n1"]["units"]
    assert unit["unit"] == "gpudeploy-hs.idle.service" and unit["deployed"] is False  # the real probe's answer
    assert server.output.count("exec") == 1  # one probe, not a head start and then another


def test_the_head_start_answers_as_the_plain_probe_does(servers: Servers, control_dir: Path,
                                                        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    server = servers.start("n1", run=True)
    path = inventory(tmp_path, servers, server)
    run_status(path, json_=True)
    early = json.loads(capsys.readouterr().out)
    run_status(path, json_=True, role="idle")  # --role: no head start, the plain probe
    plain = json.loads(capsys.readouterr().out)
    assert early == plain
    assert server.output.count("exec") == 2


def test_a_probe_not_needed_after_all_ends_and_does_nothing(servers: Servers, control_dir: Path,
                                                             tmp_path: Path) -> None:
    server = servers.start("n1", run=True)
    host = next(iter(load_inventory(inventory(tmp_path, servers, server)).hosts.values()))
    early = HeadStart([host])
    [running] = early.running.values()
    assert wait_for("the probe's exec", lambda: "exec" in server.output)
    early.close()  # e.g. the plan failed: the probe never gets its spec
    assert running.proc.poll() is not None  # our ssh is gone, by its own PID, and reaped
    # the host's python saw its stdin close and ended, having done nothing
    assert wait_for("the probe's end", lambda: any(line.startswith("exit ") for line in server.output))
    assert [line for line in server.output if line.startswith("exit ")] == ["exit 0"]
    assert early.probe(host, {}) is None  # nothing is left to answer: status probes as usual
