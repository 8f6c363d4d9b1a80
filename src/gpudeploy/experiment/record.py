"""The study: Optuna's record of a search, in SQLite beside the results folder, and what gpudeploy keeps
in it (one user attribute per trial, ``gpudeploy``: the variant, its key and point, the outcome and
why, the constraints, the region a failed launch showed). The measurements are the experiment's store's.

    <results>.optuna.sqlite    the study (``optuna-dashboard sqlite:///<results>.optuna.sqlite`` opens it)
    <results>/tune.lock        held while a tune runs: one at a time, so a running trial is never taken
                               for one a crash left behind

A trial left running (a crash, a kill) is failed when the next tune opens the study, and its point is
queued to run first, as Ctrl-C's is: retried, not skipped (see search.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from ..errors import InputError, Problem
from . import bounds, objective, runner
from .search_space import Search
from .spec import Experiment

Say = runner.Say
SUFFIX = ".optuna.sqlite"
ATTR = "gpudeploy"  # the trial's user attribute that holds what gpudeploy keeps of it (info())


@dataclass
class Tally:
    """What the study holds, counted: launches spent, saved and failed."""

    trials: int = 0
    launches: int = 0  # launches that ended (an interrupted one is retried, and counted then)
    measured: int = 0
    failed: dict[str, int] = field(default_factory=dict)  # cause -> launches that died of it
    refused_preflight: int = 0
    refused_learned: int = 0
    refused_plan: int = 0
    repeated: int = 0
    interrupted: int = 0
    host_failed: int = 0  # stopped by a host's failure: neither a trial nor a launch of the budget
    spent_s: float = 0.0

    @property
    def saved(self) -> int:
        return self.refused_preflight + self.refused_learned

    def lines(self) -> list[str]:
        failed = sum(self.failed.values())
        causes = ", ".join(f"{n} {c}" for c, n in sorted(self.failed.items()))
        out = [f"launches: {self.launches} spent ({self.measured} measured, {failed} failed"
               + (f": {causes}" if causes else "")
               + (f"; {self.interrupted} interrupted and retried" if self.interrupted else "")
               + (f"; {self.host_failed} stopped by a host's failure, not counted, retried"
                  if self.host_failed else "")
               + f"); {self.saved} saved, refused without a launch ({self.refused_preflight} by the memory "
               f"preflight, {self.refused_learned} inside a region a failed launch showed)",
               f"trials: {self.trials} ({self.repeated} repeated a point already tried and were told its result"
               + (f", {self.refused_plan} refused by the planner" if self.refused_plan else "")
               + f"); {runner.duration(self.spent_s)} spent"]
        return out


def study_file(exp: Experiment) -> Path:
    """The study's SQLite file: beside the results folder (``results/x`` -> ``results/x.optuna.sqlite``)."""
    folder = Path(exp.results_dir)
    return folder.with_name(folder.name + SUFFIX)


def storage_url(path: Path) -> str:
    return f"sqlite:///{path.resolve()}"


def retry_later(study: optuna.Study, number: int, params: dict[str, Any], wall_s: float, why: str,
                outcome: str = "interrupted") -> None:
    """The trial ``number`` did not finish (``outcome``: interrupted, or host-failed): failed in the study,
    its point queued to run first next time."""
    _enqueue_once(study, params, number)
    trial = optuna.trial.Trial(study, _trial_id(study, number))
    trial.set_user_attr(ATTR, {**info(study.get_trials(deepcopy=False)[number]), "outcome": outcome,
                               "reason": f"{why}; queued again, to run first", "wall_s": round(wall_s, 3)})
    study.tell(number, state=optuna.trial.TrialState.FAIL)


def _trial_id(study: optuna.Study, number: int) -> int:
    # Optuna's Trial(study, trial_id) takes the storage's id, which FrozenTrial keeps as _trial_id
    frozen = study.get_trials(deepcopy=False)[number]
    return int(frozen._trial_id)


def _enqueue_once(study: optuna.Study, params: dict[str, Any], number: int) -> None:
    waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    if not any(t.params == params or t.system_attrs.get("fixed_params") == params for t in waiting):
        study.enqueue_trial(params, user_attrs={"retry_of": number})


def recover(study: optuna.Study, say: Say) -> None:
    """Trials left running by a command that did not end itself (a crash, a kill): failed, retried first.
    (The lock says no other command runs this study now.)"""
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        retry_later(study, t.number, dict(t.params), 0.0,
                    "was running when the last tune stopped without a word (a crash or a kill)")
        say(f"== trial {t.number} was running when the last tune stopped; it is marked failed in the study and its "
            "point runs again first (the benchmark levels it finished are kept)")


