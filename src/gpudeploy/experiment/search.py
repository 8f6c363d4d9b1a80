"""`gpudeploy tune`: the experiment file's ``search:`` space, searched without a person in the loop.

Optuna chooses the points (TPE for one objective, NSGA-II for several, each reading constraints);
gpudeploy turns each into a variant and puts it through what it already knows, in this order:

    1. the variant is planned like a deploy (a point the planner refuses is infeasible, said why);
    2. the memory preflight: a variant it predicts will not boot is recorded as skipped, with its verdict
       and the deploy it saved, WITHOUT a launch (runner.run_variant);
    3. the regions failed launches showed (bounds.py): a point inside one is skipped, without a launch;
    4. a launch (deploy, gate), the engine's own benchmark through the router, power per GPU, as
       `experiment` does; the deployment stays up, and the next trial restarts only what changed.
       A launch that dies is recorded with the gate's cause (deploy feeds it to the memory model's
       calibration as it always does) and rules out its region.

Whatever happens, the sampler is told: a measured point its objective values; a refused or failed
one a constraint vector (objective.py) so it learns where not to look. The study lives in SQLite
beside the results folder (record.py: ``<results>.optuna.sqlite``; ``optuna-dashboard sqlite:///...``
opens it), the measurements in the experiment's own store; the same command again continues the study.

A trial that was running when the command stopped (Ctrl-C, a crash, a kill) is marked failed in the
study and its point queued again, first: it is retried, not skipped, because the sampler chose it for
a reason and the store kept every benchmark level it finished (only the rest is measured). A point
the store has finished (measured, skipped, failed under load) is never launched again: a sampler that
proposes it again is told the stored result.
"""

from __future__ import annotations

import json
import math
import shlex
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import optuna

from .. import interrupt
from ..errors import GpudeployError, InputError, Problem
from ..fanout import Interrupted
from ..inventory import load_inventory
from ..plan.calibrate import CalibrationStore
from . import bounds, objective, record, runner
from .best import write_best
from .search_space import (
    Dimension,
    Search,
    contains,
    label_of,
    overrides,
    sample,
    space_size,
)
from .spec import VARIANT_RE, Experiment, Variant, key_of
from .store import Store
from .variants import Planned, plan_variants

Say = runner.Say
AGAIN = "`invoke tune --file {file}`"  # (gpudeploy tune outside gpudeploy's repository: the same task)


class SearchStopped(GpudeployError):
    """A host of the deployment failed (unreachable, ssh, a lost lock): the search stops, its study whole."""


class _HostFailed(Exception):
    """A trial's launch ended by a host's failure rather than the point's (runner.Outcome.host)."""

    def __init__(self, host: str, failure: str, deployment: str) -> None:
        super().__init__(failure)
        self.host, self.failure, self.deployment = host, failure, deployment


@dataclass
class Result:
    store: Store
    study_url: str
    tally: record.Tally
    stopped: str  # why the search ended this time
    best: list[dict[str, Any]] = field(default_factory=list)  # the best trial, or the Pareto front's
    written: list[Path] = field(default_factory=list)  # the best variant's inventory and role files
    lines: list[str] = field(default_factory=list)  # the report, after the table


def run_search(exp: Experiment, *, dry_run: bool = False, calibration: CalibrationStore | None = None,
               deploy_timeout_s: float | None = None, say: Say = print) -> Result | None:
    """Run (or with ``dry_run`` show) the search; None after a dry run."""
    search = exp.search
    if search is None:
        raise InputError([Problem("no search: section (`gpudeploy experiment` runs variants and a grid)",
                                  file=exp.file, key="search")])
    check_space(exp, search, calibration)
    path = record.study_file(exp)
    if dry_run:
        for line in dry_run_lines(exp, search, path):
            say(line)
        return None
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # our own lines say what each trial did
    store = Store(exp.results_dir)
    with record.lock(Path(exp.results_dir)):
        study = record.open_study(exp, search, path, say)
        record.recover(study, say)
        tally = record.tally_of(study)
        study.sampler = record.sampler(search, tally.trials)
        if search.baseline and tally.trials == 0:
            _baseline(exp, search, study, say)
        _sync_meta(store, exp, search, study, path)
        stopped = _loop(exp, search, study, store, calibration, deploy_timeout_s, say)
        tally = record.tally_of(study)
        result = Result(store, record.storage_url(path), tally, stopped)
        _report(exp, search, study, store, result)
    return result


