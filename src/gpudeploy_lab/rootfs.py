"""The lab hosts' shared, read-only base: a Debian bookworm minbase tree built once by mmdebstrap.

The tree lives in ``/var/cache/gpudeploy-lab/rootfs-<key>/``; ``<key>`` hashes the package list, the
files this module writes into the tree and ``RECIPE_REVISION`` (bump it when the build code changes),
so a changed recipe builds a new tree instead of reusing a stale one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from gpudeploy_lab import aptsources
from gpudeploy_lab.config import CACHE_DIR, GUEST_SHIMS, GUEST_SRC
from gpudeploy_lab.system import LabError, remove_other_keys, run, write_file

RECIPE_REVISION = 1
SUITE = "bookworm"
# A mirror URL to use instead of this machine's own apt sources (see aptsources.py).
MIRROR_OVERRIDE = os.environ.get("GPUDEPLOY_LAB_MIRROR")
PACKAGES = ("systemd", "systemd-sysv", "dbus", "libpam-systemd", "openssh-server", "python3",
            "iproute2", "procps", "netbase", "sudo",
            "libnuma1",  # vLLM's CPU build (engine.py, mounted at /opt/gpudeploy/engines) links libnuma
            # mooncake's transfer engine (the SGLang recipe's PD transfer) links libibverbs (loaded even for
            # TCP) and libcurl
            "libibverbs1", "libnl-3-200", "libnl-route-3-200", "libcurl4")

# Units that only cost time or fail in a container with no network and no console.
MASKED_UNITS = ("apt-daily.timer", "apt-daily-upgrade.timer", "e2scrub_all.timer", "e2scrub_reap.service",
                "console-getty.service", "systemd-networkd-wait-online.service")

# Files identical on every host. Per-host files (hostname, keys, gpus.json) are written by host.py.
FILES: dict[str, str] = {
    "etc/ssh/sshd_config.d/gpudeploy-lab.conf": (
        "# gpudeploy lab: root with the lab key only, no DNS, many parallel sessions\n"
        "HostKey /etc/ssh/ssh_host_ed25519_key\n"
        "PermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "UseDNS no\n"
        "MaxStartups 100:30:200\n"
        "MaxSessions 100\n"
    ),
    # Python finds the stand-in engine (`python3 -m sglang.launch_server`) in the bind mounts.
    "usr/lib/python3/dist-packages/gpudeploy-lab.pth": f"{GUEST_SHIMS}\n{GUEST_SRC}\n",
    # The stand-in writes per-process "GPU usage" records here.
    "etc/tmpfiles.d/gpudeploy-lab.conf": "d /run/gpudeploy-lab/gpu-procs 0755 root root -\n",
    "etc/resolv.conf": "",  # no DNS: an unreachable nameserver makes getfqdn() hang for seconds
}
DIRECTORIES = (GUEST_SRC, GUEST_SHIMS, "/etc/gpudeploy-lab", "/root/.ssh")


def cache_key(packages: tuple[str, ...] = PACKAGES, extra: object = None) -> str:
    """The image's key: the package list, what :func:`customize` writes and ``extra`` (a second image's
    own recipe, e.g. slurmfiles.IMAGE_RECIPE)."""
    recipe = {"revision": RECIPE_REVISION, "suite": SUITE, "packages": packages,
              "masked": MASKED_UNITS, "files": FILES, "dirs": DIRECTORIES}
    if extra is not None:
        recipe["extra"] = extra
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def base_dir() -> Path:
    return CACHE_DIR / f"rootfs-{cache_key()}"


def ensure_rootfs(log: bool = True) -> Path:
    """Return the cached base tree, building it first if it is missing (~30 s, needs the mirror)."""
    return ensure_image(base_dir(), PACKAGES, log=log)


def ensure_image(final: Path, packages: tuple[str, ...], then: Callable[[Path], None] | None = None,
                 log: bool = True) -> Path:
    """Return ``final``, building it first if it is missing: mmdebstrap with ``packages``, then
    :func:`customize`, then ``then(tree)`` (a second image's own steps)."""
    if final.is_dir():
        return final
    partial = final.with_name(final.name + ".partial")
    if partial.exists():  # an interrupted earlier build
        shutil.rmtree(partial)
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    if log:
        print(f"lab: building rootfs {final.name} with mmdebstrap ({SUITE}, {len(packages)} packages)",
              flush=True)
    mirror = MIRROR_OVERRIDE
    if mirror is None:
        sources = aptsources.machine_sources(SUITE)
        if not sources:
            raise LabError(f"this machine's apt sources ({', '.join(aptsources.SOURCE_FILES)}) have no entry for "
                           f"{SUITE}; set GPUDEPLOY_LAB_MIRROR to a Debian mirror URL")
        sources_file = CACHE_DIR / "lab.sources"
        write_file(sources_file, sources)  # atomic: the main lab and the Slurm cluster may build at once
        mirror = str(sources_file)
    run(["mmdebstrap", "--variant=minbase", "--include=" + ",".join(packages), "--quiet",
         *aptsources.machine_proxy_options(), SUITE, str(partial), mirror], timeout=900)
    customize(partial)
    if then is not None:
        then(partial)
    partial.rename(final)
    if log:
        print(f"lab: rootfs built in {time.monotonic() - started:.1f} s", flush=True)
    return final


def customize(root: Path) -> None:
    """Turn a fresh minbase tree into a lab host image (the same for every host)."""
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()  # every host gets fresh keys at its first boot, known_hosts gets them
    (root / "etc/hostname").unlink(missing_ok=True)
    for rel, text in FILES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)  # resolv.conf may be a symlink
        path.write_text(text)
    for unit in MASKED_UNITS:
        link = root / "etc/systemd/system" / unit
        link.unlink(missing_ok=True)
        link.symlink_to("/dev/null")
    for directory in DIRECTORIES:
        (root / directory.lstrip("/")).mkdir(parents=True, exist_ok=True)
    (root / "root/.ssh").chmod(0o700)


def remove_stale() -> list[Path]:
    """Delete cached trees of other recipe keys; return what was removed."""
    return remove_other_keys(CACHE_DIR, "rootfs-*", base_dir())
