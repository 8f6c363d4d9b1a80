"""The experiment loop, per variant in order:

    1. the memory preflight: a variant predicted not to boot is skipped with its verdict (never
       launched blind), and the deploy it did not have to try is counted as time saved;
    2. deploy through the normal path and gate (engines, routers, the smoke generation);
    3. the engine's own benchmark client on the router's host, over SSH, against the router, level by
       level (choose.next_level), its raw JSON kept unchanged;
    4. while it runs, the deployment's units are watched: one that dies is "failed under load", with
       the cause its journal shows, not a slow result;
    5. everything recorded (store.py), the deployment torn down, the next variant.

``--resume`` skips variants already finished and, in a variant that was interrupted, the levels
already measured. A variant is known by its key (spec.variant_key: its overrides and the benchmark
settings), so an edited variant runs again (and says so) and a grid point keeps its runs when the
``grid-N`` names shift. Ctrl-C leaves the store consistent (every write is a transaction) and says
what is still running. A benchmark that breaks off (the SSH connection dropped, the host did not
answer) fails that variant with its cause, tears the deployment down and goes on with the next;
when the teardown cannot be done the experiment stops and says what may still run.
"""

from __future__ import annotations

import json
import re
import shlex
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from .. import interrupt
from ..apply.deploy import Options
from ..apply.deployment import deploy
from ..apply.teardown import teardown
from ..errors import GpudeployError, InputError, Problem
from ..fanout import Interrupted
from ..model import Plan, Unit
from ..plan.calibrate import CalibrationStore
from ..plan.memcheck import headroom_margin
from ..remote import connect
from ..remote.base import Result
from ..report import memory_figures
from ..verify.status import status
from . import bench, benchdir, choose, power, ship
from .spec import Experiment, key_of
from .store import RunRow, Store
from .variants import Planned, plan_variants

WATCH_EVERY_S = 2.0  # how often the units are looked at while the client runs
AFTER_DEATH_S = 60.0  # how long the client may go on after an engine died (it ends by itself)
VLLM_VERSION = re.compile(r"(?:vLLM server version|version)\s+(?:\x1b\[[\d;]*m)*(\d+\.\d+[\w.+-]*)")
VLLM_MEMORY = re.compile(r"(GiB for KV cache|KV cache size|Maximum concurrency for|Model loading took"
                         r"|Available KV cache memory)")

Say = Callable[[str], None]


@dataclass
class Death:
    unit: str
    cause: str
    kind: str | None = None  # the cause's kind (verify/causes.py), where the journal showed one
    role: str = ""  # the unit's role (as placed), and its role file
    file_role: str = ""


@dataclass(frozen=True)
class Outcome:
    """How one variant ended, for the caller that chooses the next (a search): the store has the rest."""

    status: str  # measured | skipped | deploy-failed | bench-failed | failed-under-load
    failure: str | None = None
    cause: str | None = None  # the kind of the gate's (or the journal's) cause of a launch that died
    roles: frozenset[str] = frozenset()  # the role of the unit that died, and its role file
    # the host whose failure ended the deploy (unreachable, ssh, a lost lock, shipping), not the variant's:
    # a search stops on it rather than spend a launch and blame the point
    host: str | None = None


EXPERIMENT_AGAIN = "`invoke experiment --file {file} --resume`"  # what goes on from here (tune says its own)


class ExperimentStopped(GpudeployError):
    """The experiment cannot go on safely (a deployment could not be torn down); the store is whole."""


