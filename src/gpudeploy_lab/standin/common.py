"""Pieces shared by the stand-in engine, its workers and the router: logging, env, GPUs, records.

Stdlib only (see the package docstring).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from gpudeploy import flagspec

GIB = 1 << 30
MIB = 1 << 20

DEFAULT_GPUS_JSON = "/etc/gpudeploy-lab/gpus.json"
DEFAULT_PROCS_DIR = "/run/gpudeploy-lab/gpu-procs"
# NVML "used" on an idle H200 (h200-nvml-probe.md); torch's "total capacity" is NVML total minus this.
NVML_BASELINE_BYTES = 644_939_776
# CUDA context + NCCL buffers a rank holds before loading weights.
CUDA_CONTEXT_BYTES = 512 * MIB


# ---------------------------------------------------------------------------------------------- env


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        return default


def speed() -> float:
    """Time scale: 1.0 = about 3 s from start to ready; 0 makes every phase instant."""
    return max(0.0, env_float("SGLANG_STANDIN_SPEED", 1.0))


def fault() -> str:
    return os.environ.get("SGLANG_STANDIN_FAULT", "").strip()


def procs_dir() -> Path:
    return Path(os.environ.get("SGLANG_STANDIN_GPU_PROCS_DIR") or DEFAULT_PROCS_DIR)


def gpus_json_path() -> Path:
    return Path(os.environ.get("GPUDEPLOY_LAB_GPUS") or DEFAULT_GPUS_JSON)


# ------------------------------------------------------------------------------------------ logging


def stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


def emit(text: str, tag: str | None = None) -> None:
    """Write one log record to stdout in a single write(2), so processes never interleave mid-line.

    ``tag`` is e.g. ``"TP0"``; the record is ``[YYYY-MM-DD HH:MM:SS TP0] text`` (or without a tag).
    Continuation lines of a multi-line ``text`` (tracebacks) are written unprefixed, like logging does.
    """
    prefix = f"[{stamp()} {tag}] " if tag else f"[{stamp()}] "
    raw(prefix + text)


def raw(text: str) -> None:
    data = (text if text.endswith("\n") else text + "\n").encode()
    with contextlib.suppress(OSError):
        while data:
            n = os.write(1, data)
            data = data[n:]


# --------------------------------------------------------------------------------------------- GPUs


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    uuid: str
    memory_total_bytes: int
    numa_node: int | None
    pci_bus_id: str


def load_gpus() -> tuple[str, list[GpuInfo]] | None:
    """(driver version, GPUs) from the lab's gpus.json, or None when there is none."""
    path = gpus_json_path()
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    gpus = []
    for g in data.get("gpus", []):
        numa = g.get("numa_node")
        gpus.append(GpuInfo(
            index=int(g["index"]),
            name=str(g.get("name", "NVIDIA H200")),
            uuid=str(g.get("uuid", f"GPU-00000000-0000-0000-0000-{int(g['index']):012d}")),
            memory_total_bytes=int(g["memory_total_bytes"]),
            numa_node=int(numa) if isinstance(numa, int) else None,
            pci_bus_id=str(g.get("pci_bus_id", "")),
        ))
    return str(data.get("driver_version", "")), gpus


def default_gpu_bytes() -> int:
    return int(env_float("SGLANG_STANDIN_GPU_GIB", 96.0) * GIB)


# ------------------------------------------------------------------------------ fake GPU records


def record_path(pid: int) -> Path:
    return procs_dir() / f"{pid}.json"


