"""Fake NVML for lab hosts: ``import pynvml`` behaves like nvidia-ml-py for what gpudeploy uses.

GPUs come from the JSON file in ``GPUDEPLOY_LAB_GPUS`` (default ``/etc/gpudeploy-lab/gpus.json``):
    {"driver_version": "580.159.04",
     "gpus": [{"index": 0, "name": "NVIDIA H200", "uuid": "GPU-...", "memory_total_bytes": N,
               "numa_node": 0, "pci_bus_id": "00000000:00:06.0"}]}
No file -> ``nvmlInit`` raises ``NVMLError_LibraryNotFound`` (a host without a driver).

Memory use comes from the stand-in engine's per-process records in ``SGLANG_STANDIN_GPU_PROCS_DIR``
(default ``/run/gpudeploy-lab/gpu-procs``): ``<pid>.json`` = {"pid", "gpu", "used_bytes"}. Only records
whose process is alive (``/proc/<pid>`` exists, not a zombie) count, like the driver freeing the memory
of a dead process. ``used`` = 644939776 B (an idle H200's baseline) + the live records on that GPU.

``nvmlDeviceGetNumaNodeId``: returns the GPU's ``numa_node``; when that is null or negative it raises
``NVMLError_NotSupported``, as on the real H200 VM (so both paths can be exercised).
"""

from __future__ import annotations

import json
import os
from typing import Any

from gpudeploy_lab.standin.common import gpus_json_path, live_records

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_UNKNOWN = 999

BASELINE_USED = 644_939_776

_STRINGS = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    """Like pynvml's: ``NVMLError(code)`` builds the matching subclass; ``.value`` is the code."""

    _valClassMapping: dict[int, type[NVMLError]] = {}  # noqa: RUF012

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
        return _STRINGS.get(self.value, "Unknown Error")

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


NVMLError_Uninitialized = _subclass("NVMLError_Uninitialized", NVML_ERROR_UNINITIALIZED)
NVMLError_InvalidArgument = _subclass("NVMLError_InvalidArgument", NVML_ERROR_INVALID_ARGUMENT)
NVMLError_NotSupported = _subclass("NVMLError_NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_NotFound = _subclass("NVMLError_NotFound", NVML_ERROR_NOT_FOUND)
NVMLError_LibraryNotFound = _subclass("NVMLError_LibraryNotFound", NVML_ERROR_LIBRARY_NOT_FOUND)
NVMLError_Unknown = _subclass("NVMLError_Unknown", NVML_ERROR_UNKNOWN)


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


def nvmlInit() -> None:
    try:
        data = json.loads(gpus_json_path().read_text())
    except (OSError, ValueError) as e:
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND) from e
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


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    for g in _data().get("gpus", []):
        if int(g["index"]) == int(index):
            return _Handle(g)
    raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)


def nvmlDeviceGetHandleByUUID(uuid: str | bytes) -> _Handle:
    want = uuid.decode() if isinstance(uuid, bytes) else uuid
    for g in _data().get("gpus", []):
        if g.get("uuid") == want:
            return _Handle(g)
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetIndex(handle: _Handle) -> int:
    return handle.index


def nvmlDeviceGetName(handle: _Handle) -> str:
    return str(handle.gpu.get("name", "NVIDIA H200"))


def nvmlDeviceGetUUID(handle: _Handle) -> str:
    return str(handle.gpu.get("uuid", ""))


def nvmlDeviceGetPciInfo(handle: _Handle) -> c_nvmlPciInfo_t:
    return c_nvmlPciInfo_t(str(handle.gpu.get("pci_bus_id", "")))


nvmlDeviceGetPciInfo_v3 = nvmlDeviceGetPciInfo


def nvmlDeviceGetNumaNodeId(handle: _Handle) -> int:
    numa = handle.gpu.get("numa_node")
    if not isinstance(numa, int) or numa < 0:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return numa


def _live_records(index: int) -> list[tuple[int, int]]:
    # The stand-in's workers write these records; one reader for both (dead PIDs are skipped).
    return [(r["pid"], r["used_bytes"]) for r in live_records() if r["gpu"] == index]


def nvmlDeviceGetComputeRunningProcesses(handle: _Handle) -> list[c_nvmlProcessInfo_t]:
    return [c_nvmlProcessInfo_t(pid, used) for pid, used in _live_records(handle.index)]


nvmlDeviceGetComputeRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses
nvmlDeviceGetComputeRunningProcesses_v2 = nvmlDeviceGetComputeRunningProcesses


def nvmlDeviceGetGraphicsRunningProcesses(handle: _Handle) -> list[c_nvmlProcessInfo_t]:
    return []


def nvmlDeviceGetMemoryInfo(handle: _Handle, version: int | None = None) -> c_nvmlMemory_t:
    total = int(handle.gpu["memory_total_bytes"])
    used = min(total, BASELINE_USED + sum(u for _, u in _live_records(handle.index)))
    return c_nvmlMemory_t(total, total - used, used)


def nvmlDeviceGetCpuAffinity(handle: _Handle, cpu_set_size: int) -> list[int]:
    ncpu = os.cpu_count() or 1
    mask = [0] * cpu_set_size
    for cpu in range(min(ncpu, 64 * cpu_set_size)):
        mask[cpu // 64] |= 1 << (cpu % 64)
    return mask