def run_experiment(exp: Experiment, *, resume: bool = False, dry_run: bool = False,
                   calibration: CalibrationStore | None = None, deploy_timeout_s: float | None = None,
                   say: Say = print) -> Store:
    """Run (or with ``dry_run`` show) the experiment; returns its store."""
    if exp.search is not None:
        raise InputError([Problem(f"{exp.file} holds a search, which `gpudeploy tune --file {shlex.quote(exp.file)}` "
                                  "runs (experiment runs variants and a grid)", file=exp.file, line=exp.search.line,
                                  key="search")])
    planned = plan_variants(exp, calibration)
    keys = {p.variant.name: key_of(exp, p.variant) for p in planned}
    targets = {p.variant.name: bench.target(exp, p.plan) for p in planned}
    store = Store(exp.results_dir)
    if dry_run:
        for line in dry_run_lines(exp, planned, targets, store if resume else None):
            say(line)
        return store
    if store.variants() and not resume:
        raise InputError([Problem(f"{store.path} already holds results of this experiment: --resume goes on "
                                  "with it (finished variants are not re-run); or move the folder away to start "
                                  "over", file=exp.file, key="results")])
    for line in stored_mismatches(store, planned, keys):
        say(line)
    store.set_meta(name=exp.name, file=exp.file, inventory=exp.inventory, deployment=exp.deployment,
                   benchmark=asdict(exp.benchmark), slo=exp.slo, choose=asdict(exp.choose),
                   dimensions=list(exp.dimensions), variants=[p.variant.name for p in planned],
                   variant_keys=[keys[p.variant.name] for p in planned])
    finished = store.finished() if resume else set()
    for index, p in enumerate(planned):
        v, key = p.variant, keys[p.variant.name]
        if key in finished:
            row = store.variant(key) or {}
            was = f" (as {row['name']}: the same overrides and benchmark)" if row.get("name") != v.name else ""
            store.relabel(key, v.name, index)
            say(f"== {v.name}: already {row.get('status')}{was}; not re-run (--resume)")
            continue
        _variant(exp, index, p, key, targets[v.name], store, calibration, deploy_timeout_s, planned, keys, say)
    return store


def stored_mismatches(store: Store, planned: list[Planned], keys: dict[str, str]) -> list[str]:
    """What the store holds that no longer matches the experiment file, said plainly: a stored variant
    whose name now means other overrides or benchmark settings (its runs are not reused), and stored
    variants the file no longer defines (kept in the store, not shown)."""
    rows = store.variants()
    by_key = {r["key"]: r for r in rows}
    wanted = set(keys.values())
    out = []
    for p in planned:
        name, key = p.variant.name, keys[p.variant.name]
        stale = [r for r in rows if r["name"] == name and r["key"] != key and r["key"] not in wanted]
        if stale:
            out.append(f"== {name}: the stored {name} was measured with other overrides or benchmark settings than "
                       f"the file gives it now ({_difference(stale[0], p, store)}); its "
                       f"{len(store.runs(stale[0]['key']))} runs are not reused: it runs again")
        elif key not in by_key and any(r["name"] == name for r in rows):
            moved = next(r for r in rows if r["name"] == name)
            out.append(f"== {name}: the stored {name} is now {_name_of(moved['key'], keys)} (same overrides and "
                       f"benchmark); {name} itself is new and runs")
    names = set(keys)
    gone = [r["name"] for r in rows if r["key"] not in wanted and r["name"] not in names]
    if gone:
        out.append(f"stored variants that no variant of the file matches any more (kept in {store.path}, not shown, "
                   f"not reused): {', '.join(gone)}")
    return out


def _name_of(key: str, keys: dict[str, str]) -> str:
    return next((n for n, k in keys.items() if k == key), "?")


def _difference(row: dict[str, Any], p: Planned, store: Store) -> str:
    if (row.get("overrides") or {}) != p.variant.overrides:
        return f"overrides were {json.dumps(row.get('overrides') or {}, sort_keys=True)}"
    return "the benchmark settings changed"


