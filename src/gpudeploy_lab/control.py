"""lab up / down / status / private links: the whole lab, composed from host.py's per-host steps."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from gpudeploy import flagspec
from gpudeploy_lab import config, gpu_faults, host, rootfs
from gpudeploy_lab.config import Host, Machine, PrivateLink, host_named, lab_hosts, repo_root
from gpudeploy_lab.sshclient import SSH_FAILED, ensure_key, ssh, write_known_hosts
from gpudeploy_lab.standin import release
from gpudeploy_lab.system import (
    LabError,
    cgroup_pids,
    link_exists,
    link_names,
    mounts_under,
    netns_names,
    pss_kib,
    raise_sysctl,
    remove_cgroup_tree,
    run,
    write_file,
)

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)  # a Host, or a SlurmHost (slurm.py boots its hosts with _each too)

# executable -> Debian package that provides it (the rootfs is cached as a directory: no zstd needed)
TOOLS = {"systemd-nspawn": "systemd-container", "mmdebstrap": "mmdebstrap", "ip": "iproute2",
         "ssh": "openssh-client", "ssh-keygen": "openssh-client"}


NO_SYSTEMD = "no systemd"  # HostStatus.systemd of a host booted without it (up(no_systemd=...))


@dataclass(frozen=True)
class HostStatus:
    host: Host
    up: bool  # nspawn running with its root mounted and its netns present
    ssh_ok: bool
    # `systemctl is-system-running`: running, degraded, starting, ...; NO_SYSTEMD on a host without
    # systemd (no /run/systemd/system there); "-" when unknown (down, or no ssh)
    systemd: str
    failed_units: tuple[str, ...] = ()
    pss_kib: int = 0  # proportional RAM of every process of the host (nspawn included)

    @property
    def has_systemd(self) -> bool:
        return self.systemd != NO_SYSTEMD

    def line(self) -> str:
        failed = f" failed: {', '.join(self.failed_units)}" if self.failed_units else ""
        # A host that is not up but still has processes lost its nspawn: up or down sweeps it.
        state = "up" if self.up else "crashed" if self.pss_kib else "down"
        init = f"systemd {self.systemd:<9}" if self.has_systemd else f"{NO_SYSTEMD:<17}"
        return (f"{self.host.name:<6} {state:<7} {self.host.address:<12} "
                f"ssh {'ok' if self.ssh_ok else 'no':<3} {init} "
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

def probe(h: Host, wait: bool = False, timeout: float = 30) -> HostStatus:
    """Look at one host: nspawn, ssh, systemd state (``wait``: until boot has finished).

    A booted host on a machine whose cores are busy (the test suite beside two busy loops) may take
    seconds for one ssh handshake: ssh gets 10 s to connect and is tried again within ``timeout``
    before the host counts as not answering."""
    if not host.is_running(h):
        return HostStatus(h, up=False, ssh_ok=False, systemd="-", pss_kib=_host_pss(h))
    is_running = "systemctl is-system-running" + (" --wait" if wait else "")
    # The host itself says whether systemd runs there (systemd's own test, sd_booted()): a host
    # without it is asked nothing of systemctl
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        result = ssh(h.address, f"if [ -d /run/systemd/system ]; then {is_running}; "
                     f"systemctl list-units --failed --plain --no-legend; else echo '{NO_SYSTEMD}'; fi",
                     timeout=max(1.0, left), connect_timeout=max(1.0, min(10.0, left)))
        if result.returncode != SSH_FAILED or deadline - time.monotonic() < 1 or not host.is_running(h):
            break
        time.sleep(0.5)  # the retry's pause; the deadline above bounds the whole
    if result.returncode == SSH_FAILED:
        return HostStatus(h, up=True, ssh_ok=False, systemd="-", pss_kib=_host_pss(h))
    state, *failed = result.stdout.splitlines() or ["?"]
    units = tuple(line.split()[0] for line in failed if line.strip())
    return HostStatus(h, up=True, ssh_ok=True, systemd=state.strip(), failed_units=units, pss_kib=_host_pss(h))


def _host_pss(h: Host) -> int:
    return pss_kib(cgroup_pids(h.cgroups[0]))


def status() -> list[HostStatus]:
    """Every lab host this machine knows of, up or leftover (probed in parallel)."""
    hosts = traced_hosts()
    found = _each(hosts, probe, workers=16)
    return [found[h] for h in hosts]


def running_hosts() -> list[Host]:
    return [h for h in traced_hosts() if host.is_running(h)]


# --- up -------------------------------------------------------------------------------------------

def _named(names: Sequence[str | Host], what: str) -> list[Host]:
    hosts = []
    for name in names:
        h = name if isinstance(name, Host) else host_named(name)
        if h is None:
            raise ValueError(f"{what}: not a lab host name: {name!r} (lab1..lab{config.MAX_HOSTS})")
        hosts.append(h)
    return hosts


def parse_names(text: str) -> list[str]:
    """``lab3,lab9`` -> ["lab3", "lab9"] (for --no-systemd and --extra)."""
    return [n.strip() for n in text.split(",") if n.strip()]


def up(count: int = 3, repo: Path | None = None, timeout: float = 120,
       private: Sequence[tuple[str, str]] = (), no_systemd: Sequence[str | Host] = (),
       extra: Sequence[str | Host] = ()) -> list[HostStatus]:
    """Make lab1..lab<count> (``count`` may be 0), the hosts in ``extra`` and those in ``no_systemd``
    run and be ready; other hosts already running stay as they are.

    ``no_systemd``: hosts booted like a rented GPU container, without systemd (see
    :func:`gpudeploy_lab.host.nspawn_argv`): ``--as-pid2`` under nspawn's stub init, sshd in the
    foreground, no ``/run/systemd/system``; ssh, key, known_hosts, address, fake NVML and stand-ins as
    on the others; their status says ``no systemd``. E.g. ``up(3, no_systemd=["lab3"])``, or
    ``up(0, no_systemd=["lab9"])`` for one such host beside whatever runs. A wanted host that is up
    in the other mode is rebooted in the wanted one (its deployments are gone).
    ``private``: (bastion, host) pairs to connect with :func:`add_private_link` once all are ready.
    """
    bare = set(_named(no_systemd, "no_systemd"))
    wanted = sorted(set(lab_hosts(count) if count else []) | set(_named(extra, "extra")) | bare,
                    key=lambda h: h.index)
    if not wanted:
        raise ValueError("no hosts wanted: give a count of at least 1, or extra / no_systemd hosts")
    links = [_private_link(a, b) for a, b in private]
    for lk in links:
        if lk.bastion not in wanted or lk.private not in wanted:
            raise ValueError(f"--private {lk.bastion.name}:{lk.private.name}: both must be among the hosts "
                             f"wanted ({', '.join(h.name for h in wanted)})")
    ensure_tools()
    with _locked():
        started = time.monotonic()
        base = rootfs.ensure_rootfs()
        authorized_key = ensure_key()
        running = [h for h in traced_hosts() if host.is_running(h)]
        # a wanted host up in the other mode boots again in the wanted one
        wrong = [h for h in running if h in wanted and host.boots_systemd(h) is (h in bare)]
        keep = [h for h in running if h not in wrong]
        for h in wrong:
            print(f"lab: {h.name} runs {'with' if h in bare else 'without'} systemd; booting it again "
                  f"{'without' if h in bare else 'with'}", flush=True)
        _sweep([h for h in traced_hosts() if h not in keep])
        new = [h for h in wanted if h not in keep]
        every = sorted(set(keep) | set(wanted), key=lambda h: h.index)
        _raise_kernel_limits(len(every))
        host.ensure_bridge()
        _each(new, lambda h: host.prepare(h, base, authorized_key), workers=PREPARE_WORKERS)
        _write_names(every)  # keeps the private links among kept hosts in /etc/hosts and known_hosts
        _say(f"lab: {len(new)} host(s) booting, {len(keep)} already up"
             + (f" ({', '.join(h.name for h in new if h in bare)} without systemd)" if bare & set(new) else "")
             + (f", at most {config.BOOT_WINDOW} at once" if len(new) > config.BOOT_WINDOW else ""))
        source = repo or repo_root()

        def boot(h: Host) -> HostStatus:
            host.start(h, source, systemd=h not in bare)
            return _wait_ready(h, time.monotonic() + timeout)  # each host's own boot has ``timeout``

        ready = _each(new, boot, workers=config.BOOT_WINDOW)
        ready.update(_each([h for h in every if h in keep], lambda h: _wait_ready(h, started + timeout),
                           workers=16))
        statuses = [ready[h] for h in every]
        _say(f"lab: {len(every)} host(s) ready in {time.monotonic() - started:.1f} s")
        for lk in links:
            _connect(lk, every, max(10.0, started + timeout - time.monotonic()))
        return statuses


PREPARE_WORKERS = 8  # hosts whose network, overlay and files are made at once (ip, mount, ssh-keygen)
_say_lock = threading.Lock()


def _say(line: str) -> None:
    """One whole line on stdout, also from the threads that boot hosts."""
    with _say_lock:
        print(line, flush=True)


def _each(hosts: Sequence[K], fn: Callable[[K], T], workers: int) -> dict[K, T]:
    """``fn(host)`` for every host, at most ``workers`` at once. The first error (in host order)
    is raised once every call that had begun has ended; calls not begun yet are not made."""
    if not hosts:
        return {}
    pool = ThreadPoolExecutor(max_workers=max(1, min(workers, len(hosts))), thread_name_prefix="lab")
    futures: dict[K, Future[T]] = {h: pool.submit(fn, h) for h in hosts}
    try:
        _done, pending = wait(futures.values(), return_when=FIRST_EXCEPTION)
        if pending:  # one failed: start no more, let those under way finish
            for f in pending:
                f.cancel()
    finally:
        pool.shutdown(wait=True)
    for f in futures.values():
        error = None if f.cancelled() else f.exception()
        if error is not None:
            raise error
    return {h: f.result() for h, f in futures.items()}


def _raise_kernel_limits(hosts: int) -> None:
    """inotify instances for ``hosts`` booting hosts (see config.INOTIFY_INSTANCES_PER_HOST)."""
    name = "fs.inotify.max_user_instances"
    want = 128 + config.INOTIFY_INSTANCES_PER_HOST * hosts
    was = raise_sysctl(name, want)
    if was is not None:
        _say(f"lab: raised {name} from {was} to {want} for {hosts} host(s)")


def _write_names(hosts: list[Host]) -> None:
    """/etc/hosts of every host and the lab's known_hosts, with the private links that exist now."""
    links = host.private_links(hosts)
    for h in hosts:
        host.write_etc_hosts(h, hosts, links)
    write_known_hosts(((h, host.host_public_key(h)) for h in hosts), links)


