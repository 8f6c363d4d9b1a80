"""A stand-in for what the experiment runner reaches: deploy, teardown, status and the router's host
(the client's commands), each recorded, so the runner's own decisions (what to re-run, what to do
when the host drops the connection, what to say) are tested without a lab. The client's result is
SGLang 0.5.23's real bench_serving line (tests/experiment/data)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from gpudeploy.apply.deploy import UnitOutcome
from gpudeploy.apply.deployment import DeploymentOutcome, DeployResult
from gpudeploy.errors import GpudeployError
from gpudeploy.experiment import power, runner
from gpudeploy.model import Host, Plan
from gpudeploy.remote.base import Result
from gpudeploy.verify.status import UnitStatus

RESULT = (Path(__file__).parent / "data" / "sglang-0.5.23-bench_serving.jsonl").read_text()


class FakeLab:
    client_error: str | None = None  # the client's stderr when it fails (rc 1, no result file)

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.commands: list[list[str]] = []  # every command on the router's host, in order
        self.deployed: list[str] = []  # each deploy: every unit's argv, joined
        self.up = False
        self.torn_down = 0
        self.teardown_error: GpudeployError | None = None
        self.status_error: Exception | None = None
        # called before each command on the host; may raise (a dropped connection)
        self.on_command: Callable[[list[str]], None] = lambda argv: None
        self.on_connect: Callable[[], None] = lambda: None
        # a deploy's own outcome (a launch that dies: surface.py), None: every unit starts
        self.on_deploy: Callable[[Plan], DeployResult | None] = lambda plan: None
        # the client's result file for (the deployed plan, the concurrency it ran at); None: RESULT
        self.respond: Callable[[Plan, int], str] | None = None
        self.plan: Plan | None = None  # what runs now (the last deploy that came up)
        self.concurrency = 0  # the last client run's
        self.deploy_options: list[Any] = []
        self.plans: list[Plan] = []  # every deploy's plan, in order
        self.said: list[str] = []
        monkeypatch.setattr(runner, "deploy", self.deploy)
        monkeypatch.setattr(runner, "teardown", self.teardown)
        monkeypatch.setattr(runner, "status", self.status)
        monkeypatch.setattr(runner, "connect", self.connect)
        monkeypatch.setattr(runner, "WATCH_EVERY_S", 0.05)
        # the engine hosts' NVML samplers (experiment/power.py): each GPU draws `watts` while sampled
        self.watts = 300.0
        self.samplers: list[FakeSampler] = []
        monkeypatch.setattr(power, "connect", self.connect_sampler)

    def say(self, line: str) -> None:
        self.said.append(line)

    @property
    def out(self) -> str:
        return "\n".join(self.said)

    def client_runs(self) -> list[list[str]]:
        return [c for c in self.commands if c[0] == "timeout"]

    def deploy(self, plan: Plan, opts: Any, calibration: Any = None) -> DeployResult:
        self.deployed.append(" ".join(" ".join(u.argv) for u in plan.units))
        self.plans.append(plan)
        self.deploy_options.append(opts)
        failed = self.on_deploy(plan)
        if failed is not None:
            return failed  # (what ran before stays as it was: deploy restores a failed redeploy's units)
        self.up = True
        self.plan = plan
        dep = plan.units[0].deployment
        hosts: dict[str, list[UnitOutcome] | GpudeployError] = {}
        for u in plan.units:
            hosts.setdefault(u.host.name, []).append(UnitOutcome(u, "started", True))  # type: ignore[union-attr]
        return DeployResult(hosts=hosts, deployments={dep: DeploymentOutcome(dep)})

    def teardown(self, plan: Plan, hosts: list[Host], *, purge: bool, deployments: list[str]) -> dict[str, Any]:
        if self.teardown_error is not None:
            return {h.name: self.teardown_error for h in hosts}
        self.up = False
        self.torn_down += 1
        return {h.name: [] for h in hosts}

    def status(self, plan: Plan, hosts: list[Host]) -> dict[str, Any]:
        if self.status_error is not None:
            raise self.status_error
        state = "active/running" if self.up else "inactive/dead"
        return {h.name: [UnitStatus(h.name, u.name, u.role.name, u.deployment, state, 1, None, {}, "200", True, True)
                         for u in plan.units if u.host.name == h.name] for h in hosts}

    @contextmanager
    def connect(self, host: Host) -> Iterator[FakeRemote]:
        self.on_connect()
        yield FakeRemote(self)


    @contextmanager
    def connect_sampler(self, host: Host) -> Iterator[FakeSamplerHost]:
        yield FakeSamplerHost(self)


class FakeSamplerHost:
    def __init__(self, lab: FakeLab) -> None:
        self.lab = lab

    def stream(self, argv: list[str]) -> FakeSampler:
        sampler = FakeSampler(argv, self.lab.watts)
        self.lab.samplers.append(sampler)
        return sampler


class FakeSampler:
    """power.SAMPLER as a host runs it: ready, then a sample of every GPU it was given each read."""

    def __init__(self, argv: list[str], watts: float) -> None:
        self.argv = argv
        self.gpus = argv[argv.index("-c") + 2].split(",")
        self.watts = watts
        self.ready = False
        self.closed = False
        self.beats = 0

    def settimeout(self, timeout: float | None) -> None:
        return None

    def recv(self, nbytes: int) -> bytes:
        if self.closed:
            return b""
        if not self.ready:
            self.ready = True
            return b'{"ready": true, "standin": null}\n'
        time.sleep(0.02)
        doc = {"t": time.time(), "gpus": {g: [self.watts, 50, 40 * 2**30] for g in self.gpus}}
        return (json.dumps(doc) + "\n").encode()

    def sendall(self, data: bytes) -> None:
        self.beats += 1

    def close(self) -> None:
        self.closed = True


class FakeRemote:
    def __init__(self, lab: FakeLab) -> None:
        self.lab = lab

    def run(self, argv: list[str], *, stdin: bytes | None = None, timeout: float = 60.0,
            check: bool = True) -> Result:
        self.lab.commands.append(argv)
        self.lab.on_command(argv)
        if argv[1:3] == ["-I", "-c"]:  # benchdir's script: base, prefix
            return Result(0, json.dumps({"path": f"/root/.cache/gpudeploy/bench/{argv[-1]}q7x2k9"}) + "\n", "")
        if argv[0] == "timeout":
            self.lab.concurrency = int(argv[argv.index("--max-concurrency") + 1])
        if argv[0] == "cat" and self.lab.respond is not None and self.lab.plan is not None:
            return Result(0, self.lab.respond(self.lab.plan, self.lab.concurrency), "")
        if argv[0] == "cat":
            return Result(0, RESULT, "") if self.lab.client_error is None else Result(1, "", "no such file")
        if argv[0] == "timeout" and self.lab.client_error is not None:  # the client itself
            return Result(1, "", self.lab.client_error)
        return Result(0, "", "")
