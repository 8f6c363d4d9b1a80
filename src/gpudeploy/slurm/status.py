"""status and teardown of a Slurm deployment: the recorded job (and nothing else) as Slurm sees it
(squeue, sacct, scontrol), each step's health, and the router's view of its workers."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..controlchars import printable
from ..model import Unit
from ..remote.base import Transport
from ..verify.causes import classify, log_format
from ..verify.http import status_of
from . import queue
from .job import HEALTH_TIMEOUT_S, Clock, resolve
from .look import look
from .plan import SlurmPlan
from .record import forget, read_record
from .roll import live_steps
from .script import Step, output_file

TEARDOWN_S = 60.0  # scancel -> every step ended (measured: 0.06 s in squeue, 0.35 s in sacct)


def table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """status's table style: columns padded to their widest cell."""
    full = [head, *rows]
    widths = [max(len(r[i]) for r in full) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in full)


def status_text(sp: SlurmPlan, login: Transport) -> tuple[str, bool]:
    record = read_record(login, sp.inv.target, sp.deployment)
    if record is None:
        return f"deployment {sp.deployment}: no job recorded in {sp.inv.target.output_dir} (not deployed)", True
    seen = look(login, record.job, [])  # the job, its steps and sacct's rows: one remote command
    job, acct_all, running, acct = seen.job, seen.acct, seen.running, seen.ended()
    job_state = job.state if job is not None else acct_all[record.job].state if record.job in acct_all else "GONE"
    head = ("DEPLOYMENT", "JOB", "STEP", "NAME", "NODE", "STATE", "HEALTH", "ROUTER")
    rows: list[tuple[str, ...]] = []
    notes: list[str] = []
    ok = job is not None and job.state == "RUNNING"
    if job is not None and job.state == "PENDING":
        notes.append(f"job {record.job} pending: {job.reason} (estimated start {job.start})")
    nodes = record.nodes
    live = live_steps(sp, record)  # a rolled engine as the copy that serves (its step name, ports, output)
    asked = [s for s in live if s.name in running and len(nodes) > s.slot]
    # SGLang's /health generates a token (about 1 s): every step's at once, over the one connection
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(asked)))) as pool:
        answers = dict(zip([s.name for s in asked], pool.map(lambda s: _health(resolve(s.unit, nodes), login), asked),
                           strict=True))
    for s in live:
        row, ended = running.get(s.name), acct.get(s.name)
        step_id = record.steps.get(s.name) or (row.id if row else ended.id if ended else "-")
        state = "RUNNING" if row is not None else queue.step_death(ended) if ended is not None else "-"
        node = row.node if row is not None else ended.node if ended is not None else "-"
        health, router = answers.get(s.name, ("-", "-"))
        if health != "ok":
            ok = False
        if row is None and ended is not None:
            notes.append(ended_note(login, s, ended, record.job, sp))
        rows.append((sp.deployment, record.job, step_id, s.name, node, state, health, router))
    text = f"job {record.job} {job_state}" + (f" on {job.nodelist}" if job is not None and job.nodelist else "")
    return printable("\n".join([text, table(head, rows), *notes]), lines=True), ok


def _health(unit: Unit, login: Transport) -> tuple[str, str]:
    """A running step's health word, and a router's view of its workers."""
    code = status_of(unit.health_url, HEALTH_TIMEOUT_S, via=login)
    health = "ok" if code == 200 else f"HTTP {code}" if code is not None else "no answer"
    router = router_view(unit, login) if unit.role.engine == "sglang_router" and code == 200 else "-"
    return health, router


def ended_note(login: Transport, step: Step, ended: queue.StepRow, job: str, sp: SlurmPlan) -> str:
    """An ended step, with the cause its own output file shows (the cause table of the gate)."""
    path = output_file(sp.inv.target, step.unit, job)
    fmt = log_format(step.unit.role.log_format)
    lines = login.run(["tail", "-n", str(fmt.journal_lines), path], check=False, timeout=30).stdout.splitlines()
    death = queue.step_death(ended)
    cause = classify(lines, step.unit.role.settings, exited=True, exit_status=death, fmt=fmt)
    text = f"step {ended.id} {step.name}: {death}; its output: {path}"
    return text + (f"\n{cause.render()}" if cause is not None else "")


def router_view(router: Unit, login: Transport) -> str:
    from ..verify.router_api import workers

    listed = workers(router, login)
    if listed is None:
        return "workers unknown"
    return f"{sum(1 for w in listed if w.healthy)}/{len(listed)} workers healthy"


@dataclass(frozen=True)
class Teardown:
    job: str
    clean: bool
    words: str


def teardown(sp: SlurmPlan, login: Transport, clock: Clock | None = None,
             say: Callable[[str], None] = print) -> Teardown:
    """scancel the recorded job (by id: another deployment's job is never touched), then prove that it
    and every step ended (sacct), it holds no node (hence no GPU) and so no step process Slurm tracks."""
    clock = clock or Clock()
    record = read_record(login, sp.inv.target, sp.deployment)
    if record is None:
        return Teardown("", True, f"deployment {sp.deployment}: no job recorded (nothing deployed)")
    job = record.job
    login.run(["scancel", job], check=False, timeout=30)
    say(f"scancel {job} (deployment {sp.deployment}'s job)")
    deadline = clock.now() + TEARDOWN_S
    while True:
        left = _left(login, job)
        if not left or clock.now() >= deadline:
            break
        clock.sleep(0.25)
    if left:
        return Teardown(job, False, f"job {job}: NOT CLEAN after {TEARDOWN_S:g} s: {'; '.join(left)}")
    forget(login, sp.inv.target, sp.deployment)
    return Teardown(job, True, f"job {job}: every step ended (sacct), the job holds no node or GPU (squeue)")


def _left(login: Transport, job: str) -> list[str]:
    """What of the job is still there: its squeue line (COMPLETING still holds the nodes and their
    GPUs), steps sacct does not call ended. (``scontrol listpids`` answers only on the step's own
    node, which gpudeploy does not reach: Slurm's word is the proof here.)"""
    out: list[str] = []
    state = queue.parse_job(login.run(queue.job_argv(job), check=False, timeout=30).stdout)
    if state is not None:
        out.append(f"squeue lists it {state.state}")
    got = login.run(queue.sacct_argv(job), check=False, timeout=30)
    if got.rc == 0:
        live = [f"{r.id} {r.state}" for r in queue.parse_sacct(got.stdout).values() if not queue.terminal(r.state)]
        if live:
            out.append("sacct: " + ", ".join(live))
    return out
