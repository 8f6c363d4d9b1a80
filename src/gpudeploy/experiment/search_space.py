"""The ``search:`` section of an experiment file -> :class:`Search`, every problem with file:line; and
a point of the space -> a variant's overrides. Pure: no Optuna here (search.py drives it), no host.

    search:
      space:                                        # KEY: a range or choices
        decode.settings.mem_fraction_static: {range: [0.6, 0.9], step: 0.01}
        decode.settings.cuda_graph_max_bs: {range: [8, 256], log: true}     # ints: an int range
        decode.settings.max_running_requests: {choices: [64, 128, 256]}
        decode.settings.speculative_algorithm: {choices: [null, EAGLE]}     # null: off
        decode.settings.speculative_num_steps: {range: [1, 5]}              # only while an algorithm is on
        decode.env.SGLANG_ENABLE_JIT_DEEPGEMM: {choices: ["0", "1"]}
        decode.settings.chunked_prefill_size: {choices: [4096, 8192], when: {decode.settings.x: [a, b]}}
        prefill.settings.chunked_prefill_size: {range: [2048, 16384], log: true}   # PD: each role its own keys
        prefill+decode.model.path: {choices: [/models/a, {path: /models/b, facts: {...}}]}   # one value, both roles
        decode.tp_size: {choices: [4, 8]}
      objective: output_tok_s_per_gpu             # or a list of them: a Pareto front (NSGA-II)
      budget: {launches: 20, trials: 200, hours: 6}
      sampler: tpe                                # tpe (one objective), nsga2 (several), random
      seed: 1
      baseline: true                              # the first trial: the inventory's own values

A KEY is ``ROLE.settings.NAME``, ``ROLE.env.NAME``, ``ROLE.model.path`` or ``ROLE.tp_size``, as a grid
dimension, where ROLE may name several roles joined by ``+`` (one value for all of them: a PD pair
must load the same checkpoint). A range of two integers is an integer range; ``log`` samples it on a
log scale; ``step`` makes it discrete. ``when`` makes a key mean something only while other keys
(choices of the space) take one of the values given; ``ROLE.settings.speculative_*`` keys are
conditioned on ``ROLE.settings.speculative_algorithm`` not being null by themselves, when the space
has that key. A key whose condition does not hold is removed from the role (``null``), so a stale
value of the role file does not reach the engine.

Objectives, each judged at the variant's best level (the highest concurrency that meets the SLO; the
most tok/s per GPU without one) unless a level is named:

    output_tok_s_per_gpu   output tok/s per GPU (maximise)
    goodput                requests/s served while the SLO holds (maximise)
    output_tok_s_per_user  a request's output tokens / its median end-to-end latency (maximise)
    output_tok_s_per_w     output tok/s per watt the GPUs drew (maximise; needs NVML)
    {p99_tpot_ms: {concurrency: 16}}   any SLO figure at one level of the ladder (minimise)
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from typing import Any, Protocol

from ..errors import Problem
from ..inventory import role_overrides
from ..yamlsrc import Checker

KEY_RE = re.compile(r"(?P<roles>[a-z0-9][a-z0-9_-]*(?:\+[a-z0-9][a-z0-9_-]*)*)\."
                    r"(?:(?P<section>settings|env)\.(?P<name>[A-Za-z0-9_]+)|model\.(?P<model>path)|(?P<tp>tp_size))")
KEY_RULE = "ROLE.settings.NAME, ROLE.env.NAME, ROLE.model.path or ROLE.tp_size (ROLE may be roles joined by +)"
SAMPLERS = ("tpe", "nsga2", "random")
# objective -> (the figure of the best level it reads, direction)
AT_BEST = {"output_tok_s_per_gpu": ("output_tok_s_per_gpu", "maximize"),
           "goodput": ("request_per_s", "maximize"),
           "output_tok_s_per_user": ("output_tok_s_per_user", "maximize"),
           "output_tok_s_per_w": ("output_tok_s_per_w", "maximize")}
SPECULATIVE = "speculative_algorithm"
DEFAULT_LAUNCHES = 20
TRIALS_PER_LAUNCH = 10  # default trials budget: refused trials cost no launch, but they end too


@dataclass(frozen=True)
class Dimension:
    key: str  # as written: decode.settings.mem_fraction_static
    roles: tuple[str, ...]
    section: str | None  # settings | env | model | None (tp_size)
    name: str  # the setting or env name, "path", or "tp_size"
    kind: str  # int | float | choice
    low: float | None = None
    high: float | None = None
    step: float | None = None
    log: bool = False
    choices: tuple[Any, ...] = ()
    facts: dict[str, Any] = field(default_factory=dict, hash=False)  # model.path choice -> its facts
    # (key, values it must take) each; values None: any value but null
    when: tuple[tuple[str, tuple[Any, ...] | None], ...] = ()
    line: int | None = None

    def describe(self) -> str:
        if self.kind == "choice":
            return "one of " + ", ".join("null" if c is None else str(c) for c in self.choices)
        scale = ", log scale" if self.log else f", step {self.step:g}" if self.step else ""
        return f"{self.kind} in [{self.low:g}, {self.high:g}]{scale}"


@dataclass(frozen=True)
class Objective:
    name: str
    direction: str  # maximize | minimize
    concurrency: int | None = None  # a figure at this level; None: at the variant's best level

    @property
    def label(self) -> str:
        return self.name if self.concurrency is None else f"{self.name}@c{self.concurrency}"


@dataclass(frozen=True)
class Search:
    space: tuple[Dimension, ...]
    objectives: tuple[Objective, ...]
    launches: int = DEFAULT_LAUNCHES
    trials: int = DEFAULT_LAUNCHES * TRIALS_PER_LAUNCH
    hours: float | None = None
    sampler: str = "tpe"
    seed: int | None = None
    baseline: bool = True
    line: int | None = None

    def digest(self) -> str:
        """What the study's trials mean: the space and the objectives (not the budget, the seed, or the
        sampler: a study may be given more launches, or go on with another sampler)."""
        doc = {"space": [{k: v for k, v in asdict(d).items() if k != "line"} for d in self.space],
               "objectives": [asdict(o) for o in self.objectives]}
        return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def dimension(self, key: str) -> Dimension:
        return next(d for d in self.space if d.key == key)


class Suggests(Protocol):
    """What sampling needs of a trial (optuna.Trial has these)."""

    def suggest_float(self, name: str, low: float, high: float, *, step: float | None = None,
                      log: bool = False) -> float: ...

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False) -> int: ...

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any: ...


# ------------------------------------------------------------------------------------------ parse

def load_search(top: Checker, ladder: tuple[int, ...]) -> Search | None:
    """The ``search:`` section (None when the file has none); problems go to ``top``'s list."""
    if top.data.get("search") is None:
        return None
    problems, file = top.problems, top.file
    line = top.where("search")
    c = top.child("search")
    c.unknown_keys({"space", "objective", "budget", "sampler", "seed", "baseline"})
    space = _space(c.child("space", required=True), problems, file)
    if c.data.get("space") == {}:
        c.fail("the space is empty: name at least one key to search", "space")
    objectives = _objectives(c, ladder)
    bc = c.child("budget")
    bc.unknown_keys({"launches", "trials", "hours"})
    launches = bc.get("launches", int, default=DEFAULT_LAUNCHES, check=lambda v: None if v >= 1 else "must be >= 1")
    trials = bc.get("trials", int, default=launches * TRIALS_PER_LAUNCH,
                    check=lambda v: None if v >= launches else
                    f"at least budget.launches ({launches}): every launch is a trial")
    hours = bc.get("hours", float, check=lambda v: None if 0 < v < math.inf else "a number of hours, more than 0")
    default_sampler = "tpe" if len(objectives) <= 1 else "nsga2"
    sampler = c.get("sampler", str, default=default_sampler, check=_sampler_problem)
    seed = c.get("seed", int)
    baseline = c.get("baseline", bool, default=True)
    if not space or not objectives:
        return None
    return Search(space=tuple(space), objectives=tuple(objectives), launches=launches, trials=trials, hours=hours,
                  sampler=sampler, seed=seed, baseline=baseline, line=line)


