"""The driver's Xid errors: what each means and what to do, and how they become a unit's cause.

When a GPU fails under an engine, the engine's own words point elsewhere (an NCCL error, "unspecified
launch failure", a silent exit, a hang); the truth is the Xid the driver wrote to the kernel log. So
when an engine dies or stalls, the Xids its GPUs reported since its run started are named first.

The table: NVIDIA's Xid catalog for Ampere and newer GPUs, "Analyzing Xid Errors with the Xid Catalog"
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html; the catalog as of 2025-10-29),
whose description ("nvidia") and immediate resolution bucket ("bucket": RESTART_APP, RESET_GPU,
RESTART_BM = reboot the machine, IGNORE, WORKFLOW_*, XID_154) each entry keeps; NVIDIA's Xid overview
(https://docs.nvidia.com/deploy/xid-errors/index.html) and dynamic page retirement pages
(https://docs.nvidia.com/deploy/dynamic-page-retirement/) for 48, 63 and 64; the A100/H100 memory error
management pages (https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/) for 94, 95, row remapping and
Xid 154's recovery actions. ``words`` and ``todo`` are gpudeploy's, for an operator serving on the GPU.
docs/troubleshooting-xid.md lists the same table (a test keeps the two equal).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import GpudeployError
from ..facts import health
from ..facts.probe import Runner, probe
from ..model import Unit
from .causes import Cause

NVIDIA_CATALOG = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"

# What kind of fault: which words the cause uses and how it judges the GPU.
HARDWARE = "hardware"  # the GPU (its memory, bus, links, firmware) failed: nothing to change in the settings
APPLICATION = "application"  # the driver's report of the application's own fault: the engine's error says more
INFO = "info"  # a note about another Xid or a repair under way


@dataclass(frozen=True)
class Xid:
    code: int
    nvidia: str  # NVIDIA's description in the catalog
    bucket: str  # NVIDIA's immediate resolution bucket
    kind: str
    words: str  # what happened, for "GPU 3 (...) reported Xid 79, <words>, at 12:03:44"
    todo: str  # what to do, for an operator serving on that GPU


_RESET = "reset the GPU (`nvidia-smi -r -i N` once nothing runs on it) or drain the node"
XIDS: dict[int, Xid] = {x.code: x for x in (
    Xid(8, "GPU stopped processing", "RESTART_APP", APPLICATION, "the GPU stopped processing (a channel timed out)",
        "restart the engine; if it repeats, " + _RESET),
    Xid(13, "Graphics Engine Exception", "RESTART_APP", APPLICATION,
        "a graphics engine exception (usually a kernel's own fault: an illegal address or instruction)",
        "the engine's own error says where; if it repeats across models and releases, run `dcgmi diag -r 3` "
        "on the GPU"),
    Xid(31, "GPU memory page fault", "RESTART_APP", APPLICATION,
        "a GPU memory page fault (an illegal memory access, usually the application's)",
        "the engine's own error says where (CUDA_LAUNCH_BLOCKING=1 in the role's env names the kernel); if it "
        "repeats across models, run `dcgmi diag -r 3` on the GPU"),
    Xid(43, "GPU stopped processing", "IGNORE", APPLICATION,
        "the GPU stopped a channel of a faulting application (the GPU stays usable)",
        "restart the engine; the engine's own error says why it faulted"),
    Xid(45, "Preemptive cleanup, due to previous errors", "WORKFLOW_XID_45", INFO,
        "the driver ended the GPU's work after an earlier error", "follow the Xid logged before it"),
    Xid(46, "GPU stopped processing", "RESET_GPU", HARDWARE, "the GPU stopped processing (a GPU timeout)", _RESET),
    Xid(48, "Double Bit ECC Error", "WORKFLOW_XID_48", HARDWARE,
        "an uncorrectable double-bit ECC memory error",
        "reset the GPU (the bad row is remapped at the reset) or drain the node; if it repeats, the GPU needs "
        "service"),
    Xid(61, "Internal micro-controller breakpoint/warning (the catalog marks it unused on Ampere and newer)",
        "CONTACT_SUPPORT", HARDWARE, "an internal micro-controller breakpoint", _RESET + "; if it repeats, contact "
        "NVIDIA support"),
    Xid(62, "Internal micro-controller halt", "RESET_GPU", HARDWARE, "an internal micro-controller halt", _RESET),
    Xid(63, "GPU memory remapping event", "IGNORE", HARDWARE,
        "a memory row was marked for remapping (applied at the next GPU reset)",
        "reset the GPU when nothing runs on it, so the remap is applied"),
    Xid(64, "GPU memory remapping failure", "RESET_GPU", HARDWARE, "a memory row could not be remapped",
        "reset the GPU or drain the node; if it repeats, the GPU needs service (RMA)"),
    Xid(68, "NVDEC0 Exception", "RESTART_APP", APPLICATION, "a video decoder (NVDEC) exception",
        "restart the engine; if it repeats, contact NVIDIA support"),
    Xid(69, "Graphics Engine class error", "RESTART_APP", APPLICATION, "a graphics engine class error",
        "restart the engine; the engine's own error says where"),
    Xid(74, "NVLINK Error", "WORKFLOW_NVLINK_ERR", HARDWARE, "an NVLink error",
        "reset the GPUs of the link (with NVSwitch: every GPU of the node) or drain the node; "
        "`nvidia-smi nvlink -s` shows the links"),
    Xid(79, "GPU has fallen off the bus", "RESTART_BM", HARDWARE, "fell off the bus",
        "reset the GPU or drain the node (NVIDIA: reboot the machine); if it repeats, check the GPU, its slot "
        "and its power"),
    Xid(92, "High single-bit ECC error rate", "IGNORE", HARDWARE,
        "a high rate of corrected (single-bit) ECC errors",
        "nothing now (they were corrected); if it goes on, plan to service the GPU"),
    Xid(94, "Contained memory error", "RESTART_APP", HARDWARE,
        "an uncorrectable memory error, contained to the process that used the memory",
        "restart the engine (the GPU stays usable); reset the GPU when you can, so the bad row is remapped"),
    Xid(95, "Uncontained memory error", "RESET_GPU", HARDWARE,
        "an uncorrectable memory error the GPU could not contain (every process on it is affected)", _RESET),
    Xid(109, "Context Switch Timeout Error", "RESET_GPU", HARDWARE, "a context switch timed out", _RESET),
    Xid(119, "GSP RPC Timeout", "RESET_GPU", HARDWARE,
        "its GSP (the GPU's system processor) stopped answering the driver",
        _RESET + "; if it repeats, update the driver"),
    Xid(120, "GSP Error", "RESET_GPU", HARDWARE, "an error of its GSP (the GPU's system processor)",
        _RESET + "; if it repeats, update the driver"),
    Xid(136, "Link Training Failed", "RESET_GPU", HARDWARE, "a link failed to train", _RESET),
    Xid(140, "ECC Unrecovered Error", "RESET_GPU", HARDWARE, "an ECC error it could not recover from", _RESET),
    Xid(143, "GPU Initialization Error", "RESET_GPU", HARDWARE, "it failed to initialize", _RESET),
    Xid(154, "GPU Recovery Action Changed", "XID_154", INFO,
        "the driver changed what the GPU needs to recover", "do what the line says (None, GPU Reset Required, "
        "Node Reboot Required, Drain P2P, Drain and Reset)"),
    Xid(158, "GPU Fatal Timeout", "RESET_GPU", HARDWARE, "a fatal GPU timeout", _RESET),
)}

# Xid 154's line says what the GPU now needs: "GPU recovery action changed from 0x0 (None) to 0x4
# (Drain and Reset)".
_RECOVERY = re.compile(r"recovery action changed from .* to (0x[0-9a-fA-F]+) \(([^)]*)\)")


def describe(code: int) -> Xid:
    """The table's entry, or an entry that says the table does not know it."""
    return XIDS.get(code) or Xid(code, "", "", HARDWARE, "an Xid gpudeploy's table does not list",
                                 f"look it up in NVIDIA's Xid catalog ({NVIDIA_CATALOG}); " + _RESET)


