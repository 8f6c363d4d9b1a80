"""Fake NVML for lab hosts: ``import pynvml`` behaves like nvidia-ml-py for what gpudeploy uses.

GPUs come from the JSON file in ``GPUDEPLOY_LAB_GPUS`` (default ``/etc/gpudeploy-lab/gpus.json``):
    {"driver_version": "580.159.04",
     "gpus": [{"index": 0, "name": "NVIDIA H200", "uuid": "GPU-...", "memory_total_bytes": N,
               "numa_node": 0, "pci_bus_id": "00000000:00:06.0"}]}
No file -> ``nvmlInit`` raises ``NVMLError_LibraryNotFound`` (a host without a driver);
``"init_error": "DRIVER_NOT_LOADED"`` -> ``NVMLError_DriverNotLoaded`` (library there, no kernel driver).

Memory use comes from the stand-in engine's per-process records in ``SGLANG_STANDIN_GPU_PROCS_DIR``
(default ``/run/gpudeploy-lab/gpu-procs``): ``<pid>.json`` = {"pid", "gpu", "used_bytes"}. Only records
whose process is alive (``/proc/<pid>`` exists, not a zombie) count, like the driver freeing the memory
of a dead process. ``used`` = 644939776 B (an idle H200's baseline) + the live records on that GPU.

``nvmlDeviceGetNumaNodeId``: returns the GPU's ``numa_node``; when that is null or negative it raises
``NVMLError_NotSupported``, as on the real H200 VM (so both paths can be exercised).

Power and utilisation are MODELLED, not measured, and ``STANDIN`` says so (gpudeploy shows it next to
every figure): a stand-in does its "GPU" work on the CPU, so a GPU's SM utilisation is the CPU share
its live processes and the engine that started them used since this process last asked (since they
started, the first time), x2, at most 100 %; memory-controller utilisation 0.6 of that. Power: the
board's idle draw, + 53 % of it while a process holds memory there (a CUDA context), + 98 % of the
rest of its limit times the utilisation. The H200's figures are measured (the experiment's own sampler
on a real H200, bench/results/h200-power-sampler-2026-12-01.txt: 77 W idle, 118 W holding memory,
686-697 W at 95-98 % SM in bf16 matmuls, limit 700 W). For the RTX PRO 6000 Blackwell Server Edition
the limit is its specified 600 W (the field's "~400 W of its 600 W"); its 35 W idle is an assumption.
``power_limit_w``/``idle_w`` in gpus.json win.

Health (issue 49), per GPU from its ``"health"`` in gpus.json, a healthy H100's answers where it has none
(shared/reference/h100-gpu-health-probe.md): ``nvmlDeviceGetRemappedRows`` (0, 0, 0, 0) (or
``"remapped_rows": [correctable, uncorrectable, pending, failed]``); page retirement NotSupported (row
remapping replaces it); ECC on, ``"ecc_uncorrected_volatile"``/``"_aggregate"``/``"ecc_corrected_volatile"``
(0); the clocks event reasons ``"clocks_event_reasons"`` (else 0x1, idle, with no process on the GPU, 0
with one); ``"temperature_c"`` (else 34 C idle, up to 74 C busy); PCIe ``"pcie": [gen, max gen, width, max
width]`` (5, 5, 16, 16); NVLink NotSupported unless ``"nvlink_links": N`` (``"nvlink_down": [link, ...]``).
``"lost": true``: the GPU fell off the bus, every call for it (its handle first, as NVML's docs list for
nvmlDeviceGetHandleByIndex) raises ``NVMLError_GpuIsLost``; ``"reset_required": true`` likewise
``NVMLError_ResetRequired`` once a handle is had. gpudeploy_lab.control's ``inject_xid`` writes these with
the Xid line.

``STANDIN_KERNEL_LOG``: the file that stands for this host's kernel log (``GPUDEPLOY_LAB_KERNEL_LOG``, else
/var/log/gpudeploy-lab/kernel.log), in ``journalctl -o short-unix`` form. A systemd-nspawn container has no
kernel log of its own: no /dev/kmsg, CAP_SYSLOG dropped (dmesg: "Operation not permitted"), so its journald
receives no kernel line, and ``logger`` writes syslog lines that ``journalctl -k`` never shows. gpudeploy's
probe reads this file instead where the NVML it imports names one.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from gpudeploy_lab.standin.common import gpus_json_path, live_records

STANDIN = ("the gpudeploy lab's stand-in NVML: GPUs from /etc/gpudeploy-lab/gpus.json, power and utilisation "
           "modelled from the CPU time of each GPU's processes, not measured")
STANDIN_KERNEL_LOG = os.environ.get("GPUDEPLOY_LAB_KERNEL_LOG") or "/var/log/gpudeploy-lab/kernel.log"
# (name contains, limit W, idle W): H200 measured (see the docstring); the RTX PRO 6000's idle assumed
BOARDS = (("RTX PRO 6000", 600.0, 35.0), ("H200", 700.0, 77.0))
DEFAULT_BOARD = (700.0, 77.0)
CONTEXT_SHARE = 0.53  # of the idle draw, more while a process holds memory: H200 77 -> 118 W, measured
BUSY_SHARE = 0.98  # of what is left of the limit at 100 % utilisation: H200 ~690 of 700 W at 97 %, measured

NVML_SUCCESS = 0
# Every code of nvidia-ml-py 13 (its values and names); each gets an NVMLError_<CapWords> subclass.
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_FREQ_NOT_SUPPORTED = 24
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_DEPRECATED = 26
NVML_ERROR_NOT_READY = 27
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_INVALID_STATE = 29
NVML_ERROR_RESET_TYPE_NOT_SUPPORTED = 30
NVML_ERROR_UNKNOWN = 999

BASELINE_USED = 644_939_776

# nvidia-ml-py's NVMLError._errcode_to_string, verbatim; other codes read "Unknown Error" here.
_STRINGS = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
    NVML_ERROR_INSUFFICIENT_POWER: "Insufficient External Power",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_IRQ_ISSUE: "Interrupt Request Issue",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_CORRUPTED_INFOROM: "Corrupted infoROM",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
    NVML_ERROR_OPERATING_SYSTEM: "The operating system has blocked the request.",
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
    NVML_ERROR_MEMORY: "Insufficient Memory",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}

# What the real library says when it cannot be loaded (ctypes' OSError, the context of the NVMLError).
LIBRARY_OSERROR = "libnvidia-ml.so.1: cannot open shared object file: No such file or directory"


class NVMLError(Exception):
    """Like pynvml's: ``NVMLError(code)`` builds the matching subclass; ``.value`` is the code;
    ``str()`` the library's text ("NVML Shared Library Not Found"), ``repr()`` e.g.
    ``NVMLError_LibraryNotFound(12)``."""

    _valClassMapping: dict[int, type[NVMLError]] = {}  # noqa: RUF012
    _errcode_to_string = _STRINGS

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _STRINGS.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NVMLError) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)


def _subclass(name: str, code: int) -> type[NVMLError]:
    def new(cls: type[NVMLError], value: int = code) -> NVMLError:
        return NVMLError.__new__(cls, code)

    def init(self: NVMLError, value: int = code) -> None:
        NVMLError.__init__(self, code)

    sub = type(name, (NVMLError,), {"__new__": new, "__init__": init})
    NVMLError._valClassMapping[code] = sub
    return sub


def _class_name(err_name: str) -> str:
    """NVML_ERROR_DRIVER_NOT_LOADED -> NVMLError_DriverNotLoaded (nvidia-ml-py's capwords rule)."""
    return "NVMLError_" + "".join(w.capitalize() for w in err_name.removeprefix("NVML_ERROR_").split("_"))


for _name, _code in [(k, v) for k, v in globals().items() if k.startswith("NVML_ERROR_")]:
    globals()[_class_name(_name)] = _subclass(_class_name(_name), _code)

# For mypy and readers: the ones gpudeploy and the lab name.
NVMLError_Uninitialized = NVMLError._valClassMapping[NVML_ERROR_UNINITIALIZED]
NVMLError_InvalidArgument = NVMLError._valClassMapping[NVML_ERROR_INVALID_ARGUMENT]
NVMLError_NotSupported = NVMLError._valClassMapping[NVML_ERROR_NOT_SUPPORTED]
NVMLError_NotFound = NVMLError._valClassMapping[NVML_ERROR_NOT_FOUND]
NVMLError_DriverNotLoaded = NVMLError._valClassMapping[NVML_ERROR_DRIVER_NOT_LOADED]
NVMLError_LibraryNotFound = NVMLError._valClassMapping[NVML_ERROR_LIBRARY_NOT_FOUND]
NVMLError_GpuIsLost = NVMLError._valClassMapping[NVML_ERROR_GPU_IS_LOST]
NVMLError_ResetRequired = NVMLError._valClassMapping[NVML_ERROR_RESET_REQUIRED]
NVMLError_Unknown = NVMLError._valClassMapping[NVML_ERROR_UNKNOWN]


def nvmlExceptionClass(nvmlErrorCode: int) -> type[NVMLError]:
    if nvmlErrorCode not in NVMLError._valClassMapping:
        raise ValueError(f"nvmlErrorCode {nvmlErrorCode} is not valid")
    return NVMLError._valClassMapping[nvmlErrorCode]


def nvmlErrorString(result: int) -> str:
    return _STRINGS.get(result, "Unknown Error")


class c_nvmlMemory_t:
    def __init__(self, total: int, free: int, used: int) -> None:
        self.total, self.free, self.used = total, free, used

    def __repr__(self) -> str:
        return f"c_nvmlMemory_t(total: {self.total} B, free: {self.free} B, used: {self.used} B)"


class c_nvmlPciInfo_t:
    def __init__(self, bus_id: str) -> None:
        self.busId = bus_id
        self.busIdLegacy = bus_id[4:] if len(bus_id) > 12 else bus_id
        parts = bus_id.replace(".", ":").split(":")
        nums = [int(p, 16) if p else 0 for p in parts] + [0, 0, 0, 0]
        self.domain, self.bus, self.device = nums[0], nums[1], nums[2]


class c_nvmlProcessInfo_t:
    def __init__(self, pid: int, used: int) -> None:
        self.pid = pid
        self.usedGpuMemory = used
        self.gpuInstanceId = 0xFFFFFFFF
        self.computeInstanceId = 0xFFFFFFFF

    def __repr__(self) -> str:
        return f"c_nvmlProcessInfo_t(pid: {self.pid}, usedGpuMemory: {self.usedGpuMemory} B)"


class _Handle:
    def __init__(self, gpu: dict[str, Any]) -> None:
        self.gpu = gpu

    @property
    def index(self) -> int:
        return int(self.gpu["index"])

    def __repr__(self) -> str:
        return f"<fake nvmlDevice_t index={self.index}>"


_state: dict[str, Any] = {"init": 0, "data": None}


def _data() -> dict[str, Any]:
    if not _state["init"]:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    return _state["data"]  # type: ignore[no-any-return]


def _init_error(data: dict[str, Any]) -> int | None:
    """``"init_error"`` in gpus.json: the code (or NVML_ERROR_ name) nvmlInit fails with."""
    err = data.get("init_error")
    if err is None:
        return None
    if isinstance(err, int):
        return err
    name = str(err).upper().removeprefix("NVML_ERROR_")
    code = globals().get("NVML_ERROR_" + name)
    return code if isinstance(code, int) else NVML_ERROR_UNKNOWN


def nvmlInit() -> None:
    """Reads gpus.json. No file: ``NVMLError_LibraryNotFound`` ("NVML Shared Library Not Found"), raised
    while handling ctypes' OSError for libnvidia-ml.so.1, as nvidia-ml-py does on a host without the
    driver's user-space library. ``{"init_error": "DRIVER_NOT_LOADED"}`` (or a code): the library is
    there but nvmlInit fails, e.g. ``NVMLError_DriverNotLoaded`` ("Driver Not Loaded")."""
    try:
        data = json.loads(gpus_json_path().read_text())
    except (OSError, ValueError):
        try:
            raise OSError(LIBRARY_OSERROR) from None
        except OSError:
            raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)  # noqa: B904 (the real one chains implicitly)
    code = _init_error(data) if isinstance(data, dict) else NVML_ERROR_UNKNOWN
    if code is not None:
        raise NVMLError(code)
    _state["data"] = data
    _state["init"] += 1