def dry_run_lines(exp: Experiment, planned: list[Planned], targets: dict[str, bench.Target],
                  store: Store | None) -> list[str]:
    """What the experiment would run, in order; nothing is touched."""
    done = store.finished() if store else set()
    keys = {p.variant.name: key_of(exp, p.variant) for p in planned}
    b = exp.benchmark
    out = [f"experiment {exp.name}: {len(planned)} variants of deployment "
           f"{planned[0].plan.units[0].deployment if planned and planned[0].plan.units else '?'}; results in "
           f"{exp.results_dir} (--dry-run: nothing is deployed, run or written)",
           f"ladder {list(b.concurrency)}, {b.prompts} prompts per level x {b.repeats}, {b.input_len} in / "
           f"{b.output_len} out tokens" + (f"; SLO {', '.join(f'{k} <= {v:g}' for k, v in exp.slo.items())}, "
                                          f"then up to {exp.choose.bisect} bisection levels" if exp.slo else "")]
    if store is not None:
        out += stored_mismatches(store, planned, keys)
    for p in planned:
        v, t = p.variant, targets[p.variant.name]
        head = f"== {v.name}" + (f" ({', '.join(f'{d}={x}' for d, x in v.grid)})" if v.grid else "")
        if keys[v.name] in done:
            out.append(f"{head}: already finished; --resume does not re-run it")
            continue
        if not p.boots:
            out.append(f"{head}: SKIP, the memory preflight predicts it does not boot: {'; '.join(p.refusals)}")
            out += memory_lines(p)
            continue
        out.append(f"{head}: deploy, then benchmark through {t.through} with {t.client}'s client"
                   + (" (stand-in engines: token timing is synthetic)" if t.synthetic else ""))
        out += memory_lines(p)
        out += [f"   {w}" for w in p.warnings]
        for host, bundle in p.shipped:
            out.append(f"   ships {bundle.source} ({len(bundle.files)} file{'s' if len(bundle.files) != 1 else ''}, "
                       f"{bundle.size / 1024:.1f} KiB) to {host.name}:{bundle.folder}, {bundle.env}={bundle.target}")
        for u in p.plan.units:
            out.append(f"   {u.key}: {shlex.join(u.argv)}")
        folder = f"{b.remote_dir}/{bench.run_prefix(exp.name, v.name, b.concurrency[0], 0)}XXXXXXXX"
        out.append(f"   client on {t.host.name}, in a private run folder ({folder}): "
                   + shlex.join(bench.client_argv(b, t, b.concurrency[0], folder)))
        if len(b.concurrency) > 1:
            out.append(f"   ... then --max-concurrency {', '.join(map(str, b.concurrency[1:]))}"
                       + (" while the SLO holds" if exp.slo else ""))
    return out


def memory_lines(p: Planned) -> list[str]:
    """Every engine's memory verdict in this variant (--dry-run shows each variant's, also the ones run)."""
    out = []
    for u in p.plan.units:
        mem = u.memory
        if mem is None:
            if u.role.engine != "sglang_router":
                out.append(f"   memory {u.key}: not checked (the memory model is SGLang's; {u.role.engine} "
                           f"engine{', ' + u.role.log_format if u.role.engine == 'command' else ''})")
            continue
        verdict = str(mem.get("verdict", "unknown"))
        spare = headroom_margin(mem)  # none where the check stopped before the headroom (an empty KV pool)
        margin = f", headroom margin {spare:+.2f} GiB" if spare is not None else ""
        kv = f", KV pool {mem['kv_tokens']} tokens" if mem.get("kv_tokens") is not None else ""
        severity = {"refuse": " (deploy refuses)", "warn": " (inside the estimate's error: goes ahead)"}.get(
            str(mem.get("severity", "ok")), "")
        out.append(f"   memory {u.key}: {verdict.upper()}{severity}{margin}{kv}: {mem.get('reason', '')}".rstrip(": "))
    return out


def duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def estimate_saved(store: Store, p: Planned) -> tuple[float, str]:
    """What a skipped variant saved: the median deploy of this experiment so far, else the gate's limit."""
    measured = [v["deploy_s"] for v in store.variants() if v.get("deploy_s")]
    if measured:
        return statistics.median(measured), f"the median deploy of this experiment ({len(measured)} measured)"
    limit = max((u.role.health.timeout_s for u in p.plan.units), default=0.0)
    return limit, "up to the gate's timeout: no deploy measured yet"


def run_variant(exp: Experiment, index: int, p: Planned, key: str, store: Store, *,
                calibration: CalibrationStore | None, deploy_timeout_s: float | None, keep_up: bool, again: str,
                say: Say) -> Outcome:
    """One variant the caller chose (a search's trial): preflight, deploy, benchmark, record. With
    ``keep_up`` a measured variant's deployment is left running, and the next deploy restarts only the
    units whose files changed (apply/deployment.py: an unchanged, healthy unit is not restarted), never
    rolled through the router; ``again``: the command that goes on after Ctrl-C."""
    return _variant(exp, index, p, key, bench.target(exp, p.plan), store, calibration, deploy_timeout_s, [p],
                    {p.variant.name: key}, say, keep_up=keep_up, again=again)


