"""The stand-in ``python3 -m sglang.launch_server``: SGLang as seen from outside, without a GPU.

One process per TP rank (:mod:`gpudeploy_lab.standin.worker`) prints the rank's startup log lines and
registers fake GPU memory; this process plans the numbers, watches the ranks, then serves HTTP:

  loading weights / KV cache / CUDA graphs   port closed
  HTTP up, warmup                            /health 503, /v1/models /model_info /server_info 200
  ready                                      /health 200, "The server is fired up and ready to roll!"
  SIGTERM                                    /health 503, workers terminated, exit 0

A rank that dies makes this process log like SGLang 0.5.23 and end as it does, killing the other ranks:
after a rank's exception SIGKILL to itself (exit -9), after a rank's silent death before ready exit 1.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpudeploy_lab.standin import FAULTS, api, progress
from gpudeploy_lab.standin.common import (
    CUDA_CONTEXT_BYTES,
    GIB,
    as_float,
    as_int,
    at_least,
    build_parser,
    default_gpu_bytes,
    emit,
    env_float,
    fault,
    host_available_bytes,
    human_readable_int,
    live_records,
    load_gpus,
    opt,
    print_captured_help,
    raw,
    remove_record,
    speed,
)
from gpudeploy_lab.standin.memory import (
    EnginePlan,
    EngineSettings,
    graph_oom_text,
    plan_cpu,
    plan_engine,
    read_model_info,
    resolve_gpus,
    torch_oom,
)
from gpudeploy_lab.standin.release import DEFAULT_VERSION, sglang_release
from gpudeploy_lab.standin.world import World, listen_error

# Phase durations in seconds at SGLANG_STANDIN_SPEED=1.0 (about 3 s in all).
T_INIT, T_WEIGHTS, T_KV, T_GRAPH, T_WARMUP = 0.15, 1.0, 0.2, 1.0, 0.5
# 0.5.23 imports its model classes between "Memory baseline taken." and "Load weight begin" (its
# "Ignore import error when loading sglang.srt.models.*" lines: 1-6 s on the CPU build)
T_IMPORTS = 0.5

SITE = "/usr/local/lib/python3.12/dist-packages/sglang/srt"
FRAMES = {
    "init": [("managers/scheduler.py", 3052, "run_scheduler_process", "scheduler = Scheduler("),
             ("model_executor/model_runner.py", 512, "init_torch_distributed",
              "min_per_gpu_memory = get_available_gpu_memory(")],
    "weights": [("managers/scheduler.py", 3052, "run_scheduler_process", "scheduler = Scheduler("),
                ("model_executor/model_runner.py", 921, "load_model",
                 "self.model = get_model("),
                ("model_loader/loader.py", 684, "load_weights_and_postprocess",
                 "model.load_weights(weights)")],
    "kv": [("managers/scheduler.py", 3052, "run_scheduler_process", "scheduler = Scheduler("),
           ("model_executor/model_runner.py", 1873, "init_memory_pool",
            'raise RuntimeError(')],
    "mamba": [("managers/scheduler.py", 3052, "run_scheduler_process", "scheduler = Scheduler("),
              ("model_executor/model_runner.py", 1790, "init_memory_pool",
               "raise RuntimeError(")],
    # torch's own OOM raised inside a capture, with no "Capture cuda graph failed" wrapper around it
    "graph-torch": [("managers/scheduler.py", 3052, "run_scheduler_process", "scheduler = Scheduler("),
                    ("model_executor/model_runner.py", 2101, "init_device_graphs",
                     "self.graph_runner = graph_runners[self.device](self)"),
                    ("model_executor/cuda_graph_runner.py", 402, "capture",
                     ") = self.capture_one_batch_size(bs, forward)"),
                    ("model_executor/cuda_graph_runner.py", 571, "capture_one_batch_size", "run_once()")],
    "graph": [("managers/scheduler.py", 3052, "run_scheduler_process", "scheduler = Scheduler("),
              ("model_executor/model_runner.py", 2101, "init_device_graphs",
               "self.graph_runner = graph_runners[self.device](self)"),
              ("model_executor/cuda_graph_runner.py", 410, "__init__", "raise Exception(")],
    "nccl": [("managers/scheduler.py", 3052, "run_scheduler_process", "scheduler = Scheduler("),
             ("distributed/parallel_state.py", 1301, "init_distributed_environment",
              "torch.distributed.barrier(group=_WORLD.cpu_group)")],
    "broadcast": [("managers/scheduler.py", 3070, "run_scheduler_process", "scheduler.event_loop_overlap()"),
                  ("managers/scheduler.py", 1102, "event_loop_overlap", "recv_reqs = self.recv_requests()"),
                  ("managers/scheduler.py", 1190, "recv_requests", "recv_reqs = broadcast_pyobj("),
                  ("utils/common.py", 1455, "broadcast_pyobj",
                   "dist.broadcast(tensor_size, src=src, group=dist_group)"),
                  ("/usr/local/lib/python3.12/dist-packages/torch/distributed/distributed_c10d.py", 2974,
                   "broadcast", "work.wait()")],
    # 0.5.23's PD server without mooncake (tests/verify/data/sglang-0.5.23-cpu/missing-module.log)
    "mooncake": [("distributed/device_communicators/mooncake_transfer_engine.py", 120, "__init__",
                  "from mooncake.engine import TransferEngine")],
    "run": [("managers/scheduler.py", 3070, "run_scheduler_process", "scheduler.event_loop_overlap()"),
            ("managers/scheduler.py", 1120, "event_loop_overlap",
             "batch_result = self.run_batch(batch)")],
}

NCCL_TEXT = (
    "torch.distributed.DistBackendError: NCCL error in: "
    "/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, unhandled system error "
    "(run with NCCL_DEBUG=INFO for details), NCCL version 2.27.3\n"
    "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error. \n"
    "Last error:\n"
    "socketStartConnect: Connect to 127.0.0.1<38273> failed : Software caused connection abort"
)
# gloo's words when the other end of a connection is gone (gloo/transport/tcp/pair.cc).
PEER_LOST_TEXT = ("RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] "
                  "Connection closed by peer {peer}")
CRASH_TEXT = (
    "torch.AcceleratorError: CUDA error: an illegal memory access was encountered\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
    "below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1"
)


# The field report's own OOM, verbatim up to "is free." (an MTP start at --mem-fraction-static 0.70
# on 96 GB GPUs, rank 1); the rest is torch's CUDACachingAllocator text with the figures that follow
FIELD_OOM_TEXT = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7.50 GiB. GPU 1 has a total capacity of "
    "94.97 GiB of which 2.30 GiB is free. Including non-PyTorch memory, this process has 92.67 GiB memory in use. "
    "Of the allocated memory 90.05 GiB is allocated by PyTorch, and 1.10 GiB is reserved by PyTorch but "
    "unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
    "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


# The rest of that log's traceback: SGLang's own words after the import failed (verbatim, paths of the
# stand-in's SITE).
MISSING_MOONCAKE_TEXT = (
    "ModuleNotFoundError: No module named 'mooncake'\n\n"
    "The above exception was the direct cause of the following exception:\n\n"
    "Traceback (most recent call last):\n"
    f'  File "{SITE}/managers/scheduler.py", line 6362, in run_scheduler_process\n'
    "    scheduler = Scheduler(server_args, port_args)\n"
    f'  File "{SITE}/distributed/bootstrap.py", line 143, in init_parallel_runtime\n'
    "    maybe_init_shared_mooncake_transfer_engine(gpu_id=get_device().gpu_id)\n"
    f'  File "{SITE}/distributed/device_communicators/mooncake_transfer_engine.py", line 122, in __init__\n'
    "    raise ImportError(\n"
    "ImportError: Please install mooncake by following the instructions at "
    "https://kvcache-ai.github.io/Mooncake/getting_started/build.html to run SGLang with MooncakeTransferEngine.\n")


def missing_model_text(path: str) -> str:
    """What 0.5.23 prints, before anything else, for a --model-path that is no folder and no valid
    hub repo id (tests/verify/data/sglang-0.5.23-cpu/missing-model.log, its frames shortened)."""
    said = (f"Repo id must be in the form 'repo_name' or 'namespace/repo_name': '{path}'. "
            "Use `repo_type` argument if needed.")
    hub = "/usr/local/lib/python3.12/dist-packages"
    chain = ("Traceback (most recent call last):\n"
             f'  File "{hub}/huggingface_hub/utils/_validators.py", line 133, in validate_repo_id\n'
             "    raise HFValidationError(\n"
             f"huggingface_hub.errors.HFValidationError: {said}\n\n"
             "The above exception was the direct cause of the following exception:\n\n"
             "Traceback (most recent call last):\n"
             f'  File "{SITE}/server_args.py", line 277, in resolve_once\n'
             "    run_resolution_pipeline(self)\n"
             f'  File "{hub}/transformers/utils/hub.py", line 595, in cached_files\n'
             '    raise OSError(f"{e}") from e\n'
             f"OSError: {said}")
    # the config is looked up twice (the second lookup in the first one's except): the chain twice
    return f"{chain}\n\nDuring handling of the above exception, another exception occurred:\n\n{chain}"


def scheduler_died_text(rank: int, code: int) -> str:
    """The launcher's traceback when a scheduler died before it was ready (0.5.23 entrypoints/engine.py
    _scheduler_died_error; scheduler-killed-while-starting.log, frames shortened)."""
    return ("Traceback (most recent call last):\n"
            f'  File "{SITE}/entrypoints/engine.py", line 2040, in _wait_for_scheduler_ready\n'
            "    raise _scheduler_died_error(j, scheduler_procs[j])\n"
            f"RuntimeError: Rank {rank} scheduler died during initialization (exit code: {code}). If exit code is -9 "
            "(SIGKILL), a common cause is the OS OOM killer. Run `dmesg -T | grep -i oom` to check.")


def scheduler_exception(phase: str, message: str) -> str:
    """``Scheduler hit an exception: Traceback ...`` as a scheduler logs it."""
    lines = ["Scheduler hit an exception: Traceback (most recent call last):"]
    for path, line, func, code in FRAMES[phase]:
        lines.append(f'  File "{path if path.startswith("/") else f"{SITE}/{path}"}", line {line}, in {func}')
        lines.append(f"    {code}")
    lines.append(message.rstrip("\n"))
    return "\n".join(lines)


def os_error_tail(what: str, e: OSError) -> list[str]:
    """The launcher's traceback when binding a port failed."""
    frames = {
        "http": [("entrypoints/http_server.py", 1521, "launch_server", "uvicorn.run("),
                 ("asyncio/base_events.py", 1536, "create_server", "sock.bind(sa)")],
        "bootstrap": [("disaggregation/common/conn.py", 412, "_run_server",
                       "self._loop.run_until_complete(self._runner.setup())"),
                      ("asyncio/base_events.py", 1536, "create_server", "sock.bind(sa)")],
    }[what]
    lines = ["Traceback (most recent call last):"]
    for path, line, func, code in frames:
        lines += [f'  File "{SITE}/{path}", line {line}, in {func}', f"    {code}"]
    lines.append(f"OSError: [Errno {e.errno}] {e.strerror or e}")
    return ["\n".join(lines)]