nvmlInitWithFlags = lambda flags=0: nvmlInit()  # noqa: E731


def nvmlShutdown() -> None:
    if not _state["init"]:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    _state["init"] -= 1


def nvmlSystemGetDriverVersion() -> str:
    return str(_data().get("driver_version", ""))


def nvmlSystemGetNVMLVersion() -> str:
    return "12." + nvmlSystemGetDriverVersion()


def nvmlDeviceGetCount() -> int:
    return len(_data().get("gpus", []))


def _health(gpu: dict[str, Any]) -> dict[str, Any]:
    h = gpu.get("health")
    return h if isinstance(h, dict) else {}


def _reachable(handle: _Handle) -> _Handle:
    """The handle of a GPU that answers; a lost one raises as the driver's NVML does."""
    h = _health(handle.gpu)
    if h.get("lost"):
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    if h.get("reset_required"):
        raise NVMLError(NVML_ERROR_RESET_REQUIRED)
    return handle


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    for g in _data().get("gpus", []):
        if int(g["index"]) == int(index):
            if _health(g).get("lost"):
                raise NVMLError(NVML_ERROR_GPU_IS_LOST)
            return _Handle(g)
    raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)


nvmlDeviceGetHandleByIndex_v2 = nvmlDeviceGetHandleByIndex