def _variant(exp: Experiment, index: int, p: Planned, key: str, t: bench.Target, store: Store,
             calibration: CalibrationStore | None, deploy_timeout_s: float | None, planned: list[Planned],
             keys: dict[str, str], say: Say, *, keep_up: bool = False, again: str = EXPERIMENT_AGAIN) -> Outcome:
    again = again.format(file=shlex.quote(exp.file))
    v = p.variant
    rows = {r["key"]: r for r in store.variants()}
    scores = {q.variant.name: _variant_score(store, keys[q.variant.name], exp) for q in planned
              if keys[q.variant.name] in rows}
    skipped = {q.variant.name: rows[keys[q.variant.name]]["verdict"] or "" for q in planned
               if rows.get(keys[q.variant.name], {}).get("status") == "skipped"}
    why = choose.stop_reason(v, [q.variant for q in planned], scores, skipped,
                             exp.choose.stop_when_gain_below_percent)
    store.begin_variant(v.name, index, v.overrides, [list(g) for g in v.grid], key=key)
    if why:
        store.finish_variant(key, "skipped", verdict=why)
        say(f"== {v.name}: SKIPPED: {why}")
        return Outcome("skipped", why)
    if not p.boots:
        saved, basis = estimate_saved(store, p)
        verdict = "; ".join(p.refusals)
        store.finish_variant(key, "skipped", verdict=verdict, saved_s=saved)
        say(f"== {v.name}: SKIPPED, predicted not to boot: {verdict}\n   saved {duration(saved)} ({basis})")
        return Outcome("skipped", verdict)
    dep = p.plan.units[0].deployment
    say(f"== {v.name}: deploying {dep} ({', '.join(u.key for u in p.plan.units)})")
    started = time.monotonic()
    try:
        shipping = _ship(p, say)
        if shipping is not None:
            host, failure = shipping
            store.finish_variant(key, "deploy-failed", failure=failure)
            say(f"== {v.name}: DEPLOY FAILED: {failure}")
            return Outcome("deploy-failed", failure, host=host)
        # kept up between variants, the deployment serves when the next deploys: never rolled through
        # its router (that needs room for a second copy), its changed units restarted plainly
        result = deploy(p.plan, Options(timeout_s=deploy_timeout_s, rolling="never" if keep_up else "auto"),
                        calibration)
    except (KeyboardInterrupt, Interrupted):
        _interrupted(store, exp, p, key, t, "while deploying", say, again)
        raise
    deploy_s = time.monotonic() - started
    outcome = result.deployments.get(dep)
    outcomes = [o for res in result.hosts.values() if not isinstance(res, GpudeployError) for o in res]
    units = [{"host": u.host.name, "role": u.role.name, "unit": u.name, "argv": list(u.argv), "env": u.env}
             for u in p.plan.units]
    store.update_variant(key, units=units, engine=t.engine, client=t.client, synthetic=t.synthetic,
                         gpus=t.gpus, deploy_s=deploy_s, verdict="; ".join(p.warnings) or None,
                         engine_release=_release(p.plan, outcomes), memory=_memory(outcomes))
    if outcome is None or not outcome.ok:
        failure = outcome.failure if outcome else "; ".join(str(r) for r in result.hosts.values()
                                                            if isinstance(r, GpudeployError))
        store.finish_variant(key, "deploy-failed", failure=failure)
        say(f"== {v.name}: DEPLOY FAILED: {failure}")
        died = _first_death(outcomes)
        broken = next((h for h, r in result.hosts.items() if isinstance(r, GpudeployError)), None)
        return Outcome("deploy-failed", failure, died[0] if died else None, died[1] if died else frozenset(),
                       host=broken)
    say(f"== {v.name}: ready in {deploy_s:.1f} s; benchmark through {t.through}"
        + (" (stand-in engines: synthetic token timing)" if t.synthetic else ""))
    # Said if Ctrl-C must end the command before it can report itself (interrupt.GRACE_S)
    interrupt.note(f"experiment {v.name}", f"still running: {', '.join(u.key for u in p.plan.units)} (deployment "
                   f"{dep}): `invoke teardown --inventory {shlex.quote(exp.inventory)} --deployment {dep}` stops "
                   f"it; {again} goes on from here")
    broke: GpudeployError | None = None
    death = None
    try:
        death = _ladder(exp, p, key, t, store, say)
    except (KeyboardInterrupt, Interrupted):
        _interrupted(store, exp, p, key, t, "during the benchmark", say, again)
        raise
    except GpudeployError as exc:  # the connection broke, the host did not answer: this variant's failure
        broke = exc
        store.finish_variant(key, "bench-failed", failure=f"the benchmark broke off: {exc}")
        say(f"== {v.name}: BENCHMARK FAILED: {exc}\n   its finished runs are kept (--resume runs the rest); "
            f"tearing {dep} down")
    measured = broke is None and not death and bool(levels_of(store, key))
    left: list[str] = []
    if not (keep_up and measured):
        try:
            left = _teardown(p.plan, dep, say)
        except (KeyboardInterrupt, Interrupted):
            _interrupted(store, exp, p, key, t, "while tearing down", say, again)
            raise
    interrupt.clear(f"experiment {v.name}")  # what teardown left, it says itself (below)
    ended = Outcome("bench-failed", f"the benchmark broke off: {broke}")
    if broke is None and death:
        store.finish_variant(key, "failed-under-load", failure=f"{death.unit}: {death.cause}")
        say(f"== {v.name}: FAILED UNDER LOAD: {death.unit}: {death.cause}")
        ended = Outcome("failed-under-load", f"{death.unit}: {death.cause}", death.kind,
                          frozenset({death.role, death.file_role} - {""}))
    elif broke is None and not measured:
        # the client ran but gave no figures at any level (it failed: its own output says why)
        why = _client_failure(store, key)
        store.finish_variant(key, "bench-failed", failure=f"the benchmark client gave no result: {why}")
        say(f"== {v.name}: BENCHMARK FAILED: the client gave no result: {why}")
        ended = Outcome("bench-failed", f"the benchmark client gave no result: {why}")
    elif broke is None:
        store.finish_variant(key, "measured")
        say(f"== {v.name}: measured")
        ended = Outcome("measured")
    if left:
        _stop(store, exp, p, t, left, again)
    if broke is not None:
        say(f"   {dep} is torn down; going on with the next variant")
    return ended


