"""Deploy, status and teardown of a Slurm deployment, through its login node over SSH.

deploy: upload the steps' environment files (0600) and the batch script into the deployment's
folder of output_dir, ``sbatch`` it, and keep the job id in the run record at once. While the job
pends, Slurm's reason and estimated start are said (not waited out silently); at the timeout it is
given up with that reason and that job id alone is cancelled. Once it runs, each step's id is found
by its name (step numbers follow no script order) and recorded; then the gate, as for units: each
step's /health through its node's address (asked by the login node), its own output file read from
its start (the name carries the job id: never a stale run's), the same cause table, and a step that
ends (sacct: FAILED, CANCELLED...) named with its cause at the next poll; a PD router's smoke
generation last.
"""

from __future__ import annotations

import difflib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ..errors import GpudeployError
from ..model import Unit
from ..remote.base import Transport
from ..verify import stall
from ..verify.causes import Cause, LogFormat, classify, log_format, phase_of
from ..verify.http import status_of
from . import queue
from .inventory import PLACEHOLDER_RE
from .look import Reader, look
from .plan import SlurmPlan
from .record import RunRecord, forget, read_record, write_record
from .script import Step, deployment_dir, output_file

POLL_S = 0.25
SACCT_GRACE_S = 0.6  # a step gone from squeue -s: how long its sacct row may take to say how it ended
HEALTH_TIMEOUT_S = 2.0
Say = Callable[[str], None]


@dataclass(frozen=True)
class Options:
    timeout_s: float | None = None  # None: the longest health.timeout_s of the steps
    check: bool = False
    keep_on_failure: bool = False


@dataclass
class Clock:
    """Time and sleep, injectable (tests run the loops without waiting)."""

    now: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


@dataclass
class StepWatch:
    step: Step
    unit: Unit  # its node filled in
    output: str  # its output file: the job id in its name
    id: str = ""
    seen_running: bool = False
    offset: int = 0
    lines: list[str] = field(default_factory=list)
    healthy: bool = False
    phase: str = "starting"
    quiet: stall.Clock | None = None  # when the step's output last moved (set once it runs)
    gone_since: float | None = None  # when it left squeue -s while sacct did not call it ended yet


@dataclass(frozen=True)
class Outcome:
    ok: bool
    job: str
    message: str


class SlurmFailed(GpudeployError):
    pass


def resolve(unit: Unit, nodes: list[str]) -> Unit:
    """``unit`` with every slot placeholder replaced by that slot's node."""
    def sub(text: str) -> str:
        return PLACEHOLDER_RE.sub(lambda m: nodes[int(m.group(1))], text)
    return replace(unit, host=replace(unit.host, address=sub(unit.host.address)), health_url=sub(unit.health_url),
                   argv=tuple(sub(a) for a in unit.argv))


def submitted_script(login: Transport, sp: SlurmPlan, job: str) -> str | None:
    """The script the job runs as: the one a roll applied, else Slurm's own copy, else the one
    deploy kept."""
    from .roll import applied_path

    applied = login.run(["cat", applied_path(sp, job)], check=False, timeout=30)
    if applied.rc == 0 and applied.stdout.startswith("#!"):
        return applied.stdout
    got = login.run(["scontrol", "write", "batch_script", job, "-"], check=False, timeout=30)
    if got.rc == 0 and got.stdout.startswith("#!"):
        return got.stdout
    kept = login.run(["cat", kept_script(sp, job)], check=False, timeout=30)
    return kept.stdout if kept.rc == 0 else None


def kept_script(sp: SlurmPlan, job: str) -> str:
    return f"{deployment_dir(sp.inv.target, sp.deployment)}/{job}.batch.sh"


def alive(login: Transport, job: str) -> queue.JobState | None:
    state = queue.parse_job(login.run(queue.job_argv(job), check=False, timeout=30).stdout)
    return state if state is not None and not queue.terminal(state.state) else None


def diff(old: str, new: str, name: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"{name} (running job)",
                                        f"{name} (plan)"))


