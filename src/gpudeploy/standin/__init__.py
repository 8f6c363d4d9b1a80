"""Stand-in SGLang engine and router for lab hosts (no GPU, stdlib only).

Runs under Debian's ``/usr/bin/python3`` with nothing but the standard library and
``gpudeploy.flagspec``; it must never import other gpudeploy modules.

Entry points (through the shims in ``lab/shims``, put on PYTHONPATH together with ``src``):
  ``python3 -m sglang.launch_server ARGS``        -> :func:`gpudeploy.standin.engine.main`
  ``python3 -m sglang_router.launch_router ARGS`` -> :func:`gpudeploy.standin.router.main`
  ``import pynvml``                               -> ``lab/shims/pynvml.py`` (fake NVML)

Environment contract (all optional):
  SGLANG_STANDIN_VERSION            release whose captured flags the engine accepts ("0.5.23")
  SGLANG_STANDIN_SPEED              time scale; 1.0 = about 3 s from start to ready
  SGLANG_STANDIN_GPU_GIB            GPU size (NVML total, GiB) when no gpus.json exists (96)
  SGLANG_STANDIN_WEIGHTS_GIB        checkpoint size in GiB, all ranks together
                                    (else model.safetensors.index.json total_size, else 16)
  SGLANG_STANDIN_KV_BYTES_PER_TOKEN KV bytes per token per rank (else from config.json, else 65536)
  SGLANG_STANDIN_GRAPH_MIB_PER_BS   CUDA graph memory per captured batch size, MiB (4)
  SGLANG_STANDIN_GPU_PROCS_DIR      fake-NVML process records (/run/gpudeploy-lab/gpu-procs)
  SGLANG_STANDIN_FAULT              fault to inject, see ``FAULTS``
  SGLANG_STANDIN_FAULT_AFTER        seconds, for faults that happen after a delay
  GPUDEPLOY_LAB_GPUS                GPU inventory JSON (/etc/gpudeploy-lab/gpus.json)
"""

FAULTS = (
    "oom-graph",
    "kv-not-enough",
    "weights-oom",
    "mamba-oom",
    "silent-exit",
    "hang",
    "hang-warmup",
    "crash-after-ready",
    "ignore-sigterm",
    "worker-dies",
    "leak-worker",
    "port-in-use",
    "nccl-error",
)