# ------------------------------------------------------------------------------------ the loop

def _loop(exp: Experiment, search: Search, study: optuna.Study, store: Store,
          calibration: CalibrationStore | None, deploy_timeout_s: float | None, say: Say) -> str:
    """Trials until the budget ends. Ended by the budget, the deployment the trials kept up is torn down;
    Ctrl-C or an error leaves it up, and says so: the same command again restarts only what its next
    trial changes."""
    regions = record.regions_of(study, search)
    last: Planned | None = None  # the last launch: its deployment is kept up between trials
    note = "tune deployment"
    while (stop := _budget_stop(search, record.tally_of(study), study)) is None:
        trial = study.ask()
        started = time.monotonic()
        try:
            params = sample(trial, search)
            told = _trial(exp, search, trial, params, study, store, regions, calibration, deploy_timeout_s, say)
        except _HostFailed as exc:
            # The host failed, not the point: the next trials would fail the same way on it, each spending
            # a launch and teaching the sampler a lie. Stop; the trial is failed uncounted, its point queued
            # first (as Ctrl-C's), and the same command goes on once the host answers.
            record.retry_later(study, trial.number, trial.params, time.monotonic() - started,
                               f"host {exc.host} failed: {exc.failure}", outcome="host-failed")
            raise SearchStopped(_host_stop(exp, search, study, trial.number, exc)) from None
        except BaseException as exc:
            interrupted = isinstance(exc, (KeyboardInterrupt, Interrupted))
            record.retry_later(study, trial.number, trial.params, time.monotonic() - started,
                         "interrupted (Ctrl-C)" if interrupted else f"stopped: {type(exc).__name__}: {exc}")
            if last is not None and not record.info(trial).get("launched"):
                say(interrupt.noted(note) or "")  # (a launch says what runs itself)
            raise
        # one attribute, one write: each is a SQLite commit (an fsync), and a trial had a dozen
        trial.set_user_attr(record.ATTR, {**told.attrs, "wall_s": round(time.monotonic() - started, 3)})
        if told.state == "fail":
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            # what the samplers read (TPE and NSGA-II alike, Optuna >= 5): each <= 0 is met
            for name, value in zip(objective.CONSTRAINTS, told.attrs["constraints"], strict=True):
                trial.set_constraint(name, value)
            study.tell(trial, told.values)
        if told.region is not None:
            regions.append(told.region)
        if told.planned is not None:
            last = told.planned
            dep = last.plan.units[0].deployment
            interrupt.note(note, f"deployment {dep} may still run as trial {trial.number} left it: `invoke teardown "
                           f"--inventory {shlex.quote(exp.inventory)} --deployment {dep}` stops it; "
                           f"{AGAIN.format(file=shlex.quote(exp.file))} goes on")
        _sync_meta(store, exp, search, study, record.study_file(exp))
    say(f"== search: {stop}")
    if last is not None:
        _end(last, say)
        interrupt.clear(note)
    return stop


def _host_stop(exp: Experiment, search: Search, study: optuna.Study, number: int, exc: _HostFailed) -> str:
    tally = record.tally_of(study)
    dep = exc.deployment
    why = exc.failure.removeprefix(f"host {exc.host} failed: ")  # (deploy's own words begin so)
    return (f"tune {exp.name} stopped: trial {number}'s deploy failed because host {exc.host} failed: {why}\n"
            f"this is the host's failure, not the point's: trial {number} is not counted and the sampler is not told "
            f"it failed ({tally.launches} of the budget's {search.launches} launches spent, {tally.trials} "
            f"trial{'s' if tally.trials != 1 else ''} done)\n"
            f"once {exc.host} answers again, the same command goes on with the study, trial {number}'s point first: "
            f"{AGAIN.format(file=shlex.quote(exp.file))}\n"
            f"what the trials left running: "
            f"`invoke status --inventory {shlex.quote(exp.inventory)} --deployment {dep}`")


