"""Thin wrappers over the main machine's kernel interfaces: commands, cgroups, mounts, netns, links.

Nothing here knows about lab hosts; ``host.py`` composes these into a host's life cycle.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from gpudeploy.errors import GpudeployError


class LabError(GpudeployError):
    """The lab could not be brought up, inspected or torn down."""


def run(argv: Sequence[str], *, check: bool = True, input: str | None = None,
        timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` (no shell), capture text output; raise LabError with stderr on failure."""
    try:
        proc = subprocess.run(list(argv), input=input, capture_output=True, text=True,
                              timeout=timeout, env=env, check=False)
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"timed out after {timeout:.0f} s: {' '.join(argv)}") from exc
    except FileNotFoundError as exc:
        raise LabError(f"command not found: {argv[0]}") from exc
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip()
        raise LabError(f"{' '.join(argv)} exited {proc.returncode}: {detail}")
    return proc


def wait_until(condition: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    """Poll ``condition`` until it is true (-> True) or ``timeout`` seconds passed (-> False)."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def write_file(path: Path, text: str, mode: int = 0o644) -> None:
    """Write atomically (temp file + rename) so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.chmod(mode)
    tmp.replace(path)


def raise_sysctl(name: str, minimum: int, root: Path = Path("/proc/sys")) -> int | None:
    """Raise the kernel setting ``name`` (e.g. ``fs.inotify.max_user_instances``) to ``minimum`` if it
    is lower; never lower it. Returns the value it had when it was raised, else None."""
    path = root.joinpath(*name.split("."))
    try:
        value = int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError) as exc:
        raise LabError(f"cannot read {name} ({path}): {exc}") from exc
    if value >= minimum:
        return None
    try:
        path.write_text(f"{minimum}\n")
    except OSError as exc:
        raise LabError(f"cannot raise {name} from {value} to {minimum} ({path}): {exc}") from exc
    return value


# --- cgroups --------------------------------------------------------------------------------------

def cgroup_populated(cgroup: Path) -> bool:
    """True if a v2 cgroup (or any cgroup below it) still holds a process."""
    try:
        events = (cgroup / "cgroup.events").read_text()
    except OSError:
        # ENOENT or ENODEV: systemd inside the host removed the cgroup while we read it.
        return False
    return "populated 1" in events.split("\n")


def cgroup_pids(cgroup: Path) -> list[int]:
    """Every PID in ``cgroup`` and below it (v1 or v2)."""
    pids: list[int] = []
    if not cgroup.is_dir():
        return pids
    for dirpath, _dirs, _files in os.walk(cgroup):
        try:
            text = (Path(dirpath) / "cgroup.procs").read_text()
        except OSError:
            # The host's own systemd creates and removes cgroups all the time (a session scope
            # that just ended); reading a removed one gives ENOENT or ENODEV. It held no one.
            continue
        pids.extend(int(line) for line in text.split())
    return pids


def cgroup_kill(cgroup: Path) -> None:
    """SIGKILL every process in a v2 cgroup and below, atomically (kernel >= 5.14)."""
    if cgroup_populated(cgroup):
        (cgroup / "cgroup.kill").write_text("1")


def remove_cgroup_tree(cgroup: Path) -> None:
    """rmdir a cgroup and all cgroups below it, deepest first (they must be empty)."""
    if not cgroup.is_dir():
        return
    for dirpath, _dirs, _files in os.walk(cgroup, topdown=False):
        os.rmdir(dirpath)


# --- processes ------------------------------------------------------------------------------------

def pid_in_cgroup(pid: int, cgroups: Sequence[str]) -> bool:
    """True if process ``pid`` is alive and sits in one of the v2 ``cgroups`` (e.g. /lab/lab1).

    This ties a PID read from a pid file to the process we started, even if the PID was reused.
    """
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat.rsplit(")", 1)[1].split()[0] == "Z":
        return False
    paths = [line.split(":", 2)[2] for line in lines if line.startswith("0::")]
    return any(p in cgroups for p in paths)


def pss_kib(pids: Sequence[int]) -> int:
    """Sum of the proportional set size of ``pids`` in KiB (processes that vanished count 0)."""
    total = 0
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:  # the process ended while we read it
            continue
        for line in text.splitlines():
            if line.startswith("Pss:"):
                total += int(line.split()[1])
    return total


# --- mounts ---------------------------------------------------------------------------------------

def _unescape_mount_path(field: str) -> str:
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def mounts_under(path: Path) -> list[Path]:
    """Mount points at or below ``path`` in this mount namespace, deepest first."""
    prefix = str(path).rstrip("/")
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = _unescape_mount_path(line.split()[4])
        if point == prefix or point.startswith(prefix + "/"):
            found.append(Path(point))
    return sorted(set(found), key=lambda p: len(p.parts), reverse=True)


def is_mount_point(path: Path) -> bool:
    return path in mounts_under(path)


def unmount_all_under(path: Path) -> None:
    for point in mounts_under(path):
        run(["umount", str(point)])


# --- network --------------------------------------------------------------------------------------

NETNS_DIR = Path("/run/netns")


def netns_names(prefix: str) -> list[str]:
    if not NETNS_DIR.is_dir():
        return []
    return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(prefix))


def link_names(prefix: str, kind: str | None = None) -> list[str]:
    """Names of network links on the main machine starting with ``prefix`` (optionally of one kind)."""
    argv = ["ip", "-o", "link", "show"] + (["type", kind] if kind else [])
    names = []
    for line in run(argv).stdout.splitlines():
        name = line.split(":", 2)[1].strip().split("@", 1)[0]
        if name.startswith(prefix):
            names.append(name)
    return names


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def remove_other_keys(folder: Path, pattern: str, keep: Path) -> list[Path]:
    """Delete the cached builds in ``folder`` matching ``pattern`` except ``keep`` (other recipe keys)."""
    removed = []
    if folder.is_dir():
        for path in folder.glob(pattern):
            if path.name != keep.name and path.is_dir():
                shutil.rmtree(path)
                removed.append(path)
    return removed
