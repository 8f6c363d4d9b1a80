"""Engine command lines rendered for the release a host runs, checked against that release's --help.

Role settings use release-neutral names (underscores). Most map to ``--name-with-dashes``; the ones
SGLang renamed list every spelling, oldest first, and we take the first the release actually has.
So the captured flag list, not a version comparison, decides.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import flagcache
from ..errors import Problem
from ..flagspec import FlagSpec, captured_versions, load_flags, resolve
from ..model import Host, Role
from ..versions import release_tuple, sort_key

SPELLINGS: dict[str, tuple[str, ...]] = {
    "cuda_graph_max_bs": ("--cuda-graph-max-bs", "--cuda-graph-max-bs-decode"),
    "mamba_scheduler_strategy": ("--mamba-scheduler-strategy", "--mamba-radix-cache-strategy"),
}

# Set by gpudeploy from placement and ports; a role setting them would fight the plan.
RESERVED = {
    "sglang": {"model_path": "model.path", "tp_size": "tp_size", "tensor_parallel_size": "tp_size",
               "port": "ports.http", "host": "bind_address", "nccl_port": "ports.nccl",
               "disaggregation_bootstrap_port": "ports.bootstrap", "base_gpu_id": "placement"},
    "sglang_router": {"port": "ports.http", "host": "bind_address", "prefill": "upstreams",
                      "decode": "upstreams", "pd_disaggregation": "upstreams"},
}
PROGRAM = {"sglang": "sglang", "sglang_router": "sglang_router"}


def known_releases(program: str) -> list[str]:
    """Releases gpudeploy has the real --help of: captured, or learned from a host earlier."""
    return sorted(set(captured_versions(program)) | set(flagcache.releases(program)), key=sort_key)


def release_flags(program: str, version: str, host: str | None = None) -> dict[str, FlagSpec]:
    """The options of ``program`` ``version`` on ``host``: captured, else the help text learned for that
    host (flagcache.for_host); KeyError when there is none."""
    if resolve(program, version) is not None:
        return load_flags(program, version)
    learned = flagcache.for_host(program, version, host)
    if learned is None:
        raise KeyError(f"no --help of {program} {version} for {host}")
    return flagcache.flags_of(learned.path, learned.digest)


def flags_source(program: str, version: str, host: str | None) -> flagcache.Learned | None:
    """Where a unit's flags come from when they were learned (None: captured, or not known)."""
    return None if resolve(program, version) is not None else flagcache.for_host(program, version, host)


def has_flags(program: str, version: str, host: str | None = None) -> bool:
    return resolve(program, version) is not None or flagcache.for_host(program, version, host) is not None


def nearest_captured(program: str, version: str) -> str | None:
    """The captured (or learned) release nearest below ``version`` (the oldest when it is older than all)."""
    known = known_releases(program)
    if not known:
        return None
    key = release_tuple(version)
    below = [v for v in known if release_tuple(v) <= key]
    return below[-1] if below else known[0]


def flags_release(program: str, version: str, host: str | None = None) -> str:
    """The release whose --help spells the flags for ``version``: itself when gpudeploy has it (for
    ``host``), else the nearest captured one (an offline plan; deploy then reads the host's own --help)."""
    if has_flags(program, version, host):
        return version
    return nearest_captured(program, version) or version


