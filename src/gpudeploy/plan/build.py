"""Inventory -> Plan: every unit with its placement, ports, argv, environment and rendered files."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import jinja2

from ..errors import InputError, Problem
from ..inventory import load_inventory
from ..model import Group, Host, Inventory, Plan, Role, Unit
from ..yamlsrc import did_you_mean
from .flags import check_args, engine_version, flags_release, settings_args
from .group import plan_groups, with_groups
from .modelcheck import model_problems
from .pd import pd_problems
from .placement import Placement, place_host, role_of
from .ports import assign_ports, port_span, uses_mooncake
from .process_spec import spec_path, spec_text
from .render import Renderer, control_problem, env_value, exec_line
from .render import unit_text as description_text

if TYPE_CHECKING:
    from .calibrate import CalibrationStore

UNIT_DIR = "/etc/systemd/system"
ENV_DIR = "/etc/gpudeploy"
STATE_ROOT = "/var/lib"
SECRET_MASK = "********"  # noqa: S105 - the mask, not a secret
MODULES = {"sglang": "sglang.launch_server", "sglang_router": "sglang_router.launch_router"}
PROGRAM_OF = {"sglang": "sglang", "sglang_router": "sglang_router"}


def unit_stem(deployment: str, role: str) -> str:
    """``<deployment>.<role>``: names hold no ``.``, so no two (deployment, role) pairs share a stem
    (with ``-`` between them, ``pd``/``test-decode`` and ``pd-test``/``decode`` would)."""
    return f"{deployment}.{role}"


def unit_name(deployment: str, role: str) -> str:
    return f"gpudeploy-{unit_stem(deployment, role)}.service"


# Set by gpudeploy from the placement: a host or role env setting them would run the engine on
# GPUs the preflight never checked, or number them differently from NVML.
RESERVED_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")


def load_plan(inventory_path: str, *, host: str | None = None, role: str | None = None,
              deployment: str | None = None, whole: bool = False, store: CalibrationStore | None = None,
              suggest: bool = False, memory: bool = True, offline_flags: bool = False) -> Plan:
    """Parse the inventory and plan it, reporting the problems of both steps together."""
    problems: list[Problem] = []
    inv = load_inventory(inventory_path, problems)
    return build_plan(inv, host=host, role=role, deployment=deployment, whole=whole, problems=problems,
                      store=store, suggest=suggest, memory=memory, offline_flags=offline_flags)


def build_plan(inv: Inventory, *, host: str | None = None, role: str | None = None,
               deployment: str | None = None, whole: bool = False,
               problems: list[Problem] | None = None, store: CalibrationStore | None = None,
               suggest: bool = False, memory: bool = True, offline_flags: bool = False) -> Plan:
    """Compute every deployment of the inventory, then select. Raises InputError with every problem.

    The whole inventory is always checked: a router's upstreams live on other hosts, and a broken
    host elsewhere is worth knowing about before anything is touched. Selection: ``deployment``
    keeps that deployment's units; ``host`` keeps the units on it, or with ``whole`` (deploy
    without --role) every unit of the deployments that have one on it, on every host; ``role``
    keeps that role (a role file's name also selects its named instances). ``memory=False`` skips the
    memory preflight (status, teardown, logs).
    ``offline_flags`` plans a release gpudeploy has not captured with the nearest captured
    release's flags and memory rules, marked as such (``invoke plan``); without it such a release is a
    :class:`~.flags.FlagsNotKnown` problem, which deploy answers by reading the host's ``--help``.
    """
    problems = problems if problems is not None else []
    selection: list[Problem] = []
    names = deployments(inv)
    if deployment is not None and deployment not in names:
        selection.append(Problem(f"unknown deployment {deployment!r} (deployments: {', '.join(sorted(names))})",
                                 file=inv.path, key="deployment"))
    if host is not None and host not in inv.hosts:
        selection.append(Problem(f"unknown host {host!r} (hosts: {', '.join(sorted(inv.hosts))})",
                                file=inv.path, host=host, key="hosts"))
    if role is not None and not any(role in (r.name, r.file_role) for r in inv.roles.values()):
        selection.append(Problem(f"unknown role {role!r} (placed roles: {', '.join(sorted(inv.roles))})",
                                 file=inv.path, role=role, key="roles"))
    if selection:
        raise InputError(problems + selection)

    placements: dict[str, dict[str, Placement]] = {}
    ports: dict[str, dict[str, dict[str, int]]] = {}
    for h in inv.hosts.values():
        placements[h.name] = place_host(h, inv.roles, problems)
        ports[h.name] = assign_ports(h, inv.roles, problems)

    groups = plan_groups(inv, ports, problems)
    for placed in inv.roles.values():
        problems += model_problems(placed, memory=memory)
    renderer = Renderer(inv.templates_dir)
    units: list[Unit] = []
    for h in inv.hosts.values():
        for req in h.placements:
            r = role_of(req, inv.roles)
            if r is None or r.name not in placements[h.name] or r.name not in ports[h.name]:
                continue
            dep = req.deployment or h.deployment
            group = groups.get((dep, r.name, h.name))
            if r.nnodes > 1 and group is None:
                continue  # the group's problem is reported
            unit = _unit(inv, h, dep, r, placements[h.name][r.name],
                         ports[h.name][r.name], ports, renderer, problems, group, groups, offline_flags)
            if unit is not None and unit.engine_version and memory:
                from .memcheck import unit_memory  # the memory model is only loaded when asked for

                before = len(problems)
                unit = replace(unit, memory=unit_memory(h, r, unit.gpus, unit.engine_version, store, problems,
                                                        want_suggestions=suggest,
                                                        flags_release=unit.flags_release or None,
                                                        argv=unit.argv))
                problems[before:] = [located(p, h, r) for p in problems[before:]]
            if unit is not None:
                units.append(unit)
    problems += pd_problems(units)
    if problems:
        raise InputError(problems)
    on_host = {u.deployment for u in units if u.host.name == host}
    selected = tuple(u for u in units
                     if (deployment is None or u.deployment == deployment)
                     and (host is None or u.host.name == host or (whole and role is None and u.deployment in on_host))
                     and (role is None or role in (u.role.name, u.role.instance_of)))
    # A group starts and stops whole: selecting one of its ranks selects them all.
    selected = with_groups(tuple(units), selected)
    if host is not None and role is not None and not selected:
        raise InputError([Problem(f"role {role!r} is not placed on host {host!r}", file=inv.path,
                                  host=host, role=role, key="roles")])
    return Plan(inventory=inv, units=selected)


def located(problem: Problem, host: Host, role: Role) -> Problem:
    """A problem the memory model found in a role's settings, at the line of the key in its role file
    (the memory model knows the file, not the lines)."""
    if problem.line is not None or problem.file != role.file:
        return problem
    key = problem.key
    if key and key not in role.lines and f"settings.{key}" in role.lines:
        key = f"settings.{key}"
    return replace(problem, line=role.lines.get(key or "", None), host=problem.host or host.name,
                   role=problem.role or role.name, key=key)


def unit_kind(role: Role) -> str:
    """router, prefill, decode or server: what teardown needs to stop units in order."""
    if role.engine == "sglang_router":
        return "router"
    mode = role.settings.get("disaggregation_mode")
    return str(mode) if mode in ("prefill", "decode") else "server"


def deployments(inv: Inventory) -> set[str]:
    """Every deployment a placement of the inventory belongs to."""
    return {p.deployment or h.deployment for h in inv.hosts.values() for p in h.placements} | {inv.deployment}


def _unit(inv: Inventory, host: Host, deployment: str, role: Role, placed: Placement, my_ports: dict[str, int],
          all_ports: dict[str, dict[str, dict[str, int]]], renderer: Renderer,
          problems: list[Problem], group: Group | None = None,
          groups: dict[tuple[str, str, str], Group] | None = None, offline_flags: bool = False) -> Unit | None:
    before = len(problems)
    version = engine_version(host, role, problems, offline=offline_flags)
    # an uncaptured release (offline plans only) is spelled like the nearest captured one
    spelling = flags_release(PROGRAM_OF.get(role.engine, ""), version) if version else version
    name = unit_name(deployment, role.name)
    stem = unit_stem(deployment, role.name)
    state_dir = f"{STATE_ROOT}/gpudeploy/{stem}"
    argv: list[str] = []
    # a flag the stand-in release lacks but another captured one has: a warning, never a refusal
    stand_in = Speaking(version if spelling and spelling != version else None, [])
    if role.engine == "sglang" and spelling:
        argv = _sglang_argv(host, role, spelling, my_ports, problems, group, stand_in)
    elif role.engine == "sglang_router" and spelling:
        argv = _router_argv(inv, deployment, host, role, spelling, my_ports, all_ports, problems, groups or {},
                            stand_in)
    elif role.engine == "command":
        argv = _command_argv(host, role, placed, my_ports, state_dir, renderer, problems)
    # An engine's flag values never hold a newline: one there is a mistake (a folded `>` YAML
    # value), refused. A command role's own argv may (a multi-line `python3 -c` script): the unit
    # file carries it as C escapes, which systemd decodes back (render.systemd_word).
    checked = argv if role.engine != "command" else []
    for i, word in enumerate(checked):
        bad = control_problem(word)
        if bad:
            key = _argv_key(role, word)
            problems.append(Problem(f"command line word {i} {bad}", file=role.file,
                                    line=role.lines.get(key, role.lines.get(key.split(".")[0])),
                                    host=host.name, role=role.name, key=key))
    if len(problems) > before:
        return None

    env: dict[str, str] = {}
    if placed.gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in placed.gpus)
        # CUDA's default order is fastest-first; NVML's (and so preflight's and teardown's) is PCI
        # bus order. With this, CUDA device N is NVML GPU N.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    if role.engine == "sglang":
        # SGLang's CUDA-graph capture bar (tqdm, no bar_format of its own) writes "\r" between
        # updates; journald and log files only split at "\n", so the whole capture would arrive as
        # one line when it ends. tqdm >= 4.66 takes TQDM_* variables as defaults: one line per update.
        env["TQDM_BAR_FORMAT"] = "{l_bar}{bar}{r_bar}\n"
    if "mooncake_rpc" in my_ports:
        # mooncake's RPC port, picked at random in this range: one range per engine on the host
        env["MC_MIN_RPC_PORT"] = str(my_ports["mooncake_rpc"])
        env["MC_MAX_RPC_PORT"] = str(my_ports["mooncake_rpc"] + port_span("mooncake_rpc") - 1)
    if uses_mooncake(role):
        # the address the peer of the pair (and its bootstrap) reaches this server at; SGLang guesses
        # one from the interfaces otherwise, which on a host with several picks any of them
        env["SGLANG_HOST_IP"] = host.address
    env.update(host.env)
    env.update(role.env)
    env_path = f"{ENV_DIR}/{stem}.env"
    unit_path = f"{UNIT_DIR}/{name}"
    where = {"host": host.name, "role": role.name}
    unit_text = renderer.render("engine.service.j2", {
        "unit": name, "host": host.name, "deployment": deployment,
        "role": role.name, "engine": role.engine, "description": description_text(role.description),
        "kind": unit_kind(role),
        "env_path": env_path, "exec_start": exec_line(argv), "state_dir_name": f"gpudeploy/{stem}",
        "syslog_identifier": f"gpudeploy-{stem}", "stop_timeout_s": _seconds(role.stop_timeout_s),
        "binding": _binding(host, placed),
    }, problems, **where)
    env_text = render_env(renderer, name, host.name, role.name, env, role.secret_env, None, problems)
    if unit_text is None or env_text is None:
        return None
    unit = Unit(
        deployment=deployment, host=host, role=role, name=name, engine_version=version,
        gpus=placed.gpus, numa_node=placed.numa_node, cpus=placed.cpus, ports=my_ports,
        argv=tuple(argv), env=env, secret_names=role.secret_env, unit_path=unit_path, env_path=env_path,
        state_dir=state_dir,
        health_url=f"http://{host.address}:{my_ports['http']}{role.health.path}" if "http" in my_ports else "",
        files={unit_path: unit_text, env_path: env_text}, group=group,
        flags_release=spelling if spelling and spelling != version else "", flag_notes=tuple(stand_in.notes),
    )
    if host.supervisor == "process":  # no systemd there: the process supervisor's JSON spec instead
        path = spec_path(name)
        unit = replace(unit, unit_path=path, files={path: spec_text(unit, unit_kind(role)), env_path: env_text})
    return unit


def _argv_key(role: Role, word: str) -> str:
    """The role key a command line word most likely came from, for the error message."""
    for name, value in role.settings.items():
        values = value if isinstance(value, list) else [value]
        if word in (str(v) for v in values):
            return f"settings.{name}"
    if word in role.extra_args:
        return "extra_args"
    if word == str(role.model.get("path")):
        return "model.path"
    return "argv"


def render_env(renderer: Renderer, unit: str, host: str, role: str, env: dict[str, str],
               secret_names: tuple[str, ...], secrets: dict[str, str] | None,
               problems: list[Problem]) -> str | None:
    """The env file text. With ``secrets`` None the secret values are masked (for display)."""
    pairs = [(k, env_value(v)) for k, v in env.items()]
    for s in secret_names:
        pairs.append((s, SECRET_MASK if secrets is None else env_value(secrets[s])))
    return renderer.render("engine.env.j2", {"unit": unit, "host": host, "env": pairs}, problems,
                           host=host, role=role)


@dataclass(frozen=True)
class Speaking:
    """The release a stand-in release's flags speak for (None: its own), and what that left unsure."""

    planned: str | None
    notes: list[str]


def _sglang_argv(host: Host, role: Role, version: str, ports: dict[str, int],
                 problems: list[Problem], group: Group | None = None,
                 stand_in: Speaking | None = None) -> list[str]:
    stand_in = stand_in or Speaking(None, [])
    argv = [role.python or host.python, "-m", MODULES["sglang"], "--model-path", str(role.model.get("path", "")),
            "--tp-size", str(role.tp_size), "--host", host.bind_address, "--port", str(ports["http"])]
    if group is not None:
        argv += ["--dist-init-addr", group.dist_init, "--nnodes", str(group.nnodes), "--node-rank", str(group.rank)]
    if "nccl" in ports:
        argv += ["--nccl-port", str(ports["nccl"])]
    if "bootstrap" in ports:
        argv += ["--disaggregation-bootstrap-port", str(ports["bootstrap"])]
    argv += settings_args(host, role, version, role.settings, problems, planned=stand_in.planned,
                          notes=stand_in.notes)
    check_args(host, role, version, role.extra_args, "extra_args", problems, planned=stand_in.planned,
               notes=stand_in.notes)
    return argv + list(role.extra_args)


def _router_argv(inv: Inventory, deployment: str, host: Host, role: Role, version: str, ports: dict[str, int],
                 all_ports: dict[str, dict[str, dict[str, int]]], problems: list[Problem],
                 groups: dict[tuple[str, str, str], Group], stand_in: Speaking | None = None) -> list[str]:
    stand_in = stand_in or Speaking(None, [])
    argv = [role.python or host.python, "-m", MODULES["sglang_router"]]
    if role.upstreams.get("prefill") or role.upstreams.get("decode"):
        argv.append("--pd-disaggregation")
    for kind in ("prefill", "decode", "workers"):
        for upstream in role.upstreams.get(kind, ()):
            # The upstream's units of this deployment (a role placed for another one is not ours): the
            # role placed under that name, and every named instance of that role file.
            found = [(h, all_ports[h.name][p.role]) for h in inv.hosts.values() for p in h.placements
                     if upstream in (p.role, p.file_role) and (p.deployment or h.deployment) == deployment
                     and p.role in all_ports[h.name]
                     # a group serves on its leader only; the other ranks have no API
                     and _leads(groups.get((deployment, p.role, h.name)))]
            placed = {name for h in inv.hosts.values() for p in h.placements
                      if (p.deployment or h.deployment) == deployment for name in (p.role, p.file_role)}
            if not found and upstream not in placed:
                hint = did_you_mean(upstream, placed & set(inv.roles))  # never a name that is itself unknown
                problems.append(Problem(f"upstream role {upstream!r} is not placed on any host of deployment "
                                        f"{deployment!r}" + (f"; {hint}" if hint else ""),
                                        file=role.file, line=role.lines.get(f"upstreams.{kind}",
                                                                            role.lines.get("upstreams")),
                                        host=host.name, role=role.name, key=f"upstreams.{kind}"))
            # placed but not found: its role file did not load, and says why itself
            for up_host, up_ports in found:
                url = f"http://{up_host.address}:{up_ports['http']}"
                if kind == "prefill":
                    argv += ["--prefill", url]
                    if "bootstrap" in up_ports:
                        argv.append(str(up_ports["bootstrap"]))
                elif kind == "decode":
                    argv += ["--decode", url]
                else:
                    argv += ["--worker-urls", url]
    argv += ["--host", host.bind_address, "--port", str(ports["http"])]
    argv += settings_args(host, role, version, role.settings, problems, planned=stand_in.planned,
                          notes=stand_in.notes)
    check_args(host, role, version, role.extra_args, "extra_args", problems, planned=stand_in.planned,
               notes=stand_in.notes)
    return argv + list(role.extra_args)


def _leads(group: Group | None) -> bool:
    return group is None or group.rank == 0


def _command_argv(host: Host, role: Role, placed: Placement, ports: dict[str, int], state_dir: str,
                  renderer: Renderer, problems: list[Problem]) -> list[str]:
    context: dict[str, Any] = {
        "python": role.python or host.python, "port": ports["http"], "ports": ports, "address": host.address,
        "bind_address": host.bind_address, "gpus": ",".join(str(g) for g in placed.gpus),
        "tp_size": role.tp_size, "model": role.model, "settings": role.settings, "state_dir": state_dir,
        "host": host.name, "role": role.name,
    }
    out: list[str] = []
    for i, arg in enumerate(role.argv):
        try:
            out.append(renderer.render_string(arg, context))
        except jinja2.TemplateError as exc:
            problems.append(Problem(f"argv[{i}] {arg!r}: {exc} (defined: {', '.join(sorted(context))})",
                                    file=role.file, line=role.lines.get("argv"), host=host.name,
                                    role=role.name, key=f"argv[{i}]"))
    return out


def _binding(host: Host, placed: Placement) -> list[str]:
    if not placed.gpus:
        return []
    lines = []
    if placed.cpus:
        lines.append(f"CPUAffinity={placed.cpus}")
    if host.numa_policy != "none":
        nodes = sorted({host.numa_of(g) for g in placed.gpus})
        lines.append(f"NUMAPolicy={host.numa_policy}")
        lines.append("NUMAMask=" + ",".join(str(n) for n in nodes))
    return lines


def _seconds(value: float) -> str:
    return f"{value:g}s"
