"""Stand-in SGLang engine and router for lab hosts (no GPU, stdlib only).

Runs under Debian's ``/usr/bin/python3`` with nothing but the standard library and
``gpudeploy.flagspec``; it must never import other gpudeploy modules.

Entry points (through the shims in ``lab/shims``, put on PYTHONPATH together with ``src``):
  ``python3 -m sglang.launch_server ARGS``        -> :func:`gpudeploy_lab.standin.engine.main`
  ``python3 -m sglang_router.launch_router ARGS`` -> :func:`gpudeploy_lab.standin.router.main`
  ``import pynvml``                               -> ``lab/shims/pynvml.py`` (fake NVML)

Environment contract (all optional):
  SGLANG_STANDIN_VERSION            release the engine reports and whose captured flags it accepts
                                    (else the host's /etc/gpudeploy-lab/sglang.json, else "0.5.23")
  SGLANG_STANDIN_FLAGS_LIKE         captured release whose flags it accepts, whatever it reports
  GPUDEPLOY_LAB_SGLANG              that file ({"version": "0.5.99", "flags_like": "0.5.10"}: an
                                    uncaptured release with 0.5.10's flags; see release.py)
  SGLANG_STANDIN_SPEED              time scale; 1.0 = about 3 s from start to ready
  SGLANG_STANDIN_GPU_GIB            GPU size (NVML total, GiB) when no gpus.json exists (96)
  SGLANG_STANDIN_WEIGHTS_GIB        checkpoint size in GiB, all ranks together
                                    (else model.safetensors.index.json total_size, else 16)
  SGLANG_STANDIN_KV_BYTES_PER_TOKEN KV bytes per token per rank (else from config.json, else 65536)
  SGLANG_STANDIN_GRAPH_MIB_PER_BS   CUDA graph memory per captured batch size, MiB (4)
  SGLANG_STANDIN_GPU_PROCS_DIR      fake-NVML process records (/run/gpudeploy-lab/gpu-procs)
  SGLANG_STANDIN_FAULT              fault to inject, see ``FAULTS``
  SGLANG_STANDIN_FAULT_AFTER        seconds, for faults that happen after a delay
  SGLANG_STANDIN_FAULT_WHEN         a path: crash-after-ready and transfer-thread-dies wait for it to exist
                                    instead (a test says when, so no delay races the deploy's own gate)
  GPUDEPLOY_LAB_GPUS                GPU inventory JSON (/etc/gpudeploy-lab/gpus.json)
  CUDA_VISIBLE_DEVICES              indices or GPU UUIDs; rank r uses entry base_gpu_id + r * gpu_id_step

Log lines (stdout, one write per record), in SGLang 0.5.23's formats and order (checked line by line
against the real server: tests/standin/test_real_vs_standin.py, tests/verify/data/sglang-0.5.23-cpu/):
``[YYYY-MM-DD HH:MM:SS TPn] message`` from rank n's worker, the `` TPn`` only when tp > 1; the
launcher's own lines (``Received sigquit...``, ``The server is fired up and ready to roll!``) and
uvicorn's (``[...] INFO:     Uvicorn running on ...``) carry no tag. ``--device cpu`` starts as the real
CPU build does: host RAM (MemAvailable) as "avail mem", no GPU records, no CUDA graphs,
``available_cpu_mem``. A ``--model-path`` that is no folder and no valid hub repo id fails as the real
one does when HF_HUB_OFFLINE=1 (without it the stand-in takes any path for a downloaded model). A
child's death ends the launcher as 0.5.23's does: its SIGQUIT words, then SIGKILL to itself (exit -9);
a scheduler that dies silently before it is ready: "RuntimeError: Rank N scheduler died during
initialization (exit code: -9). ..." (exit 1), after: "Subprocess scheduler_N (pid=P) crashed with
exit code -9. ...".

Progress (rank 0, stderr, byte for byte what tqdm 4.70 writes; see progress.py): between ``Load weight
begin`` and ``Load weight end``, ``\rMulti-thread loading shards:  50% Completed | 2/4 [00:00<00:00,
3.98it/s]`` per update (0.5.23's default loader; no newline until the bar closes, so under systemd one
journal record); between ``Capture target decode CUDA graph begin. ...`` and its ``end`` line (0.5.23's;
``Capture cuda graph begin``/``end`` when SGLANG_STANDIN_VERSION is older),
``\rCapturing batches (bs=256 avail_mem=12.60 GB):  11%|█         | 4/36 [00:00<00:00, 35.32it/s]`` per
update, "\r" only, one "\n" when the bar closes (so under systemd one journal record for the whole
capture, unless the unit sets ``TQDM_BAR_FORMAT`` ending in a newline). Shards: the index's files,
else ``*.safetensors``, else one per 5 GB. Paced over the phases' durations (SGLANG_STANDIN_SPEED);
tqdm prints at most every 0.1 s (``TQDM_MININTERVAL``) except when the description changes (every
batch size).

Processes: the launcher (MainPID) + one ``python3 -m gpudeploy_lab.standin.worker`` per TP rank (named
``sglang::scheduler`` like the real one's, ``_TPn`` when tp > 1), each
writing ``$SGLANG_STANDIN_GPU_PROCS_DIR/<pid>.json`` = {"pid", "gpu", "used_bytes"} while it lives.
Workers exit when the launcher's pipe closes (launcher killed); a SIGKILLed worker's record stays
(the fake NVML skips dead PIDs).

Faults (SGLANG_STANDIN_FAULT; an unknown name exits 2):
  oom-graph          rank 0 fails mid CUDA graph capture: "Capture cuda graph failed: CUDA out of
                     memory. Tried to allocate 7.50 GiB. ..." + "Possible solutions:" lines
  oom-graph-spent    as oom-graph, with figures a real capture OOM has (less free than asked, whatever the
                     stand-in's own arithmetic left): "... Tried to allocate 2.00 GiB. GPU 0 has a total capacity
                     of ... of which 0.50 GiB is free. ..." (a field report that names no figures)
  oom-graph-field    the field report's MTP OOM: rank 1 (0 at TP1) dies mid capture with torch's text alone,
                     no "Capture cuda graph failed" wrapper: "torch.OutOfMemoryError: CUDA out of memory.
                     Tried to allocate 7.50 GiB. GPU 1 has a total capacity of 94.97 GiB of which 2.30 GiB is
                     free. ..." (the report's figures verbatim)
  kv-not-enough      "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."
  weights-oom        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate ..." while loading
  mamba-oom          "Not enough GPU memory for hybrid (mamba/linear-attention) state cache."
  silent-exit        exit 1 halfway through loading weights, printing nothing
  hang               stops after "Capture target decode CUDA graph begin" forever, port closed
  hang-warmup        HTTP up, /health 503 forever
  crash-after-ready  ready, then after SGLANG_STANDIN_FAULT_AFTER s (1), or once the file
                     SGLANG_STANDIN_FAULT_WHEN exists, rank 0 logs a CUDA illegal memory access and
                     the server dies (exit -9)
  crash-after-requests  dies under load: ready and serving; once it has taken SGLANG_STANDIN_FAULT_AFTER
                     generation requests (10), rank 0 logs the same CUDA illegal memory access and the
                     server dies (exit -9; the smoke generation before is request 1)
  transfer-thread-dies  ready, then after SGLANG_STANDIN_FAULT_AFTER s (1), or once the file
                     SGLANG_STANDIN_FAULT_WHEN exists, a prefill prints 0.5.23's death of
                     its mooncake transfer_worker thread ("RuntimeError: Transfer thread failed because of
                     ... Prefill instance with bootstrap_port=P is dead.") and goes on serving, as the real
                     one does (its transfers then hang; the stand-in's do not)
  ignore-sigterm     launcher and workers ignore SIGTERM
  worker-dies        rank 1 (0 at TP1) is SIGKILLed mid capture: "Rank 1 scheduler is dead. ..." exit 1
  leak-worker        the last rank double-forks into a new session and outlives the launcher,
                     keeping its GPU record (an orphaned scheduler)
  port-in-use        binding the HTTP port fails after loading: uvicorn's "ERROR:    [Errno 98] error while
                     attempting to bind on address ('H', P): address already in use", then "INFO:
                     Waiting for application shutdown." and the server hangs, deaf to SIGTERM, as
                     0.5.23 does; a really busy port does too
  nccl-error         rank 1 (0 at TP1) dies at start with "torch.distributed.DistBackendError: NCCL error"
  missing-module     rank 0 dies at start as a PD server whose Python lacks mooncake: "ModuleNotFoundError:
                     No module named 'mooncake'", then "ImportError: Please install mooncake by following
                     the instructions at ..." (0.5.23's words)
  generate-500       starts and gets ready normally, /health stays 200, but every generation request
                     (/generate, /v1/completions, /v1/chat/completions, streamed or not) answers HTTP 500
                     with SGLang's ErrorResponse JSON ({"object": "error", "message", "type", "param",
                     "code": 500}); each rank logs SGLang's failed-KV-transfer line ("Decode transfer
                     failed for request rank=N ... Failed to get kvcache from prefill instance, it might
                     be dead" on a decode, "Prefill transfer failed ..." on a prefill). Behind a router:
                     every /health is 200, the smoke generation fails (500 decode_internal_error)
Without a fault, numbers that do not fit fail the same ways (see memory.py): weights larger than the
GPU, --mem-fraction-static too low (KV rest <= 0), too little headroom for CUDA graphs, ranks whose free
memory differs by more than 10% ("The memory capacity is unbalanced", e.g. an orphan on one GPU).
"""

FAULTS = (
    "oom-graph",
    "oom-graph-field",
    "oom-graph-spent",
    "kv-not-enough",
    "weights-oom",
    "mamba-oom",
    "silent-exit",
    "hang",
    "hang-warmup",
    "crash-after-ready",
    "transfer-thread-dies",
    "crash-after-requests",
    "ignore-sigterm",
    "worker-dies",
    "leak-worker",
    "port-in-use",
    "nccl-error",
    "missing-module",
    "generate-500",
)
