"""gpudeploy's command line: thin invoke tasks that parse flags, call the package, print and exit.

    invoke plan     [--host H] [--role R] [--json]
    invoke deploy   [--host H] [--role R] [--check] [--force] [--timeout S]
    invoke status   [--host H] [--role R] [--json] [--watch]
    invoke teardown [--host H] [--role R] [--purge]
    invoke logs     --host H --role R [--follow]
    invoke render   --target k8s [--out DIR] [--deployment D] [--image IMAGE] [--model-pvc NAME]
    invoke lab.up | lab.down | lab.status
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from contextlib import redirect_stdout
from typing import Any

from invoke import Collection, Exit, task

from gpudeploy import interrupt
from gpudeploy.errors import GpudeployError
from gpudeploy.fanout import Interrupted, raise_open_files, set_forks
from gpudeploy.plan import load_plan
from gpudeploy.report import deploy_records, deploy_summary, interrupted_text, plan_json, plan_text, status_text

DEFAULT_INVENTORY = "inventory/hosts.yml"


def calibration():  # type: ignore[no-untyped-def]
    from gpudeploy.plan.calibrate import CalibrationStore
    from gpudeploy.plan.memcheck import DEFAULT_STORE

    return CalibrationStore(DEFAULT_STORE)
SELECT = {"inventory": "inventory file (default inventory/hosts.yml)", "host": "only this host",
          "role": "only this role"}


def plan_and_hosts(inventory: str, host: str | None, role: str | None,
                   deployment: str | None = None) -> tuple[Any, list[Any], tuple[str, ...]]:
    """The plan for a read-or-stop command (no memory check), the hosts it looks at (the one asked
    for, the hosts of the deployment asked for, or all of them), and among those the hosts added
    only because a selected multi-node group has ranks there (a group is one engine)."""
    p = load_plan(inventory, host=host, role=role, deployment=deployment, memory=False)
    on = {u.host.name for u in p.units}
    picked = [h for h in p.inventory.hosts.values()
              if (host is None or h.name == host) and (deployment is None or h.name in on)]
    names = {h.name for h in picked}
    mates = tuple(sorted({u.host.name for u in p.units if u.group is not None} - names))
    return p, picked + [p.inventory.hosts[n] for n in mates], mates


def plan_learning_flags(inventory: str, **kwargs: Any) -> Any:
    """The plan; when a host runs a release gpudeploy has not captured, read its --help there
    first (once: it is kept on this machine) and plan again."""
    from gpudeploy.errors import InputError
    from gpudeploy.plan.flags import FlagsNotKnown

    try:
        return load_plan(inventory, **kwargs)
    except InputError as exc:
        needed = [p for p in exc.problems if isinstance(p, FlagsNotKnown)]
        if not needed or len(needed) != len(exc.problems):
            raise
        from gpudeploy.apply.learn import learn
        from gpudeploy.inventory import load_inventory

        learn(load_inventory(inventory), needed)
    return load_plan(inventory, **kwargs)


FORKS_HELP = "hosts at once (default: min(20 x CPUs, hosts, (open files - 10) / 3), as pyinfra)"


def positive_int(value: str | None, flag: str) -> int | None:
    if value is None:
        return None
    if not str(value).isdigit() or int(value) < 1:
        raise Exit(f"gpudeploy: {flag} takes a whole number of 1 or more, not {value!r}", code=1)
    return int(value)


def percent(value: str | None, flag: str) -> float:
    if value is None:
        return 0.0
    try:
        number = float(str(value).rstrip("%"))
    except ValueError:
        raise Exit(f"gpudeploy: {flag} takes a percentage (0-100), not {value!r}", code=1) from None
    if not 0 <= number <= 100:
        raise Exit(f"gpudeploy: {flag} takes a percentage (0-100), not {value!r}", code=1)
    return number


def seconds(value: str | None, flag: str) -> float | None:
    """A positive number of seconds from the command line (None when not given)."""
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        raise Exit(f"gpudeploy: {flag} takes a number of seconds, not {value!r}", code=1) from None
    if not 0 < number < float("inf"):
        raise Exit(f"gpudeploy: {flag} must be more than 0 seconds, got {value!r}", code=1)
    return number


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn gpudeploy's own errors into a message and exit status 1, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        raise_open_files()
        interrupt.install()  # Ctrl-C always ends the command within interrupt.GRACE_S
        try:
            return fn(*args, **kwargs)
        except GpudeployError as exc:
            raise Exit(f"gpudeploy: {exc}", code=1) from None
        except KeyboardInterrupt:
            print("gpudeploy: interrupted", file=sys.stderr)
            interrupt.leave(130)  # never waits for worker threads still on a host

    return wrapper


@task(help={**SELECT, "json": "one JSON document on stdout",
            "suggest": "also list memory settings that fit, with the KV tokens each leaves"})
@user_errors
def plan(c, inventory=DEFAULT_INVENTORY, host=None, role=None, json_=False, suggest=False):  # type: ignore[no-untyped-def]
    """Show what would run where (GPUs, NUMA, ports, command, env, files, memory) without touching anything."""
    # a release gpudeploy has not captured plans with the nearest captured one's flags, marked so;
    # deploy reads the host's own --help before it renders anything
    p = load_plan(inventory, host=host, role=role, store=calibration(), suggest=suggest, offline_flags=True)
    if json_:
        json.dump(plan_json(p), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(plan_text(p))


@task(help={**SELECT, "deployment": "only this deployment (all its hosts)",
            "force": "deploy even when the memory check predicts OOM or GPUs are busy",
            "timeout": "seconds to wait for /health (default: the role's health.timeout_s)",
            "keep_on_failure": "when a deployment fails, leave what this run started running, for debugging",
            "check": "show what would change on the hosts, with diffs, and change nothing",
            "serial": "roll out in batches of deployments, e.g. 1,25%,100% (a canary first)",
            "max_fail_percent": "with --serial: stop when more than this share of deployments failed (default 0)",
            "json": "one JSON record per host and unit, and per deployment, on stdout",
            "only_failed": "deploy only the deployments the last deploy of this inventory did not make ready",
            "rolling": "always roll changed engines through the router (default: when the deployment serves now)",
            "no_rolling": "never roll: restart what changed",
            "allow_downtime": "when there is no room for a rolling update, restart plainly instead of refusing",
            "forks": FORKS_HELP})
@user_errors
def deploy(c, host=None, inventory=DEFAULT_INVENTORY, role=None, deployment=None, force=False,  # type: ignore[no-untyped-def]
           timeout=None, keep_on_failure=False, check=False, serial=None, max_fail_percent=None, json_=False,
           only_failed=False, forks=None, rolling=False, no_rolling=False, allow_downtime=False):
    """Deploy whole deployments: every engine on every host, then the routers, then a real generation.

    --host H without --role deploys the deployments that have units on H, on all their hosts.
    """
    from dataclasses import replace

    from gpudeploy.apply import results as last
    from gpudeploy.apply.deploy import Options
    from gpudeploy.apply.deployment import deploy as run_deploy
    from gpudeploy.apply.rollout import parse_serial

    timeout_s = seconds(timeout, "--timeout")
    set_forks(positive_int(forks, "--forks"))
    batches = tuple(parse_serial(serial)) if serial else ()
    budget = percent(max_fail_percent, "--max-fail-percent")
    p = plan_learning_flags(inventory, host=host, role=role, deployment=deployment, whole=True, store=calibration())
    if only_failed:
        wanted = last.not_ready(inventory)
        if wanted is None:
            raise Exit(f"gpudeploy: no earlier deploy of {inventory} is recorded here; run deploy first", code=1)
        p = replace(p, units=tuple(u for u in p.units if u.deployment in wanted))
        print(f"--only-failed: {', '.join(wanted) or 'nothing failed last time'}", file=sys.stderr)
    if not p.units:
        print(f"nothing is placed on {host or 'any host'}")
        return
    say_to = sys.stderr if json_ else sys.stdout
    if rolling and no_rolling:
        raise Exit("gpudeploy: --rolling and --no-rolling contradict each other", code=1)
    opts = Options(force=force, timeout_s=timeout_s, keep_on_failure=keep_on_failure, check=check,
                   serial=batches, max_fail_percent=budget, allow_downtime=allow_downtime,
                   rolling="always" if rolling else "never" if no_rolling else "auto")
    try:
        with redirect_stdout(say_to):
            result = run_deploy(p, opts, None if check else calibration())
    except Interrupted as exc:
        print(deploy_summary(exc.results)[0])
        print(interrupted_text(exc.results))
        interrupt.leave(130)
    text, ok = deploy_summary(result)
    records = deploy_records(result)
    if not check:
        last.save(inventory, records)
    if json_:
        json.dump(records, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(text)
    if not ok:
        raise Exit(code=1)


@task(help={**SELECT, "json": "one JSON document on stdout", "deployment": "only this deployment",
            "forks": FORKS_HELP,
            "watch": "keep watching until Ctrl-C (exit 130): states, health and the routers' workers; "
                     "a death at once, with its cause"})
@user_errors
def status(c, inventory=DEFAULT_INVENTORY, host=None, role=None, deployment=None, json_=False, forks=None,  # type: ignore[no-untyped-def]
           watch=False):
    """Every gpudeploy unit by deployment: state, PID, uptime, ports, /health, the router's view of it."""
    from gpudeploy.errors import GpudeployError as Err
    from gpudeploy.verify.status import status as run_status

    set_forks(positive_int(forks, "--forks"))
    if watch and json_:
        raise Exit("gpudeploy: --watch is a live view and --json one document: use one of them", code=1)
    p, hosts, mates = plan_and_hosts(inventory, host, role, deployment)
    if watch:
        from gpudeploy.verify.watch import watch_status

        watch_status(p, hosts, mates, status_text, keep=lambda s: (role is None or s.role == role)
                     and (deployment is None or s.deployment == deployment))
        return
    results = run_status(p, hosts, mates)
    if role is not None or deployment is not None:
        results = {h: (r if isinstance(r, Err) else [s for s in r if (role is None or s.role == role)
                                                     and (deployment is None or s.deployment == deployment)])
                   for h, r in results.items()}
    text, ok = status_text(results)
    if json_:
        doc = {h: ({"error": str(r)} if isinstance(r, Err) else {"units": [s.to_json() for s in r]})
               for h, r in results.items()}
        deps: dict[str, Any] = {}
        for r in results.values():
            for s in [] if isinstance(r, Err) else r:
                d = deps.setdefault(s.deployment, {"units": [], "healthy": True})
                d["units"].append(f"{s.host}/{s.role}")
                d["healthy"] = d["healthy"] and (s.healthy or not s.deployed)
        json.dump({"hosts": doc, "deployments": deps, "healthy": ok}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(text)
    if not ok or any(isinstance(r, Err) for r in results.values()):
        raise Exit(code=1)


@task(help={**SELECT, "deployment": "only this deployment (all its hosts)",
            "purge": "also remove unit files, env files, run records and state directories", "forks": FORKS_HELP})
@user_errors
def teardown(c, inventory=DEFAULT_INVENTORY, host=None, role=None, deployment=None, purge=False, forks=None):  # type: ignore[no-untyped-def]
    """Stop units (routers, then decode, then prefill) and prove nothing of them is left, GPUs free."""
    from gpudeploy.apply.teardown import teardown as run_teardown
    from gpudeploy.errors import GpudeployError as Err

    set_forks(positive_int(forks, "--forks"))
    p, hosts, mates = plan_and_hosts(inventory, host, role, deployment)
    from gpudeploy.plan.build import deployments

    # Without --role, also the units of these deployments the inventory no longer places.
    whole = [] if role is not None else [deployment] if deployment else sorted(deployments(p.inventory))
    if mates:
        print(f"also on {', '.join(mates)}: the other ranks of the multi-node group(s) selected "
              "(a group stops whole)")
    results = run_teardown(p, hosts, purge=purge, deployments=whole, group_hosts=mates)
    ok = True
    for h, res in results.items():
        if isinstance(res, Err):
            ok = False
            print(f"{h}: FAILED: {res}")
            continue
        if not res:
            print(f"{h}: nothing deployed")
        for o in res:
            ok = ok and o.clean
            gpu = "  GPUs " + ", ".join(f"{g}: {v:.1f} GiB used" for g, v in o.gpu_used_gib.items()) \
                if o.gpu_used_gib else ""
            killed = f"  killed leftover pids {o.killed}" if o.killed else ""
            killed += f"  NOT killed: {'; '.join(o.refused)}" if o.refused else ""
            held = "; ".join(f"GPU {g['gpu']} held by pid {g['pid']} ({g['used'] / 2**30:.1f} GiB, "
                             f"{g.get('cmd') or '?'})" for g in o.gpu_left)
            verdict = "clean: no process left" if o.clean else \
                "NOT CLEAN: " + "; ".join(x for x in (f"pids {o.left} alive" if o.left else "", held) if x)
            print(f"{h}/{o.role}: was {o.was}; {verdict}{killed}{gpu}{'  (purged)' if o.purged else ''}")
    if not ok:
        raise Exit(code=1)


@task(help={**SELECT, "follow": "keep printing new lines"})
@user_errors
def logs(c, host, role, inventory=DEFAULT_INVENTORY, follow=False):  # type: ignore[no-untyped-def]
    """The journal of the unit's current run only (never lines of earlier runs)."""
    from gpudeploy.verify.logs import show_logs

    p = load_plan(inventory, host=host, role=role, memory=False)
    show_logs(next(u for u in p.units if u.host.name == host), follow=follow)  # not a group mate's


@task(help={"inventory": SELECT["inventory"], "host": "only this host", "json": "one JSON document on stdout",
            "forks": FORKS_HELP})
@user_errors
def facts(c, inventory=DEFAULT_INVENTORY, host=None, json_=False, forks=None):  # type: ignore[no-untyped-def]
    """What each host really has: GPUs (NVML: UUID, bus id, NUMA, memory, processes), CPUs, init, engines."""
    from gpudeploy.errors import GpudeployError as Err
    from gpudeploy.facts.host import gather
    from gpudeploy.report import facts_text

    set_forks(positive_int(forks, "--forks"))
    p, hosts, mates = plan_and_hosts(inventory, host, None)
    results = gather(p, [h for h in hosts if h.name not in mates])
    text, ok = facts_text(results, p.inventory.hosts)
    if json_:
        json.dump({h: ({"error": str(r)} if isinstance(r, Err) else r.to_json()) for h, r in results.items()},
                  sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(text)
    if not ok:
        raise Exit(code=1)


@task(help={"target": "what to render: k8s (LeaderWorkerSet engines, the router as a Deployment, Services, ConfigMaps)",
            "inventory": SELECT["inventory"], "deployment": "only this deployment",
            "out": "write <deployment>.yaml and NOTES.md into this directory (default: the YAML on stdout)",
            "image": "the engines' image (default: lmsysorg/sglang:v<the planned release>)",
            "router_image": "the router's image (default: --image, else its engines' image)",
            "model_pvc": "mount the model directory from this PersistentVolumeClaim (default: the node's path)"})
@user_errors
def render(c, target, inventory=DEFAULT_INVENTORY, deployment=None, out=None, image=None, router_image=None,  # type: ignore[no-untyped-def]
           model_pvc=None):
    """The inventory as Kubernetes manifests, validated offline; nothing is written unless all of them pass."""
    from pathlib import Path

    from gpudeploy.k8s import Options
    from gpudeploy.k8s import render as render_k8s
    from gpudeploy.k8s.write import summary, write_files

    if target != "k8s":
        raise Exit(f"gpudeploy: --target {target!r}: the one target so far is k8s", code=1)
    r = render_k8s(inventory, Options(image=image, router_image=router_image, model_pvc=model_pvc),
                   deployment=deployment)
    if not r.manifests:
        raise Exit(f"gpudeploy: nothing is placed in {inventory}; nothing was written", code=1)
    if out is None:
        sys.stdout.write("".join(r.streams.values()))
        return
    write_files(Path(out), r.files())
    sys.stdout.write(summary(Path(out), r.manifests, r.notes))


@task(name="run", default=True,
      help={"file": "the experiment file (YAML, beside the inventory)",
            "dry_run": "print what would be deployed and run, in order; touch nothing",
            "resume": "go on with the results folder: variants already finished are not re-run",
            "timeout": "seconds each deploy may wait for /health (default: the roles' health.timeout_s)"})
@user_errors
def experiment_run(c, file, dry_run=False, resume=False, timeout=None):  # type: ignore[no-untyped-def]
    """Per variant: memory check, deploy (gate), the engine's own benchmark through the router, record, teardown."""
    from gpudeploy.experiment.plot import plot as write_plot
    from gpudeploy.experiment.runner import run_experiment
    from gpudeploy.experiment.show import summary, table
    from gpudeploy.experiment.spec import load_experiment

    exp = load_experiment(file)
    store = run_experiment(exp, resume=resume, dry_run=dry_run, calibration=calibration(),
                           deploy_timeout_s=seconds(timeout, "--timeout"))
    if dry_run:
        return
    doc = summary(store)
    text = table(doc)
    (store.folder / "table.txt").write_text(text + "\n")
    png = write_plot(doc, store.folder / "plot.png")
    print(f"\n{text}\n\nstore {store.path}; table {store.folder / 'table.txt'}; plot {png}")


@task(name="show", help={"file": "the experiment file (its results folder is read)",
                         "results": "or the results folder itself", "json": "one JSON document on stdout",
                         "plot": "also write the plot (PNG) to this path"})
@user_errors
def experiment_show(c, file=None, results=None, json_=False, plot=None):  # type: ignore[no-untyped-def]
    """Variant x concurrency: TTFT, TPOT, tok/s (total, per GPU, per user), failures; the best under the SLO marked."""
    from gpudeploy.experiment.plot import plot as write_plot
    from gpudeploy.experiment.show import summary, table
    from gpudeploy.experiment.spec import load_experiment
    from gpudeploy.experiment.store import Store

    if (file is None) == (results is None):
        raise Exit("gpudeploy: experiment.show takes --file F (the experiment file) or --results DIR", code=1)
    store = Store(results if results is not None else load_experiment(file).results_dir)
    if not store.exists():
        raise Exit(f"gpudeploy: no results in {store.folder} yet (invoke experiment --file F runs it)", code=1)
    doc = summary(store)
    if plot:
        write_plot(doc, plot)
    if json_:
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(table(doc))


ns = Collection(plan, deploy, status, teardown, logs, facts, render)
ns.add_collection(Collection("experiment", experiment_run, experiment_show))
try:
    from gpudeploy_lab.tasks import lab_collection

    ns.add_collection(lab_collection)
except ImportError:  # pragma: no cover - the lab is optional outside this repo
    pass