def _sampler_problem(v: str) -> str | None:
    if v == "gp":
        return ("gp is Optuna's GPSampler, which needs torch and scipy (not gpudeploy's dependencies); tpe reads "
                "the same constraints and handles choices and conditional keys")
    return None if v in SAMPLERS else f"one of {', '.join(SAMPLERS)}"


def _space(c: Checker, problems: list[Problem], file: str) -> list[Dimension]:
    out: list[Dimension] = []
    for key, spec in c.data.items():
        line = c.where(str(key))
        key = str(key)
        m = KEY_RE.fullmatch(key)
        if not m:
            problems.append(Problem(f"search key {key!r}: expected {KEY_RULE}", file=file, line=line,
                                    key="search.space"))
            continue
        d = _dimension(key, m, spec, problems, file, line)
        if d is not None:
            out.append(d)
    keys = {d.key: d for d in out}
    resolved = []
    for d in out:
        when = d.when
        for parent, values in when:
            p = keys.get(parent)
            if p is None or p.kind != "choice":
                problems.append(Problem(f"when: {parent!r} is not a key of the space with choices", file=file,
                                        line=d.line, key=f"search.space.{d.key}.when"))
            elif values is not None and any(v not in p.choices for v in values):
                wrong = [v for v in values if v not in p.choices]
                problems.append(Problem(f"when: {parent} has no choice {', '.join(map(repr, wrong))} (its choices: "
                                        f"{', '.join(map(repr, p.choices))})", file=file, line=d.line,
                                        key=f"search.space.{d.key}.when"))
        if not when and d.section == "settings" and d.name.startswith("speculative_") and d.name != SPECULATIVE:
            algorithm = f"{'+'.join(d.roles)}.settings.{SPECULATIVE}"
            if algorithm in keys and keys[algorithm].kind == "choice":
                when = ((algorithm, None),)  # only while a speculative algorithm is on
        resolved.append(Dimension(**{**_fields(d), "when": when}))
    for d in resolved:
        cycle = _cycle(d, {x.key: x for x in resolved})
        if cycle:
            problems.append(Problem(f"when: the conditions go round in a circle ({' -> '.join(cycle)})", file=file,
                                    line=d.line, key=f"search.space.{d.key}.when"))
            return []
    return resolved