def _end(last: Planned, say: Say) -> None:
    """The deployment the last trials kept up, torn down (the best one deploys from its own files)."""
    dep = last.plan.units[0].deployment
    try:
        left = runner.teardown_deployment(last, say)
    except (KeyboardInterrupt, Interrupted):
        say(f"interrupted while tearing down {dep}: `invoke status --deployment {dep}` says what still runs")
        raise
    if left:
        say(f"   the teardown of {dep} did not finish ({'; '.join(left)}): `invoke teardown --deployment {dep}`")


@dataclass
class Told:
    """What the sampler is told of one trial, and what the study keeps of it."""

    values: list[float]
    attrs: dict[str, Any]
    state: str = "complete"  # complete | fail (a failure of the host, not of the point: nothing learned)
    region: bounds.Region | None = None
    planned: Planned | None = None  # a launch: its deployment may be up (torn down when the budget ends)


def _trial(exp: Experiment, search: Search, trial: optuna.Trial, params: dict[str, Any], study: optuna.Study,
           store: Store, regions: list[bounds.Region], calibration: CalibrationStore | None,
           deploy_timeout_s: float | None, say: Say) -> Told:
    number = trial.number
    ov = overrides(search, params)
    label = label_of(search, params)
    name = f"t{number},{label}" if VARIANT_RE.fullmatch(f"t{number},{label}") else f"t{number}"
    v = Variant(name, ov, search.line)
    key = key_of(exp, v)
    base = {"variant": name, "key": key, "params": _jsonable(params)}
    row = store.variant(key)
    if row is not None and row["status"] in ("measured", "skipped", "failed-under-load"):
        return _repeat(exp, search, study, store, row, base, say, number)
    try:
        [p] = plan_variants(replace(exp, variants=(v,), search=None), calibration)
    except InputError as exc:
        why = "; ".join(str(x.message).removeprefix(f"variant {name}: ") for x in exc.problems)
        say(f"== trial {number} {name}: REFUSED by the planner: {why}")
        return Told(objective.told_values(None, search.objectives),
                    {**base, "outcome": "refused-plan", "reason": why,
                     "constraints": objective.constraints(refused=True)})
    index = number
    # a point launched before keeps its row (its failure and cause), also when it is not launched again
    fresh = row is None or row["status"] in ("running", "interrupted")
    if not p.boots:
        if fresh:
            out = runner.run_variant(exp, index, p, key, store, calibration=calibration,
                                     deploy_timeout_s=deploy_timeout_s, keep_up=True, again=AGAIN, say=say)
            why = out.failure or ""
        else:  # the memory model learned from its launch (calibration): it is refused now
            why = "; ".join(p.refusals)
            say(f"== {name}: not launched again ({row['status'] if row else '?'} before): {why}")
        return Told(objective.told_values(None, search.objectives),
                    {**base, "outcome": "refused-preflight", "reason": why,
                     "constraints": objective.constraints(refused=True)})
    inside = next((found for r in regions if (found := bounds.covers(r, params, search))), None)
    if inside is not None:
        if fresh:
            saved, basis = runner.estimate_saved(store, p)
            store.begin_variant(name, index, ov, [], key=key)
            store.finish_variant(key, "skipped", verdict=inside, saved_s=saved)
            say(f"== {name}: SKIPPED, {inside}\n   saved {runner.duration(saved)} ({basis})")
        else:
            say(f"== {name}: not launched again: {inside}")
        return Told(objective.told_values(None, search.objectives),
                    {**base, "outcome": "refused-learned", "reason": inside,
                     "constraints": objective.constraints(learned=True)})
    trial.set_user_attr(record.ATTR, {**base, "launched": True})  # spent from here on, also if it is interrupted
    out = runner.run_variant(exp, index, p, key, store, calibration=calibration, deploy_timeout_s=deploy_timeout_s,
                             keep_up=True, again=AGAIN, say=say)
    if out.host is not None:
        raise _HostFailed(out.host, out.failure or f"host {out.host} failed", p.plan.units[0].deployment)
    attrs = {**base, "outcome": out.status, "launched": True}
    if out.status == "measured":
        ev = objective.evaluate(runner.levels_of(store, key), exp.slo, search.objectives)
        say(f"   trial {number}: " + ", ".join(f"{o.label} {_fig(v)}" for o, v in zip(search.objectives, ev.values,
                                                                                   strict=True))
            + ("" if ev.feasible else f" (infeasible: {_infeasible(ev)})"))
        return Told(objective.told_values(ev, search.objectives),
                    {**attrs, "constraints": objective.constraints(ev=ev), "best_concurrency": ev.best_concurrency},
                    planned=p)
    region = bounds.region(number, out.cause, out.roles, params, search) if out.status != "bench-failed" else None
    attrs.update(reason=out.failure, cause=out.cause or "", roles=sorted(out.roles))
    if region is None:  # the host's failure, not the point's: the sampler learns nothing from it
        return Told([], attrs, state="fail", planned=p)
    attrs["region"] = {"cause": region.cause, "roles": sorted(region.roles), "worse": region.worse,
                       "only": list(region.only)}
    return Told(objective.told_values(None, search.objectives), {**attrs, "constraints": objective.constraints(
        failed=True)}, region=region, planned=p)


