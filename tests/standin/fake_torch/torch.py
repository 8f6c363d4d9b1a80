"""A test double of the few torch calls gpudeploy_lab.gpu_standin makes on a GPU (no GPU here).

The same names and shapes as torch 2.x: ``torch.cuda.set_device`` (invalid ordinal raises),
``torch.cuda.mem_get_info(i) -> (free, total)``, ``torch.cuda.get_device_properties(i).uuid`` (prints
without "GPU-", like torch's _CUuuid), ``torch.empty(n, dtype=torch.uint8, device=torch.device("cuda", i))``,
``Tensor.zero_()``, ``torch.cuda.synchronize(i)`` and ``torch.OutOfMemoryError`` with torch's wording.
FAKE_TORCH_GPUS (default 1) devices of 139.80 GiB; this process holds 518 MiB once it touched one.

``torch.distributed``: ``init_process_group("nccl", init_method="tcp://H:P", rank, world_size,
device_id)`` (refused unless NVLink multicast is off, as the device requires) and ``all_reduce(t)``,
which really sums over the group's processes: each rank writes its tensor's value to a file in a
folder named by the rendezvous port and waits for the others' (``torch.full``/``torch.ones`` of one
value; ``min``/``max``/``item``/``[0]``).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
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


float32 = "float32"


class Tensor:
    def __init__(self, n: int, i: int, value: float = 0.0) -> None:
        self.n, self.i, self.value = n, i, value

    def zero_(self) -> Tensor:
        self.value = 0.0
        return self

    def min(self) -> Tensor:
        return self

    def max(self) -> Tensor:
        return self

    def item(self) -> float:
        return self.value

    def __getitem__(self, k: int) -> Tensor:
        return self


def full(shape: tuple[int, ...], value: float, dtype: Any = None, device: device | None = None) -> Tensor:
    t = empty(shape[0] * 4, device=device)
    t.value = float(value)
    return t


def ones(n: int, dtype: Any = None, device: device | None = None) -> Tensor:
    return full((n,), 1.0, device=device)


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


_group: dict[str, Any] = {}


def _init_process_group(backend: str, init_method: str, rank: int, world_size: int, device_id: Any = None) -> None:
    off = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    if any(os.environ.get(k) != v for k, v in off.items()):
        raise RuntimeError("fake torch: NVLink multicast must be off (" + ", ".join(f"{k}={v}" for k, v in off.items())
                           + ")")
    port = init_method.rsplit(":", 1)[1]
    _group.update(backend=backend, rank=rank, world=world_size, calls=0,
                  folder=os.path.join(tempfile.gettempdir(), f"fake-torch-dist-{os.getppid()}-{port}"))


def _all_reduce(t: Tensor) -> None:
    g = _group
    call = os.path.join(g["folder"], str(g["calls"]))
    g["calls"] += 1
    os.makedirs(call, exist_ok=True)
    tmp = os.path.join(call, f".{g['rank']}")
    with open(tmp, "w") as f:
        f.write(repr(t.value))
    os.replace(tmp, os.path.join(call, str(g["rank"])))
    deadline = time.monotonic() + 20
    while True:
        names = [n for n in os.listdir(call) if not n.startswith(".")]
        if len(names) >= g["world"]:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"fake torch: all_reduce waited 20 s for {g['world']} ranks, saw {len(names)}")
        time.sleep(0.01)
    total = 0.0
    for n in names:
        with open(os.path.join(call, n)) as f:
            total += float(f.read())
    t.value = total


distributed = types.ModuleType("torch.distributed")
distributed.init_process_group = _init_process_group  # type: ignore[attr-defined]
distributed.all_reduce = _all_reduce  # type: ignore[attr-defined]
sys.modules["torch.distributed"] = distributed