# --- what a running host pretends to have (files the stand-ins read) ------------------------------

GUEST_GPUS_JSON = "etc/gpudeploy-lab/gpus.json"  # the fake NVML's GPUs (pynvml shim)
GUEST_GPUS_HIDDEN = "etc/gpudeploy-lab/.gpus.json.removed"  # where remove_nvml keeps them
GUEST_SGLANG_JSON = release.DEFAULT_RELEASE_FILE.lstrip("/")  # the stand-in's release


def _running_host(name: str | Host) -> Host:
    h = name if isinstance(name, Host) else host_named(name)
    if h is None:
        raise ValueError(f"not a lab host name: {name!r}")
    if not host.is_running(h):
        raise LabError(f"{h.name} is not up")
    return h


def set_sglang_release(name: str | Host, version: str, flags_like: str | None = None) -> None:
    """Make the host's stand-in SGLang a release gpudeploy has not captured: ``import sglang`` reports
    ``version``; ``python3 -m sglang.launch_server`` takes the flags of the captured ``flags_like``
    (default: ``version`` itself) and prints its captured ``--help`` verbatim. E.g.
    ``set_sglang_release("lab2", "0.5.99", "0.5.10")`` (0.5.10 spells ``--cuda-graph-max-bs``, 0.5.23
    ``--cuda-graph-max-bs-decode``). Writes /etc/gpudeploy-lab/sglang.json, seen at once by new
    processes; ``SGLANG_STANDIN_VERSION`` in a process's environment still wins.
    """
    h = _running_host(name)
    like = flags_like or version
    if not flagspec._files("sglang", like)[1].is_file():
        captured = sorted(p.name.split("-")[1] for p in flagspec.DATA.glob("sglang-*-launch_server-help.txt"))
        raise ValueError(f"flags_like={like!r}: no captured --help of sglang {like}; captured: "
                         f"{', '.join(captured)}")
    write_file(h.root / GUEST_SGLANG_JSON, release.release_json(version, like))