def _first_death(outcomes: list[Any]) -> tuple[str, frozenset[str]] | None:
    """The cause kind and the roles of the unit that died first in a failed deploy (a group's root
    cause is the rank that died first too), or None when no gate named one."""
    dead = [o for o in outcomes if not o.ok and o.gate is not None and o.gate.cause is not None]
    if not dead:
        return None
    first = min(dead, key=lambda o: o.gate.died_at if o.gate.died_at is not None else float("inf"))
    return first.gate.cause.kind, frozenset({first.unit.role.name, first.unit.role.file_role})


def teardown_deployment(p: Planned, say: Say) -> list[str]:
    """Tear down the deployment a kept-up variant left running; what could not be done, per host."""
    return _teardown(p.plan, p.plan.units[0].deployment, say)


def _ship(p: Planned, say: Say) -> tuple[str, str] | None:
    """The variant's files onto the hosts that run its units, before they start (ship.py); the host
    and what went wrong there, or None."""
    for host, bundle in p.shipped:
        try:
            with connect(host) as remote:
                ship.upload(remote, bundle)
        except GpudeployError as exc:
            return host.name, f"shipping {bundle.source} to {host.name} failed: {exc}"
        n = len(bundle.files)
        say(f"   shipped {bundle.source} ({n} file{'s' if n != 1 else ''}) to {host.name}:{bundle.folder}")
    return None


def _stop(store: Store, exp: Experiment, p: Planned, t: bench.Target, left: list[str], again: str) -> None:
    """The deployment could not be torn down: say what may still run, and stop (the next variant would
    deploy over a state nobody knows)."""
    dep = p.plan.units[0].deployment
    what = _running_text(p)
    raise ExperimentStopped(
        f"stopped after variant {p.variant.name}: the teardown of deployment {dep} did not finish "
        f"({'; '.join(left)}). {what}. `invoke teardown --inventory {shlex.quote(exp.inventory)} "
        f"--deployment {dep}` stops it; {again} goes on "
        f"(the store {store.path} holds every finished run; the client on {t.host.name} ends by itself within "
        f"{exp.benchmark.timeout_s:g} s)")