def deploy(sp: SlurmPlan, login: Transport, opts: Options, say: Say, clock: Clock | None = None,
           secrets: dict[str, str] | None = None) -> Outcome:
    clock = clock or Clock()
    target = sp.inv.target
    record = read_record(login, target, sp.deployment)
    running = alive(login, record.job) if record is not None else None
    if record is not None and running is not None:
        old = submitted_script(login, sp, record.job) or ""
        if old == sp.script:
            say(f"job {record.job} runs this very script ({running.state}): nothing to change")
            return Outcome(True, record.job, "up to date")
        changed = diff(old, sp.script, "batch script")
        from .roll import prepare

        todo, why = prepare(sp, login, old, record) if old else ([], "the running job's script could not be read")
        if opts.check:
            say(changed or "(the running job's script could not be read)")
            if todo:
                return Outcome(True, record.job, "would roll " + ", ".join(p.step.unit.role.name for p in todo)
                               + " as new step(s) of the running job")
            return Outcome(True, record.job, f"would refuse: the running job differs ({why})")
        if not todo:
            return Outcome(False, record.job, no_room(sp, record.job, changed, why))
        from .rollout import roll

        missing = [n for p in todo for n in p.copy.unit.secret_names if n not in (secrets or os.environ)]
        if missing:
            raise SlurmFailed(f"secret(s) {', '.join(sorted(set(missing)))} are not set in this environment "
                              "(secret_env values come from the deploying user's environment)")
        values = {n: (secrets or os.environ)[n] for p in todo for n in p.copy.unit.secret_names}
        return roll(sp, login, record, old, todo, opts, say, clock, values)
    if opts.check:
        say(f"would submit a new job (no running job of deployment {sp.deployment}):")
        say(diff("", sp.script, "batch script"))
        return Outcome(True, "", "would submit")
    folder = deployment_dir(target, sp.deployment)
    login.run(["mkdir", "-p", folder], timeout=30)
    login.run(["chmod", "0700", folder], timeout=30)
    missing = [n for s in sp.steps for n in s.unit.secret_names if n not in (secrets or os.environ)]
    if missing:
        raise SlurmFailed(f"secret(s) {', '.join(sorted(set(missing)))} are not set in this environment "
                          "(secret_env values come from the deploying user's environment)")
    values = {n: (secrets or os.environ)[n] for s in sp.steps for n in s.unit.secret_names}
    for path, text in sp.files(values).items():
        login.put(path, text.encode(), 0o600)
    script_path = f"{folder}/batch.sh"
    login.put(script_path, sp.script.encode(), 0o600)
    got = login.run(queue.sbatch_argv(script_path), check=False, timeout=60)
    if got.rc != 0:
        return Outcome(False, "", f"sbatch refused the job: {(got.stderr or got.stdout).strip()}")
    job = queue.parse_sbatch(got.stdout)
    login.put(kept_script(sp, job), sp.script.encode(), 0o600)
    record = RunRecord(job=job, deployment=sp.deployment, submitted_at=time.time())
    write_record(login, target, record)
    say(f"submitted job {job} (gpudeploy-{sp.deployment}) via {target.login.address}")
    timeout = opts.timeout_s or max((s.unit.role.health.timeout_s for s in sp.steps), default=600.0)
    deadline = clock.now() + timeout
    outcome = _start(sp, login, record, deadline, timeout, say, clock)
    if not outcome.ok and not opts.keep_on_failure:
        cancel(login, job)
        outcome = replace(outcome, message=f"{outcome.message}\ncancelled job {job} (this deployment's job only)")
    return outcome


def no_room(sp: SlurmPlan, job: str, changed: str, why: str = "") -> str:
    return (f"no room: deployment {sp.deployment} runs as job {job}, submitted with another script; a changed "
            "engine would need a new step in that allocation, whose GPUs its steps hold"
            + (f" ({why})" if why else "") + ". Run `gpudeploy teardown` "
            "then `gpudeploy deploy` (a new job), or keep the running one.\n" + changed)


def cancel(login: Transport, job: str) -> None:
    login.run(["scancel", job], check=False, timeout=30)


