"""`gpudeploy tune` when a host fails (ssh down, a lost lock): the host failed, not the point. The
search stops and says which host and why; the trial costs no launch of the budget and the sampler is
not told the point failed; the same command again goes on with the study, that point first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
import surface
from fakelab import FakeLab
from test_search_runs import run, study

from gpudeploy.apply.deploy import UnitOutcome
from gpudeploy.apply.deployment import DeploymentOutcome, DeployResult
from gpudeploy.errors import GpudeployError, HostUnreachable
from gpudeploy.experiment import record
from gpudeploy.model import Plan


def unreachable(plan: Plan) -> DeployResult:
    """deploy's result when the decode server's host does not answer ssh (deployment._host_failed)."""
    dep = plan.units[0].deployment
    host = next(u.host.name for u in plan.units if u.role.name == "decode")
    error = HostUnreachable(host, "ssh: connect to host port 22: No route to host")
    hosts: dict[str, Any] = {host: error}
    for u in plan.units:
        if u.host.name != host:
            hosts.setdefault(u.host.name, []).append(UnitOutcome(u, "unchanged", True))
    return DeployResult(hosts=hosts, deployments={dep: DeploymentOutcome(
        dep, ok=False, failure=f"host {host} failed: {error}")})


def test_a_host_that_fails_stops_the_search_uncounted_and_the_same_command_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lab = surface.answer(FakeLab(monkeypatch))
    answers = lab.on_deploy
    lab.on_deploy = lambda plan: unreachable(plan) if len(lab.plans) == 2 else answers(plan)  # the 2nd launch
    path = surface.write(tmp_path, surface.search_file(launches=4, seed=4))
    with pytest.raises(GpudeployError) as exc:
        run(path, lab)
    first = surface.launched(lab)
    assert len(first) == 2  # stopped at once: no third launch after the host failed
    host = next(u.host.name for u in lab.plans[1].units if u.role.name == "decode")
    message = str(exc.value)
    assert f"host {host} failed" in message and "No route to host" in message, message
    assert "1 of the budget's 4 launches spent" in message and "not counted" in message, message
    assert "`invoke tune --file " in message and "goes on" in message, message
    trials = study(path).trials
    assert record.tally_of(study(path)).launches == 1
    failed = trials[1]
    # failed in the study (no values, no constraints: the sampler learns nothing of the point) and queued again
    assert failed.state == optuna.trial.TrialState.FAIL and record.info(failed)["outcome"] == "host-failed"
    assert "constraints" not in record.info(failed) and not failed.constraints
    assert trials[-1].state == optuna.trial.TrialState.WAITING
    assert trials[-1].system_attrs["fixed_params"] == failed.params

    lab.on_deploy = answers  # the host answers again
    lab.said.clear()
    result = run(path, lab)
    again = surface.launched(lab)[len(first):]
    assert result.tally.launches == 4 and len(again) == 3, (result.tally, again)  # the rest of the budget
    assert again[0] == first[1]  # the host's trial's point runs first
    assert first[0] not in again  # the finished trial is not launched again
    assert "failed" not in [record.info(t).get("outcome") for t in study(path).trials]
