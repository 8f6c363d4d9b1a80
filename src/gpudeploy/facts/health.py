"""A GPU's health judged from what the host probe read (gpu_health.py): pure.

Four words, worst first: ``lost`` (NVML answers "GPU is lost": it fell off the bus or stopped
answering), ``failing`` (it needs a reset, its memory reports uncorrected errors, or a row remap is
pending or failed,
or, as verify/xid.py adds, a hardware fault's Xid came while a run served on it), ``degraded`` (it runs, slower than it
should: a PCIe link trained below what its slot can do, clocks held down by the hardware, an NVLink
down), ``ok``. Each word comes with the facts that made it and what to do.

What refuses a start (deploy's preflight; ``--force`` overrides) is ``lost`` and ``failing`` as NVML
says it now; ``degraded`` is said as a warning. A pending row remap refuses although NVIDIA says work
may go on beside it (a remap is applied at the next reset, and an engine's start is the moment the GPU
is idle and a reset costs nothing); the refusal says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

WORDS = ("ok", "degraded", "failing", "lost")  # worst last
# Clock reasons that mean the hardware holds the GPU down (sw_power_cap, idle, sync_boost and the
# application clocks are the normal life of a busy or idle GPU).
SLOWDOWN = {"hw_slowdown": "hardware slowdown (HW_SLOWDOWN: the board's power or temperature sensors)",
            "hw_thermal_slowdown": "hardware thermal slowdown (too hot)",
            "hw_power_brake_slowdown": "hardware power brake (the power supply asked the GPU to slow down)",
            "sw_thermal_slowdown": "the driver holds the clocks down for temperature (SW thermal slowdown)"}
RESET = "reset the GPU (`nvidia-smi -r -i {gpu}` with nothing running on it)"
DRAIN = "drain the node (move its work elsewhere) if the reset does not clear it"


@dataclass(frozen=True)
class Finding:
    """One reason a GPU is not ``ok``: ``word`` is how bad, ``fact`` what NVML says, ``todo`` what to do."""

    gpu: int
    word: str
    fact: str
    todo: str

    def text(self, where: str = "") -> str:
        return f"GPU {self.gpu}{where} {self.fact}: {self.todo}"


def _bus(device: dict[str, Any]) -> str:
    from .remote_probe import sysfs_bus_id

    bus = str(device.get("bus_id") or "")
    return sysfs_bus_id(bus) if bus else ""


def findings(device: dict[str, Any]) -> list[Finding]:
    """Everything NVML's reading of ``device`` (a probe's GPU record) says is wrong with it, worst first."""
    h = device.get("health")
    gpu = int(device["index"])
    if not isinstance(h, dict):
        return []
    reset = RESET.format(gpu=gpu)
    if h.get("lost"):
        return [Finding(gpu, "lost", "is lost (NVML answers NVML_ERROR_GPU_IS_LOST: it fell off the bus or stopped "
                                     "answering)", f"{reset}; if it stays lost, drain the node and reboot it")]
    if h.get("reset_required"):
        return [Finding(gpu, "failing", "needs a reset before it can be used (NVML answers "
                                        "NVML_ERROR_RESET_REQUIRED)", f"{reset}; {DRAIN}")]
    out: list[Finding] = []
    rows = h.get("remapped_rows") or {}
    if rows.get("failed"):
        out.append(Finding(gpu, "failing", "has a failed row remap (its memory could not be repaired; "
                                           f"{_rows(rows)})", f"drain the node: the GPU needs service (RMA); {reset} "
                                                              "only clears it until the next error"))
    if rows.get("pending"):
        out.append(Finding(gpu, "failing", f"has a pending row remap ({_rows(rows)}; it is applied at the next reset)",
                           f"{reset} now, while nothing runs on it; {DRAIN}"))
    pages = h.get("retired_pages") or {}
    if pages.get("pending"):
        out.append(Finding(gpu, "failing", "has retired pages pending (applied when the driver reloads)",
                           f"{reset} or reload the driver; {DRAIN}"))
    ecc = h.get("ecc") or {}
    if (ecc.get("uncorrected_volatile") or 0) > 0:
        out.append(Finding(gpu, "failing", f"has {ecc['uncorrected_volatile']} uncorrected ECC error(s) since the "
                                           "driver loaded (volatile count)", f"{reset}; {DRAIN}"))
    out += degradations(device)
    return out


def _rows(rows: dict[str, Any]) -> str:
    return (f"rows remapped: {rows.get('correctable', '?')} for correctable, {rows.get('uncorrectable', '?')} for "
            "uncorrectable errors")


def degradations(device: dict[str, Any]) -> list[Finding]:
    """What slows the GPU without stopping it: a PCIe link below what its slot trains to (its width
    always; its generation only under load: an idle GPU may lower its link speed to save power), the
    hardware holding its clocks down, NVLink links down."""
    h = device.get("health") or {}
    gpu = int(device["index"])
    out: list[Finding] = []
    pcie = h.get("pcie") or {}
    reasons = (h.get("clocks_event_reasons") or {}).get("reasons") or []
    width, max_width, gen, max_gen = pcie.get("width"), pcie.get("max_width"), pcie.get("gen"), pcie.get("max_gen")
    if width and max_width and width < max_width:
        out.append(Finding(gpu, "degraded", f"has its PCIe link at x{width} of x{max_width}",
                           "reseat the card or check its riser and slot (host-to-GPU copies run slower)"))
    if gen and max_gen and gen < max_gen and "idle" not in reasons:
        out.append(Finding(gpu, "degraded", f"has its PCIe link at gen{gen} of gen{max_gen} while busy",
                           "check the slot's BIOS settings, the riser or the card (host-to-GPU copies run slower)"))
    slow = [SLOWDOWN[r] for r in reasons if r in SLOWDOWN]
    if slow:
        out.append(Finding(gpu, "degraded", "has its clocks held down: " + "; ".join(slow),
                           "check its cooling and power (`nvidia-smi -q -d PERFORMANCE` names the reason)"))
    nvlink = h.get("nvlink") or {}
    if nvlink.get("down") and nvlink.get("active"):
        down = ", ".join(str(i) for i in nvlink["down"])
        out.append(Finding(gpu, "degraded", f"has NVLink link(s) {down} down ({nvlink['active']} of "
                                            f"{nvlink['links']} up)",
                           "reset the GPUs of the node or drain it (`nvidia-smi nvlink -s` shows the links)"))
    return out


def worst(words: list[str]) -> str:
    return max(words, key=WORDS.index) if words else "ok"


def word(device: dict[str, Any] | None) -> str:
    """The GPU's one word from NVML's reading (its findings' worst; verify/xid.py adds the Xids that came
    while a run served on it); "-" where NVML did not read it."""
    if device is None or not isinstance(device.get("health"), dict):
        return "-"
    return worst([f.word for f in findings(device)])


def grouped(words: dict[int, str]) -> str:
    """GPU -> word, runs of GPUs with the same word together: "0-3 ok", "0 ok, 1 failing, 2-3 ok"; "-" for none."""
    parts: list[tuple[int, int, str]] = []
    for g, w in sorted(words.items()):
        if parts and parts[-1][1] == g - 1 and parts[-1][2] == w:
            parts[-1] = (parts[-1][0], g, w)
        else:
            parts.append((g, g, w))
    return ", ".join(f"{a}{'-' + str(b) if b != a else ''} {w}" for a, b, w in parts) or "-"


def refusals(devices: list[dict[str, Any]], gpus: dict[int, str]) -> list[str]:
    """Deploy's preflight: why an engine may not start on these GPUs (``gpus``: index -> the role that
    wants it) as NVML says now; --force deploys anyway."""
    out = []
    for d in devices:
        if d.get("index") not in gpus:
            continue
        where = f" (for role {gpus[int(d['index'])]}{', ' + _bus(d) if _bus(d) else ''})"
        out += [f.text(where) + "; --force deploys anyway" for f in findings(d) if f.word in ("lost", "failing")]
    return out


def warnings(devices: list[dict[str, Any]], gpus: dict[int, str]) -> list[str]:
    """Deploy's preflight: what a start on these GPUs may suffer (said, never refused)."""
    out = []
    for d in devices:
        if d.get("index") not in gpus or (d.get("health") or {}).get("lost"):
            continue
        where = f" (for role {gpus[int(d['index'])]}{', ' + _bus(d) if _bus(d) else ''})"
        out += [f.text(where) for f in findings(d) if f.word == "degraded"]
    return out
