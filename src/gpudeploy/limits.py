"""The ranges of the numbers a user writes for time and GPU memory, each a ``check`` for
:meth:`gpudeploy.yamlsrc.Checker.get`: the message it returns is the problem at the key's line.

Seconds (``stop_timeout_s``, ``health.*``, ``smoke.timeout_s``, ``ssh.connect_timeout_s``, an
experiment's ``benchmark.timeout_s``): more than 0 and at most a day. YAML reads ``.inf`` as a
number, and an endless wait is no setting: ``stop_timeout_s: .inf`` rendered ``TimeoutStopSec=infs``,
which systemd ignores, the process supervisor never sent SIGKILL to a server that ignores SIGTERM,
and a client timer given it died with an OverflowError. No wait of gpudeploy's needs a day (the
longest in this repository is 2400 s, a large checkpoint's start); a larger figure is a typo, or
milliseconds.

GPU memory (``gpu_memory_gib``): at least 1 GiB, since CUDA keeps about 0.6 GiB of every GPU
(:data:`gpudeploy.plan.memcheck.CUDA_RESERVED_GIB`) and the memory model needs the rest to be
more than nothing, and at most 4096 GiB: the largest GPU has 288 GB, and a larger figure is
nvidia-smi's, which is in MiB.
"""

from __future__ import annotations

import math

MAX_WAIT_S = 86400.0
GPU_GIB_RANGE = (1.0, 4096.0)


def seconds_problem(v: float) -> str | None:
    """What is wrong with ``v`` as a number of seconds to wait, or None."""
    if isinstance(v, float) and not math.isfinite(v):
        return f"must be a finite number of seconds, got {v!r}"
    if v <= 0:
        return f"must be a positive number of seconds, got {v!r}"
    if v > MAX_WAIT_S:
        return f"must be at most {MAX_WAIT_S:.0f} seconds (a day), got {v!r}"
    return None


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