def engine_version(host: Host, role: Role, problems: list[Problem], *, offline: bool = False) -> str | None:
    """The release of the role's engine on this host, if it is one we have the real --help of
    (``offline``: any release; :func:`flags_release` then picks the nearest captured spelling)."""
    program = PROGRAM.get(role.engine)
    if program is None:
        return None
    version = role.version or host.engine_versions.get(program)
    known = known_releases(program)
    if version is None:
        problems.append(Problem(
            f"no {program} release declared; set engine_versions: {{{program}: \"X.Y.Z\"}} "
            f"(supported: {', '.join(known)})", file=host.where.file if host.where else None,
            line=host.where.line if host.where else None, host=host.name, role=role.name,
            key="engine_versions"))
        return None
    if not has_flags(program, version, host.name) and offline and known:
        return version
    if not has_flags(program, version, host.name):
        taught = flagcache.of_release(program, version)
        why = (f"hosts printed different --help texts of {program} {version} "
               f"({'; '.join(e.describe() for e in taught)}), so {host.name}'s own is needed"
               if taught else f"{program} {version} is a release gpudeploy has not captured (it has the real "
               f"--help of {', '.join(known)})")
        problems.append(FlagsNotKnown(
            f"{why}; `invoke deploy` reads its --help from {host.name} once and checks "
            "the flags against it", file=host.where.file if host.where else None,
            line=host.where.line if host.where else None, host=host.name, role=role.name,
            key="engine_versions" if role.version is None else "version",
            program=program, version=version, python=role.python or host.python, own=bool(taught)))
        return None
    return version


MODULES = {"sglang": "sglang.launch_server", "sglang_router": "sglang_router.launch_router"}


@dataclass(frozen=True)
class FlagsNotKnown(Problem):
    """A release whose --help gpudeploy has not seen: deploy can learn it from the host."""

    program: str = ""
    version: str = ""
    python: str = ""
    own: bool = False  # hosts taught different texts of this release: learn this host's own

    @property
    def module(self) -> str:
        return MODULES[self.program]


def flag_for(program: str, version: str, name: str, host: str | None = None) -> str:
    """The option string for a release-neutral setting name (unchecked if none matches)."""
    try:
        flags = release_flags(program, version, host)
    except KeyError:
        flags = {}
    for spelling in SPELLINGS.get(name, ()):
        if spelling in flags:
            return spelling
    return "--" + name.replace("_", "-")


def settings_args(host: Host, role: Role, version: str, settings: dict[str, Any],
                  problems: list[Problem], *, planned: str | None = None,
                  notes: list[str] | None = None) -> list[str]:
    """Render ``settings`` as argv for ``role``'s engine, recording every invalid flag or value.

    ``planned`` is the release the host runs when ``version`` only stands in for it (an offline plan of
    a release gpudeploy has not captured): a flag or value that ``version`` lacks but another captured
    release has may well be in ``planned`` too, so it is rendered as that release spells it and said
    in ``notes``, not refused; deploy reads the host's own --help and checks the line again."""
    program = PROGRAM[role.engine]
    flags = release_flags(program, version, host.name)
    reserved = RESERVED.get(role.engine, {})
    args: list[str] = []
    for name, value in settings.items():
        said: list[str] = []

        def fail(message: str, name: str = name) -> None:
            problems.append(Problem(message, file=role.file,
                                    line=role.lines.get(f"settings.{name}", role.lines.get("settings")),
                                    host=host.name, role=role.name, key=f"settings.{name}"))

        if name in reserved:
            fail(f"{name} is set by gpudeploy; use {reserved[name]} instead")
            continue
        flag = flag_for(program, version, name, host.name)
        spec = flags.get(flag)
        rendered = None if spec is None else _render(spec, value, said.append)
        if rendered is None and planned:
            other = _in_another_release(program, version, name, value)
            if other is not None:
                release, rendered = other
                if notes is not None:
                    lacks = f"has no flag {flag}" if spec is None else f"does not take {value!r} for {flag}"
                    notes.append(f"settings.{name}: {program} {version}, whose flags stand in for {planned}, "
                                 f"{lacks}; {program} {release} takes it, so {planned} may too: rendered as "
                                 f"{release} spells it ({' '.join(rendered)}), and deploy checks it against "
                                 f"{planned}'s own --help before anything starts")
                args += rendered
                continue
        if spec is None:
            fail(_unknown(program, version, flag, flags))
            continue
        for message in said:
            fail(message)
        if rendered is not None:
            args += rendered
    return args