def xid_word(code: int) -> str:
    """How an Xid that came while a run served judges its GPU: 79 ``lost``; another hardware fault
    ``failing`` (``degraded`` where NVIDIA's first step is to ignore it: a corrected-error rate, a remap
    recorded); an application's fault or a note: ``ok``."""
    x = describe(code)
    if x.kind != HARDWARE:
        return "ok"
    if code == 79:
        return "lost"
    return "degraded" if x.bucket == "IGNORE" else "failing"


def _when(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))


def _bus(bus: str) -> str:
    """"0000:41:00" (an Xid's) -> "0000:41:00.0", as sysfs and `lspci -D` name the GPU."""
    return bus if "." in bus else f"{bus}.0"


def sentence(x: dict[str, Any]) -> str:
    """"GPU 3 (0000:41:00.0) reported Xid 79, fell off the bus, at 12:03:44: a hardware fault\""""
    info = describe(int(x["xid"]))
    who = f"GPU {x['gpu']} ({_bus(x['bus'])})" if x.get("gpu") is not None else f"the GPU at {_bus(x['bus'])}"
    words = info.words
    if info.code == 154:
        m = _RECOVERY.search(x.get("text") or "")
        if m:
            words = f"the GPU now needs: {m.group(2)}"
    kind = {HARDWARE: "a hardware fault", APPLICATION: "the driver's report of an application's fault",
            INFO: "the driver's note"}[info.kind]
    return f"{who} reported Xid {info.code}, {words}, at {_when(float(x['at']))}: {kind}"