def _repeat(exp: Experiment, search: Search, study: optuna.Study, store: Store, row: dict[str, Any],
            base: dict[str, Any], say: Say, number: int) -> Told:
    """A point the store has finished: the sampler is told its stored result; nothing is launched."""
    first = next((t.number for t in study.get_trials(deepcopy=False)
                  if record.info(t).get("key") == row["key"] and t.number != number), None)
    attrs = {**base, "outcome": "repeated", "of": first, "was": row["status"]}
    of = f"trial {first}" if first is not None else row["name"]
    say(f"== trial {number}: the same point as {of} ({row['status']}); told its result, not launched again")
    if row["status"] == "measured":
        ev = objective.evaluate(runner.levels_of(store, row["key"]), exp.slo, search.objectives)
        return Told(objective.told_values(ev, search.objectives), {**attrs, "constraints": objective.constraints(
            ev=ev)})
    learned = str(row.get("verdict") or "").startswith("inside the region")
    refused = row["status"] == "skipped"
    return Told(objective.told_values(None, search.objectives), {**attrs, "constraints": objective.constraints(
        refused=refused and not learned, learned=refused and learned, failed=not refused)})


def _budget_stop(search: Search, tally: record.Tally, study: optuna.Study) -> str | None:
    if tally.launches >= search.launches:
        return f"the budget's {search.launches} launches are spent"
    if tally.trials >= search.trials:
        return f"the budget's {search.trials} trials are spent ({tally.launches} of them launched)"
    if search.hours is not None and tally.spent_s >= search.hours * 3600:
        return f"the budget's {search.hours:g} hours are spent"
    size = space_size(search)
    tried = {record.info(t).get("key") for t in study.get_trials(deepcopy=False) if record.info(t).get("outcome")
             not in (None, "interrupted", "host-failed")}
    if size is not None and len(tried - {None}) >= size:
        return f"every point of the space ({size}) has been tried"
    return None


def _sync_meta(store: Store, exp: Experiment, search: Search, study: optuna.Study, path: Path) -> None:
    """The store's meta names the trials' variants, in trial order: what `experiment.show` shows."""
    names, keys = [], []
    stored = {v["key"] for v in store.variants()}
    for t in study.get_trials(deepcopy=False):
        key = record.info(t).get("key")
        if key and key not in keys and key in stored:
            keys.append(key)
            names.append(record.info(t).get("variant"))
    store.set_meta(name=exp.name, file=exp.file, inventory=exp.inventory, deployment=exp.deployment,
                   benchmark=asdict(exp.benchmark), slo=exp.slo, choose=asdict(exp.choose), dimensions=[],
                   variants=names, variant_keys=keys,
                   search={"study": record.storage_url(path), "space": [d.key for d in search.space],
                           "objectives": [{"name": o.name, "direction": o.direction, "concurrency": o.concurrency,
                                           "label": o.label} for o in search.objectives]})