def _variant_score(store: Store, key: str, exp: Experiment) -> float | None:
    return choose.score(levels_of(store, key), exp.slo)


def levels_of(store: Store, key: str) -> dict[int, dict[str, Any]]:
    """concurrency -> the aggregated figures of the finished runs of the variant ``key``."""
    by: dict[int, list[dict[str, Any]]] = {}
    for r in store.runs(key):
        if r.ok:
            by.setdefault(r.concurrency, []).append(r.figures)
    return {c: choose.aggregate(runs) for c, runs in by.items()}


def _client_failure(store: Store, key: str) -> str:
    """The last lines the client printed in the variant's last run (its own error), from the run's log."""
    runs = store.runs(key)
    if not runs:
        return "it never ran"
    last = runs[-1]
    sub = last.variant if not last.key else f"{last.variant}-{last.key}"
    try:
        text = (store.folder / "raw" / sub / f"c{last.concurrency}-r{last.repeat}.log").read_text(errors="replace")
    except OSError:
        return "its log is missing"
    tail = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith(("$ ", "rc "))][-2:]
    return " | ".join(tail) or "no output"


def _ladder(exp: Experiment, p: Planned, key: str, t: bench.Target, store: Store, say: Say) -> Death | None:
    b = exp.benchmark
    done = {(r.concurrency, r.repeat) for r in store.runs(key) if r.ok}
    while True:
        levels = levels_of(store, key)
        met = {c: not choose.misses(f, exp.slo) for c, f in levels.items()}
        c = choose.next_level(b.concurrency, met, bool(exp.slo), exp.choose.bisect)
        if c is None:
            return None
        for repeat in range(b.repeats):
            if (c, repeat) in done:
                continue
            death = _run(exp, p, key, t, store, c, repeat, say)
            if death:
                return death
        if not levels_of(store, key).get(c):
            say(f"   c={c}: no result from the client; the ladder stops here")
            return None


def _run(exp: Experiment, p: Planned, key: str, t: bench.Target, store: Store, concurrency: int, repeat: int,
         say: Say) -> Death | None:
    b = exp.benchmark
    started_wall = time.time()
    started = time.monotonic()
    box: dict[str, Any] = {}
    death: Death | None = None
    with connect(t.host) as remote:
        folder = benchdir.make_run_dir(remote, t.host, b.remote_dir,
                                       bench.run_prefix(exp.name, p.variant.name, concurrency, repeat))
        argv = bench.client_argv(b, t, concurrency, folder)

        def client() -> None:
            try:
                box["result"] = remote.run(argv, timeout=b.timeout_s + bench.KILL_AFTER_S + 30, check=False)
            except Exception as exc:  # the connection broke or the run timed out: recorded, not raised
                box["error"] = f"{type(exc).__name__}: {exc}"

        thread = threading.Thread(target=client, name=f"bench-{p.variant.name}-c{concurrency}", daemon=True)
        # NVML on the engine hosts for as long as the client runs (power.py: nothing outlives it; the
        # samplers end with this block, also on Ctrl-C)
        with power.Sampling(p.plan, b.timeout_s + bench.KILL_AFTER_S) as sampling:
            client_started = time.time()
            thread.start()
            died_at = None
            while thread.is_alive():
                thread.join(WATCH_EVERY_S)
                if death is None:
                    death = _dead_unit(p.plan)
                    if death is not None:
                        died_at = time.monotonic()
                        say(f"   c={concurrency}: {death.unit} DIED under load: {death.cause}")
                if died_at is not None and time.monotonic() - died_at > AFTER_DEATH_S:
                    say(f"   the client on {t.host.name} is still running; it ends by itself "
                        f"(timeout {b.timeout_s:g} s)")
                    break
            client_ended = time.time()
        samples = sampling.hosts
        if death is None:
            death = _dead_unit(p.plan)
        wall = time.monotonic() - started
        res: Result | None = box.get("result")
        raw: bytes | None = None
        if not thread.is_alive():
            got = remote.run(["cat", bench.result_path(t, folder)], timeout=60, check=False)
            raw = got.stdout.encode() if got.rc == 0 and got.stdout.strip() else None
            remote.run(["rm", "-rf", "--", folder], timeout=60, check=False)
    log = (f"$ {shlex.join(argv)}\n" + (res.stdout + res.stderr if res else "") +
           (f"\nrc {res.rc}\n" if res else "") + (f"\n{box['error']}\n" if "error" in box else ""))
    figures: dict[str, Any] = {}
    ok = False
    if raw is not None:
        try:
            figures = bench.figures(t.client, bench.parse_result(t.client, raw.decode()), b.prompts, concurrency,
                                    t.gpus)
            # the samples of the client's measured span: its duration, up to when it ended (+1 s to write)
            span = figures.get("duration_s") or (client_ended - client_started)
            figures.update(power.figures(samples, max(client_started, client_ended - span - 1.0), client_ended))
            figures["output_tok_s_per_w"] = power.per_watt(figures.get("output_tok_s"), figures.get("mean_power_w"))
            ok = death is None
        except ValueError as exc:
            log += f"\ngpudeploy: the result file could not be read: {exc}\n"
    store.record_run(RunRow(p.variant.name, concurrency, repeat, ok, f"{death.unit}: {death.cause}" if death else None,
                            argv, None, figures, started_wall, wall, key), raw, log)
    if ok:
        misses = choose.misses(figures, exp.slo)
        say(f"   c={concurrency} r{repeat}: {_brief(figures)}" + (f"  SLO missed: {'; '.join(misses)}" if misses
                                                                 and exp.slo else "  SLO met" if exp.slo else ""))
    elif death is None:
        tail = (res.stderr or res.stdout).strip().splitlines()[-3:] if res else [box.get("error", "")]
        say(f"   c={concurrency} r{repeat}: the client failed (rc {res.rc if res else '?'}): {' | '.join(tail)}")
    return death


