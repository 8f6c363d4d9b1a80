"""One lab host's life cycle on the main machine: network, overlay root, files, nspawn, teardown.

    prepare()  netns + veth on the bridge, overlay root, per-host files (hostname, keys, gpus.json)
    start()    systemd-nspawn --boot (or --as-pid2 with sshd: no systemd) in the host's own cgroup,
               detached, console to a log file
    stop()     SIGTERM to nspawn (clean poweroff); cgroup.kill if that does not end everything
    release()  unmount, delete netns/veth/cgroups/dirs: also sweeps what a crashed run left

    connect_private()  a veth pair between two hosts' netns only (a bastion and the host behind it);
                       it goes away with either netns, so release() removes it too
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from gpudeploy_lab import config, engine
from gpudeploy_lab.config import Host, Machine, PrivateLink, host_named
from gpudeploy_lab.system import (
    LabError,
    cgroup_kill,
    cgroup_populated,
    is_mount_point,
    link_exists,
    pid_in_cgroup,
    remove_cgroup_tree,
    run,
    unmount_all_under,
    wait_until,
    write_file,
)

# The host cgroup must hold nothing but nspawn and the container; see test-lab.md step 4.
_ENTER_CGROUPS_AND_EXEC = 'while [ "$1" != -- ]; do echo $$ > "$1"; shift; done; shift; exec "$@"'

_PCI_BUSES = ("1A", "3C", "4D", "5D", "9A", "BA", "CA", "DA")

# Popen handles of the nspawn processes this Python process started, so stop() can reap them.
_children: dict[str, subprocess.Popen[bytes]] = {}


# --- network --------------------------------------------------------------------------------------

def ensure_bridge(name: str = config.BRIDGE, address: str = config.BRIDGE_ADDRESS) -> None:
    if not link_exists(name):
        run(["ip", "link", "add", name, "type", "bridge"])
        run(["ip", "addr", "add", f"{address}/{config.PREFIX_LEN}", "dev", name])
    run(["ip", "link", "set", name, "up"])


def remove_bridge(name: str = config.BRIDGE) -> None:
    if link_exists(name):
        run(["ip", "link", "del", name])


def _setup_network(host: Machine) -> None:
    """A netns whose only link (eth0) is a veth to the bridge; no default route: nothing leaves."""
    run(["ip", "netns", "add", host.netns])
    run(["ip", "link", "add", host.veth, "type", "veth",
         "peer", "name", "eth0", "address", host.mac, "netns", host.netns])
    run(["ip", "link", "set", host.veth, "master", host.bridge, "up"])
    ns = ["ip", "-n", host.netns]
    run([*ns, "addr", "add", f"{host.address}/{config.PREFIX_LEN}", "dev", "eth0"])
    run([*ns, "link", "set", "lo", "up"])
    run([*ns, "link", "set", "eth0", "up"])


# --- private links (bastion topology) ------------------------------------------------------------

def _netns_links(netns: str) -> list[tuple[str, str]]:
    """(name, flags) of every link in a named netns; [] when the netns does not exist."""
    res = run(["ip", "-n", netns, "-o", "link", "show"], check=False)
    if res.returncode != 0:
        return []
    out = []
    for line in res.stdout.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            out.append((parts[1].strip().split("@", 1)[0], parts[2].split(">", 1)[0]))
    return out


def _link_up_with(netns: str, ifname: str, address: str) -> bool:
    flags = dict(_netns_links(netns)).get(ifname)
    if flags is None or "LOWER_UP" not in flags or ",UP" not in flags + ",":
        return False
    res = run(["ip", "-n", netns, "-o", "-4", "addr", "show", "dev", ifname], check=False)
    return res.returncode == 0 and f" {address}/24 " in res.stdout


def private_link_ok(link: PrivateLink) -> bool:
    """Both ends exist, are up and carry their addresses."""
    return (_link_up_with(link.bastion.netns, link.bastion_ifname, link.bastion_address)
            and _link_up_with(link.private.netns, link.private_ifname, link.private_address))


def connect_private(link: PrivateLink) -> bool:
    """Make ``link`` (idempotent: an intact link is kept, a partial one is rebuilt); True if built now.

    Created inside the bastion's netns with its peer moved straight into the private host's netns,
    so nothing of it ever exists in the main machine's namespace. Neither netns forwards (the
    kernel's default ip_forward=0 in a new netns): the bastion relays only what its sshd relays.
    """
    if private_link_ok(link):
        return False
    disconnect_private(link)
    a, b = link.bastion.netns, link.private.netns
    run(["ip", "-n", a, "link", "add", link.bastion_ifname, "type", "veth",
         "peer", "name", link.private_ifname, "netns", b])
    run(["ip", "-n", a, "addr", "add", f"{link.bastion_address}/24", "dev", link.bastion_ifname])
    run(["ip", "-n", b, "addr", "add", f"{link.private_address}/24", "dev", link.private_ifname])
    run(["ip", "-n", a, "link", "set", link.bastion_ifname, "up"])
    run(["ip", "-n", b, "link", "set", link.private_ifname, "up"])
    if not wait_until(lambda: private_link_ok(link), 5, interval=0.02):
        raise LabError(f"private link {link.bastion.name} -> {link.private.name} did not come up")
    return True


def disconnect_private(link: PrivateLink) -> None:
    """Delete both ends by their exact names, if present (deleting one end deletes the pair)."""
    for netns, ifname in ((link.bastion.netns, link.bastion_ifname), (link.private.netns, link.private_ifname)):
        if ifname in dict(_netns_links(netns)):
            run(["ip", "-n", netns, "link", "del", ifname], check=False)


def private_links(hosts: list[Host]) -> list[PrivateLink]:
    """The private links that exist now between ``hosts`` (read from the bastions' netns)."""
    wanted = set(hosts)
    links = []
    for h in hosts:
        for name, _flags in _netns_links(h.netns):
            other = host_named(name.removeprefix(config.PRIVATE_BASTION_PREFIX))
            if name.startswith(config.PRIVATE_BASTION_PREFIX) and other in wanted and other is not None:
                links.append(PrivateLink(h, other))
    return sorted(links, key=lambda lk: (lk.private.index, lk.bastion.index))


def private_route_present() -> bool:
    res = run(["ip", "-o", "route", "show", "exact", config.PRIVATE_ROUTE, "type", "unreachable"], check=False)
    return res.returncode == 0 and bool(res.stdout.strip())


def ensure_private_route() -> None:
    """On the main machine: 10.232.0.0/16 is unreachable (an immediate error, not the default route)."""
    run(["ip", "route", "replace", "unreachable", config.PRIVATE_ROUTE])


def remove_private_route() -> None:
    if private_route_present():
        run(["ip", "route", "del", "unreachable", config.PRIVATE_ROUTE], check=False)


# --- files ----------------------------------------------------------------------------------------

def gpus_json(host: Machine) -> str:
    gpus = [{
        "index": i,
        "name": config.GPU_NAME,
        "uuid": f"GPU-{host.name}-0000-0000-0000-{i:012d}",
        "memory_total_bytes": config.GPU_MEMORY_BYTES,
        "numa_node": 0 if i < config.GPU_COUNT // 2 else 1,
        "pci_bus_id": f"00000000:{_PCI_BUSES[i % len(_PCI_BUSES)]}:00.0",
    } for i in range(config.GPU_COUNT)]
    return json.dumps({"driver_version": config.DRIVER_VERSION, "gpus": gpus}, indent=2) + "\n"


def etc_hosts(hosts: list[Host], links: Sequence[PrivateLink] = ()) -> str:
    """Every lab host by name at its bridge address, and each private address as ``labN-private``."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += [f"{h.address}\t{h.name}" for h in sorted(hosts, key=lambda h: h.index)]
    lines += [f"{lk.private_address}\t{lk.private_name}" for lk in links]
    return "\n".join(lines) + "\n"


def write_etc_hosts(host: Host, hosts: list[Host], links: Sequence[PrivateLink] = ()) -> None:
    """(Re)write /etc/hosts through the mounted root; a running host sees it at once."""
    write_file(host.root / "etc/hosts", etc_hosts(hosts, links))


def host_public_key(host: Machine) -> str:
    return (host.root / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()[:2][1]


def _write_host_files(host: Machine, authorized_key: str) -> None:
    root = host.root
    write_file(root / "etc/hostname", host.name + "\n")
    write_file(root / "root/.ssh/authorized_keys", authorized_key, mode=0o600)
    write_file(root / "etc/gpudeploy-lab/gpus.json", gpus_json(host))
    write_file(root / "etc/gpudeploy-lab/host.json",
               json.dumps({"name": host.name, "address": host.address}) + "\n")
    keyfile = root / "etc/ssh/ssh_host_ed25519_key"
    if not keyfile.exists():
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{host.name}", "-f", str(keyfile)])


# --- life cycle -----------------------------------------------------------------------------------

def prepare(host: Machine, base: Path, authorized_key: str) -> None:
    """Network and root filesystem for a host that is not running (call release() first)."""
    upper, work = host.state_dir / "upper", host.state_dir / "work"
    for d in (upper, work, host.root):
        d.mkdir(parents=True, exist_ok=True)
    for cgroup in host.cgroups:
        cgroup.mkdir(parents=True, exist_ok=True)
    _setup_network(host)
    run(["mount", "-t", "overlay", "overlay", "-o",
         f"lowerdir={base},upperdir={upper},workdir={work}", str(host.root)])
    _write_host_files(host, authorized_key)


# PID 2 of a host without systemd (nspawn's own stub init is PID 1 and reaps zombies): what systemd's
# units would have done (sshd's runtime dir, host key if missing, the stand-in's GPU-record dir that
# tmpfiles.d makes elsewhere), then sshd in the foreground, logging to the console (the host's log).
NO_SYSTEMD_INIT = (
    "mkdir -p /run/sshd /run/gpudeploy-lab/gpu-procs && chmod 0755 /run/sshd && "
    "{ [ -s /etc/ssh/ssh_host_ed25519_key ] || ssh-keygen -q -t ed25519 -N '' -f /etc/ssh/ssh_host_ed25519_key; } && "
    "exec /usr/sbin/sshd -D -e"
)


def nspawn_argv(host: Machine, repo: Path, systemd: bool = True, binds: Sequence[tuple[Path, str]] = ()) -> list[str]:
    """``systemd``: boot the image's systemd as PID 1 (``--boot``). Otherwise a host like a rented GPU
    container: ``--as-pid2`` runs :data:`NO_SYSTEMD_INIT` under nspawn's stub init, no systemd at all
    (no ``/run/systemd/system``); the same root, binds, network, key and address. ``binds``: more
    (source, target) folders, writable (the Slurm cluster's /shared)."""
    argv = ["systemd-nspawn", "--boot" if systemd else "--as-pid2", f"--directory={host.root}",
            f"--machine={host.name}",
            "--register=no", "--keep-unit",  # there is no system bus on the main machine
            f"--network-namespace-path=/run/netns/{host.netns}",
            "--resolv-conf=off", "--timezone=off", "--link-journal=no", "--console=read-only"]
    for source, target in ((repo / "src", config.GUEST_SRC), (repo / "lab" / "shims", config.GUEST_SHIMS)):
        if source.is_dir():
            argv.append(f"--bind-ro={source}:{target}")
        else:
            print(f"lab: warning: {host.name}: {source} does not exist; {target} stays empty",
                  file=sys.stderr, flush=True)
    engines, guest_engines = engine.bind_mount()  # vLLM venv + tiny model, also when built later
    argv.append(f"--bind-ro={engines}:{guest_engines}")
    argv += [f"--bind={source}:{target}" for source, target in binds]
    if not systemd:
        argv += ["--", "/bin/sh", "-c", NO_SYSTEMD_INIT]
    return argv


def start(host: Machine, repo: Path, systemd: bool = True, binds: Sequence[tuple[Path, str]] = ()) -> int:
    """Boot the prepared host (``systemd=False``: see :func:`nspawn_argv`); return nspawn's PID (also
    written to the host's pid file)."""
    host.log_file.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, SYSTEMD_NSPAWN_UNIFIED_HIERARCHY="1")  # pure cgroup v2 inside
    with host.log_file.open("wb") as log:
        proc = subprocess.Popen(
            ["sh", "-c", _ENTER_CGROUPS_AND_EXEC, "sh", *(str(cg / "cgroup.procs") for cg in host.cgroups),
             "--", *nspawn_argv(host, repo, systemd, binds)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
            start_new_session=True)
    _children[host.name] = proc
    write_file(host.pid_file, f"{proc.pid}\n")
    in_cgroup = wait_until(lambda: nspawn_pid(host) is not None or proc.poll() is not None, 5, interval=0.01)
    if not in_cgroup or proc.poll() is not None:
        raise LabError(f"{host.name}: systemd-nspawn did not start; see {host.log_file}")
    return proc.pid


def nspawn_pid(host: Machine) -> int | None:
    """PID of the host's running nspawn, checked against its cgroup (a reused PID does not count).

    nspawn starts in the host's cgroup and moves itself to ``supervisor/`` below it (``payload/``
    holds the container).
    """
    try:
        pid = int(host.pid_file.read_text())
    except (FileNotFoundError, ValueError):
        return None
    cgroup = host.cgroup_path
    return pid if pid_in_cgroup(pid, (cgroup, f"{cgroup}/supervisor")) else None


def boots_systemd(host: Machine) -> bool | None:
    """Whether the host's running nspawn booted systemd (``--boot``), read from its command line;
    None when it does not run."""
    pid = nspawn_pid(host)
    if pid is None:
        return None
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    # nspawn's own options come before the payload's "--"; a payload argument cannot fool this
    own = argv[:argv.index(b"--")] if b"--" in argv else argv
    return b"--boot" in own


def is_running(host: Machine) -> bool:
    """nspawn alive, root mounted and netns present: a host that ``up`` may keep."""
    return (nspawn_pid(host) is not None and is_mount_point(host.root)
            and Path("/run/netns", host.netns).exists())


def request_stop(host: Machine) -> bool:
    """Ask for a clean poweroff: nspawn forwards SIGTERM to the container's systemd.

    Returns False if there is no nspawn to ask (never started, or crashed: its container may live on).
    """
    pid = nspawn_pid(host)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
    return pid is not None


def finish_stop(host: Machine, timeout: float = 15) -> None:
    """Wait up to ``timeout`` for the host's cgroup to empty; then SIGKILL what is left in it."""
    v2 = host.cgroups[0]
    if not wait_until(lambda: not cgroup_populated(v2), timeout):
        cgroup_kill(v2)
        if not wait_until(lambda: not cgroup_populated(v2), 10):
            raise LabError(f"{host.name}: processes survive cgroup.kill in {v2}")
    child = _children.pop(host.name, None)
    if child is not None:
        child.wait(timeout=5)  # reap it


def release(host: Machine) -> None:
    """Remove everything the host owns on the main machine. Its processes must be gone."""
    unmount_all_under(host.run_dir)
    if Path("/run/netns", host.netns).exists():
        run(["ip", "netns", "del", host.netns])  # takes the veth pair with it
    if link_exists(host.veth):  # the kernel may still be removing it after the netns went away
        run(["ip", "link", "del", host.veth], check=False)
        if not wait_until(lambda: not link_exists(host.veth), 5):
            raise LabError(f"{host.name}: cannot delete link {host.veth}")
    for cgroup in host.cgroups:
        remove_cgroup_tree(cgroup)
    for d in (host.run_dir, host.state_dir):
        if d.exists():
            shutil.rmtree(d)