def _baseline(exp: Experiment, search: Search, study: optuna.Study, say: Say) -> None:
    """The first trial: the inventory's own values, where the space holds them."""
    problems: list[Problem] = []
    inv = load_inventory(exp.inventory, problems)
    if problems:
        raise InputError(problems)
    fixed, outside = {}, []
    for d in search.space:
        value = own_value(inv, d)
        if value is not _MISSING and contains(d, value):
            fixed[d.key] = value
        elif not d.when:
            outside.append(f"{d.key} {'is not set' if value is _MISSING else value!r}")
    if fixed:
        study.enqueue_trial(fixed, user_attrs={"baseline": True})
        say("== the first trial is the inventory's own values"
            + (f" (the sampler chooses where they are outside the space: {'; '.join(outside)})" if outside else ""))


_MISSING: Any = object()


def own_value(inv: Any, d: Dimension) -> Any:
    """The inventory's value of the space's key ``d`` (of its first role), or _MISSING."""
    role = inv.roles.get(d.roles[0]) or next((r for r in inv.roles.values() if r.file_role == d.roles[0]), None)
    if role is None:
        return _MISSING
    if d.section is None:
        return role.tp_size
    if d.section == "model":
        return role.model.get("path", _MISSING)
    return (role.settings if d.section == "settings" else role.env).get(d.name, _MISSING)


# ------------------------------------------------------------------------------------ checks

def check_space(exp: Experiment, search: Search, calibration: CalibrationStore | None) -> None:
    """Before any trial: every key's values planned like a variant's (a role the deployment lacks, a flag
    the engine does not know, a named instance), every problem at once, at the key's line."""
    problems: list[Problem] = []
    inv = load_inventory(exp.inventory, problems)
    if problems:
        raise InputError(problems)
    probes: list[Variant] = []
    by_name: dict[str, Dimension] = {}
    for d in search.space:
        for role in d.roles:
            placed = inv.roles.get(role)
            if placed is not None and placed.instance_of:
                problems.append(Problem(f"{role} is an instance of role file {placed.instance_of}: the best variant is "
                                        f"written as role files, and a role file sets every instance; name "
                                        f"{placed.instance_of} in the key", file=exp.file, line=d.line,
                                        key=f"search.space.{d.key}"))
        values = list(d.choices) if d.kind == "choice" else [d.low, d.high]
        for value in values:
            if value is None:
                continue
            name = f"probe-{len(probes)}"  # this key at this value, the rest as the inventory has it
            v = int(value) if d.kind == "int" else value
            probes.append(Variant(name, overrides(replace(search, space=(d,)), {d.key: v}), d.line))
            by_name[name] = d
    try:
        plan_variants(replace(exp, variants=tuple(probes), search=None), calibration)
    except InputError as exc:
        seen = set()
        for x in exc.problems:
            message = str(x.message)
            dim = next((by_name[n] for n in by_name if message.startswith(f"variant {n}: ")), None)
            if dim is not None:
                message = message.split(": ", 1)[1]
            text = (message, dim.key if dim else None)
            if text in seen:
                continue
            seen.add(text)
            problems.append(Problem(message, file=exp.file, line=dim.line if dim else search.line,
                                    key=f"search.space.{dim.key}" if dim else "search"))
    if problems:
        raise InputError(problems)