def _start(sp: SlurmPlan, login: Transport, record: RunRecord, deadline: float, timeout: float, say: Say,
           clock: Clock) -> Outcome:
    job = record.job
    state = wait_running(login, job, deadline, timeout, say, clock)
    if state.state != "RUNNING":
        return Outcome(False, job, f"job {job} is {state.state}" + (f" ({state.reason})" if state.reason not in
                                                                      ("", "None") else ""))
    nodes = hostnames(login, state.nodelist)
    say(f"job {job} running on {', '.join(nodes)}")
    watches = [StepWatch(step=s, unit=resolve(s.unit, nodes), output=output_file(sp.inv.target, s.unit, job))
               for s in sp.steps]
    result = gate(sp, login, job, watches, deadline, say, clock)
    write_record(login, sp.inv.target, replace(record, steps={w.step.name: w.id for w in watches if w.id},
                                               nodes=nodes))
    if not result.ok:
        return result
    return smoke(sp, login, job, watches, say)


def wait_running(login: Transport, job: str, deadline: float, timeout: float, say: Say,
                 clock: Clock) -> queue.JobState:
    """The job once it left PENDING; while it pends, Slurm's reason and estimated start are said
    each time they change; at the deadline the last pending state."""
    said = None
    while True:
        state = queue.parse_job(login.run(queue.job_argv(job), check=False, timeout=30).stdout)
        if state is None:
            return queue.JobState("GONE", "not in squeue", "", "")
        if state.state != "PENDING":
            return state
        if (state.reason, state.start) != said and state.reason != "None":  # None: not yet scheduled
            said = (state.reason, state.start)
            say(f"job {job} pending: {state.reason} (estimated start {state.start})")
        if clock.now() >= deadline:
            return queue.JobState("PENDING", f"gave up after {timeout:g} s, still pending: {state.reason}, "
                                  f"estimated start {state.start}", state.start, "")
        clock.sleep(POLL_S)


def hostnames(login: Transport, nodelist: str) -> list[str]:
    got = login.run(["scontrol", "show", "hostnames", nodelist], timeout=30)
    return [n for n in got.stdout.split() if n]


def take_output(w: StepWatch, data: bytes | None) -> list[str]:
    """The step's output lines written since the last look (its own file, read from its start)."""
    reader = Reader(w.output, w.offset)
    new = reader.take(data)
    w.offset = reader.offset
    w.lines += new
    return new


def step_ids(login: Transport, job: str) -> tuple[dict[str, queue.StepRow], dict[str, queue.StepRow]]:
    """The running steps by name (squeue -s), and sacct's rows by name (every step, ended ones too)."""
    seen = look(login, job, [])
    return seen.running, seen.ended()


def gate(sp: SlurmPlan, login: Transport, job: str, watches: list[StepWatch], deadline: float, say: Say,
         clock: Clock) -> Outcome:
    """Every POLL_S, ONE remote command (look.py): the job, its steps, sacct and each waited step's new
    output; then /health of the steps that run and are not healthy yet. A step that died is named
    with its cause at the first look after its death."""
    while True:
        waiting = [w for w in watches if not w.healthy]
        seen = look(login, job, [(w.output, w.offset) for w in waiting])
        state = seen.job
        if state is None or queue.terminal(state.state):
            return Outcome(False, job, f"job {job} ended ({state.state if state else 'gone from squeue'}) "
                                       "before every step was healthy")
        running, acct = seen.running, seen.ended()
        for w, data in zip(waiting, seen.new, strict=True):
            row = running.get(w.step.name)
            if row is not None:
                w.id, w.seen_running = row.id, True
            ended = acct.get(w.step.name)
            if ended is not None:
                w.id = w.id or ended.id
            new = take_output(w, data)
            fmt = log_format(w.unit.role.log_format)
            stalled = watch_progress(w, new, fmt, clock, say)
            if stalled is not None:
                return Outcome(False, job, step_failed(w, job, "stalled", stalled.cause()))
            over = ended is not None and queue.terminal(ended.state)
            if not over and w.seen_running and row is None:  # gone from squeue -s; sacct's words may lag
                w.gone_since = w.gone_since if w.gone_since is not None else clock.now()
                over = clock.now() - w.gone_since >= SACCT_GRACE_S
                if not over:
                    continue
            if over:
                death = queue.step_death(ended) if ended is not None and queue.terminal(ended.state) else \
                    "ended (no longer in squeue -s; sacct has no end for it yet)"
                cause = classify(w.lines, w.unit.role.settings, exited=True, exit_status=death, fmt=fmt)
                said = srun_said(login, sp, job, w.id)
                srun = "\n".join(f"    | {x}" for x in said)
                return Outcome(False, job, step_failed(w, job, death, cause)
                               + (f"\nsrun said (batch output):\n{srun}" if said else ""))
            cause = classify(w.lines, w.unit.role.settings, exited=False, fmt=fmt)
            if cause is not None and cause.fatal:
                return Outcome(False, job, step_failed(w, job, "running, but its output says it failed", cause))
            if w.seen_running and status_of(w.unit.health_url, HEALTH_TIMEOUT_S, via=login) == 200:
                w.healthy = True
                say(f"step {w.id} {w.step.name} on {w.unit.host.address}: healthy")
        if all(w.healthy for w in watches):
            return Outcome(True, job, "every step healthy")
        if clock.now() >= deadline:
            unhealthy = ", ".join(f"{w.step.name} ({w.id or 'not started'})" for w in watches if not w.healthy)
            return Outcome(False, job, f"timed out waiting for /health of {unhealthy}")
        clock.sleep(POLL_S)


