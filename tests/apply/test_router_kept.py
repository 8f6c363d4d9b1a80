"""A plain restart of a changed engine (a tune trial, rolling off) keeps its router and the unchanged
engines running: the engine leaves the router before it stops and joins again once ready (issue 47:
a prefill-only change restarted the router too)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_roll_failures import Remote, Supervisor, active, by, make_plan

from gpudeploy.apply import deploy as d
from gpudeploy.apply import deployment, preflight, probe_stages, rejoin, surges
from gpudeploy.apply.deploy import UnitOutcome
from gpudeploy.fanout import Cancel
from gpudeploy.model import Plan, Unit
from gpudeploy.verify import router_api, smoke
from gpudeploy.verify.http import Response


class States(Supervisor):
    def __init__(self, units: list[Unit]) -> None:
        super().__init__()
        self.units = units

    def states(self, facts: Any) -> Any:
        return active(self.units)


def redeploy(monkeypatch: pytest.MonkeyPatch, plan: Plan, changed: set[str],
             workers: Any) -> tuple[list[str], list[str], deployment.DeployResult, dict[str, UnitOutcome]]:
    """Redeploy ``plan`` (rolling off) onto a host where every unit runs healthy and only the roles in
    ``changed`` have other files than the plan's; the units started, and the router API calls made."""
    units = list(plan.units)
    h = plan.inventory.hosts["n1"]
    files = {u.name: {u.unit_path: (b"new " + u.name.encode(), 0o644)} for u in units}
    on_host = {u.unit_path: d.file_hashes({u.unit_path: (b"new " + u.name.encode() if u.role.name not in changed
                                                         else b"old", 0o644)})[u.unit_path] for u in units}
    s = deployment.HostSession(h, Remote(h), States(units), units,  # type: ignore[arg-type]
                               facts={"files": on_host, "http": {u.name: {"status": 200} for u in units}})
    monkeypatch.setattr(deployment, "for_host", lambda host, facts: s.supervisor)
    monkeypatch.setattr(deployment, "desired_files", lambda u, *a: files[u.name])
    monkeypatch.setattr(probe_stages, "complete", lambda facts: True)
    monkeypatch.setattr(preflight, "problems", lambda *a, **kw: [])
    monkeypatch.setattr(preflight, "warnings", lambda *a: [])
    monkeypatch.setattr(surges, "put_away", lambda *a: [])
    monkeypatch.setattr(surges, "left", lambda *a: [])
    started: list[str] = []

    def gate(remote: Any, sup: Any, us: list[Unit], *a: Any, **kw: Any) -> list[UnitOutcome]:
        started.extend(u.role.name for u in us)
        return [UnitOutcome(u, "restarted", True, 300) for u in us]

    monkeypatch.setattr(deployment, "start_and_gate", gate)
    monkeypatch.setattr(smoke, "smoke_test", lambda *a, **kw: smoke.SmokeResult(True, "/generate", "ok", 0.1, 0.2, ""))
    asked: list[str] = []

    def request(url: str, *, timeout: float, via: Any = None, body: Any = None, method: str | None = None) -> Any:
        verb = method or ("POST" if body is not None else "GET")
        asked.append(f"{verb} {url.split(':', 2)[2].split('/', 1)[1]}")
        return workers(verb, url, body)

    monkeypatch.setattr(router_api, "request", request)
    result = deployment.DeployResult({}, {"pd": deployment.DeploymentOutcome("pd")})
    outcomes: dict[str, UnitOutcome] = {}
    deployment._run(plan, {"n1": s}, units, {}, None, d.Options(rolling="never"), Cancel(),  # type: ignore[arg-type]
                    result, outcomes)
    return started, asked, result, outcomes


class Router:
    """The real router's worker API as far as this needs it (router_api.py): the prefill listed, taken
    out, added again and listed healthy."""

    def __init__(self, pre_url: str, answers: bool = True) -> None:
        self.listed = {"w1": pre_url}
        self.answers = answers

    def __call__(self, verb: str, url: str, body: Any) -> Response | None:
        if not self.answers:
            return None
        if verb == "DELETE":
            self.listed.pop(url.rsplit("/", 1)[1], None)
            return Response(202, b"{}")
        if verb == "POST":
            self.listed["w2"] = body["url"]
            return Response(202, b'{"worker_id": "w2"}')
        items = ",".join(f'{{"id": "{i}", "url": "{u}", "worker_type": "prefill", "is_healthy": true}}'
                         for i, u in self.listed.items())
        return Response(200, f'{{"workers": [{items}]}}'.encode())


def test_a_prefill_only_change_restarts_prefill_alone_and_it_rejoins_the_running_router(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    plan = make_plan(tmp_path, {"n1": {"address": "192.0.2.1", "roles": ["pre", "dec", "rt"]}})
    pre = by(plan, "pre")
    router = Router(rejoin.url_of(pre))
    started, asked, result, outcomes = redeploy(monkeypatch, plan, {"pre"}, router)
    assert result.deployments["pd"].ok, result.deployments["pd"].failure
    assert started == ["pre"]  # decode and the router keep running
    assert outcomes[by(plan, "dec").key].action == outcomes[by(plan, "rt").key].action == "unchanged"
    # out of the router before it stopped, back in (with its bootstrap port) once ready
    assert asked.index("DELETE workers/w1") < asked.index("POST workers")
    assert router.listed == {"w2": rejoin.url_of(pre)}


def test_a_router_that_does_not_answer_its_worker_api_is_restarted_after_its_engines(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    plan = make_plan(tmp_path, {"n1": {"address": "192.0.2.1", "roles": ["pre", "dec", "rt"]}})
    monkeypatch.setattr(rejoin, "LEAVE_S", 0.0)
    started, _, result, _ = redeploy(monkeypatch, plan, {"pre"}, Router("", answers=False))
    assert result.deployments["pd"].ok, result.deployments["pd"].failure
    assert started == ["pre", "rt"]  # its view of the restarted prefill would be stale


def test_only_routers_that_do_not_restart_and_front_a_restarting_engine_are_kept(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, {"n1": {"address": "192.0.2.1", "roles": ["pre", "dec", "rt"]}})
    units = list(plan.units)
    pre, dec, rt = by(plan, "pre"), by(plan, "dec"), by(plan, "rt")
    [kept] = rejoin.kept_routers(units, {pre.key})
    assert kept.router == rt and kept.engines == ((pre, "prefill"),)
    assert rejoin.kept_routers(units, {pre.key, rt.key}) == []  # the router restarts itself
    assert rejoin.kept_routers(units, set()) == []  # nothing restarts
    assert {e.key: k for e, k in rejoin.kept_routers(units, {pre.key, dec.key})[0].engines} == {pre.key: "prefill",
                                                                                     dec.key: "decode"}