def dry_run_lines(exp: Experiment, search: Search, path: Path) -> list[str]:
    """What the search would do; nothing is deployed, run or written."""
    objectives = ", ".join(f"{o.label} ({'max' if o.direction == 'maximize' else 'min'})" for o in search.objectives)
    budget = f"{search.launches} launches, {search.trials} trials" + (f", {search.hours:g} hours" if search.hours
                                                                       else "")
    out = [f"search {exp.name} (--dry-run: nothing is deployed, run or written)",
           f"objective{'s' if len(search.objectives) > 1 else ''}: {objectives}"
           + (f"; under the SLO {', '.join(f'{k} <= {v:g}' for k, v in exp.slo.items())}" if exp.slo else ""),
           f"sampler: {search.sampler}" + (f" (seed {search.seed})" if search.seed is not None else "")
           + f"; budget: {budget}",
           "space:"]
    for d in search.space:
        when = "; ".join(f"when {k} {'is not null' if vs is None else 'in ' + json.dumps(list(vs))}"
                         for k, vs in d.when)
        out.append(f"   {d.key}: {d.describe()}" + (f" ({when})" if when else ""))
    size = space_size(search)
    out.append(f"the space holds {size} points" if size is not None else "the space is continuous")
    out.append(f"study: {path} (optuna-dashboard {record.storage_url(path)}); results: {exp.results_dir}")
    out.append("each trial: plan, memory preflight (refused: no launch), the regions failed launches showed "
               "(inside one: no launch), then deploy (only what changed restarts) and benchmark")
    return out


# ------------------------------------------------------------------------------------ the answer

def _report(exp: Experiment, search: Search, study: optuna.Study, store: Store, result: Result) -> None:
    done = [t for t in study.get_trials(deepcopy=False) if record.info(t).get("outcome") == "measured"]
    feasible = [t for t in done if not any(x > 0 for x in record.constraints_of(t))]
    lines = [f"search {exp.name}: {result.stopped}", *result.tally.lines()]
    if not feasible:
        lines.append("no trial met the SLO yet" if exp.slo else "no trial was measured yet")
    else:
        points = [list(t.values) for t in feasible]
        front = sorted((feasible[i] for i in objective.front(points, search.objectives)),
                       key=lambda t: t.values[0], reverse=search.objectives[0].direction == "maximize")
        best = front[0]
        result.best = [{"trial": t.number, "variant": record.info(t).get("variant"), "key": record.info(t).get("key"),
                        "params": record.info(t).get("params"), "values": dict(zip([o.label for o in search.objectives],
                                                                                  t.values, strict=True)),
                        "concurrency": record.info(t).get("best_concurrency")} for t in front]
        figures = ", ".join(f"{o.label} {_fig(v)}" for o, v in zip(search.objectives, best.values, strict=True))
        lines.append(f"best: trial {best.number} {record.info(best).get('variant')}: {figures}"
                     + (f" at concurrency {record.info(best).get('best_concurrency')}"
                        if record.info(best).get("best_concurrency") else ""))
        if len(search.objectives) > 1:
            lines.append(f"Pareto front ({len(front)} trials, best first by {search.objectives[0].label}):")
            for t in front:
                lines.append(f"   trial {t.number} {record.info(t).get('variant')}: " + ", ".join(
                    f"{o.label} {_fig(v)}" for o, v in zip(search.objectives, t.values, strict=True)))
        row = store.variant(str(record.info(best).get("key")))
        if row is not None:
            folder = Path(exp.results_dir) / "best"
            result.written = write_best(exp.inventory, row["overrides"] or {}, folder,
                                        f"gpudeploy tune {exp.name}: trial {best.number} ({figures})")
            roles = ", ".join(str(p) for p in result.written[1:]) or "the inventory as it is"
            lines.append(f"the best variant: {roles}"
                         f"; `gpudeploy deploy --inventory {shlex.quote(str(result.written[0]))}` deploys it as it is "
                         f"(or copy the role files into your roles_dir)")
    lines.append(f"study: {result.study_url}; `optuna-dashboard {result.study_url}` opens it "
                 "(pip install optuna-dashboard)")
    lines.append(f"the same command again goes on with the study ({AGAIN.format(file=shlex.quote(exp.file))}); "
                 "a larger budget in the file buys more trials")
    result.lines = lines


def _fig(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}" if abs(v) >= 10 else f"{v:.3g}"


def _infeasible(ev: objective.Evaluation) -> str:
    if ev.slo_violation:
        return "no level met the SLO"
    return f"no figure for {', '.join(ev.missing)}"


def _jsonable(params: dict[str, Any]) -> dict[str, Any]:
    return {k: (v if v is None or isinstance(v, (bool, int, str)) or (isinstance(v, float) and math.isfinite(v))
                else str(v)) for k, v in params.items()}