NO_STACKS = stall.Stacks(note="no Python stacks: the step's node is reached only through Slurm (py-spy there: "
                               "srun --jobid J --overlap py-spy dump --pid PID)")


def watch_progress(w: StepWatch, new: list[str], fmt: LogFormat, clock: Clock, say: Say) -> stall.Stall | None:
    """The stall detection of the SSH path, on the step's output: a line is progress, and a start
    quiet for the role's ``health.stall_s`` of its phase is reported once; with ``on_stall: stop``
    the Stall is returned (the gate fails the step)."""
    if not w.seen_running:
        return None
    if w.quiet is None:
        w.quiet = stall.Clock(now=clock.now)
    for line in new:
        w.phase = phase_of(line, fmt) or w.phase
    if new:
        w.quiet.moved()
    health = w.unit.role.health
    quiet = w.quiet.stalled(health.stall_after(w.phase))
    if quiet is None:
        return None
    found = stall.Stall(w.phase, quiet, tuple(w.lines[-stall.LAST_LINES:]), NO_STACKS, health.on_stall)
    say(f"step {w.id} {w.step.name}: {found.report()}")
    return found if health.on_stall == "stop" else None


def srun_said(login: Transport, sp: SlurmPlan, job: str, step_id: str) -> list[str]:
    """What srun wrote into the batch output about a step that could not start or died (a launch
    refused by Slurm leaves the step's own output empty): its errors, and the lines naming it."""
    path = f"{sp.inv.target.output_dir}/{job}.batch.out"
    lines = login.run(["tail", "-n", "200", path], check=False, timeout=30).stdout.splitlines()
    mine = [x for x in lines if (step_id and f"StepId={step_id}" in x) or "srun: error" in x]
    return mine[-12:]


def step_failed(w: StepWatch, job: str, how: str, cause: Cause | None) -> str:
    text = f"step {w.id or '?'} {w.step.name} of job {job} on {w.unit.host.address}: {how}; its output: {w.output}"
    return text + (f"\n{cause.render()}" if cause is not None else "")


def smoke(sp: SlurmPlan, login: Transport, job: str, watches: list[StepWatch], say: Say) -> Outcome:
    from ..verify.smoke import smoke_test

    units = [w.unit for w in watches]
    for router in (u for u in units if u.role.engine == "sglang_router"):
        ups = [u for u in units if u.role.named_in(router.role.upstreams.get("prefill", ()))
               or u.role.named_in(router.role.upstreams.get("decode", ()))
               or u.role.named_in(router.role.upstreams.get("workers", ()))]
        got = smoke_test(router, ups, via=login)
        if not got.ok:
            return Outcome(False, job, f"{router.role.name}: the smoke generation failed: {got.message}")
        ttft = f", first token {got.ttft_s:.2f} s" if got.ttft_s is not None else ""
        say(f"{router.role.name}: smoke generation {got.endpoint} answered {got.text.strip()[:60]!r}{ttft}")
    return Outcome(True, job, "ready")


__all__ = ["Options", "Outcome", "cancel", "deploy", "forget"]
