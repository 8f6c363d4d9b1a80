"""GPU faults on a lab host: the NVML state the stand-in NVML (lab/shims/pynvml.py) reads from gpus.json,
and the driver's Xid line in the file that stands for the host's kernel log.

A systemd-nspawn host has no kernel log of its own (no /dev/kmsg; CAP_SYSLOG dropped, so dmesg and
klogctl answer "Operation not permitted"; its journald gets no kernel line, and ``logger``'s lines are
syslog ones that ``journalctl -k`` never shows: checked in an nspawn container of the lab's rootfs). So
an Xid is a line appended to the host's ``/var/log/gpudeploy-lab/kernel.log`` (the stand-in NVML names it
as ``STANDIN_KERNEL_LOG``), in ``journalctl -o short-unix`` form with the host's clock (the lab's hosts
share this machine's), and the NVML state that goes with it is written with it:

    79 (fell off the bus)           the GPU is lost: every NVML call for it raises NVMLError_GpuIsLost
    48, 94, 95 (uncorrected memory) one more uncorrected ECC error (volatile and aggregate), a row remap pending
    63 (row remap event)            a row remap pending
    64 (row remap failure)          a failed row remap
    92 (high corrected ECC rate)    100 more corrected ECC errors
    74 (NVLink)                     link 0 down (on a GPU with NVLink)
    119, 120 (GSP)                  the GPU needs a reset: NVMLError_ResetRequired

Usable on any root (a running host's mounted root, a test's temporary folder); ``control`` names the host.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from gpudeploy_lab.system import write_file

GUEST_GPUS_JSON = "etc/gpudeploy-lab/gpus.json"
GUEST_KERNEL_LOG = "var/log/gpudeploy-lab/kernel.log"

# What the driver writes after the Xid number (NVIDIA's words where a public log shows them; "lab" marks
# the lab's own where none does)
XID_TEXT = {
    79: "GPU has fallen off the bus.",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer (lab).",
    63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    64: "Row Remapper: row remapping failed (lab).",
    92: "High single-bit ECC error rate (lab).",
    94: "Contained: SM (0x1). RST: No, D-RST: No (lab).",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No (lab).",
    119: "Timeout after 45s of waiting for RPC response from GPU0 GSP! (lab)",
    154: "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
}
UNCORRECTED = (48, 94, 95)


def xid_line(at: float, hostname: str, pci_bus_id: str, xid: int, text: str | None = None,
             pid: int | None = None) -> str:
    """One kernel-log line as ``journalctl -o short-unix`` prints it: "1765103024.123456 lab2 kernel:
    NVRM: Xid (PCI:0000:1a:00): 79, GPU has fallen off the bus." (NVML's "00000000:1A:00.0" -> the
    driver's "0000:1a:00")."""
    domain, bus, rest = [*pci_bus_id.split(":"), "", "", ""][:3]
    device = rest.split(".")[0]
    where = f"PCI:{int(domain or '0', 16):04x}:{bus.lower()}:{device.lower()}"
    said = text if text is not None else XID_TEXT.get(xid, f"Xid {xid} injected by the gpudeploy lab")
    who = f"pid={pid}, name=python3, " if pid is not None else ""
    return f"{at:.6f} {hostname} kernel: NVRM: Xid ({where}): {xid}, {who}{said}"


def after_xid(health: dict[str, Any], xid: int) -> dict[str, Any]:
    """The stand-in NVML's "health" of a GPU once the driver logged ``xid`` for it (pure)."""
    h = dict(health)
    rows = list(h.get("remapped_rows") or [0, 0, 0, 0])
    if xid == 79:
        h["lost"] = True
    elif xid in UNCORRECTED:
        h["ecc_uncorrected_volatile"] = int(h.get("ecc_uncorrected_volatile") or 0) + 1
        h["ecc_uncorrected_aggregate"] = int(h.get("ecc_uncorrected_aggregate") or 0) + 1
        rows[2] = 1
    elif xid == 63:
        rows[2] = 1
    elif xid == 64:
        rows[3] = 1
    elif xid == 92:
        h["ecc_corrected_volatile"] = int(h.get("ecc_corrected_volatile") or 0) + 100
    elif xid == 74 and h.get("nvlink_links"):
        h["nvlink_down"] = sorted({*h.get("nvlink_down", []), 0})
    elif xid in (119, 120):
        h["reset_required"] = True
    if rows != [0, 0, 0, 0]:
        h["remapped_rows"] = rows
    return h


def _gpus(root: Path) -> dict[str, Any]:
    path = root / GUEST_GPUS_JSON
    try:
        doc: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: no stand-in GPUs there ({exc}); `invoke lab.nvml --restore` brings them "
                         "back") from None
    return doc


def _gpu(doc: dict[str, Any], gpu: int) -> dict[str, Any]:
    for g in doc.get("gpus", []):
        if int(g["index"]) == gpu:
            found: dict[str, Any] = g
            return found
    raise ValueError(f"no GPU {gpu} (the host's stand-in NVML has {len(doc.get('gpus', []))})")


def set_health(root: Path, gpu: int, **fields: Any) -> dict[str, Any]:
    """Merge ``fields`` into GPU ``gpu``'s "health" in the root's gpus.json (a None value removes the
    field); returns the GPU's health now. The next NVML init there reads it."""
    doc = _gpus(root)
    g = _gpu(doc, gpu)
    health = {k: v for k, v in {**(g.get("health") or {}), **fields}.items() if v is not None}
    if health:
        g["health"] = health
    else:
        g.pop("health", None)
    write_file(root / GUEST_GPUS_JSON, json.dumps(doc, indent=2) + "\n")
    return health


def inject_xid(root: Path, hostname: str, gpu: int, xid: int, text: str | None = None,
               pid: int | None = None, at: float | None = None) -> str:
    """The driver's Xid ``xid`` for GPU ``gpu``: its NVML state first, then its kernel-log line (a reader
    that sees the line finds the state that goes with it); returns the line."""
    doc = _gpus(root)
    g = _gpu(doc, gpu)
    line = xid_line(time.time() if at is None else at, hostname, str(g.get("pci_bus_id", "")), xid, text, pid)
    health = after_xid(g.get("health") or {}, xid)
    set_health(root, gpu, **{k: health.get(k) for k in {*health, *(g.get("health") or {})}})
    log = root / GUEST_KERNEL_LOG
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as f:  # one write: the follower never reads half a line as a whole one
        f.write(line + "\n")
    return line


def healthy_again(root: Path) -> None:
    """Every GPU healthy (no "health" in gpus.json) and an empty kernel log: a host just rebooted."""
    try:
        doc = _gpus(root)
    except ValueError:
        doc = None
    if doc is not None:
        for g in doc.get("gpus", []):
            g.pop("health", None)
        write_file(root / GUEST_GPUS_JSON, json.dumps(doc, indent=2) + "\n")
    (root / GUEST_KERNEL_LOG).unlink(missing_ok=True)