def gb(n: float) -> str:
    return f"{n / GIB:.2f}"


# ---------------------------------------------------------------------------------- settings


def settings_from(ns: argparse.Namespace) -> EngineSettings:
    g = ns.__dict__.get

    def opt_int(key: str) -> int | None:
        v = g(key)
        return None if v is None else as_int(v, 0)

    graph_bs = opt_int("cuda_graph_max_bs_decode")
    if graph_bs is None:
        graph_bs = opt_int("cuda_graph_max_bs")
    algo = g("speculative_algorithm")
    if isinstance(algo, str) and algo.upper() == "NEXTN":
        algo = "EAGLE"
    frac = g("mem_fraction_static")
    return EngineSettings(
        tp=max(1, as_int(opt(ns, "tp_size", "tensor_parallel_size"), 1)),
        pp=max(1, as_int(opt(ns, "pp_size", "pipeline_parallel_size"), 1)),
        base_gpu_id=as_int(g("base_gpu_id"), 0),
        gpu_id_step=max(1, as_int(g("gpu_id_step"), 1)),
        mem_fraction_static=None if frac is None else as_float(frac, 0.8),
        chunked_prefill_size=opt_int("chunked_prefill_size"),
        max_prefill_tokens=as_int(g("max_prefill_tokens"), 16384),
        max_running_requests=opt_int("max_running_requests"),
        max_total_tokens=opt_int("max_total_tokens"),
        context_length=opt_int("context_length"),
        cuda_graph_max_bs=graph_bs,
        disable_cuda_graph=bool(g("disable_cuda_graph"))
        or g("cuda_graph_backend_decode") == "disabled",
        speculative_algorithm=str(algo) if algo else None,
        kv_cache_dtype=str(g("kv_cache_dtype") or "auto"),
        mamba_strategy=str(g("mamba_radix_cache_strategy") or g("mamba_scheduler_strategy") or "auto"),
    )


