"""The gpudeploy tasks: one collection behind both commands, ``gpudeploy`` (the console script, any
folder) and ``invoke`` in gpudeploy's own repository (tasks.py adds the lab's tasks to it).

    gpudeploy init       --host ADDR [--host ADDR ...] [--out inventory/hosts.yml] [--force]
    gpudeploy init       --example [--out inventory/hosts.yml] [--force]
    gpudeploy roles      [--inventory F]
    gpudeploy plan       [--host H] [--role R] [--json] [--suggest] [--files]
    gpudeploy deploy     [--host H] [--role R] [--deployment D] [--check] [--force] [--timeout S] ...
                         [--rolling | --no-rolling] [--allow-downtime]
    gpudeploy status     [--host H] [--role R] [--deployment D] [--json] [--watch]
    gpudeploy teardown   [--host H] [--role R] [--deployment D] [--purge]
    gpudeploy logs       --host H --role R [--follow]
    gpudeploy facts      [--host H] [--json]
    gpudeploy render     --target k8s [--out DIR] [--deployment D] [--image I] [--model-pvc C]
    gpudeploy experiment --file F [--dry-run] [--resume]
    gpudeploy experiment.show --file F [--json] [--plot PNG]
    gpudeploy tune       --file F [--dry-run] [--timeout S]

Each task parses its flags, calls the package, prints and exits; every one is wrapped by
:func:`~gpudeploy.cli.args.user_errors` (gpudeploy's errors become a message and exit 1, Ctrl-C ends
the command within ``interrupt.GRACE_S`` with 130). ``--inventory`` defaults to
``$GPUDEPLOY_INVENTORY``, else ``inventory/hosts.yml`` of the current folder. Every option's short
flag (or none) is in the one table of cli/options.py.
"""

from __future__ import annotations

import json
import sys
from contextlib import redirect_stdout
from typing import Any

from invoke.collection import Collection
from invoke.context import Context
from invoke.exceptions import Exit

from .. import interrupt
from ..controlchars import printable
from .args import (
    FORKS_HELP,
    REFUSES,
    SELECT,
    calibration,
    inventory_path,
    set_forks,
    user_errors,
)
from .options import command

# Nothing of gpudeploy beyond this is imported here: `gpudeploy --help` and `invoke --list` load only
# this module (issue 26: cold start <= 0.15 s; the planner, jinja2, yaml, fabric and paramiko cost
# ~0.1 s more), and each task imports what it runs.


def read_inventory(inventory: str) -> tuple[Any, list[Any]]:
    """The inventory and its problems (all of them, reported by the plan that is built from it)."""
    from ..inventory import load_inventory

    problems: list[Any] = []
    return load_inventory(inventory, problems), problems


def plan_and_hosts(inventory: str, host: str | None, role: str | None, deployment: str | None = None,
                   read: tuple[Any, list[Any]] | None = None) -> tuple[Any, list[Any], tuple[str, ...]]:
    """The plan for a read-or-stop command (no memory check), the hosts it looks at (the one asked
    for, the hosts of the deployment asked for, or all of them), and among those the hosts added
    only because a selected multi-node group has ranks there (a group is one engine). ``read``:
    the inventory as ``read_inventory`` gave it, when the caller has read it already."""
    from ..plan.build import build_plan

    inv, problems = read or read_inventory(inventory)
    p = build_plan(inv, host=host, role=role, deployment=deployment, memory=False, problems=list(problems))
    on = {u.host.name for u in p.units}
    picked = [h for h in p.inventory.hosts.values()
              if (host is None or h.name == host) and (deployment is None or h.name in on)]
    names = {h.name for h in picked}
    mates = tuple(sorted({u.host.name for u in p.units if u.group is not None} - names))
    return p, picked + [p.inventory.hosts[n] for n in mates], mates


def plan_learning_flags(inventory: str, read: tuple[Any, list[Any]] | None = None, **kwargs: Any) -> Any:
    """The plan; when a host runs a release gpudeploy has not captured, read its --help there
    first (once: it is kept on this machine) and plan again. ``read``: the inventory as
    ``read_inventory`` gave it, when the caller has read it already."""
    from ..errors import InputError
    from ..plan import load_plan
    from ..plan.build import build_plan
    from ..plan.flags import FlagsNotKnown

    try:
        if read is not None:
            return build_plan(read[0], problems=list(read[1]), **kwargs)
        return load_plan(inventory, **kwargs)
    except InputError as exc:
        needed = [p for p in exc.problems if isinstance(p, FlagsNotKnown)]
        if not needed or len(needed) != len(exc.problems):
            raise
        from ..apply.learn import learn
        from ..inventory import load_inventory

        learn(load_inventory(inventory), needed)
    return load_plan(inventory, **kwargs)