def nvmlDeviceGetHandleByUUID(uuid: str | bytes) -> _Handle:
    want = uuid.decode() if isinstance(uuid, bytes) else uuid
    for g in _data().get("gpus", []):
        if g.get("uuid") == want:
            if _health(g).get("lost"):
                raise NVMLError(NVML_ERROR_GPU_IS_LOST)
            return _Handle(g)
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetIndex(handle: _Handle) -> int:
    _reachable(handle)
    return handle.index


def nvmlDeviceGetName(handle: _Handle) -> str:
    _reachable(handle)
    return str(handle.gpu.get("name", "NVIDIA H200"))


def nvmlDeviceGetUUID(handle: _Handle) -> str:
    _reachable(handle)
    return str(handle.gpu.get("uuid", ""))


def nvmlDeviceGetPciInfo(handle: _Handle) -> c_nvmlPciInfo_t:
    _reachable(handle)
    return c_nvmlPciInfo_t(str(handle.gpu.get("pci_bus_id", "")))


nvmlDeviceGetPciInfo_v3 = nvmlDeviceGetPciInfo


def nvmlDeviceGetNumaNodeId(handle: _Handle) -> int:
    _reachable(handle)
    numa = handle.gpu.get("numa_node")
    if not isinstance(numa, int) or numa < 0:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return numa


