"""A roll that meets a router that does not answer, a host of another deployment, a failure after its
engines were replaced, or Ctrl-C in the middle of one engine (issue 43, items 4, 5, 6 and 8)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpudeploy.apply import deploy as d
from gpudeploy.apply import deployment, rolling
from gpudeploy.apply.deploy import UnitOutcome
from gpudeploy.fanout import Cancel, Interrupted
from gpudeploy.model import Plan, Unit
from gpudeploy.plan import load_plan
from gpudeploy.remote.base import Result
from gpudeploy.supervisor.base import UnitState
from gpudeploy.verify import router_api
from gpudeploy.verify.http import Response

NUMA = [{"id": 0, "gpus": [0, 1, 2, 3], "cpus": "0-31"}, {"id": 1, "gpus": [4, 5, 6, 7], "cpus": "32-63"}]
ROLES = {
    "pre": {"engine": "sglang", "tp_size": 2, "model": {"path": "/models/a"},
            "settings": {"disaggregation_mode": "prefill"}},
    "dec": {"engine": "sglang", "tp_size": 2, "model": {"path": "/models/a"},
            "settings": {"disaggregation_mode": "decode"}},
    "rt": {"engine": "sglang_router", "upstreams": {"prefill": ["pre"], "decode": ["dec"]}},
}


def make_plan(root: Path, hosts: dict[str, dict[str, Any]]) -> Plan:
    (root / "roles").mkdir(parents=True, exist_ok=True)
    for name, role in ROLES.items():
        (root / "roles" / f"{name}.yml").write_text(yaml.safe_dump(role))
    inv = {"deployment": "pd", "roles_dir": "roles",
           "defaults": {"gpu_memory_gib": 96, "engine_versions": {"sglang": "0.5.23", "sglang_router": "0.3.2"}},
           "hosts": {name: {"numa_nodes": NUMA, **h} for name, h in hosts.items()}}
    (root / "hosts.yml").write_text(yaml.safe_dump(inv))
    return load_plan(str(root / "hosts.yml"), memory=False)


class Remote:
    """A host that records what reached it: files put, commands run."""

    def __init__(self, host: Any) -> None:
        self.host = host
        self.put_paths: list[str] = []
        self.ran: list[list[str]] = []

    def put(self, path: str, data: bytes, mode: int = 0o644) -> None:
        self.put_paths.append(path)

    def run(self, argv: list[str], **kw: Any) -> Result:
        self.ran.append(argv)
        return Result(0, "old contents\n", "")


class Supervisor:
    name = "systemd"

    def __init__(self) -> None:
        self.stopped: list[str] = []

    def stop(self, remote: Any, names: list[str], timeout: float) -> None:
        self.stopped += names

    def installed(self, remote: Any) -> None:
        pass

    def forget(self, remote: Any, names: list[str]) -> None:
        pass


def active(units: list[Unit]) -> dict[str, UnitState]:
    return {u.name: UnitState(u.name, True, "active", "running", 100, "inv", False, "") for u in units}


def session(plan: Plan, host: str) -> rolling.Session:
    h = plan.inventory.hosts[host]
    mine = [u for u in plan.units if u.host.name == host]
    return rolling.Session(h, Remote(h), Supervisor(), {"listening": {}, "gpus": {}},  # type: ignore[arg-type]
                           active(mine))


def by(plan: Plan, role: str) -> Unit:
    return next(u for u in plan.units if u.role.name == role)


# -- item 4: the router's answers ---------------------------------------------------------------

def answering(monkeypatch: pytest.MonkeyPatch, answers: dict[str, Response | None]) -> list[str]:
    """router_api's HTTP: ``answers`` by "METHOD path" (a missing one: None, as a timeout)."""
    asked: list[str] = []

    def request(url: str, *, timeout: float, via: Any = None, body: Any = None, method: str | None = None) -> Any:
        verb = method or ("POST" if body is not None else "GET")
        key = f"{verb} {url.split(':', 2)[2].split('/', 1)[1]}"
        asked.append(key)
        return answers.get(key)

    monkeypatch.setattr(router_api, "request", request)
    return asked