def _fields(d: Dimension) -> dict[str, Any]:
    return {f: getattr(d, f) for f in d.__dataclass_fields__}


def _cycle(d: Dimension, keys: dict[str, Dimension]) -> list[str] | None:
    path = [d.key]
    todo = [(d.key, path)]
    while todo:
        key, path = todo.pop()
        for parent, _ in keys[key].when if key in keys else ():
            if parent == d.key:
                return [*path, parent]
            if parent not in path:
                todo.append((parent, [*path, parent]))
    return None


def _dimension(key: str, m: re.Match[str], spec: Any, problems: list[Problem], file: str,
               line: int | None) -> Dimension | None:
    roles = tuple(m["roles"].split("+"))
    section = m["section"] or ("model" if m["model"] else None)
    name = m["name"] or m["model"] or "tp_size"
    c = Checker(spec, problems, file, prefix=f"search.space.{key}.", line=line)
    if not isinstance(spec, dict):
        if spec is not None:
            return None  # Checker said: expected a mapping
        c.fail("give a range ({range: [LOW, HIGH]}) or choices ({choices: [...]})", None)
        return None
    c.unknown_keys({"range", "step", "log", "choices", "when"})
    before = len(problems)
    when = _when(c)
    if ("range" in c.data) == ("choices" in c.data):
        c.fail("give either range: [LOW, HIGH] or choices: [...]", None)
        return None
    if "choices" in c.data:
        for extra in ("step", "log"):
            if extra in c.data:
                c.fail(f"{extra} goes with a range, not with choices", extra)
        return _choices(key, roles, section, name, c, when, problems, file, line, before)
    return _range(key, roles, section, name, c, when, problems, file, line, before)


def _when(c: Checker) -> tuple[tuple[str, tuple[Any, ...] | None], ...]:
    raw = c.get("when", dict, default={}) or {}
    out = []
    for parent, values in raw.items():
        if isinstance(values, dict):
            c.fail(f"when.{parent}: a value or a list of values", "when")
            continue
        vals = tuple(values) if isinstance(values, list) else (values,)
        out.append((str(parent), vals))
    return tuple(out)


def _choices(key: str, roles: tuple[str, ...], section: str | None, name: str, c: Checker,
             when: tuple[tuple[str, tuple[Any, ...] | None], ...], problems: list[Problem], file: str,
             line: int | None, before: int) -> Dimension | None:
    raw = c.get("choices", list)
    if raw is None and c.data.get("choices") is not None:
        return None  # not a list: said
    if not raw:
        c.fail("choices: give at least one value", "choices")
        return None
    facts: dict[str, Any] = {}
    values: list[Any] = []
    for v in raw or []:
        if section == "model" and isinstance(v, dict):
            mc = Checker(v, problems, file, prefix=f"search.space.{key}.choices.", line=line)
            mc.unknown_keys({"path", "facts"})
            path = mc.get("path", str, required=True)
            got = mc.get("facts", dict)
            if path is not None:
                values.append(path)
                if got is not None:
                    facts[path] = dict(got)
            continue
        if isinstance(v, (dict, list)):
            c.fail("choices are plain values (numbers, strings, true/false, null)"
                   + (", or {path, facts} for a checkpoint" if section == "model" else ""), "choices")
            return None
        values.append(v)
    if len({json.dumps(v, sort_keys=True) for v in values}) != len(values):
        c.fail("a value is listed twice", "choices")
    if section in ("model", None) and None in values:
        c.fail(f"null is no {name}: a choice of a checkpoint or a TP size is a value", "choices")
    _check_values(roles, section, name, [v for v in values if v is not None], problems, file, line)
    if len(problems) != before:
        return None
    return Dimension(key, roles, section, name, "choice", choices=tuple(values), facts=facts, when=when, line=line)