def _live_records(index: int) -> list[tuple[int, int]]:
    # The stand-in's workers write these records; one reader for both (dead PIDs are skipped).
    return [(r["pid"], r["used_bytes"]) for r in live_records() if r["gpu"] == index]


def nvmlDeviceGetComputeRunningProcesses(handle: _Handle) -> list[c_nvmlProcessInfo_t]:
    _reachable(handle)
    return [c_nvmlProcessInfo_t(pid, used) for pid, used in _live_records(handle.index)]


nvmlDeviceGetComputeRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses
nvmlDeviceGetComputeRunningProcesses_v2 = nvmlDeviceGetComputeRunningProcesses


def nvmlDeviceGetGraphicsRunningProcesses(handle: _Handle) -> list[c_nvmlProcessInfo_t]:
    _reachable(handle)
    return []


def nvmlDeviceGetMemoryInfo(handle: _Handle, version: int | None = None) -> c_nvmlMemory_t:
    _reachable(handle)
    total = int(handle.gpu["memory_total_bytes"])
    used = min(total, BASELINE_USED + sum(u for _, u in _live_records(handle.index)))
    return c_nvmlMemory_t(total, total - used, used)


class c_nvmlUtilization_t:
    def __init__(self, gpu: int, memory: int) -> None:
        self.gpu, self.memory = gpu, memory

    def __repr__(self) -> str:
        return f"c_nvmlUtilization_t(gpu: {self.gpu} %, memory: {self.memory} %)"