def write_record(pid: int, gpu: int, used_bytes: int) -> None:
    """Publish this process's fake GPU memory use for the fake NVML; errors are ignored."""
    path = record_path(pid)
    tmp = path.with_name(f".{pid}.json.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"pid": pid, "gpu": gpu, "used_bytes": int(used_bytes)}))
        os.replace(tmp, path)
    except OSError:
        pass


def remove_record(pid: int) -> None:
    with contextlib.suppress(OSError):
        record_path(pid).unlink()


def pid_alive(pid: int) -> bool:
    """True if /proc/<pid> exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[-1].split()[:1]
    return state != ["Z"] and state != ["X"]


def live_records(exclude: Iterable[int] = ()) -> list[dict[str, int]]:
    """Records of live processes, as {"pid", "gpu", "used_bytes"}; dead ones are skipped."""
    skip = set(exclude)
    out = []
    try:
        paths = sorted(procs_dir().glob("*.json"))
    except OSError:
        return []
    for p in paths:
        try:
            rec = json.loads(p.read_text())
            pid, gpu, used = int(rec["pid"]), int(rec["gpu"]), int(rec["used_bytes"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if pid not in skip and pid_alive(pid):
            out.append({"pid": pid, "gpu": gpu, "used_bytes": used})
    return out


# ------------------------------------------------------------------------------------- argparse


def _alias_groups(program: str, version: str) -> list[list[str]]:
    """Option strings that share one destination, read from the captured --help text."""
    _, help_path = flagspec._files(program, version)
    groups: list[list[str]] = []
    try:
        text = help_path.read_text()
    except OSError:
        return groups
    for line in text.splitlines():
        m = re.match(r"^  (--\S.*?)(?:  +|$)", line)
        if not m:
            continue
        names = [p.split(" ", 1)[0] for p in re.split(r", (?=-)", m.group(1))]
        names = [n for n in names if n.startswith("--")]
        if len(names) > 1:
            groups.append(names)
    return groups


FALLBACK_ALIASES = {"--model": "--model-path", "--tensor-parallel-size": "--tp-size"}


def build_parser(program: str, version: str, prog: str | None = None,
                 append: Iterable[str] = (), required: Iterable[str] = (),
                 types: Mapping[str, Callable[[str], Any]] | None = None) -> argparse.ArgumentParser:
    """An argparse parser accepting exactly the captured option strings of ``program`` ``version``.

    Values stay strings unless ``types`` gives a flag the real parser's type (then a value it refuses
    is refused with the same words). Flags listed in ``append`` may repeat and collect a list per
    occurrence; ``required`` ones are mandatory.
    """
    types = types or {}
    flags = flagspec.load_flags(program, version)
    groups = _alias_groups(program, version)
    # Without a help text we know no aliases but these; the destination is argparse's usual one
    # (from the first option string), so callers read both spellings (see ``opt``).
    primary: dict[str, str] = {} if groups else dict(FALLBACK_ALIASES)
    for group in groups:
        head = group[0]
        for other in group[1:]:
            if other == "--no-" + head[2:]:
                continue  # BooleanOptionalAction pair: handled as store_false below
            primary[other] = head
    grouped: dict[str, list[str]] = {}
    for name in flags:
        if not name.startswith("--") or name == "--help":
            continue
        head = primary.get(name, name)
        if head not in flags:
            head = name
        grouped.setdefault(head, [])
        if name != head:
            grouped[head].append(name)
    parser = argparse.ArgumentParser(prog=prog)
    append_set, required_set = set(append), set(required)
    for head, aliases in grouped.items():
        spec = flags[head]
        names = [head, *aliases]
        if not spec.takes_value:
            if head.startswith("--no-") and "--" + head[5:] in flags:
                parser.add_argument(*names, dest=head[5:].replace("-", "_"), action="store_false",
                                    default=None)
            else:
                parser.add_argument(*names, action="store_true", default=None)
            continue
        kwargs: dict[str, object] = {}
        if spec.nargs not in (None, 0, "0"):
            kwargs["nargs"] = spec.nargs
        if spec.choices:
            kwargs["choices"] = list(spec.choices)
        if head in append_set:
            kwargs["action"] = "append"
        if head in required_set:
            kwargs["required"] = True
        if head in types:
            kwargs["type"] = types[head]
        parser.add_argument(*names, **kwargs)  # type: ignore[arg-type]
    return parser


def print_captured_help(program: str, version: str, argv: list[str]) -> bool:
    """For ``-h``/``--help``: print the real release's captured --help verbatim; False if none."""
    if not any(a in ("-h", "--help") for a in argv if a != "--"):
        return False
    try:
        text = flagspec._files(program, version)[1].read_text()
    except OSError:
        return False
    raw(text.rstrip("\n"))
    return True


def human_readable_int(value: str) -> int:
    """SGLang 0.5.23's type for token counts (srt/utils/common.py human_readable_int): "4096", "4k",
    "25.6k", "1Ki"; its own words for anything else."""
    value = value.strip()
    si = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    iec = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if m:
        number, suffix = m.groups()
        if suffix in iec:
            if "." in number:
                raise argparse.ArgumentTypeError(
                    f"Decimals are not allowed with IEC suffixes like '{suffix}'. Use an integer IEC value such as "
                    f"'{int(Decimal(number))}{suffix}', or an SI value such as '{number}{suffix[0]}'.")
            return int(number) * iec[suffix]
        return int(Decimal(number) * si[suffix])
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"Invalid integer value: '{value}'. Use a plain integer, SI suffixes (1k, 1M), or IEC suffixes "
            "(1Ki, 1Mi). Suffixes are case-sensitive.") from None


def host_available_bytes() -> int:
    """What psutil calls available (MemAvailable): 0.5.23's "avail mem" with --device cpu."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 16 * GIB


def at_least(version: str, release: tuple[int, ...]) -> bool:
    """Whether ``version`` ("0.5.23", "0.5.10.post1", "0.5.99") is ``release`` or later; an unreadable
    one counts as the newest."""
    parts = []
    for piece in version.split(".")[:len(release)]:
        digits = re.match(r"\d+", piece)
        if digits is None:
            return True
        parts.append(int(digits.group()))
    return tuple(parts) >= release


def opt(ns: argparse.Namespace, *dests: str) -> Any:
    """The first non-None of several destinations: releases differ in which alias comes first
    (0.5.10 ``--tensor-parallel-size, --tp-size``; 0.5.23 ``--tp-size, --tensor-parallel-size``)."""
    for d in dests:
        v = getattr(ns, d, None)
        if v is not None:
            return v
    return None


def as_int(value: object, default: int) -> int:
    if value is None:
        return default
    try:
        return int(str(value))
    except ValueError:
        return default


def as_float(value: object, default: float) -> float:
    if value is None:
        return default
    try:
        return float(str(value))
    except ValueError:
        return default