def visible_devices(gpus: list[Any] | None) -> list[int] | None:
    """CUDA_VISIBLE_DEVICES as NVML indices (UUIDs resolved); None when unset."""
    raw_env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw_env is None:
        return None
    out: list[int] = []
    for item in raw_env.split(","):
        item = item.strip()
        if item.isdigit():
            out.append(int(item))
        elif item.startswith("GPU-") and gpus:
            match = [g.index for g in gpus if g.uuid == item]
            if not match:
                break
            out.append(match[0])
        else:
            break  # CUDA stops at the first invalid entry
    return out


def make_plan(ns: argparse.Namespace, s: EngineSettings, local_tp: int | None = None) -> EnginePlan:
    """This node's numbers: its own ``local_tp`` ranks (all of them on one node), each holding
    1/tp of the weights of the whole group. ``--device cpu``: the host's RAM, no GPU (plan_cpu)."""
    if str(ns.__dict__.get("device") or "") == "cpu":
        mine = s if local_tp is None else replace(s, tp=local_tp)
        model = read_model_info(str(opt(ns, "model_path", "model")), None, None, s.tp, s.kv_cache_dtype)
        weights_env = os.environ.get("SGLANG_STANDIN_WEIGHTS_GIB")
        if weights_env:
            model = replace(model, weights_bytes=int(as_float(weights_env, 0.0) * GIB))
        return plan_cpu(mine, model, host_available_bytes())
    inventory = load_gpus()
    gpus = inventory[1] if inventory else []
    totals = {g.index: g.memory_total_bytes for g in gpus}
    mine = s if local_tp is None else replace(s, tp=local_tp)
    per_rank = resolve_gpus(visible_devices(gpus or None), mine, totals, default_gpu_bytes())
    others: dict[int, int] = {}
    for rec in live_records(exclude=[os.getpid()]):
        others[rec["gpu"]] = others.get(rec["gpu"], 0) + rec["used_bytes"]
    weights_env = os.environ.get("SGLANG_STANDIN_WEIGHTS_GIB")
    kv_env = os.environ.get("SGLANG_STANDIN_KV_BYTES_PER_TOKEN")
    model = read_model_info(
        str(opt(ns, "model_path", "model")), as_float(weights_env, 16.0) if weights_env else None,
        as_int(kv_env, 65536) if kv_env else None, s.tp, s.kv_cache_dtype)
    return plan_engine(s, model, per_rank, others,
                       graph_mib_per_bs=env_float("SGLANG_STANDIN_GRAPH_MIB_PER_BS", 4.0))


# ------------------------------------------------------------------------------------ scripts


