"""A changed engine of a running Slurm deployment rolls as a new step of the same job (slurm/roll.py,
rollout.py): where its slot has room (GPUs no running step holds, a CPU for an --exact step), through
its router, the old step cancelled by its exact id; else "no room" as before. The request file the
job's batch script starts is rendered like its srun lines, every word literal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from slurm_fakes import FakeLogin, Ticks, inventory, run_batch_script, write_plan

from gpudeploy.slurm import job as jobmod
from gpudeploy.slurm.job import Options, deploy
from gpudeploy.slurm.plan import SlurmPlan
from gpudeploy.slurm.roll import changed_engines, request_text, room, used_gpus
from gpudeploy.slurm.script import step_of
from gpudeploy.verify import router_api

HOSTILE = "a'b\"c $(touch PWNED) `touch PWNED` ${HOME} ; touch PWNED"
HOSTS = """\
  node0:
    numa_nodes: [{id: 0, gpus: [0, 1, 2, 3], cpus: "0"}, {id: 1, gpus: [4, 5, 6, 7], cpus: "1"}]
    roles: [{role: a, numa_node: 0}, r]
"""
ENGINE = """\
engine: command
gpus: %d
ports: {http: 9000}
argv: ["/bin/server", "--port", "{{ port }}", "--max", "%s"]
health: {timeout_s: 5}
"""
ROUTER = """\
engine: sglang_router
upstreams: {workers: [a]}
settings: {policy: %s}
health: {timeout_s: 5}
"""


def plan(tmp_path: Path, *, max_: str = "128", gpus: int = 2, policy: str = "round_robin",
         time: str = "00:30:00", out: str = "/shared/gd") -> SlurmPlan:
    versions = '  engine_versions: {sglang: "0.5.23", sglang_router: "0.3.2"}\n'
    return write_plan(tmp_path, inventory(HOSTS, time=time, output_dir=out, defaults=versions),
                      {"a": ENGINE % (gpus, max_.replace("\\", "\\\\").replace('"', '\\"')), "r": ROUTER % policy})


def test_room_is_free_gpus_of_the_slot_and_a_cpu_for_an_exact_step(tmp_path: Path) -> None:
    old = plan(tmp_path)
    new = plan(tmp_path, max_="64")
    [a] = [s for s in new.steps if s.unit.role.name == "a"]
    from gpudeploy.slurm.record import RunRecord

    used = used_gpus(new, old.script, RunRecord(job="7", deployment="t1", submitted_at=0))
    assert used == {0: {0, 1}}  # the running script's GPUs: a's; the router holds none
    assert room(new, a, used, 2) == ((2, 3), "")
    # a rolled step's own GPUs count, not the script's
    rolled = RunRecord(job="7", deployment="t1", submitted_at=0, generations={a.name: 1}, gpus={a.name: [6, 7]})
    assert used_gpus(new, old.script, rolled) == {0: {6, 7}}
    gpus, why = room(new, a, {0: {0, 1, 2, 3, 4, 5, 6}}, 2)
    assert gpus == () and why == ("no room for a new copy of a: needs 2 free GPU(s) on slot 0 (node0): 1 free, "
                                  "GPUs 0,1,2,3,4,5,6 held by running steps")
    gpus, why = room(new, a, used, 1)
    assert gpus == () and why == ("no room for a new copy of a: needs a CPU for a new --exact step on slot 0: the "
                                  "node has 1, 1 held by engine steps")


def test_only_engines_roll(tmp_path: Path) -> None:
    old = plan(tmp_path)
    changed, why = changed_engines(plan(tmp_path, max_="64"), old.script)
    assert [s.unit.role.name for s in changed] == ["a"] and why == ""
    assert changed_engines(plan(tmp_path, policy="random"), old.script)[1].startswith("r changed: only engines roll")
    assert changed_engines(plan(tmp_path, time="01:00:00"), old.script)[1].startswith("the job's own settings")
    before = old.script[:old.script.index("gpudeploy_requests=")] + "wait\n"  # a job of an older gpudeploy
    assert "starts no new steps" in changed_engines(plan(tmp_path, max_="64"), before)[1]


def test_the_batch_script_starts_a_request_once_with_literal_words_and_ends(tmp_path: Path) -> None:
    """A request put in the deployment's requests folder is started by the job's batch script as an
    srun like its own (the slot's node filled in, a hostile argument one literal word), moved aside,
    and the script ends once no step it started runs."""
    out = tmp_path / "out"
    sp = plan(tmp_path, max_=HOSTILE, out=str(out))
    [a] = [s for s in sp.steps if s.unit.role.name == "a"]
    copy = step_of(sp.inv.target, a.unit, 0)
    requests = out / "t1" / "requests"
    requests.mkdir(parents=True)
    (requests / "x.step").write_text(request_text(copy, "a generation 1 on slot 0, GPUs 2,3"))
    calls = run_batch_script(sp.script, tmp_path, ["slurmn1"], "slurmn1")
    names = sorted(c[c.index("-J") + 1] for c in calls)
    assert names == ["gpudeploy-t1.a", "gpudeploy-t1.a", "gpudeploy-t1.r"]  # the request ran once
    assert sorted(p.name for p in requests.iterdir()) == ["x.step.started"]
    for c in calls:
        if "--nodelist=slurmn1" in c and "/bin/server" in c:
            assert c[-4:] == ["--port", "9000", "--max", HOSTILE]
    assert not list(tmp_path.rglob("PWNED"))


OLD_ID, NEW_ID = "7.0", "7.2"


class Cluster:
    """The login node of a running job 7 (a as 7.0, the router as 7.1) that starts a request as 7.2."""

    def __init__(self, old: SlurmPlan, fail_take_out: bool = False, new_dies: bool = False) -> None:
        self.events: list[str] = []
        self.cancelled: set[str] = set()
        self.new_dies = new_dies
        self.fail_take_out = fail_take_out
        rec = {"job": "7", "deployment": "t1", "submitted_at": 0, "nodes": ["slurmn1"],
               "steps": {"gpudeploy-t1.a": OLD_ID, "gpudeploy-t1.r": "7.1"}}
        self.login = FakeLogin(self.answer)
        self.login.files["/shared/gd/t1/run.json"] = json.dumps(rec).encode()
        self.old_script = old.script
        self.polls = 0

    def requested(self) -> bool:
        return any(p.startswith("/shared/gd/t1/requests/") for p in self.login.files)

    def answer(self, argv: list[str]) -> tuple[int, str]:
        if argv[:3] == ["scontrol", "write", "batch_script"]:
            return 0, self.old_script
        if argv[:3] == ["scontrol", "-o", "show"]:
            return 0, "NodeName=slurmn1 Arch=x86_64 CoresPerSocket=1 CPUAlloc=2 CPUTot=2 CPULoad=0.1\n"
        if argv[0] == "scancel":
            self.events.append(" ".join(argv))
            self.cancelled.add(argv[1])
            return 0, ""
        if argv[0] == "squeue" and "-s" in argv:
            self.polls += 1
            rows = [f"{OLD_ID}|gpudeploy-t1.a|slurmn1", "7.1|gpudeploy-t1.r|slurmn1"]
            if self.requested() and NEW_ID not in self.cancelled and not (self.new_dies and self.polls > 2):
                rows.append(f"{NEW_ID}|gpudeploy-t1.a-g1|slurmn1")
            return 0, "\n".join(r for r in rows if r.split("|")[0] not in self.cancelled) + "\n"
        if argv[0] == "squeue":
            return 0, "RUNNING|None|x|slurmn1\n"
        if argv[0] == "sacct":
            rows = [f"{i}|x|CANCELLED by 0|0:15|slurmn1" for i in sorted(self.cancelled)]
            if self.new_dies and self.polls > 2:
                rows.append(f"{NEW_ID}|gpudeploy-t1.a-g1|FAILED|1:0|slurmn1")
            return 0, "\n".join(rows) + "\n"
        return 1, ""


@pytest.fixture
def routed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The router's side: every call, in order."""
    events: list[str] = []
    monkeypatch.setattr(jobmod, "status_of", lambda *a, **k: 200)
    monkeypatch.setattr(router_api, "add", lambda r, v, url, kind, b: events.append(f"add {url} {kind}") or "w1")
    monkeypatch.setattr(router_api, "wait_listed",
                        lambda r, v, url, **k: events.append(f"listed {url}") or router_api.Worker("w1", url, "", True))
    monkeypatch.setattr(router_api, "drain", lambda e, via, timeout_s: (events.append("drain") or True, 0.0))
    return events


def test_a_roll_starts_the_copy_routes_to_it_then_cancels_the_old_step_by_id(
        tmp_path: Path, routed: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    c = Cluster(plan(tmp_path))
    monkeypatch.setattr(router_api, "take_out", lambda r, v, url, **k: routed.append(f"out {url}") or "")
    said: list[str] = []
    out = deploy(plan(tmp_path, max_="64"), c.login, Options(), said.append, clock=Ticks())  # type: ignore[arg-type]
    assert out.ok, out.message
    # the copy: its own request, env file (its GPUs), ports; started by the job, not by this session
    request = c.login.files["/shared/gd/t1/requests/gpudeploy-t1.a-g1.step"].decode()
    assert "exec srun --exact" in request and "-J gpudeploy-t1.a-g1" in request and "'--max' '64'" not in request
    assert "/bin/server --port 10000 --max 64" in request
    assert "CUDA_VISIBLE_DEVICES=2,3" in c.login.files["/shared/gd/t1/t1.a-g1.env"].decode()
    # the order: in the router, the old one out and drained, only then cancelled by its exact id
    assert routed == ["add http://slurmn1:10000 regular", "listed http://slurmn1:10000", "out http://slurmn1:9000",
                      "drain"]
    assert c.events == [f"scancel {OLD_ID}"]
    rec = json.loads(c.login.files["/shared/gd/t1/run.json"])
    assert rec["steps"]["gpudeploy-t1.a"] == NEW_ID and rec["generations"] == {"gpudeploy-t1.a": 1}
    assert rec["gpus"] == {"gpudeploy-t1.a": [2, 3]}
    # the next deploy of the same plan finds nothing to change
    said.clear()
    again = deploy(plan(tmp_path, max_="64"), c.login, Options(), said.append, clock=Ticks())  # type: ignore[arg-type]
    assert again.message == "up to date"


def test_a_failed_roll_cancels_the_copy_by_id_and_leaves_the_old_step_serving(
        tmp_path: Path, routed: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    c = Cluster(plan(tmp_path))
    monkeypatch.setattr(router_api, "take_out",
                        lambda r, v, url, **k: routed.append(f"out {url}") or ("refused" if ":9000" in url else ""))
    before = c.login.files["/shared/gd/t1/run.json"]
    out = deploy(plan(tmp_path, max_="64"), c.login, Options(), lambda s: None, clock=Ticks())  # type: ignore[arg-type]
    assert not out.ok
    assert "the old step could not be taken out of r: refused" in out.message
    assert f"new step {NEW_ID} cancelled by its id" in out.message
    assert f"the old step {OLD_ID} keeps serving in the router" in out.message
    assert c.events == [f"scancel {NEW_ID}"]  # never the old step, never the job
    assert routed[-1] == "out http://slurmn1:10000"  # the copy left the router first
    assert c.login.files["/shared/gd/t1/run.json"] == before


def test_a_copy_that_dies_in_its_gate_never_reaches_the_router(
        tmp_path: Path, routed: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobmod, "status_of", lambda *a, **k: None)
    c = Cluster(plan(tmp_path), new_dies=True)
    out = deploy(plan(tmp_path, max_="64"), c.login, Options(), lambda s: None, clock=Ticks())  # type: ignore[arg-type]
    assert not out.ok
    assert f"step {NEW_ID} gpudeploy-t1.a-g1 of job 7 on slurmn1: FAILED: exit code 1" in out.message
    assert f"the old step {OLD_ID} keeps serving" in out.message
    assert routed == []
    assert c.events == [f"scancel {NEW_ID}"]


def test_no_room_is_refused_as_before_naming_what_is_missing(tmp_path: Path) -> None:
    c2 = Cluster(plan(tmp_path, gpus=4))
    c2.old_script = c2.old_script.replace("GPUs 0,1,2,3;", "GPUs 0,1,2,3,4,5,6,7;")  # a running script holding all 8
    out = deploy(plan(tmp_path, gpus=4, max_="64"), c2.login, Options(), lambda s: None,  # type: ignore[arg-type]
                 clock=Ticks())
    assert not out.ok and out.message.startswith("no room: deployment t1 runs as job 7")
    assert "needs 4 free GPU(s) on slot 0 (node0): 0 free" in out.message, out.message
    assert "teardown` then `gpudeploy deploy`" in out.message
    assert not any(a[0] == "scancel" for a in c2.login.ran)


def test_status_follows_the_record_to_the_rolled_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a roll, status shows the copy's step (its name, id) and asks the copy's port for health."""
    from gpudeploy.slurm import status as statusmod

    asked: list[str] = []
    monkeypatch.setattr(statusmod, "status_of", lambda url, *a, **k: asked.append(url) or 200)
    monkeypatch.setattr(statusmod, "router_view", lambda *a: "1/1 workers healthy")
    sp = plan(tmp_path, max_="64")
    c = Cluster(sp)
    rec = json.loads(c.login.files["/shared/gd/t1/run.json"])
    rec.update(steps={"gpudeploy-t1.a": NEW_ID, "gpudeploy-t1.r": "7.1"}, generations={"gpudeploy-t1.a": 1},
               gpus={"gpudeploy-t1.a": [2, 3]})
    c.login.files["/shared/gd/t1/run.json"] = json.dumps(rec).encode()
    c.login.files["/shared/gd/t1/requests/gpudeploy-t1.a-g1.step"] = b""  # the copy runs as 7.2
    c.cancelled.add(OLD_ID)
    text, ok = statusmod.status_text(sp, c.login)  # type: ignore[arg-type]
    assert ok, text
    rows = {line.split()[3]: line.split() for line in text.splitlines()[2:]}
    assert rows["gpudeploy-t1.a-g1"][2:6] == [NEW_ID, "gpudeploy-t1.a-g1", "slurmn1", "RUNNING"], text
    assert "http://slurmn1:10000/health" in asked and "http://slurmn1:9000/health" not in asked