def _range(key: str, roles: tuple[str, ...], section: str | None, name: str, c: Checker,
           when: tuple[tuple[str, tuple[Any, ...] | None], ...], problems: list[Problem], file: str,
           line: int | None, before: int) -> Dimension | None:
    raw = c.get("range", list)
    if section == "model":
        c.fail("a checkpoint is chosen from choices: [...], not a range", "range")
        return None
    if not isinstance(raw, list) or len(raw) != 2 or not all(_number(v) for v in raw):
        c.fail("range is [LOW, HIGH], two numbers", "range")
        return None
    low, high = raw
    kind = "int" if all(isinstance(v, int) for v in raw) else "float"
    if kind == "float" and section is None:
        c.fail("tp_size is a whole number: give an integer range or choices", "range")
        return None
    if not low < high:
        c.fail(f"range [{low}, {high}]: LOW must be below HIGH", "range")
        return None
    log = c.get("log", bool, default=False)
    step = c.get("step", (int, float) if kind == "float" else int,
                 check=lambda v: None if 0 < v < math.inf else "must be more than 0")
    if log and low <= 0:
        c.fail("a log range starts above 0", "range")
    if log and step is not None and not (kind == "int" and step == 1):
        c.fail("step and log do not go together (Optuna samples a log range continuously)", "step")
    if step is not None and not log and step > high - low:
        c.fail(f"step {step} is wider than the range", "step")
    _check_values(roles, section, name, [low, high], problems, file, line)
    if len(problems) != before:
        return None
    return Dimension(key, roles, section, name, kind, low=low, high=high, step=float(step) if step else None,
                     log=bool(log), when=when, line=line)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check_values(roles: tuple[str, ...], section: str | None, name: str, values: list[Any],
                  problems: list[Problem], file: str, line: int | None) -> None:
    """Each value checked as that key of a variant is (reserved env names, env values, TP >= 1), once
    (the roles of a ``+`` key share the value)."""
    for value in values:
        one = {section: {name: value}} if section else {"tp_size": value}
        before = len(problems)
        role_overrides(Checker(one, problems, file, role=roles[0], prefix=f"search.space.{'+'.join(roles)}.",
                               line=line))
        if len(problems) != before:
            return


def _objectives(c: Checker, ladder: tuple[int, ...]) -> list[Objective]:
    from .spec import SLO_METRICS

    raw = c.data.get("objective")
    if raw is None:
        c.fail("required key is missing: objective (e.g. output_tok_s_per_gpu)", None)
        return []
    items = raw if isinstance(raw, list) else [raw]
    out: list[Objective] = []
    known = f"{', '.join(AT_BEST)}, or {{METRIC_ms: {{concurrency: C}}}} (METRIC_ms: {', '.join(SLO_METRICS)})"
    for item in items:
        if isinstance(item, str) and item in AT_BEST:
            out.append(Objective(item, AT_BEST[item][1]))
        elif isinstance(item, str) and item in SLO_METRICS:
            c.fail(f"{item} at which load? {{{item}: {{concurrency: C}}}}, C a level of benchmark.concurrency",
                   "objective")
        elif isinstance(item, dict) and len(item) == 1 and str(next(iter(item))) in SLO_METRICS:
            metric = str(next(iter(item)))
            at = item[metric]
            level = at.get("concurrency") if isinstance(at, dict) and set(at) == {"concurrency"} else None
            if not isinstance(level, int) or isinstance(level, bool) or level not in ladder:
                c.fail(f"{metric}: {{concurrency: C}}, C a level of benchmark.concurrency ({list(ladder)})",
                       "objective")
            else:
                out.append(Objective(metric, "minimize", level))
        else:
            c.fail(f"unknown objective {item!r}: one of {known}", "objective")
    labels = [o.label for o in out]
    if len(set(labels)) != len(labels):
        c.fail("an objective is named twice", "objective")
    return out


