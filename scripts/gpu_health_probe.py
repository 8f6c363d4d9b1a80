#!/usr/bin/env python3
"""Print, as JSON, what NVML and the kernel log say of each GPU's health on this machine (issue 49).

    python3 scripts/gpu_health_probe.py            # on the GPU machine; needs nvidia-ml-py (import pynvml)

Two views of every GPU:
  * "calls": each NVML call gpudeploy's reader makes, with its raw answer, or the exception it raised
    (NVMLError_NotSupported is an answer: a PCIe card has no NVLink, an H100 no page retirement);
  * "gpudeploy": what src/gpudeploy/facts/gpu_health.py makes of them (the host probe's "health" of each
    GPU) and of the kernel log (its Xid lines since boot, and where it read them), loaded from its file
    next to this script: that module is stdlib + pynvml too, so nothing of gpudeploy needs installing.
Plus whether the driver's Xid events can be registered (nvmlEventTypeXidCriticalError), the driver and
NVML versions, and how long each view took. Read-only: it changes nothing on the GPUs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

HEALTH = Path(__file__).resolve().parents[1] / "src" / "gpudeploy" / "facts" / "gpu_health.py"


def answer(fn: Any, *args: Any) -> Any:
    """A call's raw answer as JSON can hold it, or {"error": "NVMLError_NotSupported: Not Supported"}."""
    if fn is None:
        return {"error": "not in this nvidia-ml-py"}
    try:
        value = fn(*args)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, (list, tuple)):
        return [v if isinstance(v, (int, float, str)) or v is None else str(v) for v in value]
    if isinstance(value, (int, float, str)) or value is None:
        return value
    fields = getattr(value, "_fields_", None)
    if fields:
        return {name: answer(lambda n=name: getattr(value, n)) for name, *_ in fields}
    return str(value)


def call(nv: Any, name: str, *args: Any) -> Any:
    return answer(getattr(nv, name, None), *args)


def raw_calls(nv: Any, h: Any) -> dict[str, Any]:
    links = int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))
    calls: dict[str, Any] = {
        "nvmlDeviceGetName": call(nv, "nvmlDeviceGetName", h),
        "nvmlDeviceGetPciInfo.busId": answer(lambda: nv.nvmlDeviceGetPciInfo(h).busId),
        "nvmlDeviceGetRemappedRows": call(nv, "nvmlDeviceGetRemappedRows", h),
        "nvmlDeviceGetRetiredPages(MULTIPLE_SINGLE_BIT)": answer(lambda: len(nv.nvmlDeviceGetRetiredPages(h, 0))),
        "nvmlDeviceGetRetiredPages(DOUBLE_BIT)": answer(lambda: len(nv.nvmlDeviceGetRetiredPages(h, 1))),
        "nvmlDeviceGetRetiredPagesPendingStatus": call(nv, "nvmlDeviceGetRetiredPagesPendingStatus", h),
        "nvmlDeviceGetEccMode": call(nv, "nvmlDeviceGetEccMode", h),
        "nvmlDeviceGetTotalEccErrors(UNCORRECTED, VOLATILE)": call(nv, "nvmlDeviceGetTotalEccErrors", h, 1, 0),
        "nvmlDeviceGetTotalEccErrors(UNCORRECTED, AGGREGATE)": call(nv, "nvmlDeviceGetTotalEccErrors", h, 1, 1),
        "nvmlDeviceGetTotalEccErrors(CORRECTED, VOLATILE)": call(nv, "nvmlDeviceGetTotalEccErrors", h, 0, 0),
        "nvmlDeviceGetTotalEccErrors(CORRECTED, AGGREGATE)": call(nv, "nvmlDeviceGetTotalEccErrors", h, 0, 1),
        "nvmlDeviceGetCurrentClocksEventReasons": call(nv, "nvmlDeviceGetCurrentClocksEventReasons", h),
        "nvmlDeviceGetCurrentClocksThrottleReasons": call(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", h),
        "nvmlDeviceGetTemperature(GPU)": call(nv, "nvmlDeviceGetTemperature", h, 0),
        "nvmlDeviceGetCurrPcieLinkGeneration": call(nv, "nvmlDeviceGetCurrPcieLinkGeneration", h),
        "nvmlDeviceGetMaxPcieLinkGeneration": call(nv, "nvmlDeviceGetMaxPcieLinkGeneration", h),
        "nvmlDeviceGetGpuMaxPcieLinkGeneration": call(nv, "nvmlDeviceGetGpuMaxPcieLinkGeneration", h),
        "nvmlDeviceGetCurrPcieLinkWidth": call(nv, "nvmlDeviceGetCurrPcieLinkWidth", h),
        "nvmlDeviceGetMaxPcieLinkWidth": call(nv, "nvmlDeviceGetMaxPcieLinkWidth", h),
        "nvmlDeviceGetPowerUsage (mW)": call(nv, "nvmlDeviceGetPowerUsage", h),
        "nvmlDeviceGetEnforcedPowerLimit (mW)": call(nv, "nvmlDeviceGetEnforcedPowerLimit", h),
        "nvmlDeviceGetPersistenceMode": call(nv, "nvmlDeviceGetPersistenceMode", h),
        "nvmlDeviceGetMigMode": call(nv, "nvmlDeviceGetMigMode", h),
    }
    states = []
    for link in range(links):
        state = call(nv, "nvmlDeviceGetNvLinkState", h, link)
        states.append(state)
        if isinstance(state, dict):
            break  # NotSupported (no NVLink) or InvalidArgument (past the last link)
    calls["nvmlDeviceGetNvLinkState(0..)"] = states
    return calls


def xid_events(nv: Any, h: Any) -> dict[str, Any]:
    """Can the driver's Xid events be registered here (a way to hear them without a kernel log)?"""
    out: dict[str, Any] = {}
    try:
        events = nv.nvmlEventSetCreate()
    except Exception as exc:  # (the lab's stand-in NVML has no events: AttributeError)
        return {"create": f"{type(exc).__name__}: {exc}"}
    try:
        try:
            nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, events)
            out["register"] = "ok"
        except Exception as exc:
            out["register"] = f"{type(exc).__name__}: {exc}"
            return out
        wait = getattr(nv, "nvmlEventSetWait_v2", None) or nv.nvmlEventSetWait
        try:
            data = wait(events, 10)
            out["wait_10ms"] = {"eventType": int(data.eventType), "eventData": int(data.eventData)}
        except Exception as exc:
            out["wait_10ms"] = f"{type(exc).__name__}: {exc}"
    finally:
        try:
            nv.nvmlEventSetFree(events)
        except Exception as exc:
            out["free"] = f"{type(exc).__name__}: {exc}"
    return out