def clear_sglang_release(name: str | Host) -> None:
    """Undo :func:`set_sglang_release`: the stand-in is 0.5.23 again (nothing happens if it was)."""
    (_running_host(name).root / GUEST_SGLANG_JSON).unlink(missing_ok=True)


def remove_nvml(name: str | Host, driver_not_loaded: bool = False) -> None:
    """Make the host look like one without an NVIDIA driver: its gpus.json goes aside, so ``import
    pynvml; pynvml.nvmlInit()`` raises ``NVMLError_LibraryNotFound`` ("NVML Shared Library Not Found",
    what nvidia-ml-py raises when libnvidia-ml.so.1 cannot be loaded). ``driver_not_loaded``: the
    library is there but the kernel driver is not: ``NVMLError_DriverNotLoaded`` ("Driver Not Loaded").
    Idempotent; :func:`restore_nvml` brings the GPUs back."""
    h = _running_host(name)
    gpus, hidden = h.root / GUEST_GPUS_JSON, h.root / GUEST_GPUS_HIDDEN
    if gpus.is_file() and not hidden.exists():
        gpus.replace(hidden)
    if driver_not_loaded:
        write_file(gpus, json.dumps({"init_error": "DRIVER_NOT_LOADED"}) + "\n")
    else:
        gpus.unlink(missing_ok=True)