_cpu_seen: dict[tuple[int, int], tuple[int, float]] = {}  # (GPU, pid) -> (its CPU ticks, when) at the last reading


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _cpu_ticks(pid: int) -> tuple[int, int] | None:
    """(utime + stime, start time) of ``pid`` in clock ticks, from /proc/<pid>/stat."""
    rest = _stat(pid)
    return (int(rest[11]) + int(rest[12]), int(rest[19])) if rest else None


def _workers_and_engine(index: int) -> list[int]:
    """The GPU's processes and the engine that started them: the stand-in's TP workers hold the memory
    while its engine process does the serving, as a real scheduler's GPU work is its ranks'."""
    pids: list[int] = []
    for pid, _ in _live_records(index):
        rest = _stat(pid)
        parent = int(rest[1]) if rest else 0
        pids += [p for p in (pid, parent) if p > 1 and p not in pids]
    return pids


def _boot_time() -> float:
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("btime "):
                return float(line.split()[1])
    return 0.0


_busy_seen: dict[int, tuple[float, float]] = {}  # GPU -> (its utilisation, when): one reading per sample
SAMPLE_S = 0.25  # readings closer than this are one sample (power and utilisation asked together)


def _busy(index: int) -> float:
    """The GPU's modelled utilisation, 0..1 (see the module's docstring)."""
    hz = os.sysconf("SC_CLK_TCK")
    now = time.time()
    cached = _busy_seen.get(index)
    if cached is not None and now - cached[1] < SAMPLE_S:
        return cached[0]
    share = 0.0
    for pid in _workers_and_engine(index):
        got = _cpu_ticks(pid)
        if got is None:
            continue
        ticks, start = got
        before = _cpu_seen.get((index, pid))
        since = before[1] if before else _boot_time() + start / hz
        spent = ticks - (before[0] if before else 0)
        _cpu_seen[(index, pid)] = (ticks, now)
        if now - since > 0.05:
            share += max(0.0, spent / hz / (now - since))
    busy = min(1.0, 2 * share)
    _busy_seen[index] = (busy, now)
    return busy


def _board(handle: _Handle) -> tuple[float, float]:
    """(limit, idle) in W of the GPU (gpus.json's power_limit_w/idle_w win)."""
    name = str(handle.gpu.get("name", ""))
    limit, idle = next(((lim, idle) for part, lim, idle in BOARDS if part in name), DEFAULT_BOARD)
    return float(handle.gpu.get("power_limit_w") or limit), float(handle.gpu.get("idle_w") or idle)


def _limit_w(handle: _Handle) -> float:
    return _board(handle)[0]


def nvmlDeviceGetUtilizationRates(handle: _Handle) -> c_nvmlUtilization_t:
    _reachable(handle)
    busy = _busy(handle.index)
    return c_nvmlUtilization_t(round(100 * busy), round(60 * busy))


def nvmlDeviceGetPowerUsage(handle: _Handle) -> int:
    """mW, as NVML gives it."""
    _reachable(handle)
    held = bool(_live_records(handle.index))
    busy = _busy(handle.index) if held else 0.0
    limit, idle = _board(handle)
    floor = idle * (1 + CONTEXT_SHARE) if held else idle
    watts = floor + BUSY_SHARE * (limit - floor) * busy
    return round(watts * 1000)