def load_reader() -> Any:
    if not HEALTH.is_file():
        return None
    spec = importlib.util.spec_from_file_location("gpu_health", HEALTH)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    report: dict[str, Any] = {"python": sys.version.split()[0], "pid1": Path("/proc/1/comm").read_text().strip()
                              if Path("/proc/1/comm").exists() else None, "uid": os.getuid()}
    try:
        import pynvml
    except ImportError as exc:
        report["error"] = f"no pynvml for this python ({exc}): pip install nvidia-ml-py"
        print(json.dumps(report, indent=1))
        return 1
    try:
        from importlib.metadata import version

        report["nvidia_ml_py"] = version("nvidia-ml-py")
    except Exception:
        report["nvidia_ml_py"] = None
    reader = load_reader()
    report["reader"] = str(HEALTH) if reader is not None else f"not found: {HEALTH}"
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        report["error"] = f"nvmlInit: {type(exc).__name__}: {exc}"
        print(json.dumps(report, indent=1))
        return 1
    try:
        report["driver"] = answer(pynvml.nvmlSystemGetDriverVersion)
        report["nvml"] = answer(pynvml.nvmlSystemGetNVMLVersion)
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            gpu: dict[str, Any] = {"index": i}
            try:
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
            except Exception as exc:
                gpu["handle"] = f"{type(exc).__name__}: {exc}"
                gpus.append(gpu)
                continue
            t0 = time.perf_counter()
            gpu["calls"] = raw_calls(pynvml, h)
            gpu["calls_s"] = round(time.perf_counter() - t0, 4)
            if reader is not None:
                t0 = time.perf_counter()
                gpu["gpudeploy"] = reader.device_health(pynvml, h)
                gpu["gpudeploy_s"] = round(time.perf_counter() - t0, 4)
            gpu["xid_events"] = xid_events(pynvml, h)
            gpus.append(gpu)
        report["gpus"] = gpus
    finally:
        pynvml.nvmlShutdown()
    if reader is not None:
        t0 = time.perf_counter()
        report["kernel_log"] = reader.kernel_xids(0.0)
        report["kernel_log_s"] = round(time.perf_counter() - t0, 4)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
