"""Free memory per rank before SGLang loads the weights, from what kind of GPU it is.

``P`` (SGLang's "Load weight begin. avail mem") = the GPU's total as torch sees it, less the CUDA
context and the first torch allocations of the process, less what ``torch.distributed``/NCCL take
when TP > 1. Measured, each in its own log (GiB; torch totals: H200 139.80, RTX 4090 23.64):

  H200, TP1, device run here (tests/memory/data/h200-graph-capture-2026-12-01.json): free at start
      139.286 of 139.801 -> context 0.52
  H200 class, TP8, sgl-project/sglang#11716: "Init torch distributed ends. mem usage=2.01 GB",
      "Load weight begin. avail mem=137.34 GB" -> context 0.45 + 0.25 per rank for NCCL
  RTX 4090, TP1, sgl-project/sglang#3419: "Load weight begin. avail mem=23.16 GB" -> context 0.48
  RTX 4090 under WSL2 / docker, allenai/olmocr#105 and sgl-project/sglang#4895: "avail mem=22.46 GB" -> 1.18
  a desktop card also driving a display: "Windows (the OS) was taking around 1GB" (sgl-project/sglang#4840)
  RTX PRO 6000 under WSL2 (sgl-project/sglang#24364): ~16 GiB of hidden driver memory, where native
      Linux takes 1-2 GiB on the same card, and the free memory CUDA reports does not show it: no reading
      before the start does; the first failed allocation teaches the next plan (:mod:`.learn`)

So datacenter cards (HBM, NVSwitch) are known to +-0.1 GiB and take NCCL's NVLink-SHARP buffers
(0.25 GiB per rank up to 8); PCIe and desktop cards lose 0.5-1.2 GiB to the context and take less for
NCCL (no NVLS; not measured: assumed 0.1 GiB per rank). A capacity that several kinds share (96 GB:
the H20 is HBM/NVSwitch, the RTX PRO 6000 is PCIe) gets the range of both. At deploy time NVML names
the GPU and says what is free (another process's memory, a display's), and that replaces all of this
(:func:`preload_from_nvml`).
"""

from __future__ import annotations

from dataclasses import dataclass

NVLS_GIB_PER_RANK = 0.25      # sglang#11716: 2.01 GiB at TP8
PCIE_NCCL_GIB_PER_RANK = 0.1  # assumed: NCCL without NVLS buffers


@dataclass(frozen=True)
class GpuClass:
    """What a kind of GPU takes before the weights load, and how well that is known (GiB)."""

    name: str
    context_gib: float            # CUDA context and torch's first allocations (middle of the range)
    context_band_gib: float       # +- around it
    nccl_gib_per_rank: float      # torch.distributed init per rank at TP > 1 (up to 8 ranks)
    nccl_band_per_rank: float
    hopper: bool | None           # 0.4.6 - 0.4.9 default to FA3 on Hopper; None: cannot tell
    measured: bool = False        # the figures were read for this very GPU (NVML at deploy)

    def preload_free(self, capacity_gib: float, tp: int) -> tuple[float, float]:
        """(P, its band) for a rank of a TP group on this class."""
        ranks = min(tp, 8) if tp > 1 else 0
        p = capacity_gib - self.context_gib - self.nccl_gib_per_rank * ranks
        return p, self.context_band_gib + self.nccl_band_per_rank * ranks


DATACENTER = GpuClass("datacenter Hopper (HBM, NVSwitch)", 0.5, 0.1, NVLS_GIB_PER_RANK, 0.05, True)
DATACENTER_OTHER = GpuClass("datacenter Ampere/Blackwell (HBM, NVSwitch)", 0.5, 0.1, NVLS_GIB_PER_RANK, 0.05, False)
_BY_CAPACITY: tuple[tuple[float, GpuClass], ...] = (
    (33.0, GpuClass("desktop or workstation (24-32 GB, PCIe)", 0.85, 0.4, PCIE_NCCL_GIB_PER_RANK, 0.1, False)),
    (60.0, GpuClass("48 GB PCIe (L40S, A6000, RTX 6000 Ada) or A100 40 GB", 0.85, 0.4,
                    PCIE_NCCL_GIB_PER_RANK, 0.15, False)),
    (90.0, GpuClass("80 GB datacenter (H100, A100, H800)", 0.5, 0.1, NVLS_GIB_PER_RANK, 0.05, True)),
    (100.0, GpuClass("96 GB: H20 (HBM, NVSwitch) or RTX PRO 6000 / H100 NVL (PCIe)", 0.85, 0.4,
                     0.5 * (NVLS_GIB_PER_RANK + PCIE_NCCL_GIB_PER_RANK), 0.1, None)),
    (150.0, GpuClass("141 GB datacenter (H200)", 0.5, 0.1, NVLS_GIB_PER_RANK, 0.05, True)),
    (float("inf"), GpuClass("180 GB+ datacenter (B200, B300, MI300X)", 0.5, 0.2, NVLS_GIB_PER_RANK, 0.05, False)),
)
# NVML names -> the kind, for deploy time (substrings, first match)
_BY_NAME: tuple[tuple[str, GpuClass], ...] = (
    ("H100 NVL", GpuClass("H100 NVL (PCIe, NVLink bridge)", 0.85, 0.4, PCIE_NCCL_GIB_PER_RANK, 0.1, True)),
    ("H100", DATACENTER), ("H200", DATACENTER), ("H20", DATACENTER), ("H800", DATACENTER),
    ("A100", DATACENTER_OTHER), ("B200", DATACENTER_OTHER), ("B300", DATACENTER_OTHER),
    ("RTX", GpuClass("workstation or desktop (PCIe)", 0.85, 0.4, PCIE_NCCL_GIB_PER_RANK, 0.1, False)),
    ("L40", GpuClass("PCIe datacenter (L40/L40S)", 0.85, 0.4, PCIE_NCCL_GIB_PER_RANK, 0.1, False)),
    ("L20", GpuClass("PCIe datacenter (L20)", 0.85, 0.4, PCIE_NCCL_GIB_PER_RANK, 0.1, False)),
    ("L4", GpuClass("PCIe datacenter (L4)", 0.85, 0.4, PCIE_NCCL_GIB_PER_RANK, 0.1, False)),
    ("A10", GpuClass("PCIe datacenter (A10)", 0.85, 0.4, PCIE_NCCL_GIB_PER_RANK, 0.1, False)),
)


def gpu_class(capacity_gib: float, name: str | None = None) -> GpuClass:
    """The kind of GPU: by NVML's name when known, else by its memory (torch's total, GiB)."""
    if name:
        for key, cls in _BY_NAME:
            if key in name:
                return cls
    for below, cls in _BY_CAPACITY:
        if capacity_gib < below:
            return cls
    raise AssertionError("the last class is unbounded")


def preload_from_nvml(free_gib: float, tp: int, name: str | None, capacity_gib: float) -> tuple[float, float]:
    """(P, band) from what NVML says is free on the GPU right before the start: the engine's own CUDA
    context and NCCL buffers still come off it (NVML's free already excludes everything else)."""
    cls = gpu_class(capacity_gib, name)
    ranks = min(tp, 8) if tp > 1 else 0
    p = free_gib - cls.context_gib - cls.nccl_gib_per_rank * ranks
    return p, cls.context_band_gib + cls.nccl_band_per_rank * ranks