def todo(x: dict[str, Any]) -> str:
    info = describe(int(x["xid"]))
    step = info.todo.replace("-i N", f"-i {x['gpu']}") if x.get("gpu") is not None else info.todo
    return step + ("; nothing to change in the settings" if info.kind == HARDWARE else "")


def kernel_line(x: dict[str, Any]) -> str:
    return f"{_when(float(x['at']))} kernel: {x.get('text') or 'NVRM: Xid ' + str(x['xid'])}"


def on_gpus(xids: Sequence[dict[str, Any]], gpus: Sequence[int], since: float) -> list[dict[str, Any]]:
    """The Xids of ``gpus`` logged at or after ``since`` (the host's clock), oldest first. An Xid whose
    bus no GPU NVML read has (a GPU lost since) counts for every GPU: never hide a hardware fault."""
    mine = [x for x in xids if float(x["at"]) >= since and (x.get("gpu") in gpus or x.get("gpu") is None)]
    return sorted(mine, key=lambda x: float(x["at"]))


def gpu_word(device: dict[str, Any] | None, xids: Sequence[dict[str, Any]] = ()) -> str:
    """One GPU's word: NVML's reading (facts/health.py) and the Xids that came while a run served on it."""
    nvml = health.word(device)
    words = [xid_word(int(x["xid"])) for x in xids]
    if nvml == "-":
        return health.worst(words) if any(w != "ok" for w in words) else "-"
    return health.worst([nvml, *words])


def cause(xids: Sequence[dict[str, Any]], engine: Cause | None) -> Cause | None:
    """The unit's cause with its GPUs' Xids named first (``xids``: those since its run started, oldest
    first); None when there are none. An application's fault (13, 31, 43...) is named but its step is
    the engine's own; a hardware fault's step is the Xid's, with nothing to change in the settings."""
    if not xids:
        return None
    hardware = [x for x in xids if describe(int(x["xid"])).kind == HARDWARE]
    lead = hardware[0] if hardware else xids[0]
    others = [x for x in xids if x is not lead]
    summary = sentence(lead)
    if others:
        summary += "; also " + "; ".join(sentence(x) for x in others[:3]) + (
            f" and {len(others) - 3} more" if len(others) > 3 else "")
    if engine is not None and engine.summary:
        summary += f" (the engine said: {engine.summary})"
    if lead in hardware:
        step = todo(lead)
    else:
        step = engine.next_step if engine is not None and engine.next_step else todo(lead)
    evidence = tuple(kernel_line(x) for x in xids[:5]) + (engine.evidence if engine is not None else ())
    extra = {"xid": str(lead["xid"]), "gpu": str(lead.get("gpu")), "engine_cause": engine.kind if engine else ""}
    return Cause("gpu-xid", summary, evidence, step, extra=extra)


def logged_since(remote: Runner, since: float, timeout: float = 30.0) -> list[dict[str, Any]]:
    """The host's Xid lines since ``since`` (its clock), each with the GPU it names; [] if the host
    cannot say (no kernel log this user may read: the probe's "xids" says why)."""
    facts = probe(remote, {"xids": {"since": since}}, timeout=timeout)
    return list((facts.get("xids") or {}).get("xids") or [])


def unit_cause(remote: Runner, unit: Unit, started_us: int, engine: Cause | None) -> Cause | None:
    """A unit that died or stalled: its cause with the Xids its GPUs reported since its run started
    named first; None when there are none (or the host could not be asked: the engine's cause stands)."""
    if not unit.gpus:
        return None
    since = started_us / 1e6
    try:
        found = logged_since(remote, since)
    except GpudeployError:
        return None
    return cause(on_gpus(found, list(unit.gpus), since), engine)


def doc_lines() -> list[str]:
    """The table as docs/troubleshooting-xid.md lists it (a test keeps the page equal to it)."""
    kinds = {HARDWARE: "a hardware fault", APPLICATION: "the application's fault", INFO: "a note"}
    return [f"- **Xid {x.code}**: {x.nvidia} (NVIDIA's first step: `{x.bucket}`). {kinds[x.kind].capitalize()}: "
            f"{x.words}. What to do: {x.todo}." for x in sorted(XIDS.values(), key=lambda x: x.code)]
