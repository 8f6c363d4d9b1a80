"""lab up / down / status / private links: the whole lab, composed from host.py's per-host steps."""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import socket
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gpudeploy_lab import config, host, rootfs
from gpudeploy_lab.config import Host, PrivateLink, host_named, lab_hosts, repo_root
from gpudeploy_lab.sshclient import SSH_FAILED, ensure_key, ssh, write_known_hosts
from gpudeploy_lab.system import (
    LabError,
    cgroup_pids,
    link_exists,
    link_names,
    mounts_under,
    netns_names,
    pss_kib,
    remove_cgroup_tree,
    run,
)

# executable -> Debian package that provides it (the rootfs is cached as a directory: no zstd needed)
TOOLS = {"systemd-nspawn": "systemd-container", "mmdebstrap": "mmdebstrap", "ip": "iproute2",
         "ssh": "openssh-client", "ssh-keygen": "openssh-client"}


@dataclass(frozen=True)
class HostStatus:
    host: Host
    up: bool  # nspawn running with its root mounted and its netns present
    ssh_ok: bool
    systemd: str  # `systemctl is-system-running`: running, degraded, starting, ... or "-"
    failed_units: tuple[str, ...] = ()
    pss_kib: int = 0  # proportional RAM of every process of the host (nspawn included)

    def line(self) -> str:
        failed = f" failed: {', '.join(self.failed_units)}" if self.failed_units else ""
        # A host that is not up but still has processes lost its nspawn: up or down sweeps it.
        state = "up" if self.up else "crashed" if self.pss_kib else "down"
        return (f"{self.host.name:<6} {state:<7} {self.host.address:<12} "
                f"ssh {'ok' if self.ssh_ok else 'no':<3} systemd {self.systemd:<9} "
                f"ram {self.pss_kib / 1024:.0f} MiB{failed}")


# --- preconditions --------------------------------------------------------------------------------

def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def precondition_problem() -> str | None:
    """Why the lab cannot run on this machine, or None."""
    if os.geteuid() != 0:
        return "the lab needs root (network namespaces, mounts, cgroups, systemd-nspawn)"
    missing = missing_tools()
    if missing:
        return f"missing tools: {', '.join(missing)} (apt-get install {' '.join(sorted({TOOLS[t] for t in missing}))})"
    return None


def ensure_tools() -> None:
    """Install the Debian packages the lab needs, if any tool is missing (fresh machine)."""
    if os.geteuid() != 0:
        raise LabError(precondition_problem() or "the lab needs root")
    missing = missing_tools()
    if missing and shutil.which("apt-get"):
        packages = sorted({TOOLS[t] for t in missing})
        print(f"lab: installing {' '.join(packages)}", flush=True)
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        run(["apt-get", "update", "-q"], env=env, timeout=300)
        run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages], env=env, timeout=600)
    problem = precondition_problem()
    if problem:
        raise LabError(problem)


