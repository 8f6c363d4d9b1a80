"""Inventory and role files (YAML) -> ``model.Inventory``, reporting every problem at once.

Inventory shape (``inventory/`` holds commented examples: one-node.yml, two-nodes.yml, ...)::

    deployment: pd                 # unit names: gpudeploy-<deployment>.<role>.service
    roles_dir: ../roles            # relative to the inventory file; its role files override the packaged ones
    defaults: {ssh: {...}, gpu_memory_gib: 96, engine_versions: {sglang: "0.5.23"}, python: ..., env: {...}}
    hosts:
      node171:
        address: 10.0.0.171
        numa_nodes: [{id: 0, gpus: [0, 1, 2, 3], cpus: "0-31"}, ...]
        roles: [prefill, {role: decode, numa_node: 1}, router]
      node172:
        ...
        roles: [{role: decode, name: decode-a, gpus: [0, 1, 2, 3]},     # one role file, two instances
                {role: decode, name: decode-b, gpus: [4, 5, 6, 7], port: 30050}]

A role is read from ``roles_dir`` when that has the file, else from the package (library.py). A
``roles/`` beside an inventory that names no ``roles_dir`` is not read, so a placed role with a file
there is a problem that says how to read it. The inventory given as a folder is its ``hosts.yml``; a
host's name may be its FQDN.

Anything under ``defaults`` may be given per host too; the host's value wins. ``kubernetes:``
(defaults, a host, a role) and ``numa_nodes[].memory_gib`` are read only by
``invoke render --target k8s``; ``k8sinventory.py`` checks them.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from . import k8sinventory, library
from .controlchars import control_problem
from .errors import InputError, Problem
from .limits import gpu_gib_problem, seconds_problem
from .model import (
    ENGINES,
    LOG_FORMATS,
    ON_STALL,
    STALL_DEFAULTS_S,
    SURGE_SUFFIX,
    Health,
    Host,
    Inventory,
    K8sSettings,
    NumaNode,
    PlacementRequest,
    Role,
    Smoke,
    SshConfig,
    SshHop,
    Where,
)
from .yamlsrc import Checker, LineList, LineMap, did_you_mean, load_yaml

# The keys each level of an inventory and a role file may have: every reader below refuses any other
# (with did-you-mean), and docs/gen.py writes the key reference from these very sets.
TOP_KEYS = {"deployment", "roles_dir", "templates_dir", "defaults", "hosts"}
HOST_KEYS = {"address", "ssh", "numa_nodes", "gpu_memory_gib", "engine_versions", "python", "deployment",
             "supervisor", "connection", "kubernetes",
             "bind_address", "numa_policy", "env", "roles"}
NUMA_KEYS = {"id", "gpus", "cpus", "memory_gib"}
SSH_KEYS = {"user", "port", "key", "known_hosts", "connect_timeout_s", "proxy_jump"}
NUMA_POLICIES = ("bind", "preferred", "interleave", "none")
SUPERVISORS = ("auto", "systemd", "process")
CONNECTIONS = ("ssh", "local")
DEFAULT_KEYS = HOST_KEYS - {"address", "numa_nodes", "roles", "deployment"}
ROLE_KEYS = {"engine", "description", "tp_size", "nnodes", "gpus", "allow_span_numa", "version", "model",
             "settings", "extra_args", "argv", "ports", "upstreams", "env", "secret_env", "health",
             "stop_timeout_s", "log_format", "python", "smoke", "kubernetes"}
HEALTH_KEYS = {"path", "timeout_s", "interval_s", "drain_s", "stall_s", "on_stall", "py_spy"}
SMOKE_KEYS = {"endpoint", "prompt", "max_tokens", "timeout_s", "model"}
INVENTORY_FILE = "hosts.yml"  # what a folder given as the inventory holds
UPSTREAM_KINDS = ("prefill", "decode", "workers")
SGLANG_MODEL_KEYS = {"path", "facts"}  # the folder (or hub id) SGLang loads, the memory check's facts
# Matched with fullmatch: ``$`` would also accept a name that ends in a newline.
NAME_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,40}")
NAME_RULE = "use lowercase letters, digits, - or _ (at most 41, starting with a letter or digit)"
# A host's name may be its FQDN (node171.example.org): it is only ever a key, a label in messages and
# a comment in rendered files, never part of a unit, file or Kubernetes name, so its dots are safe.
HOST_NAME_RE = re.compile(r"(?=.{1,253}$)[a-z0-9][a-z0-9_-]{0,62}(\.[a-z0-9][a-z0-9_-]{0,62})*")
HOST_NAME_RULE = ("use lowercase letters, digits, - or _, in parts separated by dots (a short name or an FQDN "
                  "such as node171.example.org), each part starting with a letter or digit")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
CPU_LIST_RE = re.compile(r"\d+(-\d+)?(,\d+(-\d+)?)*")
RESERVED_ENV = {"CUDA_VISIBLE_DEVICES": "the GPUs of the placement (roles: [{role: R, gpus: [...]}])",
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID, so CUDA's device numbers are NVML's",
                "MC_MIN_RPC_PORT": "mooncake's RPC range from the plan, one per engine (ports: {mooncake_rpc: N})",
                "MC_MAX_RPC_PORT": "mooncake's RPC range from the plan, one per engine (ports: {mooncake_rpc: N})"}


def load_inventory(path: str | Path, problems: list[Problem] | None = None) -> Inventory:
    """Parse the inventory and every role it places.

    Without ``problems`` any problem raises InputError. With a list, problems are appended and the
    usable part is returned, so the planner can add its own findings and report everything at once.
    """
    path = Path(inventory_file(path))
    collect = problems is not None
    problems = problems if problems is not None else []
    before = len(problems)
    data = load_yaml(path, problems)
    if len(problems) > before:
        raise InputError(problems)
    return inventory_from_data(data, path, problems, collect=collect)


def inventory_from_data(data: Any, path: Path, problems: list[Problem], *, collect: bool = True) -> Inventory:
    """``load_inventory`` of YAML already read (with its lines): another target's reader
    (slurm/inventory.py) checks its own keys, then hands the rest over as an ordinary inventory."""
    before = len(problems)
    top = Checker(data, problems, str(path))
    top.unknown_keys(TOP_KEYS)
    deployment = top.get("deployment", str, default="default",
                         check=lambda v: None if NAME_RE.fullmatch(v) else NAME_RULE)
    roles_dir = _own_dir(top, "roles_dir", path)
    templates_dir = _own_dir(top, "templates_dir", path)
    defaults = top.child("defaults")
    defaults.unknown_keys(DEFAULT_KEYS)
    default_k8s = k8sinventory.k8s_settings(defaults, k8sinventory.HOST_KEYS)  # read once, not per host

    hosts_raw = top.get("hosts", dict, required=True, default={})
    hosts: dict[str, Host] = {}
    for name, raw in hosts_raw.items():
        host = _host(str(name), raw, defaults, problems, str(path), hosts_raw, deployment, default_k8s)
        if host is not None:
            hosts[host.name] = host

    hosts = _resolve_jumps(hosts)
    ignored = _roles_beside(path, roles_dir) if "roles_dir" not in top.data else None
    roles = _placed_roles(hosts, roles_dir, problems, str(path), ignored)
    # a bad value under defaults is found once per host that takes it: say it once
    problems[before:] = list(dict.fromkeys(problems[before:]))
    if problems and not collect:
        raise InputError(problems)
    return Inventory(path=str(path), deployment=deployment, hosts=hosts, roles=roles,
                     templates_dir=str(templates_dir) if templates_dir is not None else "",
                     roles_dir=str(roles_dir) if roles_dir is not None else "")


def inventory_file(path: str | Path) -> str:
    """The inventory file a path names: a folder (``-i inventory/``) means the ``hosts.yml`` in it."""
    return str(Path(path) / INVENTORY_FILE) if Path(path).is_dir() else str(path)


def own_roles_dir(path: str | Path) -> Path | None:
    """The roles_dir of the inventory at ``path`` (None: it has none; the packaged roles only); a
    problem with the file raises InputError."""
    problems: list[Problem] = []
    path = inventory_file(path)
    data = load_yaml(Path(path), problems)
    found = _own_dir(Checker(data, problems, str(path)), "roles_dir", Path(path)) if not problems else None
    if problems:
        raise InputError(problems)
    return found


def _own_dir(top: Checker, key: str, path: Path) -> Path | None:
    """The inventory's own roles_dir/templates_dir: the one it names (which must be a directory), else
    ``../roles`` (``../templates``) beside it when that exists; None: the packaged ones only."""
    given = top.get(key, str)
    if given is None:
        default = Path(os.path.normpath(path.parent / ".." / key.removesuffix("_dir")))
        return default if default.is_dir() else None
    folder = Path(os.path.normpath(path.parent / given))
    if not folder.is_dir():
        top.fail(f"{folder} is not a directory (leave {key} out to use the packaged "
                 f"{key.removesuffix('_dir')} only)", key)
        return None
    return folder


def _roles_beside(path: Path, roles_dir: Path | None) -> Path | None:
    """A ``roles/`` folder beside the inventory that is not the one read (roles_dir defaults to
    ``../roles``, for an inventory kept in ``inventory/``): a user who keeps hosts.yml at the top of
    a project beside roles/ edits files gpudeploy never reads. None when there is no such folder."""
    beside = path.parent / "roles"
    if not beside.is_dir() or beside.resolve() == library.PACKAGED_ROLES.resolve():
        return None
    if roles_dir is not None and beside.resolve() == roles_dir.resolve():
        return None
    return beside


def _placed_roles(hosts: dict[str, Host], roles_dir: Path | None, problems: list[Problem],
                  file: str, ignored: Path | None = None) -> dict[str, Role]:
    """Every role placed, by the name it is placed under: a role file read once however often it is
    placed, and a named instance as that role under its own name (``roles: [{role: decode, name: decode-a}]``)."""
    files: dict[str, Role | None] = {}
    roles: dict[str, Role] = {}
    first: dict[str, tuple[str, PlacementRequest]] = {}
    for h in hosts.values():
        for req in h.placements:
            base = req.file_role
            if base not in files:
                files[base] = _read_role(base, req, h.name, roles_dir, problems, file, ignored)
            role = files[base]
            if role is None:
                continue
            seen = first.setdefault(req.role, (base, req))
            if seen[0] != base:
                other = seen[1].where
                at = "" if other is None or other.line is None else f" (line {other.line})" \
                    if req.where is not None and other.file == req.where.file else f" ({other.file}:{other.line})"
                problems.append(Problem(
                    f"{req.role!r} names an instance of role {base!r} here and of role {seen[0]!r} elsewhere{at}; "
                    "an instance name stands for one role file", file=req.where.file if req.where else file,
                    line=req.where.line if req.where else None, host=h.name, role=req.role, key="roles"))
                continue
            if req.role != base and req.role not in roles and library.find_role(req.role, roles_dir) is not None:
                problems.append(Problem(
                    f"instance name {req.role!r} is also the name of a role file, so upstreams and --role "
                    f"{req.role} would mean both; give the instance of {base!r} another name",
                    file=req.where.file if req.where else file, line=req.where.line if req.where else None,
                    host=h.name, role=req.role, key="roles.name"))
                continue
            roles[req.role] = role if req.role == base else replace(role, name=req.role, instance_of=base)
    return roles


def _read_role(name: str, request: PlacementRequest, host: str, roles_dir: Path | None,
               problems: list[Problem], file: str, ignored: Path | None = None) -> Role | None:
    found = library.find_role(name, roles_dir)
    unread = ignored / f"{name}.yml" if ignored is not None else None
    unread = unread if unread is not None and unread.is_file() else None

    def fail(message: str) -> None:
        problems.append(Problem(message, file=request.where.file if request.where else file,
                                line=request.where.line if request.where else None, host=host, role=name,
                                key="roles"))

    near = library.misnamed(name, roles_dir)
    if near and (found is None or found.source == library.PACKAGED):
        # decode.yaml beside a packaged decode.yml: the packaged role (another model) would be deployed
        instead = f"the packaged {found.path} would be read instead" if found is not None else "no role file is read"
        fail(f"{', '.join(map(str, near))} is not read as role {name!r}: a role is read from {name}.yml exactly, "
             f"so {instead}; rename it to {name}.yml")
        return None
    if found is None:
        known = [r.name for r in library.available_roles(roles_dir)]
        where = f"{roles_dir}/{name}.yml, nor a packaged role" if roles_dir else "packaged role of that name"
        hint = did_you_mean(name, known)
        fail(f"unknown role {name!r}: no {where} (known roles: {', '.join(known) or 'none'})"
             + (f"; {hint}" if hint else "") + (f"; {_not_read(unread, roles_dir, file)}" if unread else ""))
        return None
    if unread is not None:
        # the user's own copy beside the inventory, silently replaced by another file of that name
        read = f"the packaged {found.path}" if found.source == library.PACKAGED else str(found.path)
        fail(f"role {name!r} is read from {read}, not from {unread}; {_not_read(unread, roles_dir, file)}")
        return None
    return load_role(found.path, problems)


def _not_read(unread: Path, roles_dir: Path | None, inventory: str) -> str:
    """Why a role file beside the inventory is not read, and the one line that reads it."""
    default = os.path.normpath(Path(inventory).parent / ".." / "roles")
    missing = "" if roles_dir is not None else ", which does not exist"
    return (f"the roles folder beside the inventory ({unread.parent}) is not read: roles_dir defaults to ../roles "
            f"({default}{missing}); add `roles_dir: roles` to {Path(inventory).name} to read it")


def _host(name: str, raw: Any, defaults: Checker, problems: list[Problem], file: str,
          parent: Any, default_deployment: str, default_k8s: K8sSettings) -> Host | None:
    line = parent.line_of(name) if isinstance(parent, LineMap) else None
    if not HOST_NAME_RE.fullmatch(name):
        problems.append(Problem(f"host name {name!r}: {HOST_NAME_RULE}", file=file, line=line, host=name))
    c = Checker(raw, problems, file, host=name, line=line)
    c.unknown_keys(HOST_KEYS)

    def pick(key: str, kind: Any, default: Any, check: Any = None) -> Any:
        if key in c.data:
            return c.get(key, kind, default=default, check=check)
        return defaults.get(key, kind, default=default, check=check)

    address = c.get("address", str, required=True, default=name)
    host_deployment = c.get("deployment", str, default=default_deployment,
                            check=lambda v: None if NAME_RE.fullmatch(v) else NAME_RULE)
    ssh_c = c.child("ssh") if "ssh" in c.data else defaults.child("ssh")
    ssh_c.unknown_keys(SSH_KEYS)
    if "ssh" in c.data and "ssh" in defaults.data:
        # Host ssh settings override the defaults key by key.
        merged = {**defaults.data["ssh"], **c.data["ssh"]}
        ssh_c = Checker(merged, problems, file, host=name, prefix="ssh.")
    ssh = ssh_config(ssh_c, file)

    numa_policy = _numa_policy(pick("numa_policy", str, "bind"), c)
    numa_raw = c.get("numa_nodes", list, required=True, default=[])
    nodes: list[NumaNode] = []
    seen_gpu: dict[int, int] = {}
    seen_cpu: dict[int, int] = {}  # CPU -> the NUMA node that listed it first
    for i, item in enumerate(numa_raw):
        nc = Checker(item, problems, file, host=name, prefix=f"numa_nodes[{i}].",
                     line=numa_raw.item_lines[i] if isinstance(numa_raw, LineList) else None)
        # `node: 1` reads as "this is NUMA node 1" but was dropped, binding node 0's memory: refused,
        # not taken as an alias of id, so an entry's number has one spelling only.
        nc.unknown_keys(NUMA_KEYS, hints={"node": f"a NUMA node's number is `id` (without it an entry is numbered "
                                                  f"by its place in the list: this one is node {i}); write "
                                                  "{id: N, gpus: [...], cpus: ...}"})
        nid = nc.get("id", int, default=i)
        gpus = nc.get("gpus", list, required=True, default=[])
        cpus = nc.get("cpus", (str, int), required=True, default="")
        cpus = str(cpus)
        memory = nc.get("memory_gib", float, check=_positive)
        if cpus and not CPU_LIST_RE.fullmatch(cpus.replace(" ", "")):
            nc.fail(f"CPU list {cpus!r} is not like '0-31' or '0-15,64-79'", "cpus")
        elif cpus:
            _check_cpus(nc, cpus.replace(" ", ""), nid, seen_cpu if numa_policy != "none" else None)
        good: list[int] = []
        for g in gpus:
            if not isinstance(g, int) or isinstance(g, bool) or g < 0:
                nc.fail(f"GPU index must be a non-negative integer, got {g!r}", "gpus")
                continue
            if g in seen_gpu:
                nc.fail(f"GPU {g} is listed on NUMA node {seen_gpu[g]} and on NUMA node {nid}", "gpus")
                continue
            seen_gpu[g] = nid
            good.append(g)
        if any(n.id == nid for n in nodes):
            nc.fail(f"NUMA node id {nid} appears twice", "id")
        nodes.append(NumaNode(id=nid, gpus=tuple(good), cpus=cpus.replace(" ", ""), memory_gib=memory))

    gpu_mem = _gpu_memory(c, defaults, seen_gpu)

    versions = {**(defaults.get("engine_versions", dict, default={}) or {}),
                **(c.get("engine_versions", dict, default={}) or {})}
    versions = {str(k): str(v) for k, v in versions.items()}
    env = {**(defaults.get("env", dict, default={}) or {}), **(c.get("env", dict, default={}) or {})}
    env = _env(env, c, "env")

    placements: list[PlacementRequest] = []
    roles_list = c.get("roles", list, default=[])
    roles_line = c.where("roles")
    item_lines = getattr(roles_list, "item_lines", [])
    for n, item in enumerate(roles_list):
        item_line = item_lines[n] if n < len(item_lines) else roles_line
        if isinstance(item, str):
            if _role_name_ok(item, c, item_line):
                placements.append(PlacementRequest(role=item, where=Where(file, item_line)))
        elif isinstance(item, dict):
            placement = _placement(item, c, item_line, problems, file, name)
            if placement is not None:
                placements.append(placement)
        else:
            c.fail(f"each entry is a role name or {{role: NAME, numa_node: N}}, got {item!r}", "roles")
    firsts: dict[str, PlacementRequest] = {}
    for p in placements:
        was = firsts.setdefault(p.role, p)
        if was is not p:
            at = f" (line {was.where.line})" if was.where and was.where.line else ""
            again = f"role {p.role!r} is placed twice on this host{at}" if p.role_file is None else \
                f"instance name {p.role!r} is used twice on this host{at}"
            used = {q.role for q in placements}
            free = next((f"{p.file_role}-{x}" for x in "bcdefghijklmnopqrstuvwxyz" if f"{p.file_role}-{x}" not in used),
                        f"{p.file_role}-2")
            c.fail(f"{again}: the two would share a unit name, GPUs and ports; give each placement its own name "
                   f"(roles: [{{role: {p.file_role}, name: {free}, gpus: [...], port: N}}])", "roles",
                   line=p.where.line if p.where else None)

    return Host(
        name=name, address=address, ssh=ssh, numa_nodes=tuple(nodes), gpu_memory_gib=gpu_mem,
        engine_versions=versions, python=pick("python", str, "/usr/bin/python3"),
        bind_address=pick("bind_address", str, "0.0.0.0"),  # noqa: S104 - servers must be reachable
        numa_policy=numa_policy,
        env=env, placements=tuple(placements), where=Where(file, line), deployment=host_deployment,
        supervisor=pick("supervisor", str, "auto", lambda v: None if v in SUPERVISORS else
                        f"one of {', '.join(SUPERVISORS)}"),
        connection=pick("connection", str, "ssh", lambda v: None if v in CONNECTIONS else
                        f"one of {', '.join(CONNECTIONS)}"),
        kubernetes=default_k8s.under(k8sinventory.k8s_settings(c, k8sinventory.HOST_KEYS)),
    )


def _check_cpus(nc: Checker, cpus: str, nid: int, seen: dict[int, int] | None) -> None:
    """A CPU belongs to one NUMA node: a list copied into a second entry (or a range written
    backwards) would bind an engine to the other node's CPUs, or to none, without a word.
    ``seen`` is None where the host binds no memory (numa_policy: none): its "NUMA nodes" may be
    groups of GPUs on a machine whose kernel sees one node (a VM, the lab), sharing the CPUs."""
    mine: set[int] = set()
    for part in cpus.split(","):
        a, _, b = part.partition("-")
        first, last = int(a), int(b or a)
        if last < first:
            nc.fail(f"CPU range {part!r} runs backwards (write {last}-{first})", "cpus")
            return
        mine.update(range(first, last + 1))
    if seen is None:
        return
    shared = sorted(c for c in mine if c in seen)
    if shared:
        other = seen[shared[0]]
        nc.fail(f"CPU {shared[0]} is listed on NUMA node {other} and on NUMA node {nid}"
                f"{f' ({len(shared)} CPUs in both)' if len(shared) > 1 else ''}: a CPU belongs to one NUMA node; "
                "`lscpu` or /sys/devices/system/node/node<N>/cpulist on the host lists each node's CPUs (a host "
                "that binds no memory, numa_policy: none, may share them)", "cpus")
    for c in mine:
        seen.setdefault(c, nid)


def ssh_config(ssh_c: Checker, file: str) -> SshConfig:
    """An ``ssh:`` mapping (a host's, or a Slurm login node's: the same transport and host-key rule)."""
    # user and port left out: ~/.ssh/config decides, else ssh's own defaults (your login name, 22).
    ssh = SshConfig(
        user=ssh_c.get("user", str, default=None),
        port=ssh_c.get("port", int, default=None, check=_port_check),
        key=_expand(ssh_c.get("key", str), Path(file).parent),
        known_hosts=_expand(ssh_c.get("known_hosts", str), Path(file).parent),
        connect_timeout_s=ssh_c.get("connect_timeout_s", float, default=5.0, check=seconds_problem),
    )
    jump = ssh_c.get("proxy_jump", str, check=_jump_check)
    if jump is not None:
        ssh = replace(ssh, proxy_jump=_hop(jump, ssh))
    return ssh


def _gpu_memory(c: Checker, defaults: Checker, gpus: dict[int, int]) -> dict[int, float]:
    """``gpu_memory_gib``: one number for every GPU or ``{index: GiB}``, from the host or else the
    defaults. A bad value is reported once, at its own line (the defaults' when it is theirs), and
    its GPUs are left out: the memory preflight then skips their units rather than computing with
    a made-up capacity (0 GiB, less CUDA's share, was "GPU capacity must be positive, got -0.6",
    with no file or line, in place of the inventory's own problem)."""
    src = c if "gpu_memory_gib" in c.data else defaults
    if src.data.get("gpu_memory_gib") is None:
        if gpus:
            c.fail("required key is missing (GPU memory in GiB, per host or per GPU)", "gpu_memory_gib", line=c.line)
        return {}
    mem = src.get("gpu_memory_gib", (float, dict))
    if isinstance(mem, float):
        problem = gpu_gib_problem(mem)
        if problem:
            src.fail(problem, "gpu_memory_gib")
            return {}
        return {g: mem for g in gpus}
    out: dict[int, float] = {}
    for g in gpus if isinstance(mem, dict) else ():
        v = mem.get(g)
        problem = f"no memory size for GPU {g}" if v is None else gpu_gib_problem(v)
        line = getattr(mem, "key_lines", {}).get(g)
        if problem:
            src.fail(f"GPU {g}: {problem}" if v is not None else problem, "gpu_memory_gib", line=line)
        else:
            out[g] = float(v)
    return out


PLACEMENT_KEYS = {"role", "name", "numa_node", "gpus", "deployment", "port", "ports"}


def _placement(item: dict[str, Any], c: Checker, line: int | None, problems: list[Problem], file: str,
               host: str) -> PlacementRequest | None:
    """``{role: R, name: N, gpus: [...], numa_node: K, port: P, ports: {...}, deployment: D}``: one role
    placed once; ``name`` makes it an instance of R of its own (its unit, ports and GPUs are keyed by N)."""
    pc = Checker(item, problems, file, host=host, prefix="roles.", line=line)
    pc.unknown_keys(PLACEMENT_KEYS)
    role = pc.get("role", str, required=True, default="?")
    if not _role_name_ok(role, c, line):
        return None
    instance = pc.get("name", str, check=lambda v: None if NAME_RE.fullmatch(v) else NAME_RULE)
    if instance is not None and _surge_name(instance):
        pc.fail(_surge_name(instance), "name")
        return None
    gpus = pc.get("gpus", list)
    ports: dict[str, int] = {}
    for kind, value in (pc.get("ports", dict, default={}) or {}).items():
        if not isinstance(value, int) or isinstance(value, bool) or _port_check(value):
            pc.fail(f"port {kind!r} must be an integer 1-65535, got {value!r}", f"ports.{kind}")
        else:
            ports[str(kind)] = value
    port = pc.get("port", int, check=_port_check)
    if port is not None:
        if "http" in ports and ports["http"] != port:
            pc.fail(f"port {port} and ports.http {ports['http']} are both given; port is the http port", "port")
        ports["http"] = port
    return PlacementRequest(
        role=instance if instance is not None and instance != role else role,
        role_file=role if instance is not None and instance != role else None,
        numa_node=pc.get("numa_node", int), gpus=tuple(gpus) if gpus is not None else None,
        deployment=pc.get("deployment", str, check=lambda v: None if NAME_RE.fullmatch(v) else NAME_RULE),
        where=Where(file, line), ports=ports)


def load_role(path: Path, problems: list[Problem]) -> Role | None:
    """Parse one role file; problems are appended, None returned when it is unusable."""
    before = len(problems)
    data = load_yaml(path, problems)
    if len(problems) > before:
        return None
    name = path.stem
    c = Checker(data, problems, str(path), role=name)
    c.unknown_keys(ROLE_KEYS)
    engine = c.get("engine", str, required=True, default="command",
                   check=lambda v: None if v in ENGINES else f"unknown engine {v!r} (one of {', '.join(ENGINES)})")
    hc = c.child("health")
    hc.unknown_keys(HEALTH_KEYS)
    default_health = "/readiness" if engine == "sglang_router" else "/health"
    health = Health(
        path=hc.get("path", str, default=default_health,
                    check=lambda v: None if v.startswith("/") else "must start with /"),
        timeout_s=hc.get("timeout_s", float, default=1200.0, check=seconds_problem),
        interval_s=hc.get("interval_s", float, default=0.25, check=seconds_problem),
        drain_s=hc.get("drain_s", float, default=60.0, check=seconds_problem),
        stall_s=_stall_s(hc),
        on_stall=hc.get("on_stall", str, default="wait",
                        check=lambda v: None if v in ON_STALL else f"one of {', '.join(ON_STALL)}"),
        py_spy=hc.get("py_spy", str, check=_host_path),
    )
    ports_raw = c.get("ports", dict, default={}) or {}
    ports: dict[str, int] = {}
    for k, v in ports_raw.items():
        if not isinstance(v, int) or isinstance(v, bool) or _port_check(v):
            c.fail(f"port {k!r} must be an integer 1-65535, got {v!r}", "ports")
        else:
            ports[str(k)] = v
    upstreams_raw = c.get("upstreams", dict, default={}) or {}
    upstreams: dict[str, tuple[str, ...]] = {}
    for k, v in upstreams_raw.items():
        if k not in UPSTREAM_KINDS:
            hint = did_you_mean(str(k), UPSTREAM_KINDS)
            c.fail(f"unknown upstream kind {k!r} (prefill, decode or workers){'; ' + hint if hint else ''}",
                   f"upstreams.{k}", line=upstreams_raw.line_of(k) if isinstance(upstreams_raw, LineMap) else None)
            continue
        items = [v] if isinstance(v, str) else v
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            c.fail("expected a role name or a list of role names", f"upstreams.{k}")
            continue
        upstreams[str(k)] = tuple(items)
    argv = c.get("argv", list, default=[]) or []
    if engine == "command" and not argv:
        c.fail("the command engine needs argv: the server's command line", "argv", line=c.line)
    if engine != "command" and argv:
        c.fail(f"argv is only for the command engine; engine {engine} builds its own", "argv")
    extra = _extra_args(c)
    secret_env = c.get("secret_env", list, default=[]) or []
    for s in secret_env:
        if not isinstance(s, str) or not ENV_NAME_RE.fullmatch(s):
            c.fail(f"secret names are environment variable names, got {s!r}", "secret_env")
    settings = _settings(c)
    model = c.get("model", dict, default={}) or {}
    if engine == "sglang":
        # an SGLang role's model is its path and the facts the memory check reads; anything else was
        # dropped without a word (a command role's model keys are its argv templates' to use)
        Checker(model, problems, str(path), role=name, prefix="model.", line=c.where("model")).unknown_keys(
            SGLANG_MODEL_KEYS, hints={"revision": "SGLang's --revision is a setting: settings: {revision: ...}"})
    if engine == "sglang" and "path" not in model:
        c.fail("required key is missing (the model directory on the host)", "model.path",
               line=c.where("model"))
    tp = _tp_size(c, default=1) or 1
    nnodes = c.get("nnodes", int, default=1, check=lambda v: None if v >= 1 else "must be >= 1")
    if isinstance(nnodes, int) and nnodes > 1:
        if engine != "sglang":
            c.fail(f"only an sglang engine spans hosts; engine {engine} runs on one host", "nnodes")
        elif isinstance(tp, int) and (split := tp_split_problem(tp, nnodes)):
            c.fail(split, "nnodes")
    gpus = c.get("gpus", int, check=lambda v: None if v >= 0 else "must be >= 0")
    log_format = c.get("log_format", str, default="sglang",
                       check=lambda v: None if v in LOG_FORMATS else f"one of {', '.join(LOG_FORMATS)}")
    python = c.get("python", str, check=lambda v: None if v.startswith("/") else "must be an absolute path")
    smoke = _smoke(c, engine)
    kubernetes = k8sinventory.k8s_settings(c, k8sinventory.ROLE_KEYS)
    if kubernetes.service_discovery and engine != "sglang_router":
        c.fail("service_discovery is for routers (engine sglang_router): they find their workers' pods by label",
               "kubernetes.service_discovery", line=kubernetes.where["service_discovery"].line)
    unusable = len(problems) > before
    # a problem with these leaves a usable role (with the default in its place), which the plan checks
    # further; they are read here so that they are reported along with an unusable role's problems too
    stop_timeout_s = c.get("stop_timeout_s", float, default=30.0, check=seconds_problem)
    description = c.get("description", str, default="", check=lambda v: control_problem(v))
    allow_span_numa = c.get("allow_span_numa", bool, default=False)
    env = _env(c.get("env", dict, default={}) or {}, c, "env")
    if unusable:
        return None
    lines = dict(data.key_lines) if isinstance(data, LineMap) else {}
    for section in ("settings", "model", "ports", "env", "upstreams"):
        sub = data.get(section) if isinstance(data, dict) else None
        if isinstance(sub, LineMap):
            lines.update({f"{section}.{k}": v for k, v in sub.key_lines.items()})
    return Role(
        name=name, engine=engine, file=str(path),
        description=description, tp_size=tp, nnodes=nnodes, gpus=gpus, allow_span_numa=allow_span_numa,
        version=str(c.data["version"]) if c.data.get("version") is not None else None,
        model=dict(model), settings=dict(settings), extra_args=tuple(extra),
        argv=tuple(str(a) for a in argv), ports=ports, upstreams=upstreams,
        env=env, secret_env=tuple(str(s) for s in secret_env), health=health,
        stop_timeout_s=stop_timeout_s, log_format=log_format,
        python=python, smoke=smoke, kubernetes=kubernetes, lines=lines,
    )


def _stall_s(hc: Checker) -> dict[str, float]:
    """``health.stall_s``: seconds for every phase (``stall_s: 120``), or per phase with the phase's
    name in snake case (``stall_s: {loading_weights: 900}``); phases not named keep their default."""
    out = dict(STALL_DEFAULTS_S)
    raw = hc.get("stall_s", (float, dict))
    if isinstance(raw, float):
        problem = seconds_problem(raw)
        if problem:
            hc.fail(problem, "stall_s")
        else:
            out = {phase: raw for phase in STALL_DEFAULTS_S}
    elif isinstance(raw, dict):
        keys = {phase.replace(" ", "_").lower(): phase for phase in STALL_DEFAULTS_S}
        sc = hc.child("stall_s")
        sc.unknown_keys(set(keys))
        for key, phase in keys.items():
            value = sc.get(key, float, check=seconds_problem)
            if value is not None:
                out[phase] = value
    return out


def _host_path(v: str) -> str | None:
    """A path of a program on the host: absolute, one line."""
    return control_problem(v) or (None if v.startswith("/") else "must be an absolute path on the host")


SMOKE_ENDPOINTS = ("/generate", "/v1/completions", "/v1/chat/completions")


def _smoke(c: Checker, engine: str) -> Smoke | None:
    """A router's smoke generation (on by default for routers; ``smoke: false`` turns it off)."""
    raw = c.data.get("smoke")
    if raw is False or (raw is None and engine != "sglang_router"):
        return None
    sc = c.child("smoke") if isinstance(raw, dict) else Checker({}, c.problems, c.file, role=c.role, prefix="smoke.")
    sc.unknown_keys(SMOKE_KEYS)
    return Smoke(
        endpoint=sc.get("endpoint", str, default="/generate",
                        check=lambda v: None if v in SMOKE_ENDPOINTS else f"one of {', '.join(SMOKE_ENDPOINTS)}"),
        prompt=sc.get("prompt", str, default="Say hello.", check=control_problem),
        max_tokens=sc.get("max_tokens", int, default=8, check=lambda v: None if 1 <= v <= 4096 else "1-4096"),
        timeout_s=sc.get("timeout_s", float, default=60.0, check=seconds_problem),
        model=sc.get("model", str))


# What an experiment variant may override of a role (experiment/spec.py), checked here so that a
# variant's values pass exactly the checks a role file's do. ``model`` is the checkpoint (its path and
# the facts the memory preflight reads); ``files`` ships local files with the variant: env name -> a
# file or folder beside the experiment file, uploaded to the host and that env variable set to it.
OVERRIDABLE = ("settings", "env", "extra_args", "tp_size", "model", "files")
MODEL_OVERRIDES = ("path", "facts")


def role_overrides(c: Checker) -> dict[str, Any]:
    """A role's keys as a variant overrides them (``c``: that mapping, with its file and lines),
    checked as :func:`load_role` checks a role file's; problems go to ``c``. ``null`` for a settings
    or env key is kept as None: it removes the role's own key. ``files`` is checked for its shape
    here (env names as ``env``'s); reading the files is the experiment's (experiment/ship.py)."""
    c.unknown_keys(set(OVERRIDABLE))
    out: dict[str, Any] = {}
    if c.data.get("settings") is not None:
        out["settings"] = _settings(c)
    env = c.get("env", dict)
    if env is not None:
        out["env"] = _env(env, c, "env", removable=True)
    if c.data.get("extra_args") is not None:
        out["extra_args"] = list(_extra_args(c))
    tp = _tp_size(c)
    if tp is not None:
        out["tp_size"] = tp
    if c.data.get("model") is not None:
        model = _model_override(c.child("model"))
        if model:
            out["model"] = model
    files = c.get("files", dict)
    if files is not None:
        out["files"] = _files_override(files, c, out.get("env") or {})
    return out


def _model_override(mc: Checker) -> dict[str, Any]:
    """``model: {path: ..., facts: {...}}``: the checkpoint a variant serves. Its path is what the
    engine loads (a folder on the host, or a hub id); ``facts`` as a role file's model.facts."""
    mc.unknown_keys(set(MODEL_OVERRIDES))
    out: dict[str, Any] = {}
    path = mc.get("path", str, check=lambda v: control_problem(v) or (None if v.strip() else "must not be empty"))
    if path is not None:
        out["path"] = path
    facts = mc.get("facts", dict)
    if facts is not None:
        out["facts"] = dict(facts)
    return out


def _files_override(raw: dict[str, Any], c: Checker, env: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, source in raw.items():
        line = raw.line_of(name) if isinstance(raw, LineMap) else c.where("files")
        name = str(name)
        if not ENV_NAME_RE.fullmatch(name):
            c.fail(f"{name!r} is not a valid environment variable name (files: ENV_NAME: local/path)", "files",
                   line=line)
        elif name in RESERVED_ENV:
            c.fail(f"{name} is set by gpudeploy ({RESERVED_ENV[name]})", f"files.{name}", line=line)
        elif name in env:
            c.fail(f"{name} is set by env too; a shipped file's variable points at the uploaded copy", f"files.{name}",
                   line=line)
        elif not isinstance(source, str) or not source.strip() or control_problem(source):
            c.fail(f"files.{name} is the path of a local file or folder to ship, got {source!r}", f"files.{name}",
                   line=line)
        else:
            out[name] = source
    return out


def tp_split_problem(tp: int, nnodes: int) -> str | None:
    """A multi-node role's TP is the whole group's: it must split evenly over its nodes."""
    if nnodes > 1 and tp % nnodes:
        return f"tp_size {tp} is the whole group's TP; it must split evenly over {nnodes} nodes"
    return None


def _settings(c: Checker) -> dict[str, Any]:
    # Values are checked where they become flags (plan/flags.py) or template input (a command role).
    return dict(c.get("settings", dict, default={}) or {})


def _extra_args(c: Checker) -> tuple[str, ...]:
    extra = c.get("extra_args", list, default=[]) or []
    if not all(isinstance(a, (str, int, float)) and not isinstance(a, bool) for a in extra):
        c.fail("extra_args is a list of words", "extra_args")
        return ()
    return tuple(str(a) for a in extra)


def _tp_size(c: Checker, default: int | None = None) -> int | None:
    tp: int | None = c.get("tp_size", int, default=default, check=lambda v: None if v >= 1 else "must be >= 1")
    return tp


def _role_name_ok(name: str, c: Checker, line: int | None) -> bool:
    """A placed role names a file ``roles_dir/<name>.yml``: a plain name, never a path, and not one a
    rolling update's copies are named by."""
    if not NAME_RE.fullmatch(name):
        c.fail(f"role name {name!r}: {NAME_RULE}; roles are files directly in roles_dir", "roles", line=line)
        return False
    if _surge_name(name):
        c.fail(_surge_name(name), "roles", line=line)
        return False
    return True


def _surge_name(name: str) -> str:
    """Why ``name`` cannot name a unit ("" when it can): a rolling update runs an engine's temporary copy
    as ``<role>-surge``, and the next deploy stops and removes whatever it finds under that name
    (apply/surges.py)."""
    if not name.endswith(SURGE_SUFFIX):
        return ""
    return (f"{name!r} ends in {SURGE_SUFFIX!r}, which is reserved for the temporary copies a rolling update "
            f"starts (a deploy would take this unit for a leftover copy and remove it); choose another name, "
            f"e.g. {name[:-len(SURGE_SUFFIX)]}-spare")


def _env(raw: dict[str, Any], c: Checker, key: str, *, removable: bool = False) -> dict[str, Any]:
    """Environment settings as strings (``true``/``false`` for booleans); with ``removable`` a None
    value (YAML ``null``) is kept: it removes the key from what it overrides."""
    out: dict[str, Any] = {}
    for k, v in raw.items():
        line = raw.line_of(k) if isinstance(raw, LineMap) else c.where(key)
        if not ENV_NAME_RE.fullmatch(str(k)):
            c.fail(f"{k!r} is not a valid environment variable name", key, line=line)
        elif str(k) in RESERVED_ENV:
            c.fail(f"{k} is set by gpudeploy ({RESERVED_ENV[str(k)]}); remove it from {key}", f"{key}.{k}",
                   line=line)
        elif v is None and removable:
            out[str(k)] = None
        elif isinstance(v, (dict, list)) or v is None:
            c.fail(f"value of {k} must be a string or number", key, line=line)
        elif control_problem(str(v)):
            c.fail(f"value of {k}: {control_problem(str(v))}", f"{key}.{k}", line=line)
        else:
            out[str(k)] = str(v).lower() if isinstance(v, bool) else str(v)
    return out


def _numa_policy(value: str, c: Checker) -> str:
    if value not in NUMA_POLICIES:
        c.fail(f"numa_policy must be one of {', '.join(NUMA_POLICIES)}, got {value!r}", "numa_policy")
        return "none"
    return value


def _expand(value: str | None, base: Path) -> str | None:
    if value is None:
        return None
    p = Path(value).expanduser()
    return str(p if p.is_absolute() else (base / p).resolve())


def _hop(spec: str, ssh: SshConfig) -> SshHop:
    """``[user@]host[:port]`` with the target's key, known_hosts and timeout. An inventory host name
    is resolved to that host's address and ssh settings after every host is read."""
    user, _, rest = spec.rpartition("@")
    address, port = rest, None
    m = re.fullmatch(r"(\[[^\]]+\]|[^:]+):(\d+)", rest)
    if m:
        address, port = m.group(1).strip("[]"), int(m.group(2))
    return SshHop(address=address, user=user or None, port=port, key=ssh.key, known_hosts=ssh.known_hosts,
                  connect_timeout_s=ssh.connect_timeout_s)


def _resolve_jumps(hosts: dict[str, Host]) -> dict[str, Host]:
    """A proxy_jump that names an inventory host means that host, as gpudeploy reaches it."""
    out = {}
    for name, h in hosts.items():
        hop = h.ssh.proxy_jump
        via = hosts.get(hop.address) if hop is not None and hop.user is None and hop.port is None else None
        if hop is not None and via is not None:
            hop = SshHop(address=via.address, user=via.ssh.user, port=via.ssh.port, key=via.ssh.key,
                         known_hosts=via.ssh.known_hosts, connect_timeout_s=via.ssh.connect_timeout_s)
            h = replace(h, ssh=replace(h.ssh, proxy_jump=hop))
        out[name] = h
    return out


def _jump_check(v: str) -> str | None:
    # An inventory host name, or [user@]host[:port]; no spaces or options (it reaches ssh's argv).
    return None if re.fullmatch(r"([A-Za-z0-9._-]+@)?[A-Za-z0-9._:\[\]-]+", v) else \
        "expected a host name from the inventory or [user@]host[:port]"


def _port_check(v: int) -> str | None:
    return None if 1 <= v <= 65535 else "must be 1-65535"


def _positive(v: float) -> str | None:
    return None if v > 0 else "must be positive"