def restore_nvml(name: str | Host) -> None:
    """Undo :func:`remove_nvml`: the gpus.json it put aside (else the lab's 8 stand-in GPUs) is back."""
    h = _running_host(name)
    gpus, hidden = h.root / GUEST_GPUS_JSON, h.root / GUEST_GPUS_HIDDEN
    if hidden.is_file():
        hidden.replace(gpus)
    else:
        write_file(gpus, host.gpus_json(h))


def set_gpu_health(name: str | Host, gpu: int, **fields: object) -> dict[str, object]:
    """What the host's stand-in NVML says of GPU ``gpu``'s health from now on (gpu_faults.set_health:
    lost, reset_required, remapped_rows, ecc_uncorrected_volatile, clocks_event_reasons, pcie, ...)."""
    return gpu_faults.set_health(_running_host(name).root, gpu, **fields)


def inject_xid(name: str | Host, gpu: int, xid: int, text: str | None = None, pid: int | None = None) -> str:
    """The driver's Xid ``xid`` for GPU ``gpu`` on the host: the NVML state that goes with it, then the line
    in the file that stands for its kernel log (gpu_faults.py says why a file); returns the line."""
    h = _running_host(name)
    return gpu_faults.inject_xid(h.root, h.name, gpu, xid, text, pid)


def restore_gpu_health(name: str | Host) -> None:
    """Every GPU of the host healthy again and its kernel log empty (as after a reboot)."""
    gpu_faults.healthy_again(_running_host(name).root)


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
    """Poll until ``ssh root@IP true`` works, then wait for systemd to finish booting. While sshd
    does not answer yet, a TCP connect polls (an ssh process per poll of 64 booting hosts would
    take the CPUs they boot on)."""
    while True:
        if host.nspawn_pid(h) is None:
            raise LabError(f"{h.name}: systemd-nspawn exited during boot; see {h.log_file}:\n{_tail(h.log_file)}")
        if _sshd_answers(h.address) and ssh(h.address, "true", timeout=5).returncode == 0:
            break
        if time.monotonic() > deadline:
            raise LabError(f"{h.name}: no ssh at {h.address} before the deadline; see {h.log_file}")
        time.sleep(0.1)
    st = probe(h, wait=True, timeout=max(1.0, deadline - time.monotonic()))
    with_systemd = host.boots_systemd(h) is not False
    if with_systemd and st.systemd not in ("running", "degraded"):
        raise LabError(f"{h.name}: systemd state {st.systemd!r} after boot; see {h.log_file}")
    if not with_systemd and st.systemd != NO_SYSTEMD:
        raise LabError(f"{h.name}: booted without systemd, but the host says {st.systemd!r}; see {h.log_file}")
    _say(st.line())
    return st


def _sshd_answers(address: str) -> bool:
    """sshd accepts a connection and sends its banner."""
    try:
        with socket.create_connection((address, 22), timeout=1) as conn:
            conn.settimeout(2)
            return conn.recv(4) == b"SSH-"
    except OSError:
        return False


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


# --- down -----------------------------------------------------------------------------------------

def down(hosts: Sequence[str | Host] = ()) -> None:
    """Stop every lab host and remove everything the lab (or a crashed earlier run) left behind.

    ``hosts``: only these (e.g. ``down(["lab9"])`` after ``up(0, no_systemd=["lab9"])``), whatever state
    they are in; the others keep running, with /etc/hosts and known_hosts rewritten without them. When
    none is left, the rest goes too, as with a plain ``down()``.
    """
    if os.geteuid() != 0:
        raise LabError(precondition_problem() or "the lab needs root")
    chosen = set(_named(hosts, "down"))
    with _locked():
        started = time.monotonic()
        gone: list[Host] = []
        if chosen:
            gone = [h for h in traced_hosts() if h in chosen]
            _sweep(gone)
            others = traced_hosts()
            if others:
                _write_names([h for h in others if host.is_running(h)])
                print(f"lab: {len(gone)} host(s) down in {time.monotonic() - started:.1f} s, "
                      f"{len(others)} left", flush=True)
                return
        hosts = gone + traced_hosts()
        _sweep(hosts[len(gone):])
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


def _sweep(hosts: Sequence[Machine]) -> None:
    """Stop (all at once, then wait) and release the given hosts, whatever state they are in."""
    asked = {h: host.request_stop(h) for h in hosts}
    for h in hosts:
        host.finish_stop(h, timeout=15 if asked[h] else 0)
        host.release(h)