@command(help={**SELECT, "json": "one JSON document on stdout (every unit with its files and verdict)",
               "suggest": "also list memory settings that fit, with the KV tokens each leaves",
               "files": "also show the text of each unit's files (systemd unit, environment file); "
                        "`deploy --check` shows how they differ from the hosts'"})
@user_errors
def plan(c: Context, inventory: str | None = None, host: str | None = None, role: str | None = None,
         json_: bool = False, suggest: bool = False, files: bool = False) -> None:
    """Show what would run where (GPUs, NUMA, ports, command, env, memory) without touching anything.

    It ends with a recap: per unit ok, warn (deploy says so and goes ahead) or refuse, why, and the fix.
    Exit status: 0 deploy would go ahead, 1 the input has problems, 2 deploy would refuse a unit.
    """
    inventory = inventory_path(inventory)
    from ..slurm.inventory import is_slurm

    if is_slurm(inventory):  # a Slurm target: one batch job (slurm/)
        from .slurm import plan as slurm_plan

        return slurm_plan(inventory, json_=json_, suggest=suggest, files=files)
    from ..plan import load_plan
    from ..report import plan_json, plan_recap, plan_text

    # a release gpudeploy has not captured plans with the nearest captured one's flags, marked so;
    # deploy reads the host's own --help before it renders anything
    p = load_plan(inventory, host=host, role=role, store=calibration(), suggest=suggest, offline_flags=True)
    if json_:
        doc = plan_json(p)  # its documented shape: the files' text included, --files or not
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        refused = bool(doc["deploy_would_refuse"])
    else:
        sys.stdout.write(plan_text(p, show_files=files))
        refused = plan_recap(p)[1]
    if refused:
        raise Exit(code=REFUSES)


@command(help={**SELECT, "deployment": "only this deployment (all its hosts), e.g. -d pd",
               "force": "deploy even when the memory check predicts OOM or GPUs are busy (no short flag)",
               "timeout": "seconds to wait for /health, e.g. -t 900 (default: the role's health.timeout_s)",
               "keep_on_failure": "when a deployment fails, leave what this run started running, for debugging",
               "check": "show what would change on the hosts, with diffs, and change nothing",
               "serial": "roll out in batches of deployments, e.g. 1,25%,100% (a canary first)",
               "max_fail_percent": "with --serial: stop when more than this percentage of deployments failed, "
                                   "e.g. --max-fail-percent 25 (default 0)",
               "json": "one JSON record per host and unit, and per deployment, on stdout",
               "only_failed": "deploy only the deployments the last deploy of this inventory did not make ready",
               "rolling": "always roll changed engines through the router (default: when the deployment serves now)",
               "no_rolling": "never roll: restart what changed",
               "allow_downtime": "when there is no room for a rolling update, restart plainly instead of refusing",
               "forks": FORKS_HELP})