def checkpoint_shards(model_path: str, weights_bytes: int) -> int:
    """How many files SGLang's loader walks (each rank walks them all): the files the
    ``model.safetensors.index.json`` weight map names, else the ``*.safetensors`` in the folder, else
    one per 5 GB (Hugging Face's default ``max_shard_size``: Llama-3.1-8B has 4, 70B has 30)."""
    root = Path(model_path)
    try:
        index = json.loads((root / "model.safetensors.index.json").read_text())
        files = set(index["weight_map"].values())
        if files:
            return len(files)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    try:
        found = len(list(root.glob("*.safetensors")))
    except OSError:
        found = 0
    return found or max(1, -(-weights_bytes // 5_000_000_000))


def rank_script(plan: EnginePlan, rank: int, flt: str, k: float, shards: int = 1,
                first_rank: int = 0, world: bool = False, tagged: bool | None = None,
                version: str = DEFAULT_VERSION) -> dict[str, Any]:
    """What rank ``rank`` prints, holds and signals, in order (see worker.py for the ops).

    Rank 0 also writes SGLang's two tqdm bars to stderr (see progress.py): checkpoint shards while
    loading weights, batch sizes while capturing CUDA graphs, each step at the phase's pace.
    On a node of a multi-node group, ``rank`` is the node's own rank, ``first_rank`` the group rank
    of its first (log tags are group ranks; only group rank 0 draws the bars), and with ``world``
    the rank waits in "Init torch distributed" until every node has joined. A rank's lines carry
    ``TPn`` only when the group has more than one rank (``tagged``; 0.5.23 scheduler.py
    configure_scheduler_process adds " TP{rank}" to the log prefix only if tp_size > 1).

    From ``version`` 0.5.23 on, the init and capture lines are that release's (``Init parallel begin.``,
    ``Capture target decode CUDA graph begin. ...``), before it 0.5.9's (``Init torch distributed
    begin.`` on a multi-node group only, ``Capture cuda graph begin. ...``).
    """
    new = at_least(version, (0, 5, 23))
    rp = plan.ranks[rank]
    tp = plan.settings.tp
    tag = f"TP{first_rank + rank}" if (tp > 1 if tagged is None else tagged) else ""
    cpu = plan.device == "cpu"
    title = "sglang::scheduler" + (f"_{tag}" if tag else "")
    acts: list[dict[str, Any]] = []
    fail = plan.failure if plan.failure and plan.failure.rank == rank else None
    victim = 1 if tp > 1 else 0  # the rank that worker-dies / nccl-error hit

    def log(text: str, elapsed: bool = False) -> None:
        acts.append({"op": "log", "text": text, "elapsed": elapsed})

    def sleep(s: float) -> None:
        if s > 0:
            acts.append({"op": "sleep", "s": s})

    def bar(do: str, **kw: Any) -> None:
        if rank == 0 and first_rank == 0:
            acts.append({"op": "bar", "do": do, **kw})

    def load_shards(fraction: float) -> None:
        """Load ``fraction`` of the checkpoint: one bar step per shard on rank 0."""
        per = T_WEIGHTS * k / shards
        done = int(shards * fraction) if rank == 0 and first_rank == 0 else 0
        for _ in range(done):
            sleep(per)
            bar("update")
        sleep(T_WEIGHTS * k * fraction - per * done)

    def die(phase: str, message: str) -> dict[str, Any]:
        acts.append({"op": "fail", "text": scheduler_exception(phase, message), "code": 1})
        return {"rank": rank, "gpu": rp.physical_gpu if rp.physical_gpu is not None else -1,
                "tag": tag, "actions": acts, "title": title}

    def done() -> dict[str, Any]:
        return {"rank": rank, "gpu": rp.physical_gpu if rp.physical_gpu is not None else -1,
                "tag": tag, "actions": acts, "title": title, "ignore_sigterm": flt == "ignore-sigterm",
                "crash_text": scheduler_exception("run", CRASH_TEXT),
                "peer_lost_text": scheduler_exception("broadcast", PEER_LOST_TEXT)}

    if flt == "leak-worker" and rank == tp - 1:
        acts.append({"op": "leak"})
    used = CUDA_CONTEXT_BYTES
    acts.append({"op": "mem", "bytes": used})
    if new:
        # 0.5.23 distributed/bootstrap.py init_parallel_runtime, then measure_pre_model_load_memory (two
        # free-memory reads in a row: 0.00 GB); the order of normal.log and sigstop-starting.log
        log("Init parallel begin.")
        acts.append({"op": "mark"})
    elif world:
        log("Init torch distributed begin.")
    if world:
        acts.append({"op": "world"})
    sleep(T_INIT * k)
    if fail and fail.phase == "init":
        return die("init", fail.message)
    if flt == "nccl-error" and rank == victim:
        sleep(T_INIT * k)
        return die("nccl", NCCL_TEXT)
    if flt == "missing-module" and rank == 0:
        return die("mooncake", MISSING_MOONCAKE_TEXT)
    if new:
        log("Init parallel ends. elapsed={elapsed} s", elapsed=True)
        log("Memory baseline taken. mem usage=0.00 GB")
        sleep(T_IMPORTS * k)

    log(f"Load weight begin. avail mem={gb(plan.avail_before)} GB")
    acts.append({"op": "mark"})
    bar("open", total=shards, desc=progress.SHARDS_DESC, format=progress.SHARDS_BAR_FORMAT)
    if flt == "silent-exit" and rank == 0:
        load_shards(0.5)
        acts.append({"op": "send", "msg": "silent"})
        acts.append({"op": "hang"})
        return done()
    if (fail and fail.phase == "weights") or (flt == "weights-oom" and rank == 0):
        load_shards(0.5)
        part = plan.weights_per_rank // 2
        acts.append({"op": "mem", "bytes": used + part})
        # forced: a shard that does not fit, as a real weights OOM reads (less free than it asks for)
        want = min(plan.weights_per_rank, 2 * GIB)
        message = fail.message if fail else torch_oom(want, rp, want // 4)
        return die("weights", message)
    load_shards(1.0)
    bar("close")
    used += plan.weights_per_rank
    acts.append({"op": "mem", "bytes": used})
    log(f"Load weight end. elapsed={{elapsed}} s, type={plan.model.model_class}, "
        f"avail mem={gb(plan.avail_after_weights)} GB, mem usage={gb(plan.weights_per_rank)} GB.",
        elapsed=True)
    acts.append({"op": "send", "msg": "weights"})

    sleep(T_KV * k)
    if (fail and fail.phase == "kv") or (flt == "kv-not-enough" and rank == 0):
        return die("kv", "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.")
    if (fail and fail.phase == "mamba") or (flt == "mamba-oom" and rank == 0):
        return die("mamba", fail.message if fail else (
            "RuntimeError: Not enough GPU memory for hybrid (mamba/linear-attention) state cache. "
            "Reduce --max-running-requests or increase --mem-fraction-static."))
    used += plan.kv_pool_bytes + plan.mamba_bytes + plan.req_to_token_bytes
    acts.append({"op": "mem", "bytes": used})
    tokens = plan.max_total_num_tokens
    # 0.5.23 mem_cache/memory_pool.py: "KV Cache is allocated. dtype: torch.float16, #tokens: 4096, K size:
    # 0.00 GB, V size: 0.00 GB" (normal.log), "... KV size: X GB" for MLA
    dtype = plan.model.kv_dtype
    if plan.model.mla:
        log(f"KV Cache is allocated. dtype: {dtype}, #tokens: {tokens}, KV size: {gb(plan.kv_pool_bytes)} GB")
    else:
        half = plan.kv_pool_bytes / 2
        log(f"KV Cache is allocated. dtype: {dtype}, #tokens: {tokens}, K size: {gb(half)} GB, V size: {gb(half)} GB")
    if plan.model.hybrid and plan.mamba_bytes:
        conv = plan.mamba_bytes * 0.05
        log(f"Mamba Cache is allocated. max_mamba_cache_size: {plan.max_mamba_cache_size}, "
            f"conv_state size: {gb(conv)}GB, ssm_state size: {gb(plan.mamba_bytes - conv)}GB")
    log(f"Memory pool end. avail mem={gb(plan.avail_after_pool)} GB")
    if rank == 0 and tokens < plan.context_len:  # 0.5.23 managers/tp_worker.py (kv-below-context.log)
        log(f"KV pool holds {tokens} tokens, fewer than --context-length {plan.context_len}. One full-length "
            "request cannot fit, so long requests will be refused or truncated at serving time. Lower "
            "--context-length, raise --mem-fraction-static, or free memory taken before the pool is sized.")

    sizes = plan.graph_batch_sizes
    if sizes:
        if new:  # 0.5.23 model_runner_components/cuda_graph_setup.py capture_decode_graph
            log("Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, "
                f"avail mem={gb(plan.avail_after_pool)} GB")
        else:
            log("Capture cuda graph begin. This can take up to several minutes. "
                f"avail mem={gb(plan.avail_after_pool)} GB")
        acts.append({"op": "mark"})
        n = len(sizes)
        bar("open", total=n)
        if flt == "hang":  # stuck capturing the first (largest) batch size
            bar("desc", text=progress.capture_desc(sizes[-1], plan.avail_after_pool / GIB))
            acts.append({"op": "hang"})
            return done()
        fail_at = n // 2 if ((fail and fail.phase == "graph") or (flt in ("oom-graph", "oom-graph-spent") and rank == 0)
                             or (flt == "oom-graph-field" and rank == victim)) else -1
        die_at = n // 2 if (flt == "worker-dies" and rank == victim) else -1
        # The other ranks capture in lockstep with the victim (every graph holds collectives): they
        # wait at its batch size, never finish the capture and go on to warmup without it.
        stuck_at = n // 2 if (flt == "oom-graph-field" and rank != victim) else -1
        for i, bs in enumerate(reversed(sizes), start=1):
            # cuda_graph_runner.py reads the free memory, then captures this batch size
            bar("desc", text=progress.capture_desc(bs, (plan.avail_after_pool - plan.graph_bytes * (i - 1) // n)
                                                    / GIB))
            sleep(T_GRAPH * k / n)
            if i == fail_at:  # the bar stays open: no newline before the scheduler's error
                if fail:
                    return die("graph", fail.message)
                if flt == "oom-graph-field":
                    return die("graph-torch", FIELD_OOM_TEXT)
                if flt == "oom-graph-spent":
                    # forced, as a real capture OOM reads: the headroom is spent (less free than it asks for),
                    # whatever the stand-in's own arithmetic left
                    return die("graph", "Exception: " + graph_oom_text(2 * GIB, rp, GIB // 2))
                free = plan.avail_after_pool - plan.graph_bytes * i // n
                return die("graph", "Exception: " + graph_oom_text(int(7.5 * GIB), rp, free))
            if i == die_at:
                acts.append({"op": "die", "signal": int(signal.SIGKILL)})
            if i == stuck_at:
                acts.append({"op": "hang"})
                return done()
            bar("step")
        bar("close")
        used += plan.graph_bytes
        acts.append({"op": "mem", "bytes": used})
        if new:
            log(f"Capture target decode CUDA graph end. bs={list(sizes)}, elapsed={{elapsed}} s, "
                f"mem usage={gb(plan.graph_bytes)} GB, avail mem={gb(plan.avail_after_graph)} GB.", elapsed=True)
        else:
            log(f"Capture cuda graph end. Time elapsed: {{elapsed}} s. mem usage={gb(plan.graph_bytes)} GB. "
                f"avail mem={gb(plan.avail_after_graph)} GB.", elapsed=True)
    if rank == 0 and first_rank == 0:
        log(f"max_total_num_tokens={tokens}, chunked_prefill_size={plan.chunked_prefill_size}, "
            f"max_prefill_tokens={plan.settings.max_prefill_tokens}, "
            f"max_running_requests={plan.max_running_requests}, context_len={plan.context_len}, "
            f"available_{'cpu' if cpu else 'gpu'}_mem={gb(plan.avail_after_graph)} GB")
    acts.append({"op": "send", "msg": "ready"})
    return done()


# ------------------------------------------------------------------------------------- engine


class Rank:
    def __init__(self, rank: int, proc: subprocess.Popen[bytes], status_r: int,
                 events: queue.Queue[tuple[int, str | None]]) -> None:
        self.rank = rank
        self.proc = proc
        self.errored = False
        self.eof = threading.Event()
        self.thread = threading.Thread(target=self._read, args=(status_r, events), daemon=True)
        self.thread.start()

    def _read(self, fd: int, events: queue.Queue[tuple[int, str | None]]) -> None:
        with os.fdopen(fd, "rb") as f:
            for line in f:
                msg = line.decode(errors="replace").strip()
                if msg == "error":
                    self.errored = True
                events.put((self.rank, msg))
        self.eof.set()
        events.put((self.rank, None))

    def command(self, cmd: str) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write((cmd + "\n").encode())
            self.proc.stdin.flush()
        except (OSError, ValueError):
            pass


def _src_root() -> str:
    return str(Path(__file__).resolve().parents[2])


class Engine:
    def __init__(self, ns: argparse.Namespace, version: str) -> None:
        self.ns = ns
        self.version = version
        self.settings = settings_from(ns)
        self.fault = fault()
        self.k = speed()
        self.host = str(ns.host or "127.0.0.1")
        self.port = as_int(ns.port, 30000)
        self.mode = str(ns.__dict__.get("disaggregation_mode") or "null")
        self.serving = False  # HTTP is up: a child's death is heard by the running-phase SIGQUIT handler
        self.schedulers_ready = False  # every rank sent "ready": the watchdog, not the init wait, hears deaths
        self.events: queue.Queue[tuple[int, str | None]] = queue.Queue()
        self.ranks: list[Rank] = []
        self.stop = threading.Event()
        self.httpd: api.QuietServer | None = None
        self.bootstrap: api.QuietServer | None = None
        # A group over several hosts: this node runs tp / nnodes ranks; node 0 leads (serves the API).
        self.nnodes = max(1, as_int(ns.__dict__.get("nnodes"), 1))
        self.node_rank = as_int(ns.__dict__.get("node_rank"), 0)
        self.local_tp = max(1, self.settings.tp // self.nnodes)
        self.first_rank = self.node_rank * self.local_tp
        self.world: World | None = None
        dist = ns.__dict__.get("dist_init_addr")
        if self.nnodes > 1 and dist:
            self.world = World(str(dist), self.nnodes, self.node_rank,
                               on_lost=lambda peer: self.events.put((-2, "lost " + peer)),
                               on_timeout=lambda text: self.events.put((-2, "timeout " + text)))
        self.plan = make_plan(ns, self.settings, self.local_tp)
        self.shards = checkpoint_shards(str(opt(ns, "model_path", "model")), self.plan.model.weights_bytes)
        served = ns.__dict__.get("served_model_name") or opt(ns, "model_path", "model")
        args = {k: _jsonable(v) for k, v in vars(ns).items()}
        args.update({"tp_size": self.settings.tp, "port": self.port, "host": self.host,
                     "mem_fraction_static": self.plan.mem_fraction_static,
                     "chunked_prefill_size": self.plan.chunked_prefill_size,
                     "max_running_requests": self.plan.max_running_requests,
                     "context_length": self.plan.context_len,
                     "served_model_name": served, "disaggregation_mode": self.mode})
        self.state = api.EngineState(
            served_model_name=str(served), mode=self.mode, version=version,
            context_len=self.plan.context_len, max_total_num_tokens=self.plan.max_total_num_tokens,
            server_args=args, model_type=self.plan.model.model_type,
            architectures=[self.plan.model.model_class], fault=self.fault, tp=self.settings.tp)

    # ---------------------------------------------------------------------------- lifecycle

    def spawn(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_src_root(), env.get("PYTHONPATH")) if p)
        for rank in range(self.local_tp):
            script = rank_script(self.plan, rank, self.fault, self.k, self.shards, self.first_rank,
                                 world=self.world is not None, tagged=self.settings.tp > 1,
                                 version=self.version)
            r_fd, w_fd = os.pipe()
            proc = subprocess.Popen(
                [sys.executable, "-m", "gpudeploy_lab.standin.worker", "--rank", str(rank),
                 "--status-fd", str(w_fd)],
                stdin=subprocess.PIPE, pass_fds=(w_fd,), env=env)
            os.close(w_fd)
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(script).encode() + b"\n")
            proc.stdin.flush()
            self.ranks.append(Rank(rank, proc, r_fd, self.events))
            self.state.scheduler_pids.append(proc.pid)

    def kill_workers(self, sig: int = signal.SIGKILL, grace: float = 0.0) -> None:
        for r in self.ranks:
            if r.proc.poll() is None:
                with contextlib.suppress(OSError):
                    r.proc.send_signal(sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(r.proc.poll() is None for r in self.ranks):
            time.sleep(0.01)
        for r in self.ranks:
            if r.proc.poll() is None:
                r.proc.kill()
            try:
                r.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                continue
            if r.proc.returncode < 0:
                remove_record(r.proc.pid)  # a killed child cannot tidy up; we do, like the driver

    def close_servers(self) -> None:
        for srv in (self.httpd, self.bootstrap):
            if srv is not None:
                srv.shutdown()
                srv.server_close()
        if self.world is not None:
            self.world.close()  # the other nodes' links break: they go down too, like gloo peers

    def fail(self, *lines: str) -> int:
        """Log, kill the tree, exit 1 (for what 0.5.23 has not been seen doing: a follower's port)."""
        for line in lines:
            emit(line)
        self.state.phase = "shutting_down"
        self.kill_workers()
        self.close_servers()
        return 1

    def child_failed(self) -> int:
        """0.5.23 after a child failed: its SIGQUIT handler's words, then kill_process_tree with itself
        included, which ends the launcher with SIGKILL (exit -9, "code=killed, status=9/KILL").

        Before HTTP is up it is the launch-phase handler (entrypoints/engine.py), after it the
        tokenizer manager's running-phase one, which first waits 5 s for "crash diagnostics"
        (managers/tokenizer_manager.py); the texts of kv-too-small.log and scheduler-killed-after-ready.log."""
        if not self.serving:
            emit("Received sigquit from a child process. It usually means the child failed.")
        else:
            emit("SIGQUIT received. signum=None, frame=None. It usually means one child failed.")
            emit("Sleeping 5 seconds before crash diagnostics to let GPU activity settle.")
            time.sleep(5 * self.k)
            if not any(r.proc.poll() is None for r in self.ranks):
                emit("No live scheduler processes found; skipping py-spy and CUDA coredump.")
        return self.kill_self()

    def kill_self(self) -> int:
        pid = os.getpid()
        emit(f"kill_process_tree called: parent_pid={pid}, include_parent=True, pid={pid}")
        self.state.phase = "shutting_down"
        self.kill_workers()
        self.close_servers()
        os.kill(pid, signal.SIGKILL)
        return 1  # not reached

    def child_died(self, r: Rank, code: int) -> int:
        """A rank ended without a word of its own (SIGKILL: the OOM killer, or a kill by hand)."""
        if not self.schedulers_ready:
            # the launcher's wait for its schedulers sees it and raises (exit 1)
            pid = os.getpid()
            emit(f"kill_process_tree called: parent_pid={pid}, include_parent=False, pid={pid}")
            raw(scheduler_died_text(r.rank, code))
            self.state.phase = "shutting_down"
            self.kill_workers()
            self.close_servers()
            return 1
        # then the watchdog (utils/watchdog.py, every second) sees it and sends the SIGQUIT
        emit(f"Subprocess scheduler_{r.rank} (pid={r.proc.pid}) crashed with exit code {code}. "
             "Triggering SIGQUIT for cleanup...")
        return self.child_failed()

    def hang_after_bind_failure(self) -> int:
        """0.5.23 when uvicorn cannot bind: it says so and "Waiting for application shutdown.", then
        neither exits nor answers SIGTERM (port-in-use.log: still there 180 s later, and 40 s after a
        SIGTERM); the schedulers live on. Only SIGKILL ends it."""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.state.phase = "shutting_down"
        threading.Event().wait()
        return 1  # not reached

    def serve(self, host: str, port: int, handler: type[api.BaseHandler]) -> api.QuietServer | OSError:
        """Start a server in a thread, or return the bind error."""
        try:
            if self.fault == "port-in-use" and port == self.port:
                raise OSError(errno.EADDRINUSE, os.strerror(errno.EADDRINUSE))
            srv = api.QuietServer(host, port, handler)
        except OSError as e:
            return e
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return srv

    @staticmethod
    def bind_error(host: str, port: int, e: OSError) -> str:
        """uvicorn's wording."""
        return (f"[Errno {e.errno}] error while attempting to bind on address ('{host}', {port}): "
                f"{(e.strerror or str(e)).lower()}")

    def start_bootstrap(self) -> None:
        """0.5.23 starts the KV bootstrap server in the launcher, before the schedulers (its line comes
        right after server_args, missing-module.log). A port it cannot bind is logged by its thread and
        the server goes on without it (disaggregation/common/conn.py _run_server)."""
        port = as_int(self.ns.__dict__.get("disaggregation_bootstrap_port"), 8998)
        srv = self.serve(self.host, port, BootstrapHandler)
        if isinstance(srv, OSError):
            emit(f"Server error: {self.bind_error(self.host, port, srv)}\n" + os_error_tail("bootstrap", srv)[0])
            return
        self.bootstrap = srv
        emit(f"CommonKVBootstrapServer started successfully on {self.host}:{port}")

    def start_http(self) -> OSError | None:
        # uvicorn's lines go through SGLang's logging format: "[2026-12-01 22:45:32] INFO:     Started
        # server process [21044]" (normal.log)
        emit(f"INFO:     Started server process [{os.getpid()}]")
        emit("INFO:     Waiting for application startup.")
        emit("INFO:     Application startup complete.")
        srv = self.serve(self.host, self.port, api.make_engine_handler(self.state))
        if isinstance(srv, OSError):
            emit(f"ERROR:    {self.bind_error(self.host, self.port, srv)}")
            emit("INFO:     Waiting for application shutdown.")
            return srv
        self.httpd = srv
        self.serving = True
        shown = f"[{self.host}]" if ":" in self.host else self.host
        emit(f"INFO:     Uvicorn running on http://{shown}:{self.port} (Press CTRL+C to quit)")
        return None

    def start_dummy_health(self) -> OSError | None:
        """A non-zero node of a group: no API, only SGLang's dummy /health once its ranks are ready."""
        srv = self.serve(self.host, self.port, api.DummyHealthHandler)
        if isinstance(srv, OSError):
            emit(f"ERROR:    {self.bind_error(self.host, self.port, srv)}")
            return srv
        self.httpd = srv
        self.state.phase = "ready"
        return None

    def group_event(self, msg: str) -> int | None:
        """The world's news: another node left (every rank's next broadcast fails), or never came."""
        word, _, rest = msg.partition(" ")
        if self.stop.is_set():
            return self.shutdown()
        if word == "lost":
            for r in self.ranks:
                r.command(f"peer-lost {rest}")
            return None
        emit(scheduler_exception("init", rest), self.tag(self.first_rank))
        return self.child_failed()

    def tag(self, rank: int) -> str:
        return f"TP{rank}" if self.settings.tp > 1 else ""

    def shutdown(self) -> int:
        self.state.phase = "shutting_down"
        if self.httpd is not None:
            # 0.5.23's SIGTERM handler and watchdog (managers/tokenizer_manager.py), then uvicorn (normal.log)
            pid = os.getpid()
            emit("SIGTERM received. signum=None frame=None. Draining requests and shutting down...")
            emit("Gracefully exiting... Remaining number of requests 0. Remaining requests remaining_rids=[].")
            emit(f"kill_process_tree called: parent_pid={pid}, include_parent=False, pid={pid}")
            emit("INFO:     Shutting down")
            emit("INFO:     Waiting for application shutdown.")
            emit("INFO:     Application shutdown complete.")
            emit(f"INFO:     Finished server process [{pid}]")
        self.close_servers()
        self.kill_workers(signal.SIGTERM, grace=0.5)
        return 0

    def run(self) -> int:
        emit(f"server_args={_args_dict(self.ns)!r}")
        if self.world is not None:
            err = self.world.start()
            if err is not None:
                emit(scheduler_exception("init", listen_error(self.world.port, err)), self.tag(0))
                return self.child_failed()
        if self.mode == "prefill" and self.node_rank == 0:
            self.start_bootstrap()
        self.spawn()
        tp = self.local_tp
        told_world = False
        weights: set[int] = set()
        ready: set[int] = set()
        warm_until: float | None = None
        crash_at: float | None = None
        crashed = False
        thread_dies_at: float | None = None
        thread_died = False
        trigger = os.environ.get("SGLANG_STANDIN_FAULT_WHEN")  # a path: the fault waits for it to exist
        while True:
            if self.stop.is_set():
                return self.shutdown()
            try:
                rank, msg = self.events.get(timeout=0.02)
            except queue.Empty:
                rank, msg = -1, None
            if self.world is not None and not told_world and self.world.joined.is_set():
                told_world = True
                for r in self.ranks:
                    r.command("world")
            if rank == -2 and msg:
                code = self.group_event(msg)
                if code is not None:
                    return code
                continue
            if msg == "silent":
                self.kill_workers()
                return 1
            if msg == "weights":
                weights.add(rank)
            elif msg == "ready":
                ready.add(rank)
                self.schedulers_ready = len(ready) == tp
                if len(ready) == tp and self.node_rank > 0:
                    err = self.start_dummy_health()
                    if err:
                        return self.fail(*os_error_tail("http", err))
                elif len(ready) == tp:
                    err = self.start_http()
                    if err:
                        return self.hang_after_bind_failure()
                    skip = bool(self.ns.__dict__.get("skip_server_warmup"))
                    warm_until = time.monotonic() + (0 if skip else T_WARMUP * self.k)
            for r in self.ranks:
                code = r.proc.poll()
                if code is None:
                    continue
                r.eof.wait(0.3)
                self._drain()
                if self.stop.is_set():
                    # systemd's control-group stop sends SIGTERM to every process at once: a
                    # worker that exited first is part of the shutdown, not a death.
                    return self.shutdown()
                if r.errored:
                    return self.child_failed()
                return self.child_died(r, code)
            now = time.monotonic()
            if warm_until is not None and now >= warm_until and self.state.phase == "warmup":
                if self.fault == "hang-warmup":
                    warm_until = None
                    continue
                self.state.phase = "ready"
                emit("The server is fired up and ready to roll!")  # the launcher's line: no rank tag
                if self.fault == "crash-after-ready" and not trigger:
                    crash_at = now + env_float("SGLANG_STANDIN_FAULT_AFTER", 1.0)
                if self.fault == "transfer-thread-dies" and not trigger:
                    thread_dies_at = now + env_float("SGLANG_STANDIN_FAULT_AFTER", 1.0)
            if (self.fault == "transfer-thread-dies" and not thread_died and self.state.phase == "ready"
                    and (os.path.exists(trigger) if trigger else thread_dies_at is not None and now >= thread_dies_at)):
                thread_died = True
                port = as_int(self.ns.__dict__.get("disaggregation_bootstrap_port"), 8998)
                raw(TRANSFER_THREAD_DIES.format(port=port))
            if (self.fault == "crash-after-requests" and not crashed and self.state.phase == "ready"
                    and self.state.requests >= env_float("SGLANG_STANDIN_FAULT_AFTER", 10.0)):
                crash_at = now
            if (self.fault == "crash-after-ready" and trigger and not crashed and self.state.phase == "ready"
                    and os.path.exists(trigger)):
                crash_at = now
            if crash_at is not None and not crashed and now >= crash_at:
                crashed = True
                self.ranks[0].command("crash")

    def _drain(self) -> None:
        while True:
            try:
                self.events.get_nowait()
            except queue.Empty:
                return


# 0.5.23's words when a prefill's mooncake transfer_worker thread dies (threading's excepthook, no
# log prefix), as a loaded lab run of the real CPU server printed them mid roll; the server lives on.
TRANSFER_THREAD_DIES = """Exception in thread Thread-5 (transfer_worker):
Traceback (most recent call last):
  File "/opt/sglang/srt/disaggregation/mooncake/conn.py", line 2857, in transfer_worker
    or self.check_status(kv_chunk.room) == KVPoll.Success
  File "/opt/sglang/srt/disaggregation/common/conn.py", line 609, in check_status
    return self.request_status[bootstrap_room]
           ~~~~~~~~~~~~~~~~~~~^^^^^^^^^^^^^^^^
KeyError: 658755885904621646
During handling of the above exception, another exception occurred:
Traceback (most recent call last):
  File "/usr/lib/python3.11/threading.py", line 1038, in _bootstrap_inner
    self.run()
  File "/opt/sglang/srt/disaggregation/mooncake/conn.py", line 2882, in transfer_worker
    raise RuntimeError(
RuntimeError: Transfer thread failed because of 658755885904621646. Prefill instance with bootstrap_port={port} \
is dead."""


class BootstrapHandler(api.BaseHandler):
    """The prefill server's KV bootstrap endpoint: answers, never used for real transfers here."""

    def do_GET(self) -> None:
        if self.path.startswith("/health"):
            self.send_bytes(200, b"OK", "text/plain")
        elif self.path.startswith("/route"):
            self.send_json(200, {})
        else:
            self.send_json(404, {"detail": "Not Found"})

    def do_PUT(self) -> None:
        self.read_body()
        self.send_bytes(200, b"OK", "text/plain")


def _jsonable(v: Any) -> Any:
    if isinstance(v, str):
        for conv in (int, float):
            try:
                return conv(v)
            except ValueError:
                pass
    return v


def _args_dict(ns: argparse.Namespace) -> dict[str, Any]:
    """The given arguments as 0.5.23's ``server_args={'model_path': ...}`` line shows them (it shows
    every field; the stand-in those it was given), the model first."""
    given = {k: _jsonable(v) for k, v in vars(ns).items() if v is not None}
    return {k: given[k] for k in sorted(given, key=lambda k: (k != "model_path", k))}


# The types 0.5.23 gives the flags the stand-in reads as numbers (its ServerArgs.add_cli_args, read from
# the real parser): its own human_readable_int for token counts, argparse's int and float for the rest.
# A value they refuse is refused with their words ("argument --max-total-tokens: Invalid integer value:
# 'abc'. ...", invalid-value.log; "argument --port: invalid int value: 'x'").
TYPES: dict[str, Any] = {
    "--max-total-tokens": human_readable_int, "--context-length": human_readable_int,
    "--max-prefill-tokens": human_readable_int, "--mem-fraction-static": float,
    **{f: int for f in ("--port", "--tp-size", "--pp-size", "--base-gpu-id", "--gpu-id-step", "--nnodes",
                        "--node-rank", "--chunked-prefill-size", "--max-running-requests", "--nccl-port",
                        "--cuda-graph-max-bs-decode", "--cuda-graph-max-bs", "--disaggregation-bootstrap-port")},
}


def main(argv: list[str] | None = None) -> int:
    try:
        version, flags_like = sglang_release()
    except ValueError as e:
        print(f"sglang stand-in: {e}", file=sys.stderr)
        return 2
    try:
        parser = build_parser("sglang", flags_like, prog="sglang serve", required=["--model-path"], types=TYPES)
    except KeyError:
        shown = version if flags_like == version else f"{version} (flags like {flags_like})"
        print(f"sglang stand-in: no captured flags for sglang {shown}", file=sys.stderr)
        return 2
    args = sys.argv[1:] if argv is None else argv
    if print_captured_help("sglang", flags_like, args):
        return 0
    if fault() and fault() not in FAULTS:
        print(f"sglang stand-in: unknown SGLANG_STANDIN_FAULT={fault()!r}; known: {', '.join(FAULTS)}",
              file=sys.stderr)
        return 2
    ns = parser.parse_args(args)
    model = str(opt(ns, "model_path", "model"))
    if os.environ.get("HF_HUB_OFFLINE") == "1" and not Path(model).is_dir() and model.count("/") > 1:
        # The stand-in takes any other path for a model it pretends to have downloaded.
        pid = os.getpid()
        emit(f"kill_process_tree called: parent_pid={pid}, include_parent=False, pid={pid}")
        raw(missing_model_text(model))
        return 1
    engine = Engine(ns, version)

    def on_term(signum: int, frame: object) -> None:
        engine.state.phase = "shutting_down"
        engine.stop.set()

    if engine.fault == "ignore-sigterm":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    return engine.run()


if __name__ == "__main__":
    raise SystemExit(main())