# ------------------------------------------------------------------------------------ a point

class _Inactive:
    def __repr__(self) -> str:
        return "inactive"


INACTIVE: Any = _Inactive()


def sample(trial: Suggests, search: Search) -> dict[str, Any]:
    """The trial's point: space key -> value, for the keys whose conditions hold (parents first)."""
    values: dict[str, Any] = {}
    keys = {d.key: d for d in search.space}

    def value(d: Dimension) -> Any:
        if d.key in values:
            return values[d.key]
        for parent, allowed in d.when:
            got = value(keys[parent])
            if got is INACTIVE or (got is None if allowed is None else got not in allowed):
                values[d.key] = INACTIVE
                return INACTIVE
        values[d.key] = _suggest(trial, d)
        return values[d.key]

    for d in search.space:
        value(d)
    return {k: v for k, v in values.items() if v is not INACTIVE}


def _suggest(trial: Suggests, d: Dimension) -> Any:
    if d.kind == "choice":
        return trial.suggest_categorical(d.key, list(d.choices))
    assert d.low is not None and d.high is not None
    if d.kind == "int":
        return trial.suggest_int(d.key, int(d.low), int(d.high), step=int(d.step or 1), log=d.log)
    return rounded(trial.suggest_float(d.key, float(d.low), float(d.high), step=d.step, log=d.log), d)


def rounded(v: float, d: Dimension) -> float:
    """A sampled float as the engine gets it: to the step's decimals (0.82, not 0.8200000000000001), else
    to 4 significant digits (an engine reads a flag's text; more digits tell it nothing)."""
    if d.step:
        exponent = Decimal(repr(d.step)).normalize().as_tuple().exponent
        return round(v, min(12, max(0, -exponent))) if isinstance(exponent, int) else v
    return float(f"{v:.4g}")


def overrides(search: Search, params: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A point -> the variant's overrides, role by role. A key whose condition does not hold removes
    the role's own value of a setting or env variable (null), so no stale value reaches the engine."""
    out: dict[str, dict[str, Any]] = {}
    for d in search.space:
        active = d.key in params
        if not active and d.section not in ("settings", "env"):
            continue
        value = params.get(d.key)
        for role in d.roles:
            mine = out.setdefault(role, {})
            if d.section is None:
                mine["tp_size"] = value
            elif d.section == "model":
                mine["model"] = {"path": value, **({"facts": d.facts[value]} if value in d.facts else {})}
            else:
                mine.setdefault(d.section, {})[d.name] = None if not active else (
                    str(value).lower() if d.section == "env" and isinstance(value, bool) else
                    str(value) if d.section == "env" and value is not None else value)
    return out


def space_size(search: Search) -> int | None:
    """How many points the space has (an upper bound where keys are conditional); None: continuous."""
    total = 1
    for d in search.space:
        if d.kind == "choice":
            total *= len(d.choices)
        elif d.kind == "int" and not d.log:
            assert d.low is not None and d.high is not None
            total *= int((d.high - d.low) // (d.step or 1)) + 1
        elif d.kind == "int":
            assert d.low is not None and d.high is not None
            total *= int(d.high - d.low) + 1
        elif d.step:
            assert d.low is not None and d.high is not None
            total *= round((d.high - d.low) / d.step) + 1
        else:
            return None
    return total


def contains(d: Dimension, value: Any) -> bool:
    """Whether the space's key ``d`` can take ``value`` (the inventory's own, for the baseline)."""
    if d.kind == "choice":
        return bool(value in d.choices)
    if not _number(value) or isinstance(value, bool) or (d.kind == "int" and not isinstance(value, int)):
        return False
    assert d.low is not None and d.high is not None
    if not d.low <= value <= d.high:
        return False
    if d.step and not d.log:
        k = (value - d.low) / d.step
        return bool(abs(k - round(k)) < 1e-6)
    return True


def label_of(search: Search, params: Mapping[str, Any]) -> str:
    """name=value pairs of a point, short names where they are unique: what a trial's name shows."""
    names = [d.name for d in search.space]
    parts = []
    for d in search.space:
        if d.key not in params:
            continue
        short = d.name if names.count(d.name) == 1 else f"{'+'.join(d.roles)}.{d.name}"
        v = params[d.key]
        text = "null" if v is None else f"{v:g}" if isinstance(v, float) else str(v)
        parts.append(f"{short}={text}")
    return ",".join(parts)