def nvmlDeviceGetEnforcedPowerLimit(handle: _Handle) -> int:
    _reachable(handle)
    return round(_limit_w(handle) * 1000)


nvmlDeviceGetPowerManagementLimit = nvmlDeviceGetEnforcedPowerLimit


def nvmlDeviceGetCpuAffinity(handle: _Handle, cpu_set_size: int) -> list[int]:
    _reachable(handle)
    ncpu = os.cpu_count() or 1
    mask = [0] * cpu_set_size
    for cpu in range(min(ncpu, 64 * cpu_set_size)):
        mask[cpu // 64] |= 1 << (cpu % 64)
    return mask


# -- health (issue 49): a healthy H100's answers unless gpus.json says otherwise ----------------------


def _check(handle: _Handle) -> dict[str, Any]:
    return _health(_reachable(handle).gpu)


def nvmlDeviceGetRemappedRows(handle: _Handle) -> tuple[int, int, int, int]:
    rows = _check(handle).get("remapped_rows") or [0, 0, 0, 0]
    return int(rows[0]), int(rows[1]), int(bool(rows[2])), int(bool(rows[3]))


def nvmlDeviceGetRetiredPages(handle: _Handle, sourceFilter: int) -> list[int]:
    _check(handle)
    raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # row remapping replaces page retirement (H100 probe)


def nvmlDeviceGetRetiredPagesPendingStatus(handle: _Handle) -> int:
    _check(handle)
    raise NVMLError(NVML_ERROR_NOT_SUPPORTED)


def nvmlDeviceGetEccMode(handle: _Handle) -> list[int]:
    return list(_check(handle).get("ecc_mode") or [1, 1])


NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1


def nvmlDeviceGetTotalEccErrors(handle: _Handle, errorType: int, counterType: int) -> int:
    h = _check(handle)
    key = {(1, 0): "ecc_uncorrected_volatile", (1, 1): "ecc_uncorrected_aggregate",
           (0, 0): "ecc_corrected_volatile", (0, 1): "ecc_corrected_aggregate"}.get((int(errorType), int(counterType)))
    if key is None:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return int(h.get(key) or 0)


def nvmlDeviceGetCurrentClocksEventReasons(handle: _Handle) -> int:
    h = _check(handle)
    if h.get("clocks_event_reasons") is not None:
        return int(h["clocks_event_reasons"])
    return 0 if _live_records(handle.index) else 0x1  # idle with no process on it, as the H100 probe


nvmlDeviceGetCurrentClocksThrottleReasons = nvmlDeviceGetCurrentClocksEventReasons

NVML_TEMPERATURE_GPU = 0


def nvmlDeviceGetTemperature(handle: _Handle, sensor: int) -> int:
    h = _check(handle)
    if h.get("temperature_c") is not None:
        return int(h["temperature_c"])
    return round(34 + 40 * _busy(handle.index)) if _live_records(handle.index) else 34


def _pcie(handle: _Handle) -> list[int]:
    return [int(v) for v in (_check(handle).get("pcie") or [5, 5, 16, 16])]


def nvmlDeviceGetCurrPcieLinkGeneration(handle: _Handle) -> int:
    return _pcie(handle)[0]


def nvmlDeviceGetMaxPcieLinkGeneration(handle: _Handle) -> int:
    return _pcie(handle)[1]


nvmlDeviceGetGpuMaxPcieLinkGeneration = nvmlDeviceGetMaxPcieLinkGeneration


def nvmlDeviceGetCurrPcieLinkWidth(handle: _Handle) -> int:
    return _pcie(handle)[2]


def nvmlDeviceGetMaxPcieLinkWidth(handle: _Handle) -> int:
    return _pcie(handle)[3]


NVML_NVLINK_MAX_LINKS = 18


def nvmlDeviceGetNvLinkState(handle: _Handle, link: int) -> int:
    h = _check(handle)
    links = int(h.get("nvlink_links") or 0)
    if not links:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # a PCIe card (the H100 probe's)
    if not 0 <= int(link) < links:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return 0 if int(link) in (h.get("nvlink_down") or []) else 1