def test_take_out_says_why_when_the_router_does_not_answer_or_refuses(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    plan = make_plan(tmp_path, {"n1": {"address": "192.0.2.1", "roles": ["pre", "dec", "rt"]}})
    router = by(plan, "rt")
    listed = Response(200, b'{"workers": [{"id": "w1", "url": "http://192.0.2.1:30000", "worker_type": "prefill"}]}')
    answering(monkeypatch, {"GET workers": Response(503, b"")})
    assert "did not answer GET /workers" in router_api.take_out(router, None, "http://192.0.2.1:30000",  # type: ignore[arg-type]
                                                                timeout_s=0.2, every_s=0.05)
    answering(monkeypatch, {"GET workers": listed, "DELETE workers/w1": Response(500, b"")})
    assert "did not accept DELETE /workers/w1" in router_api.take_out(router, None,  # type: ignore[arg-type]
                                                                      "http://192.0.2.1:30000", timeout_s=0.2)
    answering(monkeypatch, {"GET workers": listed, "DELETE workers/w1": Response(202, b"")})
    assert "still lists" in router_api.take_out(router, None, "http://192.0.2.1:30000",  # type: ignore[arg-type]
                                                timeout_s=0.2, every_s=0.05)


def test_an_engine_the_router_did_not_let_go_of_is_not_stopped(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    plan = make_plan(tmp_path, {"n1": {"address": "192.0.2.1", "roles": ["pre", "dec", "rt"]}})
    pre, router = by(plan, "pre"), by(plan, "rt")
    s = session(plan, "n1")
    surge = rolling.surge_unit(plan, pre, s.host, (4, 5))
    monkeypatch.setattr(rolling, "desired_files", lambda *a: {"/etc/x.service": (b"new", 0o644)})
    monkeypatch.setattr(rolling, "start_and_gate", lambda remote, sup, units, *a, **kw: [
        UnitOutcome(units[0], "started", True, 200)])
    monkeypatch.setattr(rolling, "_join", lambda *a: True)
    answering(monkeypatch, {})  # GET /workers times out, every time
    monkeypatch.setattr(router_api, "take_out", lambda *a, **kw: "the router did not answer GET /workers within 30 s")
    out = rolling.Roll("pd")
    ok = rolling._one(plan, pre, surge, router, s.remote, "prefill", {"n1": s}, {pre.name: {}}, {}, None,
                      d.Options(), Cancel(), out)
    assert not ok and pre.name not in s.supervisor.stopped  # type: ignore[attr-defined]
    assert "could not be taken out of the router (the router did not answer GET /workers" in out.failure
    assert "so it was not stopped" in out.failure


# -- item 5: a surge copy only on its own deployment's hosts ----------------------------------

def test_a_surge_copy_never_lands_on_a_host_of_another_deployment(tmp_path: Path) -> None:
    # pd fills its own host (TP4 + TP4); n2 belongs to another deployment and has room.
    roles = {**ROLES, "pre": {**ROLES["pre"], "tp_size": 4}, "dec": {**ROLES["dec"], "tp_size": 4}}
    (tmp_path / "roles").mkdir()
    for name, role in roles.items():
        (tmp_path / "roles" / f"{name}.yml").write_text(yaml.safe_dump(role))
    (tmp_path / "roles" / "other.yml").write_text(yaml.safe_dump({"engine": "command", "gpus": 1,
                                                                  "argv": ["/bin/true"]}))
    inv = {"roles_dir": "roles",
           "defaults": {"gpu_memory_gib": 96, "engine_versions": {"sglang": "0.5.23", "sglang_router": "0.3.2"}},
           "hosts": {"n1": {"address": "192.0.2.1", "deployment": "pd", "numa_nodes": NUMA,
                            "roles": ["pre", "dec", "rt"]},
                     "n2": {"address": "192.0.2.2", "deployment": "other", "numa_nodes": NUMA, "roles": ["other"]}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inv))
    plan = load_plan(str(tmp_path / "hosts.yml"), memory=False)
    mine = [u for u in plan.units if u.deployment == "pd"]
    surge, why = rolling.room(plan, by(plan, "dec"), {"n1": session(plan, "n1"), "n2": session(plan, "n2")}, mine)
    assert surge is None and "n1 has no 4 spare GPUs" in why and "n2" not in why


# -- item 6: a failure after the engines were replaced puts back what served ------------------

def test_a_roll_whose_smoke_fails_after_its_engines_were_replaced_restores_them(monkeypatch: pytest.MonkeyPatch,
                                                                               tmp_path: Path) -> None:
    import gpudeploy.verify.smoke as smoke

    plan = make_plan(tmp_path, {"n1": {"address": "192.0.2.1", "roles": ["pre", "dec", "rt"]}})
    units = list(plan.units)
    s = session(plan, "n1")
    pre, dec = by(plan, "pre"), by(plan, "dec")

    def one(plan: Plan, e: Unit, surge: Unit, router: Unit, via: Any, kind: str, sessions: Any, files: Any,
            *a: Any) -> bool:
        out = a[-1]
        out.previous[e.key] = {f"/etc/systemd/system/{e.name}.service": (b"OLD " + e.name.encode(), 0o644)}
        return True

    monkeypatch.setattr(rolling, "_one", one)
    failed = smoke.SmokeResult(False, "/generate", "", None, 0.1, "500")
    monkeypatch.setattr(smoke, "smoke_test", lambda *a, **kw: failed)
    started: list[tuple[str, bytes]] = []

    def gate(remote: Any, sup: Any, us: list[Unit], files: dict[str, Any], *a: Any, **kw: Any) -> list[UnitOutcome]:
        started.extend((u.name, next(iter(files[u.name].values()))[0]) for u in us)
        return [UnitOutcome(u, "restarted", True, 300) for u in us]

    import gpudeploy.apply.roll_back as roll_back

    monkeypatch.setattr(roll_back, "start_and_gate", gate)
    files = {u.name: {f"/etc/systemd/system/{u.name}.service": (b"NEW", 0o644)} for u in units}
    out = rolling.roll(plan, units, [pre, dec], {"n1": s}, files, {}, None, d.Options(), Cancel())
    assert not out.ok and "the smoke generation through n1/rt failed after the roll" in out.failure
    # engines back on the files they ran from, then the router restarted (its view of them is stale)
    assert started == [(pre.name, b"OLD " + pre.name.encode()), (dec.name, b"OLD " + dec.name.encode()),
                       (by(plan, "rt").name, b"NEW")]
    assert out.restored == ["n1/pre (healthy again)", "n1/dec (healthy again)", "n1/rt (healthy again)"]


# -- item 8: Ctrl-C in the middle of one engine's roll -----------------------------------------

def test_ctrl_c_in_one_engines_roll_says_where_that_engine_stands(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    plan = make_plan(tmp_path, {"n1": {"address": "192.0.2.1", "roles": ["pre", "dec", "rt"]}})
    units = list(plan.units)
    pre, dec = by(plan, "pre"), by(plan, "dec")
    states = active(units)
    h = plan.inventory.hosts["n1"]
    hs = deployment.HostSession(h, Remote(h), Supervisor(), units,  # type: ignore[arg-type]
                                files={u.name: {u.unit_path: (b"new", 0o644)} for u in units},
                                facts={"files": {}}, states=states, healthy={u.name: True for u in units})

    def roll(plan: Plan, units: list[Unit], changed: list[Unit], *a: Any) -> Any:
        r = rolling.Roll("pd")
        r.stage[pre.key] = "starting on its new files, out of the router (its new copy serves in its place)"
        r.outcomes.append(UnitOutcome(pre, "interrupted", False, 4242))
        raise rolling.RollInterrupted(r)

    monkeypatch.setattr(rolling, "room", lambda *a: (pre, ""))
    monkeypatch.setattr(deployment.pair_roll, "crossings", lambda *a: [])
    monkeypatch.setattr(rolling, "roll", roll)
    result = deployment.DeployResult({}, {"pd": deployment.DeploymentOutcome("pd")})
    outcomes: dict[str, UnitOutcome] = {}
    with pytest.raises(Interrupted):
        deployment._roll_serving(plan, {"n1": hs}, units, {}, None, d.Options(), Cancel(), result,  # type: ignore[arg-type]
                                 outcomes, set())
    assert outcomes[pre.key].main_pid == 4242  # its new run's PID, not the old one's (100)
    assert "its roll was interrupted (Ctrl-C): starting on its new files" in outcomes[pre.key].message
    assert outcomes[dec.key].message == "not rolled (Ctrl-C): still on its old files"