@contextmanager
def _locked() -> Iterator[None]:
    """One lab command at a time on this machine."""
    config.STATE_DIR.mkdir(parents=True, exist_ok=True)
    with (config.STATE_DIR / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


# --- discovery ------------------------------------------------------------------------------------

def traced_hosts() -> list[Host]:
    """Every lab host that left any trace on this machine: running, crashed or half torn down."""
    names: set[str] = set(netns_names(config.NET_PREFIX))
    names |= {n.removeprefix(config.NET_PREFIX) for n in names}
    names |= {n.removeprefix(config.NET_PREFIX) for n in link_names(config.NET_PREFIX, "veth")}
    for parent in (config.RUN_DIR, config.STATE_DIR / "hosts", *config.CGROUP_ROOTS):
        if parent.is_dir():
            names |= {p.name for p in parent.iterdir() if p.is_dir()}
    hosts = {h for h in map(host_named, names) if h is not None}
    return sorted(hosts, key=lambda h: h.index)


def leftovers() -> list[str]:
    """What a lab (or a crashed one) left on this machine; empty after a complete ``down``."""
    found = [f"network namespace {n}" for n in netns_names(config.NET_PREFIX)]
    found += [f"link {n}" for n in link_names(config.NET_PREFIX)]
    if link_exists(config.BRIDGE):
        found.append(f"bridge {config.BRIDGE}")
    for path in (config.RUN_DIR, config.STATE_DIR / "hosts"):
        found += [f"mount {m}" for m in mounts_under(path)]
    for cgroup in config.CGROUP_ROOTS:
        if cgroup.exists():
            found.append(f"cgroup {cgroup} (pids: {cgroup_pids(cgroup) or 'none'})")
    if config.RUN_DIR.exists():
        found.append(f"directory {config.RUN_DIR}")
    if host.private_route_present():
        found.append(f"route unreachable {config.PRIVATE_ROUTE}")
    return found


# --- status ---------------------------------------------------------------------------------------

def probe(h: Host, wait: bool = False, timeout: float = 10) -> HostStatus:
    """Look at one host: nspawn, ssh, systemd state (``wait``: until boot has finished)."""
    if not host.is_running(h):
        return HostStatus(h, up=False, ssh_ok=False, systemd="-", pss_kib=_host_pss(h))
    is_running = "systemctl is-system-running" + (" --wait" if wait else "")
    result = ssh(h.address, f"{is_running}; systemctl list-units --failed --plain --no-legend", timeout=timeout)
    if result.returncode == SSH_FAILED:
        return HostStatus(h, up=True, ssh_ok=False, systemd="-", pss_kib=_host_pss(h))
    state, *failed = result.stdout.splitlines() or ["?"]
    units = tuple(line.split()[0] for line in failed if line.strip())
    return HostStatus(h, up=True, ssh_ok=True, systemd=state.strip(), failed_units=units, pss_kib=_host_pss(h))


def _host_pss(h: Host) -> int:
    return pss_kib(cgroup_pids(h.cgroups[0]))


def status() -> list[HostStatus]:
    """Every lab host this machine knows of, up or leftover."""
    return [probe(h) for h in traced_hosts()]


def running_hosts() -> list[Host]:
    return [h for h in traced_hosts() if host.is_running(h)]


# --- up -------------------------------------------------------------------------------------------

def up(count: int = 3, repo: Path | None = None, timeout: float = 120,
       private: Sequence[tuple[str, str]] = ()) -> list[HostStatus]:
    """Make lab1..lab<count> run and be ready; hosts already running stay as they are.

    ``private``: (bastion, host) pairs to connect with :func:`add_private_link` once all are ready.
    """
    wanted = lab_hosts(count)
    links = [_private_link(a, b) for a, b in private]
    for lk in links:
        if lk.bastion not in wanted or lk.private not in wanted:
            raise ValueError(f"--private {lk.bastion.name}:{lk.private.name}: both must be among lab1..lab{count}")
    ensure_tools()
    with _locked():
        started = time.monotonic()
        base = rootfs.ensure_rootfs()
        authorized_key = ensure_key()
        keep = [h for h in traced_hosts() if host.is_running(h)]
        _sweep([h for h in traced_hosts() if h not in keep])
        new = [h for h in wanted if h not in keep]
        every = sorted(set(keep) | set(wanted), key=lambda h: h.index)
        host.ensure_bridge()
        for h in new:
            host.prepare(h, base, authorized_key)
        _write_names(every)  # keeps the private links among kept hosts in /etc/hosts and known_hosts
        for h in new:
            host.start(h, repo or repo_root())
        print(f"lab: {len(new)} host(s) booting, {len(keep)} already up", flush=True)
        statuses = [_wait_ready(h, started + timeout) for h in every]
        print(f"lab: {len(every)} host(s) ready in {time.monotonic() - started:.1f} s", flush=True)
        for lk in links:
            _connect(lk, every, max(10.0, started + timeout - time.monotonic()))
        return statuses


def _write_names(hosts: list[Host]) -> None:
    """/etc/hosts of every host and the lab's known_hosts, with the private links that exist now."""
    links = host.private_links(hosts)
    for h in hosts:
        host.write_etc_hosts(h, hosts, links)
    write_known_hosts(((h, host.host_public_key(h)) for h in hosts), links)


# --- private links (a bastion topology) -----------------------------------------------------------

def parse_pairs(text: str) -> list[tuple[str, str]]:
    """``lab2:lab3,lab2:lab4`` -> [("lab2", "lab3"), ("lab2", "lab4")]."""
    pairs = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        bastion, sep, private = item.partition(":")
        if not sep or not bastion or not private:
            raise ValueError(f"--private wants BASTION:HOST[,BASTION:HOST...], not {item!r}")
        pairs.append((bastion, private))
    return pairs


def _private_link(bastion: str | Host, private: str | Host) -> PrivateLink:
    a = bastion if isinstance(bastion, Host) else host_named(bastion)
    b = private if isinstance(private, Host) else host_named(private)
    if a is None or b is None:
        raise ValueError(f"not lab host names: {bastion!r}, {private!r}")
    if a == b:
        raise ValueError(f"a host cannot be its own bastion: {a.name}")
    return PrivateLink(a, b)


def add_private_link(bastion: str | Host, private: str | Host, timeout: float = 15) -> PrivateLink:
    """Put ``private`` behind ``bastion``: a veth pair between their network namespaces only, on
    10.232.<private's index>.0/24 (``bastion`` .1, ``private`` .2, e.g. lab2:lab3 -> 10.232.3.1 and
    10.232.3.2). The main machine routes 10.232.0.0/16 nowhere and no host forwards, so the private
    address answers only from the bastion: ``ssh -J``/ProxyJump through it, or a process on it. The
    bridge addresses stay as they are (``private`` keeps 10.231.0.1N too). Idempotent; ``lab down``
    (and the sweep after a crash) removes it with the hosts' namespaces, and the route.

    Every host's /etc/hosts gets ``10.232.3.2 lab3-private``; known_hosts lists the private address
    and name with ``private``'s host key (and the bastion's private address with the bastion's).
    Returns once ``ssh`` through the bastion to the private address works and a direct connection
    from the main machine is refused.
    """
    link = _private_link(bastion, private)
    with _locked():
        return _connect(link, running_hosts(), timeout)


def remove_private_link(bastion: str | Host, private: str | Host) -> None:
    """Undo :func:`add_private_link` (nothing happens if the link does not exist)."""
    link = _private_link(bastion, private)
    with _locked():
        host.disconnect_private(link)
        running = running_hosts()
        _write_names(running)
        if not host.private_links(running):
            host.remove_private_route()


def private_links() -> list[PrivateLink]:
    """The private links between running hosts."""
    return host.private_links(running_hosts())


def _direct_connect_error(address: str, port: int = 22) -> int:
    """errno of a TCP connect from the main machine (0: it connected)."""
    try:
        with socket.create_connection((address, port), timeout=2):
            return 0
    except OSError as exc:
        return exc.errno or errno.ETIMEDOUT


def _connect(link: PrivateLink, running: list[Host], timeout: float) -> PrivateLink:
    deadline = time.monotonic() + timeout
    for h in (link.bastion, link.private):
        if h not in running:
            raise LabError(f"private link {link.bastion.name}:{link.private.name}: {h.name} is not up")
    for other in host.private_links(running):
        if other.private == link.private and other != link:
            raise LabError(f"{link.private.name} is already behind {other.bastion.name}")
    host.ensure_private_route()
    built = host.connect_private(link)
    _write_names(running)
    direct = _direct_connect_error(link.private_address)
    if direct not in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        seen = os.strerror(direct) if direct else "connected"
        raise LabError(f"the main machine reaches {link.private_address} directly ({seen}): expected no route to host")
    while True:
        res = ssh(link.private_address, "true", timeout=5, jump=link.bastion.address)
        if res.returncode == 0:
            break
        if time.monotonic() > deadline:
            raise LabError(f"no ssh to {link.private_address} through {link.bastion.name}: {res.stderr.strip()}")
        time.sleep(0.2)
    print(f"lab: {link.private.name} at {link.private_address} ({link.private_name}) only through "
          f"{link.bastion.name} ({link.bastion_address}){'' if built else ', already there'}", flush=True)
    return link


def _wait_ready(h: Host, deadline: float) -> HostStatus:
    """Poll until ``ssh root@IP true`` works, then wait for systemd to finish booting."""
    while True:
        if host.nspawn_pid(h) is None:
            raise LabError(f"{h.name}: systemd-nspawn exited during boot; see {h.log_file}:\n{_tail(h.log_file)}")
        if ssh(h.address, "true", timeout=5).returncode == 0:
            break
        if time.monotonic() > deadline:
            raise LabError(f"{h.name}: no ssh at {h.address} before the deadline; see {h.log_file}")
        time.sleep(0.2)
    st = probe(h, wait=True, timeout=max(1.0, deadline - time.monotonic()))
    if st.systemd not in ("running", "degraded"):
        raise LabError(f"{h.name}: systemd state {st.systemd!r} after boot; see {h.log_file}")
    print(st.line(), flush=True)
    return st


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


# --- down -----------------------------------------------------------------------------------------

def down() -> None:
    """Stop every lab host and remove everything the lab (or a crashed earlier run) left behind."""
    if os.geteuid() != 0:
        raise LabError(precondition_problem() or "the lab needs root")
    with _locked():
        started = time.monotonic()
        hosts = traced_hosts()
        _sweep(hosts)
        host.remove_bridge()
        host.remove_private_route()  # the private links went with the hosts' network namespaces
        for cgroup in config.CGROUP_ROOTS:
            remove_cgroup_tree(cgroup)
        if config.RUN_DIR.exists():
            shutil.rmtree(config.RUN_DIR)
        rootfs.remove_stale()
        left = leftovers()
        if left:
            raise LabError("lab down left behind:\n  " + "\n  ".join(left))
        print(f"lab: {len(hosts)} host(s) down in {time.monotonic() - started:.1f} s", flush=True)


def _sweep(hosts: list[Host]) -> None:
    """Stop (all at once, then wait) and release the given hosts, whatever state they are in."""
    asked = {h: host.request_stop(h) for h in hosts}
    for h in hosts:
        host.finish_stop(h, timeout=15 if asked[h] else 0)
        host.release(h)