def _brief(f: dict[str, Any]) -> str:
    def ms(key: str) -> str:
        v = f.get(key)
        return f"{v:.1f}" if isinstance(v, (int, float)) else "-"

    out = f.get("output_tok_s")
    watts = f.get("mean_power_w")
    drawn = (f", {watts:.0f} W ({f.get('output_tok_s_per_w') or 0:.2f} tok/s per W"
             + (", stand-in NVML" if f.get("power_standin") else "") + ")") if watts else ""
    return (f"{out:.1f} tok/s out, TTFT p50/p99 {ms('median_ttft_ms')}/{ms('p99_ttft_ms')} ms, TPOT p50/p99 "
            f"{ms('median_tpot_ms')}/{ms('p99_tpot_ms')} ms, {f.get('completed')} done, {f.get('failed')} failed"
            f"{drawn}" if out is not None else "no figures")


def _dead_unit(plan: Plan) -> Death | None:
    """The first unit of the deployment that is no longer running, with its cause from the journal."""
    hosts = list({u.host.name: u.host for u in plan.units}.values())
    try:
        results = status(plan, hosts)
    except Interrupted:
        raise  # Ctrl-C, before any GpudeployError catch: never taken for "the host did not answer"
    except GpudeployError:
        return None
    for host, res in results.items():
        if isinstance(res, GpudeployError):
            continue  # a host that did not answer this once is not a death
        for s in res:
            if s.deployment != plan.units[0].deployment or not s.deployed:
                continue
            if s.state.split("/")[0] in ("failed", "inactive", "deactivating"):
                cause = s.last_failure or f"the unit is {s.state}"
                unit = next((u for u in plan.units if u.host.name == host and u.name == s.unit), None)
                return Death(f"{host}/{s.role}", cause + (f" (next: {s.next_step})" if s.next_step else ""),
                             s.failure_kind, s.role, unit.role.file_role if unit else s.role)
    return None


def _release(plan: Plan, outcomes: list[Any]) -> str | None:
    versions = {u.engine_version for u in plan.units if u.engine_version and u.role.engine == "sglang"}
    for o in outcomes:
        if o.gate and o.unit.role.log_format == "vllm":
            for line in o.gate.lines:
                m = VLLM_VERSION.search(line)
                if m:
                    versions.add(f"vllm {m.group(1)}")
                    break
    sglang = {f"sglang {x}" for x in versions if not x.startswith("vllm")}
    return ", ".join(sorted(sglang | {x for x in versions if x.startswith("vllm")})) or None


