"""The ranges of the numbers a user writes for GPU memory, each a ``check`` for
:meth:`gpudeploy.yamlsrc.Checker.get`: the message it returns is the problem at the key's line.

GPU memory (``gpu_memory_gib``): at least 1 GiB, since CUDA keeps about 0.6 GiB of every GPU
(:data:`gpudeploy.plan.memcheck.CUDA_RESERVED_GIB`) and the memory model needs the rest to be
more than nothing, and at most 4096 GiB: the largest GPU has 288 GB, and a larger figure is
nvidia-smi's, which is in MiB.
"""

from __future__ import annotations

import math

GPU_GIB_RANGE = (1.0, 4096.0)


def gpu_gib_problem(v: object) -> str | None:
    """What is wrong with ``v`` as one GPU's memory in GiB, or None."""
    least, most = GPU_GIB_RANGE
    if isinstance(v, bool) or not isinstance(v, int | float):
        return f"must be a number of GiB, got {v!r}"
    if isinstance(v, float) and not math.isfinite(v):
        return f"must be a finite number of GiB, got {v!r}"
    if v <= 0:
        return f"must be positive, got {v!r}"
    if v < least:
        return f"must be at least {least:g} GiB (CUDA itself keeps about 0.6 GiB of every GPU), got {v!r}"
    if v > most * 1024:
        return f"must be at most {most:g} GiB, got {v!r}"
    if v > most:
        return f"must be at most {most:g} GiB, got {v!r}: nvidia-smi's figures are MiB ({v / 1024:.1f} GiB)"
    return None
