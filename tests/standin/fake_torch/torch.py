"""A test double of the few torch calls gpudeploy_lab.gpu_standin makes on a GPU (no GPU here).

The same names and shapes as torch 2.x: ``torch.cuda.set_device`` (invalid ordinal raises),
``torch.cuda.mem_get_info(i) -> (free, total)``, ``torch.cuda.get_device_properties(i).uuid`` (prints
without "GPU-", like torch's _CUuuid), ``torch.empty(n, dtype=torch.uint8, device=torch.device("cuda", i))``,
``Tensor.zero_()``, ``torch.cuda.synchronize(i)`` and ``torch.OutOfMemoryError`` with torch's wording.
FAKE_TORCH_GPUS (default 1) devices of 139.80 GiB; this process holds 518 MiB once it touched one.
"""

from __future__ import annotations

import os
import types
from typing import Any

GIB = 1 << 30
TOTAL = 150_109_880_320
CONTEXT = 518 << 20
uint8 = "uint8"
_used: dict[int, int] = {}
_current = [0]


class OutOfMemoryError(RuntimeError):
    pass


class AcceleratorError(RuntimeError):
    pass


class device:
    def __init__(self, kind: str, index: int = 0) -> None:
        self.type, self.index = kind, index


def _count() -> int:
    return int(os.environ.get("FAKE_TORCH_GPUS", "1"))


def _touch(i: int) -> None:
    if not 0 <= i < _count():
        raise AcceleratorError("CUDA error: invalid device ordinal")
    _used.setdefault(i, CONTEXT)


class Tensor:
    def __init__(self, n: int, i: int) -> None:
        self.n, self.i = n, i

    def zero_(self) -> Tensor:
        return self


def _size(n: float) -> str:
    return f"{n / GIB:.2f} GiB" if n > 1 << 30 else f"{n / (1 << 20):.2f} MiB"


def empty(n: int, dtype: Any = None, device: device | None = None) -> Tensor:
    i = device.index if device is not None else _current[0]
    _touch(i)
    free = TOTAL - _used[i]
    if n > free:
        raise OutOfMemoryError(
            f"CUDA out of memory. Tried to allocate {_size(n)}. GPU {i} has a total capacity of {_size(TOTAL)} "
            f"of which {_size(free)} is free. Including non-PyTorch memory, this process has {_size(_used[i])} "
            "memory in use.")
    _used[i] += n
    return Tensor(n, i)


class _Uuid:
    def __init__(self, i: int) -> None:
        self.i = i

    def __str__(self) -> str:
        return f"6e92d042-f5db-2c0f-70df-fc4595ae{self.i:04x}"


def _set_device(i: int) -> None:
    _touch(i)
    _current[0] = i


def _mem_get_info(i: int | None = None) -> tuple[int, int]:
    i = _current[0] if i is None else i
    _touch(i)
    return TOTAL - _used[i], TOTAL


cuda = types.SimpleNamespace(
    set_device=_set_device,
    mem_get_info=_mem_get_info,
    get_device_properties=lambda i: types.SimpleNamespace(name="NVIDIA H200", uuid=_Uuid(i), total_memory=TOTAL),
    synchronize=lambda i=None: None,
    is_available=lambda: True,
    device_count=_count,
)
