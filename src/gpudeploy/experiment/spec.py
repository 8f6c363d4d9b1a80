"""The experiment file (YAML, beside the inventory) -> :class:`Experiment`, every problem at once with
file:line; nothing is touched while reading it.

    name: lab-vllm                         # default: the file's stem
    inventory: ../lab/inventory/lab-vllm.yml   # relative to this file
    deployment: vllmlab                    # default: the inventory's deployment
    results: ../bench/results/lab-vllm     # default: results/<name> beside this file
    variants:                              # name -> overrides of role keys, in this order
      seqs-1: {vllm-tiny: {settings: {max_num_seqs: 1}}}
      seqs-8: {vllm-tiny: {settings: {max_num_seqs: 8}}}
    grid:                                  # optional: the Cartesian product, after the variants
      decode.settings.max_running_requests: [64, 128, 256]
    benchmark:
      client: vllm                         # vllm or sglang; default: the engines' own
      python: /opt/vllm/bin/python3        # the client's interpreter on the router's host
      dataset: random                      # random (vllm) / random-ids (sglang) by default
      input_len: 64
      output_len: 32
      concurrency: [1, 4, 16]              # the ladder
      prompts: 32                          # per level and repeat
      warmup: 2
      repeats: 1
      seed: 1
      tokenizer: /models/x                 # default: the engine's model.path
      timeout_s: 600                       # one client run, at most
      remote_dir: ~/.cache/gpudeploy/bench # its run folders' base on the router's host (see benchdir.py)
    slo: {p99_tpot_ms: 50, p99_ttft_ms: 2000}
    choose: {bisect: 2, stop_when_gain_below_percent: 5}

Instead of variants and a grid, a file may hold ``search:``, a space the sampler chooses variants from
(search_space.py; ``gpudeploy tune --file F`` runs it, search.py).

A variant overrides, per role: ``settings`` and ``env`` (merged key by key; ``null`` removes a key),
``extra_args`` (replaced), ``tp_size``, ``model`` (the checkpoint: ``path``, and the ``facts`` the memory
preflight reads; a new path without facts drops the role's, which describe the other checkpoint) and
``files`` (``ENV_NAME: local/path``: a file or folder beside this file, shipped to the hosts with the
variant and that variable pointed at it; ship.py). A grid dimension is ``role.settings.key`` (or
``role.env.NAME``, ``role.model.path``, ``role.tp_size``)::

    variants:
      fp8: {decode: {model: {path: /models/Qwen3-235B-A22B-FP8}}}
      fp4-tuned:
        decode:
          model: {path: /models/Qwen3-235B-A22B-FP4}
          files: {SGLANG_MOE_CONFIG_DIR: tuned/moe-configs}
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError, Problem
from ..inventory import role_overrides
from ..limits import seconds_problem
from ..yamlsrc import Checker, LineList, LineMap, load_yaml
from .search_space import Search, load_search
from .ship import Bundle, read_bundle

CLIENTS = ("sglang", "vllm")
# The keys of each level of an experiment file (docs/gen.py writes their reference from these sets).
EXPERIMENT_KEYS = {"name", "inventory", "deployment", "results", "variants", "grid", "benchmark", "slo", "choose",
                   "search"}
BENCHMARK_KEYS = {"client", "python", "backend", "dataset", "input_len", "output_len", "concurrency", "prompts",
                  "warmup", "repeats", "seed", "tokenizer", "timeout_s", "extra_args", "remote_dir"}
CHOOSE_KEYS = {"bisect", "stop_when_gain_below_percent"}
SLO_METRICS = tuple(f"{stat}_{metric}_ms" for stat in ("median", "p90", "p99")
                    for metric in ("ttft", "tpot", "itl", "e2el"))
VARIANT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.=,+-]{0,80}")
VARIANT_RULE = "use letters, digits and _ . = , + - (at most 81, starting with a letter or digit)"
MAX_GRID = 256  # points: an experiment is meant to finish


@dataclass(frozen=True)
class Benchmark:
    client: str | None = None  # None: the engines' own (sglang for SGLang engines, else vllm)
    python: str | None = None
    backend: str | None = None
    dataset: str | None = None
    input_len: int = 128
    output_len: int = 64
    concurrency: tuple[int, ...] = (1, 4, 16)
    prompts: int = 32
    warmup: int = 1
    repeats: int = 1
    seed: int = 1
    tokenizer: str | None = None
    timeout_s: float = 600.0
    extra_args: tuple[str, ...] = ()
    remote_dir: str = "~/.cache/gpudeploy/bench"  # the SSH user's own; never a shared place


@dataclass(frozen=True)
class Choose:
    bisect: int = 2  # at most this many extra levels between the last passing and the first failing
    stop_when_gain_below_percent: float | None = None  # a grid dimension stops once a step gains less


@dataclass(frozen=True)
class Variant:
    name: str
    # role -> {"settings": {...}, "env": {...}, "extra_args": [...], "tp_size": N, "model": {...},
    # "files": {ENV: {"source", "sha256", "files", "bytes"}}} (what its key digests; no file content)
    overrides: dict[str, dict[str, Any]]
    line: int | None = None
    grid: tuple[tuple[str, Any], ...] = ()  # (dimension, value) for a grid point
    grid_index: tuple[int, ...] = ()  # the point's index along each dimension
    shipped: dict[str, tuple[Bundle, ...]] = field(default_factory=dict)  # role -> the files it ships


@dataclass(frozen=True)
class Experiment:
    name: str
    file: str
    inventory: str
    deployment: str | None
    results_dir: str
    variants: tuple[Variant, ...]
    benchmark: Benchmark
    slo: dict[str, float] = field(default_factory=dict)
    choose: Choose = field(default_factory=Choose)
    dimensions: tuple[str, ...] = ()  # the grid's, in order
    search: Search | None = None  # search: the space a tune samples variants from (tune, not experiment)


# Benchmark settings that change no figure a run measures (a time limit, where its files go): left out
# of a variant's key, so changing them re-runs nothing.
NOT_MEASURED = ("timeout_s", "remote_dir")


def variant_key(overrides: dict[str, Any], benchmark: dict[str, Any]) -> str:
    """What a variant is, for the store and --resume: a digest of its overrides and the benchmark
    settings (``benchmark``: ``asdict(Benchmark)``, or the same as the store's meta has it). An
    edited variant, or the same one under another benchmark, has another key; a grid point has the
    same key whatever its name (``grid-N`` shifts when a variant is added)."""
    doc = {"overrides": overrides, "benchmark": {k: v for k, v in benchmark.items() if k not in NOT_MEASURED}}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]


def key_of(exp: Experiment, v: Variant) -> str:
    return variant_key(v.overrides, asdict(exp.benchmark))


def load_experiment(path: str | Path) -> Experiment:
    """Parse and check the experiment file; InputError with every problem found, file:line each."""
    path = Path(path)
    problems: list[Problem] = []
    data = load_yaml(path, problems)
    if problems:
        raise InputError(problems)
    file = str(path)
    top = Checker(data, problems, file)
    top.unknown_keys(EXPERIMENT_KEYS)
    name = top.get("name", str, default=path.stem,
                   check=lambda v: None if VARIANT_RE.fullmatch(v) else VARIANT_RULE)
    inventory = top.get("inventory", str, required=True, default="")
    if inventory and not (path.parent / inventory).is_file():
        top.fail(f"no inventory file {path.parent / inventory}", "inventory")
    deployment = top.get("deployment", str)
    results = top.get("results", str, default=f"results/{name}")
    variants = _variants(top, problems, file)
    dimensions, grid = _grid(top, problems, file, len(variants))
    variants += grid
    searching = top.data.get("search") is not None
    if searching and ("variants" in top.data or "grid" in top.data):
        top.fail("a file holds either variants/grid (`gpudeploy experiment` runs them) or search (`gpudeploy tune` "
                 "runs it), not both: their results would share one store", "search")
    elif not searching and not variants and "variants" in top.data and "grid" not in top.data:
        top.fail("no variants: name at least one (an empty mapping `{}` runs the inventory as it is)", "variants")
    elif not searching and not variants and not problems:
        top.fail("required key is missing: variants (or grid; or search, which `gpudeploy tune` runs)", None)
    seen: dict[str, int | None] = {}
    same: dict[str, Variant] = {}
    for v in variants:
        if v.name in seen:
            problems.append(Problem(f"variant {v.name!r} is named twice (first at line {seen[v.name]})",
                                    file=file, line=v.line, key="variants"))
        seen.setdefault(v.name, v.line)
        twin = same.setdefault(json.dumps(v.overrides, sort_keys=True, default=str), v)
        if twin is not v:
            problems.append(Problem(f"variant {v.name!r} overrides exactly what {twin.name!r} (line {twin.line}) "
                                    "does: it would measure the same thing", file=file, line=v.line,
                                    key=f"variants.{v.name}" if not v.grid else "grid"))
    bench = _benchmark(top.child("benchmark", required=True), problems)
    slo = _slo(top.child("slo"))
    choose = _choose(top.child("choose"))
    search = load_search(top, bench.concurrency)
    if problems:
        raise InputError(problems)
    return Experiment(name=name, file=file, inventory=os.path.normpath(path.parent / inventory),
                      deployment=deployment, results_dir=os.path.normpath(path.parent / results),
                      variants=tuple(variants), benchmark=bench, slo=slo, choose=choose, dimensions=dimensions,
                      search=search)


def _overrides(raw: Any, problems: list[Problem], file: str, prefix: str,
               line: int | None) -> tuple[dict[str, dict[str, Any]], dict[str, tuple[Bundle, ...]]]:
    """role -> its overrides, each checked by inventory.role_overrides: a variant passes the checks a
    role file passes (reserved env names, env name syntax, control characters, value types); and
    role -> the files it ships, read from beside the experiment file (ship.py)."""
    c = Checker(raw, problems, file, prefix=prefix, line=line)
    out: dict[str, dict[str, Any]] = {}
    shipped: dict[str, tuple[Bundle, ...]] = {}
    for role, spec in c.data.items():
        rc = Checker(spec, problems, file, role=str(role), prefix=f"{prefix}{role}.", line=c.where(str(role)))
        out[str(role)] = role_overrides(rc)
        files = out[str(role)].get("files")
        if files:
            bundles = []
            for env, source in files.items():
                got = read_bundle(env, source, Path(file).parent)
                if isinstance(got, str):
                    fc = rc.child("files")
                    problems.append(Problem(got, file=file, line=fc.where(env), role=str(role),
                                            key=f"{prefix}{role}.files.{env}"))
                else:
                    bundles.append(got)
            shipped[str(role)] = tuple(bundles)
            out[str(role)]["files"] = {b.env: b.summary() for b in bundles}
    return out, shipped


def _variants(top: Checker, problems: list[Problem], file: str) -> list[Variant]:
    raw = top.get("variants", dict, default={}) or {}
    out = []
    for name, spec in raw.items():
        line = raw.line_of(name) if isinstance(raw, LineMap) else None
        name = str(name)
        if not VARIANT_RE.fullmatch(name):
            problems.append(Problem(f"variant name {name!r}: {VARIANT_RULE}", file=file, line=line, key="variants"))
            continue
        if spec is None:
            spec = {}
        if not isinstance(spec, dict):
            problems.append(Problem(f"a variant is a mapping of role -> overrides, got {type(spec).__name__}",
                                    file=file, line=line, key=f"variants.{name}"))
            continue
        overrides, shipped = _overrides(spec, problems, file, f"variants.{name}.", line)
        out.append(Variant(name, overrides, line, shipped=shipped))
    return out


DIMENSION_RE = re.compile(r"(?P<role>[a-z0-9][a-z0-9_-]*)\."
                          r"(?:(?P<section>settings|env|model)\.(?P<key>[A-Za-z0-9_]+)|tp_size)")


def _grid(top: Checker, problems: list[Problem], file: str, named: int) -> tuple[tuple[str, ...], list[Variant]]:
    raw = top.get("grid", dict, default={}) or {}
    dims: list[tuple[str, list[Any], int | None]] = []
    for dim, values in raw.items():
        line = raw.line_of(dim) if isinstance(raw, LineMap) else None
        dim = str(dim)
        if not DIMENSION_RE.fullmatch(dim):
            problems.append(Problem(f"grid dimension {dim!r}: expected role.settings.KEY, role.env.NAME, "
                                    "role.model.path or role.tp_size", file=file, line=line, key="grid"))
            continue
        if not isinstance(values, list) or not values:
            problems.append(Problem("a grid dimension is a non-empty list of values", file=file, line=line,
                                    key=f"grid.{dim}"))
            continue
        if any(isinstance(v, (dict, list)) for v in values):
            problems.append(Problem("grid values are plain values (numbers, strings, true/false)", file=file,
                                    line=line, key=f"grid.{dim}"))
            continue
        checked = _dimension_values(dim, values, problems, file, line)
        if checked is not None:
            dims.append((dim, checked, line))
    total = 1
    for _, values, _ in dims:
        total *= len(values)
    if dims and total > MAX_GRID:
        problems.append(Problem(f"the grid has {total} points; at most {MAX_GRID}", file=file, line=raw.line
                                if isinstance(raw, LineMap) else None, key="grid"))
        return (), []
    if not dims:
        return (), []
    points: list[Variant] = []
    import itertools

    for index in itertools.product(*(range(len(v)) for _, v, _ in dims)):
        chosen = tuple((dims[d][0], dims[d][1][i]) for d, i in enumerate(index))
        overrides: dict[str, dict[str, Any]] = {}
        for dim, value in chosen:
            m = DIMENSION_RE.fullmatch(dim)
            assert m is not None
            role = overrides.setdefault(m["role"], {})
            if m["section"]:
                role.setdefault(m["section"], {})[m["key"]] = value
            else:
                role["tp_size"] = value
        name = ",".join(f"{dim.rsplit('.', 1)[-1]}={value}" for dim, value in chosen)
        if not VARIANT_RE.fullmatch(name):
            name = f"grid-{named + len(points) + 1}"
        points.append(Variant(name, overrides, dims[0][2], grid=chosen, grid_index=tuple(index)))
    return tuple(d for d, _, _ in dims), points


def _dimension_values(dim: str, values: list[Any], problems: list[Problem], file: str,
                      line: int | None) -> list[Any] | None:
    """A dimension's values, each checked as that one role key of a variant is (once per value, not
    once per grid point); None if any is refused."""
    m = DIMENSION_RE.fullmatch(dim)
    assert m is not None
    before = len(problems)
    out = []
    for value in values:
        one = {m["section"]: {m["key"]: value}} if m["section"] else {"tp_size": value}
        c = Checker(one, problems, file, role=m["role"], prefix=f"grid.{m['role']}.", line=line)
        checked = role_overrides(c)
        section = checked.get(m["section"]) if m["section"] else checked
        out.append((section or {}).get(m["key"] if m["section"] else "tp_size", value))
    return out if len(problems) == before else None


def _positive_int(v: int) -> str | None:
    return None if v >= 1 else "must be >= 1"


def _benchmark(c: Checker, problems: list[Problem]) -> Benchmark:
    c.unknown_keys(BENCHMARK_KEYS)
    ladder_raw = c.get("concurrency", list, default=[1, 4, 16])
    ladder: list[int] = []
    for v in ladder_raw or []:
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            c.fail(f"concurrency levels are whole numbers >= 1, got {v!r}", "concurrency")
            break
        ladder.append(v)
    if ladder and ladder != sorted(set(ladder)):
        c.fail("the concurrency ladder goes up: each level once, lowest first", "concurrency")
    if isinstance(ladder_raw, LineList) and not ladder_raw:
        c.fail("the concurrency ladder is empty", "concurrency")
    extra = c.get("extra_args", list, default=[]) or []
    python = c.get("python", str, check=lambda v: None if v.startswith("/") else "must be an absolute path")
    return Benchmark(
        client=c.get("client", str, check=lambda v: None if v in CLIENTS else f"one of {', '.join(CLIENTS)}"),
        python=python, backend=c.get("backend", str), dataset=c.get("dataset", str),
        input_len=c.get("input_len", int, default=128, check=_positive_int),
        output_len=c.get("output_len", int, default=64, check=_positive_int),
        concurrency=tuple(ladder) or (1,), prompts=c.get("prompts", int, default=32, check=_positive_int),
        warmup=c.get("warmup", int, default=1, check=lambda v: None if v >= 0 else "must be >= 0"),
        repeats=c.get("repeats", int, default=1, check=_positive_int),
        seed=c.get("seed", int, default=1),
        tokenizer=c.get("tokenizer", str),
        timeout_s=c.get("timeout_s", float, default=600.0, check=seconds_problem),
        extra_args=tuple(str(a) for a in extra),
        remote_dir=c.get("remote_dir", str, default="~/.cache/gpudeploy/bench",
                         check=lambda v: None if (v.startswith("/") or v.startswith("~/")) and v.isprintable()
                         else "an absolute path or ~/PATH (the SSH user's home)"),
    )


def _slo(c: Checker) -> dict[str, float]:
    out: dict[str, float] = {}
    c.unknown_keys(set(SLO_METRICS))
    for key in SLO_METRICS:
        value = c.get(key, float, check=lambda v: None if v > 0 else "an upper bound in ms, more than 0")
        if value is not None:
            out[key] = value
    return out


def _choose(c: Checker) -> Choose:
    c.unknown_keys(CHOOSE_KEYS)
    return Choose(bisect=c.get("bisect", int, default=2, check=lambda v: None if v >= 0 else "must be >= 0"),
                  stop_when_gain_below_percent=c.get("stop_when_gain_below_percent", float,
                                                     check=lambda v: None if v >= 0 else "must be >= 0"))
