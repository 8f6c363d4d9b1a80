"""``gpudeploy init --host ADDR [--host ADDR ...] [--out inventory/hosts.yml] [--force]``: an inventory
written from the hosts' own facts.

Each host is reached as deploy reaches it (host keys checked against the same files; an unknown host
is refused, never added, and the message says how to add it), probed once (facts/remote_probe.py:
NVML's GPUs with memory, PCI bus ids and NUMA nodes, the kernel's CPU lists per NUMA node, the init
system, and SGLang/vLLM/sglang-router at every python found), and described in the file with comments
(found.py, write.py). Nothing is written unless every host answered; an existing file is kept unless
``--force``; the file is written whole or not at all (a temporary file renamed into place).
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import GpudeployError, HostUnreachable, InputError, Problem
from ..facts.probe import probe
from ..fanout import for_each_host
from ..model import Host, SshConfig
from ..remote import connect
from .found import ENGINE_PACKAGES, PYTHONS, Found, from_probe, host_name
from .write import SshDefaults, inventory_text

__all__ = ["InitOptions", "init_inventory", "parse_address"]


@dataclass(frozen=True)
class InitOptions:
    addresses: tuple[str, ...]
    out: str = "inventory/hosts.yml"
    force: bool = False
    user: str | None = None
    port: int | None = None
    key: str | None = None
    known_hosts: str | None = None
    python: str | None = None
    deployment: str = "pd"


ADDRESS_RE = re.compile(r"(?:(?P<user>[A-Za-z0-9._-]+)@)?(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)"
                        r"(?::(?P<port>\d+))?")


def parse_address(text: str) -> tuple[str | None, str, int | None]:
    """``[user@]host[:port]`` (``[v6]:port`` for an IPv6 address) -> (user, host, port); nothing else
    (it reaches ssh)."""
    m = ADDRESS_RE.fullmatch(text.strip())
    if m is None or (m["port"] and not 1 <= int(m["port"]) <= 65535):
        raise InputError([Problem(f"--host {text!r}: expected ADDRESS, USER@ADDRESS or ADDRESS:PORT", key="--host")])
    return m["user"], m["host"].strip("[]"), int(m["port"]) if m["port"] else None


def _path(value: str | None) -> str | None:
    """A path as the inventory should name it: ~ kept (each user's own), else absolute."""
    if value is None or value.startswith("~"):
        return value
    return str(Path(value).resolve())


def _probe_host(address: str, user: str | None, port: int | None, opts: InitOptions) -> Host:
    return Host(name=address, address=address,
                ssh=SshConfig(user=user or opts.user, port=port or opts.port,
                              key=str(Path(opts.key).expanduser()) if opts.key else None,
                              known_hosts=str(Path(opts.known_hosts).expanduser()) if opts.known_hosts else None),
                numa_nodes=(), gpu_memory_gib={}, engine_versions={}, python=opts.python or "python3",
                bind_address="0.0.0.0", numa_policy="none", env={}, placements=())  # noqa: S104 - not used


def unknown_key_hint(host: Host, error: GpudeployError) -> str:
    """How to add a host's key when it is not known (init never adds one)."""
    text = str(error)
    if "not in known_hosts" not in text:
        return ""
    port = f"-p {host.ssh.port} " if host.ssh.port else ""
    name = f"[{host.address}]:{host.ssh.port}" if host.ssh.port and host.ssh.port != 22 else host.address
    return (f"\n    to trust it: read its key's fingerprint on the host itself (`ssh-keygen -lf "
            f"/etc/ssh/ssh_host_ed25519_key.pub` on its console), compare it with `ssh-keyscan {port}{host.address} "
            f"| ssh-keygen -lf -`, and only if they match: `ssh-keyscan {port}{host.address} >> ~/.ssh/known_hosts` "
            f"(or give --known-hosts FILE with a line for {name})")


def init_inventory(opts: InitOptions) -> tuple[str, bool]:
    """Probe the hosts and write the inventory; the report to print, and whether it was written."""
    out = Path(opts.out)
    if out.exists() and not opts.force:
        raise InputError([Problem(f"{out} exists; init never overwrites an inventory (--force does, or --out "
                                  "names another file)", file=str(out), key="--out")])
    targets = [parse_address(a) for a in opts.addresses]
    hosts = [_probe_host(address, user, port, opts) for user, address, port in targets]
    if len({h.address for h in hosts}) != len(hosts):
        raise InputError([Problem("a host is given twice", key="--host")])
    spec = {"gpus": True, "topology": True, "xids": {"since": 0},
            "engines": {"pythons": [*([opts.python] if opts.python else []), *PYTHONS],
                        "packages": list(ENGINE_PACKAGES)}}

    def one(host: Host) -> dict[str, object]:
        with connect(host) as remote:
            return probe(remote, spec, timeout=240)  # every python's engines: an import each, at worst

    results = for_each_host(hosts, one)
    failed = [(h, r) for h in hosts for r in [results[h.name]] if isinstance(r, GpudeployError)]
    if failed:
        # a RemoteError's text starts with the host already
        lines = [f"{r}{unknown_key_hint(h, r) if isinstance(r, HostUnreachable) else ''}" for h, r in failed]
        return "\n".join([*lines, f"nothing was written: init describes every host or none ({out} unchanged)"]), False
    taken: set[str] = set()
    found: list[Found] = []
    for (user, address, port), h in zip(targets, hosts, strict=True):
        facts = results[h.name]
        assert isinstance(facts, dict)
        name = host_name(str(facts.get("hostname") or ""), address, taken)
        taken.add(name)
        found.append(from_probe(name, address, user, port, facts))
    text = inventory_text(found, deployment=opts.deployment,
                          ssh=SshDefaults(opts.user, opts.port, _path(opts.key), _path(opts.known_hosts)),
                          python=opts.python)
    _write(out, text, opts.force)
    return "\n".join([*(_summary(f) for f in found), f"wrote {out}", *_next_steps(out)]), True


def _write(out: Path, text: str, force: bool) -> None:
    """Whole or not at all; without ``force`` never over a file that appeared meanwhile (a hard link
    fails where the name exists)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        if force:
            os.replace(tmp, out)
        else:
            try:
                os.link(tmp, out)
            except FileExistsError:
                raise InputError([Problem(f"{out} appeared while init ran; it is kept", file=str(out),
                                          key="--out")]) from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _summary(f: Found) -> str:
    from .found import engines, numa_nodes, starter_roles

    gpus = f"{len(f.gpus)} GPUs ({', '.join(sorted({str(g.get('name')) for g in f.gpus}))})" if f.gpus else \
        f"no GPUs listed: {f.nvml_error or 'NVML lists none'} (placeholders marked TODO)"
    fake = "; its NVML says it is a stand-in" if f.standin else ""
    if f.gpus and any(isinstance(g.get("health"), dict) for g in f.gpus):
        from ..facts.health import grouped, word

        gpus += f"; GPU health {grouped({int(g['index']): word(g) for g in f.gpus})}"
    logged = f.kernel.get("xids") or []
    gpus += f"; {len(logged)} Xid line(s) in the kernel log since boot" if logged else ""
    eng = engines(f)
    where = f"; engines at {eng.python}: " + (", ".join(f"{k} {v}" for k, v in eng.versions.items()) or "vllm") \
        if eng.python else "; no SGLang or vLLM found (TODO)"
    places, why = starter_roles(numa_nodes(f), router=False) if f.gpus else ([], "")
    roles = f"; starter roles {', '.join(p.role for p in places)}" if places else (f"; {why}" if why else "")
    return f"{f.name} ({f.address}): {gpus}{fake}; init {f.init}{where}{roles}"


def _next_steps(out: Path) -> list[str]:
    """What the written inventory plans to (memory included), or what it still lacks."""
    from ..plan import load_plan

    try:
        plan = load_plan(str(out), offline_flags=True)
    except InputError as exc:
        return [f"it does not plan yet (see its TODOs): {exc}"]
    except GpudeployError as exc:  # e.g. the memory model could not read a model
        return [f"it does not plan yet: {exc}"]
    from ..plan.memcheck import memory_verdicts

    refused, _ = memory_verdicts(plan)
    steps = [f"next: gpudeploy plan --inventory {out}; gpudeploy deploy --inventory {out}"
             + (f" ({len(plan.units)} units)" if plan.units else " (nothing placed yet)")]
    steps += [f"memory: {p}" for p in refused]
    return steps