def _in_another_release(program: str, version: str, name: str, value: Any) -> tuple[str, list[str]] | None:
    """The nearest other captured release (newer first) whose flags take ``name: value``, and its rendering."""
    key = release_tuple(version)
    captured = [r for r in captured_versions(program) if r != version]
    newer = [r for r in captured if release_tuple(r) > key]
    older = [r for r in captured if release_tuple(r) <= key][::-1]
    for release in newer + older:
        flags = load_flags(program, release)
        flag = flag_for(program, release, name)
        spec = flags.get(flag)
        if spec is None:
            continue
        said: list[str] = []
        rendered = _render(spec, value, said.append)
        if rendered is not None and not said:
            return release, rendered
    return None


def check_args(host: Host, role: Role, version: str, argv: Sequence[str], key: str,
               problems: list[Problem], *, planned: str | None = None, notes: list[str] | None = None) -> None:
    """Check a raw argument list (``extra_args``) the way the engine's argparse would (``planned``,
    ``notes``: as for :func:`settings_args`, a flag only another captured release has is a note)."""
    program = PROGRAM[role.engine]
    flags = dict(release_flags(program, version, host.name))
    if planned:
        given = {token.partition("=")[0] for token in argv}
        for release in captured_versions(program):
            for option, other in load_flags(program, release).items():
                if option not in flags and option in given and notes is not None:
                    notes.append(f"{key}: {program} {version}, whose flags stand in for {planned}, has no flag "
                                 f"{option}; {program} {release} has it, so {planned} may too: deploy checks it "
                                 f"against {planned}'s own --help before anything starts")
                flags.setdefault(option, other)
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if not token.startswith("-"):
            problems.append(Problem(f"{token!r} is not a flag and follows no flag that takes a value",
                                    file=role.file, line=role.lines.get(key), host=host.name,
                                    role=role.name, key=key))
            continue
        name, eq, inline = token.partition("=")
        spec = flags.get(name)
        if spec is None:
            problems.append(Problem(_unknown(program, version, name, flags), file=role.file,
                                    line=role.lines.get(key), host=host.name, role=role.name, key=key))
            while i < len(argv) and not argv[i].startswith("-"):
                i += 1  # its values: one problem per unknown flag is enough
            continue
        values: list[str] = [inline] if eq else []
        if spec.takes_value and not eq:
            while i < len(argv) and not argv[i].startswith("--"):
                values.append(argv[i])
                i += 1
                if spec.nargs in (None, 1):
                    break
        for v in values:
            if spec.choices and v not in spec.choices:
                problems.append(Problem(f"{name} {v!r} is not one of {', '.join(spec.choices)}",
                                        file=role.file, line=role.lines.get(key), host=host.name,
                                        role=role.name, key=key))


def _render(spec: FlagSpec, value: Any, fail: Any) -> list[str] | None:
    if not spec.takes_value:
        if not isinstance(value, bool):
            fail(f"{spec.name} is a switch: use true or false, not {value!r}")
            return None
        return [spec.name] if value else []
    if isinstance(value, bool):
        fail(f"{spec.name} takes a value, not {str(value).lower()}")
        return None
    values = value if isinstance(value, list) else [value]
    if isinstance(value, list) and spec.nargs in (None, 0, 1):
        fail(f"{spec.name} takes one value, not a list")
        return None
    if isinstance(value, dict):
        fail(f"{spec.name} takes a value, not a mapping")
        return None
    out = [_scalar(v) for v in values]
    for v in out:
        if spec.choices and v not in spec.choices:
            fail(f"{spec.name} {v!r} is not one of {', '.join(spec.choices)}")
            return None
    return [spec.name, *out]


def _scalar(v: Any) -> str:
    if isinstance(v, float):
        return repr(v)
    return str(v)


def _unknown(program: str, version: str, flag: str, flags: dict[str, FlagSpec]) -> str:
    close = difflib.get_close_matches(flag, list(flags), n=2, cutoff=0.75)
    hint = f" (did you mean {' or '.join(close)}?)" if close else ""
    return f"{program} {version} has no flag {flag}{hint}"
