"""The roll itself (roll.py decides what and where): one changed engine at a time, through its router.

Order, for each engine: the new copy's files and request -> the job's batch script starts it ->
gated like a start -> added to every router that sends to the engine, listed healthy -> the old step
out of those routers, drained -> ``scancel JOB.STEP`` of the old step, proven ended by sacct -> the
run record and the applied script. Until the old step left its routers, a failure takes the copy out
of them and cancels it by its exact id: the old step keeps serving, and the words say so.
"""

from __future__ import annotations

from ..model import Unit
from ..remote.base import Transport
from ..verify import router_api
from . import roll as r
from .job import Clock, Options, Outcome, Say, StepWatch, gate, resolve
from .plan import SlurmPlan
from .record import RunRecord


def roll(sp: SlurmPlan, login: Transport, record: RunRecord, old: str, todo: list[r.Prepared], opts: Options, say: Say,
         clock: Clock, secrets: dict[str, str]) -> Outcome:
    job = record.job
    _, new_blocks = r.blocks(sp.script)
    current = old
    for p in todo:
        t0 = clock.now()
        ok, words, record = _one(sp, login, record, p, opts, say, clock, secrets)
        if not ok:
            return Outcome(False, job, words)
        # the applied script: the running one with this engine's block now the plan's
        _, cur_blocks = r.blocks(current)
        current = current.replace(cur_blocks[p.step.name].text, new_blocks[p.step.name].text)
        login.put(r.applied_path(sp, job), current.encode(), 0o600)
        say(f"{p.step.unit.role.name} rolled in {clock.now() - t0:.1f} s: {words}")
    return Outcome(True, job, f"rolled {', '.join(p.step.unit.role.name for p in todo)} as new step(s) of job {job}")


def _one(sp: SlurmPlan, login: Transport, record: RunRecord, p: r.Prepared, opts: Options, say: Say, clock: Clock,
         secrets: dict[str, str]) -> tuple[bool, str, RunRecord]:
    job, nodes = record.job, record.nodes
    name = p.step.unit.role.name
    old_id = record.steps.get(p.step.name, "")
    old = resolve(r.live_unit(sp, p.step, record), nodes)
    copy = resolve(p.copy.unit, nodes)
    routers = [(resolve(s.unit, nodes), kind) for s, kind in r.routers_of(sp, p.step)]
    request = r.put_request(sp, login, p, secrets)
    say(f"{name}: new step {p.copy.name} requested on slot {p.step.slot} (GPUs {','.join(map(str, p.gpus))}, "
        f"{r.url_of(copy)}); old step {old_id} keeps serving")
    watch = StepWatch(step=p.copy, unit=copy, output=r.copy_output(sp, p, job))
    timeout = opts.timeout_s or p.copy.unit.role.health.timeout_s
    got = gate(sp, login, job, [watch], clock.now() + timeout, say, clock)

    joined: list[tuple[Unit, str]] = []
    left: list[tuple[Unit, str]] = []

    def give_up(why: str) -> tuple[bool, str, RunRecord]:
        for router, kind in left:  # the old step back where it was taken out
            router_api.add(router, login, r.url_of(old), kind, old.ports.get("bootstrap"))
        for router, _ in joined:
            router_api.take_out(router, login, r.url_of(copy))
        # removed before the batch script took it: it never starts; else the step is found by its name
        # (its srun may take a moment to reach slurmctld) and cancelled by its id
        taken = login.run(["rm", request], check=False, timeout=30).rc != 0
        new_id = watch.id or _find(login, job, p.copy.name, clock, FIND_S if taken else 0.0)
        if new_id:
            r.cancel_step(login, job, new_id)
            gone = r.ended(login, job, new_id, clock.now, clock.sleep)
            fate = f"new step {new_id} cancelled by its id ({gone or 'sacct does not call it ended yet'})"
        else:
            fate = ("the new step never started (its request was removed)" if not taken else
                    f"the new step's request was taken by the job but no step {p.copy.name} showed within "
                    f"{FIND_S:g} s (`gpudeploy teardown` ends the whole job)")
        return False, (f"the roll of {name} failed: {why}\n{fate}; the old step {old_id} keeps serving "
                       "in the router"), record

    if not got.ok:
        return give_up(f"the new step's gate: {got.message}")
    for router, kind in routers:
        joined.append((router, kind))
        if not router_api.add(router, login, r.url_of(copy), kind, copy.ports.get("bootstrap")):
            return give_up(f"{router.role.name} refused to add {r.url_of(copy)}")
        if router_api.wait_listed(router, login, r.url_of(copy), healthy=True, timeout_s=r.REGISTER_S) is None:
            return give_up(f"{router.role.name} did not list {r.url_of(copy)} healthy within {r.REGISTER_S:g} s")
        say(f"{name}: step {watch.id} joined {router.role.name} as a {kind} worker")
    for router, kind in routers:
        why = router_api.take_out(router, login, r.url_of(old))
        if why:
            return give_up(f"the old step could not be taken out of {router.role.name}: {why}")
        left.append((router, kind))
    drained, took = router_api.drain(old, via=login, timeout_s=old.role.health.drain_s)
    say(f"{name}: old step {old_id} left the router; " + (f"its requests finished in {took:.1f} s" if drained else
                                                          "still busy at the drain limit: cancelling it"))
    r.cancel_step(login, job, old_id)
    state = r.ended(login, job, old_id, clock.now, clock.sleep)
    record = r.commit(sp, login, record, p, watch.id)  # the copy serves alone now, whatever sacct says
    if state is None:
        return False, (f"{name}: new step {watch.id} serves in the router; the old step {old_id} was cancelled "
                       "but sacct does not call it ended yet (check `gpudeploy status`)"), record
    return True, f"new step {watch.id} serves; old step {old_id} {state} (sacct)", record


FIND_S = 5.0  # a request the batch script took -> its step in squeue -s (measured: < 1 s)


def _find(login: Transport, job: str, step_name: str, clock: Clock, timeout_s: float) -> str:
    """The step of that name in this job (a copy whose gate gave up before it was seen), waited for
    at most ``timeout_s``; "" when there is none."""
    from .job import step_ids

    deadline = clock.now() + timeout_s
    while True:
        running, acct = step_ids(login, job)
        row = running.get(step_name) or acct.get(step_name)
        if row is not None:
            return row.id
        if clock.now() >= deadline:
            return ""
        clock.sleep(0.25)