@user_errors
def deploy(c: Context, host: str | None = None, inventory: str | None = None, role: str | None = None,
           deployment: str | None = None, force: bool = False, timeout: float | None = None,
           keep_on_failure: bool = False, check: bool = False, serial: str | None = None,
           max_fail_percent: float = 0.0, json_: bool = False, only_failed: bool = False,
           forks: int | None = None, rolling: bool = False, no_rolling: bool = False,
           allow_downtime: bool = False) -> None:
    """Deploy whole deployments: every engine on every host, then the routers, then a real generation.

    --host H without --role deploys the deployments that have units on H, on all their hosts.
    """
    inventory = inventory_path(inventory)
    from ..slurm.inventory import is_slurm

    if is_slurm(inventory):  # a Slurm target: one batch job (slurm/)
        from .slurm import deploy as slurm_deploy

        return slurm_deploy(inventory, check=check, timeout_s=timeout, keep_on_failure=keep_on_failure)
    from ..apply.rollout import parse_serial

    timeout_s = timeout  # (numbers are checked as the command line is read: cli/options.py)
    set_forks(forks)
    batches = tuple(parse_serial(serial)) if serial else ()
    budget = max_fail_percent
    if rolling and no_rolling:
        raise Exit("gpudeploy: --rolling and --no-rolling contradict each other", code=1)
    read = read_inventory(inventory)
    early = None
    if not (host or role or deployment or serial or only_failed or read[1]):
        # The hosts' connections and lock holders start now, while the rest of deploy is imported
        # and planned: on a redeploy they are most of the command (apply/early_locks.py).
        from ..apply.early_locks import EarlyLocks

        early = EarlyLocks(list(read[0].hosts.values()))
    try:
        from dataclasses import replace

        from ..apply import results as last
        from ..apply.deploy import Options
        from ..apply.deployment import deploy as run_deploy
        from ..fanout import Interrupted
        from ..remote import closing
        from ..report import deploy_records, deploy_summary, interrupted_text

        p = plan_learning_flags(inventory, host=host, role=role, deployment=deployment, whole=True,
                                store=calibration(), read=read)
        from ..apply.ask_defaults import ask
        from ..plan.memcheck import memory_verdicts

        # the installed release's own memory defaults, asked once, then the verdicts with them; not
        # where deploy refuses a unit anyway (it touches no host then)
        # (what it says goes where deploy's own lines go: stderr under --json, stdout stays the JSON)
        with redirect_stdout(sys.stderr if json_ else sys.stdout):
            learned = (force or not memory_verdicts(p)[0]) and ask(p)
        if learned:
            p = plan_learning_flags(inventory, host=host, role=role, deployment=deployment, whole=True,
                                    store=calibration())
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
        opts = Options(force=force, timeout_s=timeout_s, keep_on_failure=keep_on_failure, check=check,
                       serial=batches, max_fail_percent=budget, allow_downtime=allow_downtime,
                       rolling="always" if rolling else "never" if no_rolling else "auto")
        with closing.after_report():  # the hosts' connections close once the report is out
            try:
                with redirect_stdout(say_to):
                    result = run_deploy(p, opts, None if check else calibration(), early=early)
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
    finally:
        if early is not None:
            early.close()  # what deploy did not take (the plan failed): ended, its locks let go
    if not ok:
        raise Exit(code=1)


@command(help={**SELECT, "json": "one JSON document on stdout", "deployment": "only this deployment, e.g. -d pd",
               "forks": FORKS_HELP,
               "watch": "keep watching until Ctrl-C (exit 130): states, health and the routers' workers; "
                     "a death at once, with its cause"})