def _memory(outcomes: list[Any]) -> dict[str, Any]:
    """unit -> the memory figures its engine logged while starting."""
    out: dict[str, Any] = {}
    for o in outcomes:
        if not o.gate:
            continue
        if o.unit.role.log_format == "vllm":
            lines = [line.strip() for line in o.gate.lines if VLLM_MEMORY.search(line)]
            if lines:
                out[o.unit.key] = lines[:8]
        elif o.unit.role.engine == "sglang":
            text = memory_figures(o.gate.lines)
            if text:
                out[o.unit.key] = text
    return out


def _teardown(plan: Plan, dep: str, say: Say) -> list[str]:
    """Tear the variant's deployment down; what could not be done, per host (empty: all clean)."""
    hosts = list({u.host.name: u.host for u in plan.units}.values())
    try:
        results = teardown(plan, hosts, purge=False, deployments=[dep])
    except Interrupted:
        raise
    except GpudeployError as exc:
        say(f"   teardown of {dep} FAILED: {exc}")
        return [str(exc)]
    left = []
    for host, res in results.items():
        if isinstance(res, GpudeployError):
            say(f"   teardown on {host} FAILED: {res}")
            left.append(str(res) if str(res).startswith(f"{host}:") else f"{host}: {res}")
            continue
        dirty = [o for o in res if not o.clean]
        if dirty:
            say(f"   teardown on {host}: NOT CLEAN: " + "; ".join(f"{o.role}: pids {o.left}" for o in dirty))
            left.append(f"{host}: not clean")
    return left


def _still_running(p: Planned) -> tuple[list[Unit], list[str]]:
    """The variant's units that status finds active or starting, and the hosts that did not answer
    (what runs there is not known)."""
    dep = p.plan.units[0].deployment
    running: list[Unit] = []
    unknown: list[str] = []
    hosts = list({u.host.name: u.host for u in p.plan.units}.values())
    try:
        results = status(p.plan, hosts)
    except Interrupted:
        raise
    except GpudeployError:
        return [], [h.name for h in hosts]
    for host, res in results.items():
        if isinstance(res, GpudeployError):
            unknown.append(host)
            continue
        running += [u for s in res for u in p.plan.units if u.host.name == host and s.deployment == dep
                    and s.unit == u.name and s.state.startswith(("active", "activating", "deactivating"))]
    return running, unknown


def _running_text(p: Planned) -> str:
    """What still runs of the variant's deployment, in a sentence."""
    dep = p.plan.units[0].deployment
    running, unknown = _still_running(p)
    parts = [f"still running: {', '.join(u.key for u in running)} (deployment {dep})"] if running else []
    if unknown:
        parts.append(f"not known on {', '.join(unknown)} (it did not answer; its units of {dep} may still run)")
    return "; ".join(parts) if parts else f"nothing of deployment {dep} is running"


def _interrupted(store: Store, exp: Experiment, p: Planned, key: str, t: bench.Target, when: str,
                 say: Say, again: str) -> None:
    """Ctrl-C: the variant is marked interrupted (--resume runs it again, keeping its finished levels),
    and the user is told what still runs."""
    store.finish_variant(key, "interrupted", failure=f"interrupted {when}")
    dep = p.plan.units[0].deployment
    try:
        what = _running_text(p)
    except (KeyboardInterrupt, Interrupted):  # Ctrl-C again while asking: the first one is raised on
        what = f"what still runs of deployment {dep} is not known (interrupted while asking)"
    say(f"interrupted {when} of variant {p.variant.name}; the store ({store.path}) holds every finished run.")
    if what.startswith("nothing"):
        say(f"{what}.")
    else:
        say(f"{what}: `invoke teardown --inventory {shlex.quote(exp.inventory)} --deployment {dep}` stops it")
    if when == "during the benchmark":
        say(f"the benchmark client on {t.host.name} ends by itself within "
            f"{exp.benchmark.timeout_s:g} s (it runs under timeout)")
    say(f"{again} goes on from here.")