def open_study(exp: Experiment, search: Search, path: Path, say: Say) -> optuna.Study:
    """The experiment's study, made on the first run; refused when the space or the objectives it was
    made for changed (its trials' points and values would mean something else)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    url = storage_url(path)
    directions = [optuna.study.StudyDirection.MAXIMIZE if o.direction == "maximize" else
                  optuna.study.StudyDirection.MINIMIZE for o in search.objectives]
    study: optuna.Study
    try:
        study = optuna.load_study(study_name=exp.name, storage=url)
    except KeyError:
        study = optuna.create_study(study_name=exp.name, storage=url, directions=directions)
        study.set_user_attr("search_digest", search.digest())
        study.set_user_attr("objectives", [o.label for o in search.objectives])
        study.set_user_attr("constraints", list(objective.CONSTRAINTS))
        study.set_user_attr("experiment_file", exp.file)
        say(f"== search {exp.name}: new study in {path}")
        return study
    if study.user_attrs.get("search_digest") != search.digest():
        raise InputError([Problem(
            f"the search's space or objectives changed since study {exp.name} in {path} began (its "
            f"{len(study.trials)} trials chose points of the old space, objectives "
            f"{', '.join(study.user_attrs.get('objectives') or [])}): put them back to go on, or move {path} and "
            f"{exp.results_dir} away to start over (the budget, the seed and the sampler may change)",
            file=exp.file, line=search.line, key="search")])
    say(f"== search {exp.name}: going on with the study in {path} ({len(study.trials)} trials so far)")
    return study


def sampler(search: Search, done: int) -> Any:
    # A resumed study's sampler is seeded past the trials done: the same seed again would replay the
    # first proposals (repeats, told from the store, but trials spent)
    seed = None if search.seed is None else search.seed + done
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if search.sampler == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        if search.sampler == "nsga2":
            # a generation of 50 (Optuna's default) would be all a budget of 20 launches ever sees
            return optuna.samplers.NSGAIISampler(seed=seed, population_size=population(search))
        # multivariate with group: the conditional keys (speculative_*) are modelled with their parents
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, n_startup_trials=startup(search))


def startup(search: Search) -> int:
    """TPE's random trials before it models: a quarter of the launches, 4 to 10 (refused trials count)."""
    return max(4, min(10, search.launches // 4))


def population(search: Search) -> int:
    return max(4, min(50, search.launches // 3))


def info(trial: Any) -> dict[str, Any]:
    """What gpudeploy keeps of a trial in the study (its user attribute ``gpudeploy``): the variant, its
    key and point, the outcome and why, the constraints, the region a failed launch showed."""
    got = trial.user_attrs.get(ATTR)
    return got if isinstance(got, dict) else {}


def constraints_of(trial: Any) -> list[float]:
    """The constraint vector the trial recorded (objective.CONSTRAINTS; <= 0 is met)."""
    got = info(trial).get("constraints")
    return [float(x) for x in got] if isinstance(got, list) else [0.0] * len(objective.CONSTRAINTS)


def tally_of(study: optuna.Study) -> Tally:
    """The study's trials counted (a trial queued or running now is not yet one)."""
    out = Tally()
    for t in study.get_trials(deepcopy=False):
        outcome = info(t).get("outcome")
        if outcome is None:  # waiting (queued) or running now
            continue
        out.spent_s += float(info(t).get("wall_s") or 0.0)
        if outcome == "host-failed":  # the host failed, not the point: the budget does not pay for it
            out.host_failed += 1
            continue
        out.trials += 1
        if info(t).get("launched") and outcome != "interrupted":
            out.launches += 1  # (an interrupted launch gave nothing and runs again: the budget pays once)
        if outcome == "measured":
            out.measured += 1
        elif outcome in ("deploy-failed", "failed-under-load", "bench-failed"):
            cause = str(info(t).get("cause") or outcome)
            out.failed[cause] = out.failed.get(cause, 0) + 1
        elif outcome == "refused-preflight":
            out.refused_preflight += 1
        elif outcome == "refused-learned":
            out.refused_learned += 1
        elif outcome == "refused-plan":
            out.refused_plan += 1
        elif outcome == "repeated":
            out.repeated += 1
        elif outcome == "interrupted":
            out.interrupted += 1
    return out


def regions_of(study: optuna.Study, search: Search) -> list[bounds.Region]:
    """The regions the study's failed launches showed (rebuilt on every start: the study keeps them)."""
    out = []
    for t in study.get_trials(deepcopy=False):
        r = info(t).get("region")
        if isinstance(r, dict) and isinstance(info(t).get("params"), dict):
            out.append(bounds.Region(t.number, str(r["cause"]), frozenset(r["roles"]), dict(info(t)["params"]),
                                     {str(k): int(v) for k, v in (r.get("worse") or {}).items()},
                                     tuple(r.get("only") or ())))
    return out


@contextlib.contextmanager
def lock(folder: Path) -> Iterator[None]:
    """One tune of a study at a time: a second would take the first one's running trial for a crash's."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tune.lock"
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or f"see {path}"
            raise InputError([Problem(f"another tune of this study runs now ({holder}); one at a time",
                                      file=str(path))]) from None
        f.truncate(0)
        f.write(f"pid {os.getpid()}\n")
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