@user_errors
def status(c: Context, inventory: str | None = None, host: str | None = None, role: str | None = None,
           deployment: str | None = None, json_: bool = False, forks: int | None = None,
           watch: bool = False) -> None:
    """Every gpudeploy unit by deployment: state, PID, uptime, ports, /health, the router's view of it."""
    inventory = inventory_path(inventory)
    from ..slurm.inventory import is_slurm

    if watch and json_:
        raise Exit("gpudeploy: --watch is a live view and --json one document: use one of them", code=1)
    if is_slurm(inventory):  # a Slurm target: the recorded job (slurm/)
        from .slurm import status as slurm_status

        return slurm_status(inventory, json_=json_, watch=watch)
    set_forks(forks)
    read = read_inventory(inventory)
    early = None
    if not (watch or role is not None or deployment is not None or read[1]):
        # The probes of the hosts status looks at start now, before the rest of status is even
        # imported: their ssh handshakes are most of a status (verify/head_start.py).
        from ..verify.head_start import HeadStart

        early = HeadStart([h for h in read[0].hosts.values() if host is None or h.name == host])
    from ..errors import GpudeployError as Err
    from ..report import status_text
    from ..verify.status import status as run_status

    try:
        p, hosts, mates = plan_and_hosts(inventory, host, role, deployment, read)
    except BaseException:
        if early is not None:
            early.close()
        raise
    if watch:
        from ..verify.watch import watch_status

        named = {u.role.name for u in p.units}  # --role R: R, and R's named instances
        watch_status(p, hosts, mates, status_text, keep=lambda s: (role is None or s.role in named | {role})
                     and (deployment is None or s.deployment == deployment))
        return
    try:
        results = run_status(p, hosts, mates, early)
    finally:
        if early is not None:
            early.close()
    if role is not None or deployment is not None:
        named = {u.role.name for u in p.units}  # --role R: R, and R's named instances
        results = {h: (r if isinstance(r, Err) else [s for s in r if (role is None or s.role in named | {role})
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


@command(help={**SELECT, "deployment": "only this deployment (all its hosts), e.g. -d pd",
               "purge": "also remove unit files, env files, run records and state directories (no short flag)",
               "forks": FORKS_HELP})
@user_errors
def teardown(c: Context, inventory: str | None = None, host: str | None = None, role: str | None = None,
             deployment: str | None = None, purge: bool = False, forks: int | None = None) -> None:
    """Stop units (routers, then decode, then prefill) and prove nothing of them is left, GPUs free."""
    inventory = inventory_path(inventory)
    from ..slurm.inventory import is_slurm

    if is_slurm(inventory):  # a Slurm target: scancel of the recorded job only (slurm/)
        from .slurm import teardown as slurm_teardown

        return slurm_teardown(inventory)
    from ..apply.teardown import teardown as run_teardown
    from ..errors import GpudeployError as Err

    set_forks(forks)
    p, hosts, mates = plan_and_hosts(inventory, host, role, deployment)
    from ..plan.build import deployments

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
            print(printable(f"{h}: FAILED: {res}", lines=True))
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
            # the processes' command lines are the host's words
            print(printable(f"{h}/{o.role}: was {o.was}; {verdict}{killed}{gpu}{'  (purged)' if o.purged else ''}"))
    if not ok:
        raise Exit(code=1)


@command(help={**SELECT, "host": "the unit's host (required), e.g. -H node171",
               "role": "the unit's role (required), e.g. -r decode", "follow": "keep printing new lines"})
@user_errors
def logs(c: Context, host: str | None = None, role: str | None = None, inventory: str | None = None,
         follow: bool = False) -> None:
    """The journal of the unit's current run only (never lines of earlier runs): gpudeploy logs -H HOST -r ROLE."""
    from ..slurm.inventory import is_slurm

    if role is not None and is_slurm(inventory_path(inventory)):  # a step's output file of the recorded job
        from .slurm import logs as slurm_logs

        return slurm_logs(inventory_path(inventory), host=host, role=role, follow=follow)
    if host is None or role is None:
        raise Exit("gpudeploy: logs needs --host HOST and --role ROLE (one unit), e.g. gpudeploy logs -H node171 "
                   "-r decode", code=1)
    inventory = inventory_path(inventory)
    from ..plan import load_plan
    from ..verify.logs import show_logs

    p = load_plan(inventory, host=host, role=role, memory=False)
    mine = [u for u in p.units if u.host.name == host]  # not a group mate's
    if len(mine) > 1:
        raise Exit(f"gpudeploy: role {role} has {len(mine)} instances on {host} "
                   f"({', '.join(u.role.name for u in mine)}); --role names one of them", code=1)
    show_logs(mine[0], follow=follow)


@command(help={"inventory": SELECT["inventory"], "host": SELECT["host"], "json": "one JSON document on stdout",
               "forks": FORKS_HELP})
@user_errors
def facts(c: Context, inventory: str | None = None, host: str | None = None, json_: bool = False,
          forks: int | None = None) -> None:
    """What each host really has: GPUs (NVML: UUID, bus id, NUMA, memory, processes), CPUs, init, engines."""
    inventory = inventory_path(inventory)
    from ..errors import GpudeployError as Err
    from ..facts.host import gather
    from ..report import facts_text

    set_forks(forks)
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


@command(help={"target": "what to render (required): k8s (LeaderWorkerSet engines, the router as a Deployment, "
                         "Services, ConfigMaps)",
               "inventory": SELECT["inventory"], "deployment": "only this deployment, e.g. -d pd",
               "out": "write <deployment>.yaml and NOTES.md into this directory, e.g. -o k8s/ "
                      "(default: the YAML on stdout)",
               "image": "the engines' image (default: lmsysorg/sglang:v<the planned release>)",
               "router_image": "the router's image (default: --image, else its engines' image)",
               "model_pvc": "mount the model directory from this PersistentVolumeClaim (default: the node's path)"})
@user_errors
def render(c: Context, target: str | None = None, inventory: str | None = None, deployment: str | None = None,
           out: str | None = None, image: str | None = None, router_image: str | None = None,
           model_pvc: str | None = None) -> None:
    """The inventory as Kubernetes manifests, validated offline; nothing is written unless all of them pass.

    Kubernetes checks no GPU memory: the memory preflight's verdicts end the output (on stderr), and a
    unit deploy would refuse makes the exit status 2 (1: the input has problems).
    """
    if target is None:
        raise Exit("gpudeploy: render needs --target k8s (the one target so far)", code=1)
    if target != "k8s":
        raise Exit(f"gpudeploy: --target {target!r}: the one target so far is k8s", code=1)
    inventory = inventory_path(inventory)
    from pathlib import Path

    from ..k8s import Options
    from ..k8s import render as render_k8s
    from ..k8s.write import summary, write_files
    from ..report import plan_recap

    r = render_k8s(inventory, Options(image=image, router_image=router_image, model_pvc=model_pvc),
                   deployment=deployment, memory=True, store=calibration())
    if not r.manifests:
        raise Exit(f"gpudeploy: nothing is placed in {inventory}; nothing was written", code=1)
    if out is None:
        sys.stdout.write("".join(r.streams.values()))
    else:
        write_files(Path(out), r.files())
        sys.stdout.write(summary(Path(out), r.manifests, r.notes))
    text, refused = plan_recap(r.plan)
    sys.stdout.flush()
    sys.stderr.write(text)
    if refused:
        raise Exit(code=REFUSES)


@command(name="run", default=True,
         help={"file": "the experiment file (required; YAML, beside the inventory), e.g. --file experiments/tp.yml",
               "dry_run": "print what would be deployed and run, in order; touch nothing",
               "resume": "go on with the results folder: variants already finished are not re-run",
               "timeout": "seconds each deploy may wait for /health, e.g. -t 900 (default: the roles' "
                          "health.timeout_s)"})
@user_errors
def experiment_run(c: Context, file: str | None = None, dry_run: bool = False, resume: bool = False,
                   timeout: float | None = None) -> None:
    """Per variant: memory check, deploy (gate), the engine's own benchmark through the router, record, teardown."""
    if file is None:
        raise Exit("gpudeploy: experiment needs --file F (the experiment file)", code=1)
    from ..experiment.plot import plot as write_plot
    from ..experiment.runner import run_experiment
    from ..experiment.show import summary, table
    from ..experiment.spec import load_experiment

    exp = load_experiment(file)
    store = run_experiment(exp, resume=resume, dry_run=dry_run, calibration=calibration(),
                           deploy_timeout_s=timeout)
    if dry_run:
        return
    doc = summary(store)
    text = table(doc)
    (store.folder / "table.txt").write_text(text + "\n")
    png = write_plot(doc, store.folder / "plot.png")
    print(f"\n{text}\n\nstore {store.path}; table {store.folder / 'table.txt'}; plot {png}")


@command(name="show", help={"file": "the experiment file (its results folder is read)",
                         "results": "or the results folder itself", "json": "one JSON document on stdout",
                         "plot": "also write the plot (PNG) to this path"})
@user_errors
def experiment_show(c: Context, file: str | None = None, results: str | None = None, json_: bool = False,
                    plot: str | None = None) -> None:
    """Variant x concurrency: TTFT, TPOT, tok/s (total, per GPU, per user), failures; the best under the SLO marked."""
    from ..experiment.plot import plot as write_plot
    from ..experiment.show import summary, table
    from ..experiment.spec import load_experiment
    from ..experiment.store import Store

    if (file is None) == (results is None):
        raise Exit("gpudeploy: experiment.show takes --file F (the experiment file) or --results DIR", code=1)
    store = Store(results if results is not None else load_experiment(str(file)).results_dir)
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




# `tune` is a task of its own, not `experiment --search`: a search goes on by itself where it stopped
# (its study is its state; `experiment` refuses a results folder that holds results unless --resume),
# keeps each trial's deployment up for the next (an experiment tears each variant down), ends by its
# budget, and answers with role files to deploy. `experiment.show` shows its table all the same.
@command(help={"file": "the experiment file with a search: section (required), e.g. --file experiments/tune.yml",
               "dry_run": "print the space, the objectives, the budget and where the study is; touch nothing",
               "timeout": "seconds each deploy may wait for /health, e.g. -t 900 (default: the roles' "
                          "health.timeout_s)"})
@user_errors
def tune(c: Context, file: str | None = None, dry_run: bool = False, timeout: float | None = None) -> None:
    """Search the file's space unattended (Optuna): each trial memory-checked, launched only if it may boot, measured.

    The same command again goes on with the study (<results>.optuna.sqlite beside the results folder),
    repeating no finished trial; it ends with the table (best first), the plot and the best variant's
    role files, which `deploy --inventory <results>/best/hosts.yml` deploys as they are.
    """
    if file is None:
        raise Exit("gpudeploy: tune needs --file F (an experiment file with a search: section)", code=1)
    from ..experiment.plot import plot as write_plot
    from ..experiment.search import run_search
    from ..experiment.show import summary, table
    from ..experiment.spec import load_experiment

    exp = load_experiment(file)
    result = run_search(exp, dry_run=dry_run, calibration=calibration(), deploy_timeout_s=timeout)
    if result is None:
        return
    doc = summary(result.store)
    text = table(doc) if doc["variants"] else "nothing measured yet"
    (result.store.folder / "table.txt").write_text(text + "\n")
    png = write_plot(doc, result.store.folder / "plot.png")
    report = "\n".join(result.lines)
    print(f"\n{text}\n\n{report}\nstore {result.store.path}; table {result.store.folder / 'table.txt'}; plot {png}")


@command(help={"inventory": "also the roles of this inventory's roles_dir (default: $GPUDEPLOY_INVENTORY, else "
                         "inventory/hosts.yml, when it exists)",
               "json": "one JSON document on stdout"})
@user_errors
def roles(c: Context, inventory: str | None = None, json_: bool = False) -> None:
    """The roles a placement may name: the packaged library and the inventory's roles_dir, and where each comes from."""
    from pathlib import Path

    from ..inventory import own_roles_dir
    from ..library import available_roles
    from ..report import roles_text

    path = inventory_path(inventory, must_exist=inventory is not None)
    found = available_roles(own_roles_dir(path) if Path(path).is_file() else None)
    if json_:
        json.dump([{"name": r.name, "file": str(r.path), "source": r.source, "overrides_packaged": r.overrides}
                   for r in found], sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(roles_text(found))


@command(iterable=["host"],
         help={"host": "ADDRESS or USER@ADDRESS[:PORT] of a host to describe (repeat for more hosts), "
                       "e.g. -H 10.0.0.171 -H root@10.0.0.172:2222",
               "example": "write a commented example inventory (one 8-GPU node) and copy the packaged roles "
                       "beside it to edit; no host is contacted",
               "out": "the inventory to write, e.g. -o site/hosts.yml (default: inventory/hosts.yml)",
               "force": "overwrite the inventory (and with --example the role files) if they exist (no short flag)",
               "user": "ssh user (default: ~/.ssh/config's, else your login name)",
               "port": "ssh port, e.g. -p 2222 (default: ~/.ssh/config's, else 22)",
               "key": "ssh private key (default: your agent and ~/.ssh keys)",
               "known_hosts": "a known_hosts file to trust besides ~/.ssh/known_hosts and /etc/ssh/ssh_known_hosts",
               "python": "the interpreter to look for the engines with (default: the python3 each host finds "
                         "first, and the virtualenvs under /opt)",
               "deployment": "the deployment's name (default: pd)",
               "forks": FORKS_HELP})
@user_errors
def init(c: Context, host: list[str] | None = None, example: bool = False, out: str | None = None,
         force: bool = False, user: str | None = None, port: int | None = None, key: str | None = None,
         known_hosts: str | None = None, python: str | None = None, deployment: str = "pd",
         forks: int | None = None) -> None:
    """Write an inventory from the hosts' own facts (GPUs, PCI, NUMA, CPUs, init system, engines) with starter roles.

    gpudeploy init --example writes a commented example instead, without SSH, and copies the roles to edit.
    """
    if example:
        if host:
            raise Exit("gpudeploy: init --example contacts no host: leave out --host (or --example)", code=1)
        from ..init.example import write_example

        print(write_example(out or inventory_path(None, must_exist=False), force=force))
        return
    from ..init import InitOptions, init_inventory

    if not host:
        raise Exit("gpudeploy: init needs --host ADDRESS (once per host), or --example for an example "
                   "inventory to edit", code=1)
    set_forks(forks)
    opts = InitOptions(addresses=tuple(host), out=out or inventory_path(None, must_exist=False), force=force,
                       user=user, port=port, key=key, known_hosts=known_hosts,
                       python=python, deployment=deployment)
    text, ok = init_inventory(opts)
    print(text)
    if not ok:
        raise Exit(code=1)


def collection() -> Collection:
    """Every gpudeploy task (a new Collection each call: tasks.py adds the lab's to its own)."""
    ns = Collection(init, roles, plan, deploy, status, teardown, logs, facts, render, tune)
    ns.add_collection(Collection("experiment", experiment_run, experiment_show))
    return ns
