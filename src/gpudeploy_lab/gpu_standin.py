"""A GPU stand-in engine: SGLang's process shape and log lines, with real GPU memory, no model.

    python3 -m gpudeploy_lab.gpu_standin --port P --tp N --gib G [--fault oom] [--dry-run]

For proofs on a real NVIDIA device (the H200 of the device tool) that gpudeploy deploys, watches and
tears down what a TP group of SGLang really looks like to the driver:

- This process (the launcher, like SGLang's main process) never touches CUDA. It starts one worker
  process per TP rank (``python3 -m gpudeploy_lab.gpu_standin --worker-rank R ...``), serves HTTP on
  ``--host``:``--port`` (127.0.0.1) from the start: ``/health`` (and ``/health_generate``) 503 until
  every rank is ready, then 200; 503 again while shutting down; ``/v1/models``, ``/server_info``
  (ranks, PIDs, GPU UUIDs) answer at once.
- Rank r uses CUDA device r of the process's ``CUDA_VISIBLE_DEVICES`` (as SGLang's ``--base-gpu-id 0``
  does) and allocates ``--gib`` GiB there with torch (``torch.empty`` on ``cuda:r``, zeroed: real
  cudaMalloc, seen by NVML as this PID's memory): ``--weights-share`` of it as "weights", the rest as
  "KV cache". It prints SGLang's lines with its rank tag and the real free memory of
  ``torch.cuda.mem_get_info`` (SGLang's "GB" is GiB)::

      [2026-12-01 10:00:00 TP0] GPU UUID of rank 0: GPU-6e92d042-f5db-2c0f-70df-fc4595ae00fc
      [2026-12-01 10:00:00 TP0] Load weight begin. avail mem=139.28 GB
      [2026-12-01 10:00:01 TP0] Load weight end. elapsed=0.21 s, type=GpuStandinForCausalLM, avail mem=135.28 GB,
          mem usage=4.00 GB.        (one line)
      [2026-12-01 10:00:01 TP0] KV Cache is allocated. #tokens: 49152, K size: 3.00 GB, V size: 3.00 GB
      [2026-12-01 10:00:01 TP0] Memory pool end. avail mem=129.28 GB
      [2026-12-01 10:00:01 TP0] max_total_num_tokens=49152, chunked_prefill_size=8192, ...
      [2026-12-01 10:00:01] The server is fired up and ready to roll!

  The launcher's own lines carry no rank tag (SGLang's HTTP process logs without one).
- The ranks form a real NCCL group before loading (as SGLang's "Init torch distributed"): rank r joins
  ``torch.distributed`` over TCP on 127.0.0.1:``--dist-port`` (the launcher picks a free one) with
  the NCCL backend and runs an all-reduce of 4 MiB; every rank checks the sum and logs
  ``NCCL all-reduce of N ranks: 4.00 MiB in X ms, sum ok``. NVLink multicast stays off
  (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1 are set for it):
  a group that uses it can put a shared host's GPUs out of service.
- ``--fault oom``: rank 0 asks for more than its GPU has (the GPU's total plus the weights), so torch
  raises its own ``torch.OutOfMemoryError: CUDA out of memory. Tried to allocate ... GiB. GPU 0 has a
  total capacity of ...``; the rank logs it as SGLang's scheduler does (``Scheduler hit an exception:
  Traceback ...``), the launcher prints ``Received sigquit from a child process. It usually means the
  child failed.``, ends the other ranks and exits 1.
- Workers die with the launcher: each holds the read end of a pipe whose only write end the launcher
  has and exits when it closes (the launcher SIGKILLed included); SIGTERM to the process group (or to
  the launcher alone) ends every rank and the launcher exits 0. A rank that dies on its own makes the
  launcher log ``Rank N scheduler is dead. ...`` and exit 1.
- ``--dry-run``: no torch, no GPU, nothing allocated: the same processes, lines, HTTP and faults, with
  the memory of a ``--dry-run-total-gib`` GPU (139.80, what torch reports for an H200) computed, and the
  OOM raised as an exception whose type prints as ``torch.OutOfMemoryError`` with torch's wording. For
  tests on machines without a GPU (tests/standin/test_gpu_standin.py).

Stdlib only besides torch (imported only by the workers, only without ``--dry-run``); runs on Python
3.11+ (Debian bookworm's lab hosts and the device's 3.12).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from gpudeploy_lab.standin import api
from gpudeploy_lab.standin.common import GIB, MIB, emit, raw

MODEL_CLASS = "GpuStandinForCausalLM"
DRY_TOTAL_GIB = 139.80  # torch's "total capacity" of an H200 (h200-nvml-probe.md)
DRY_CONTEXT_BYTES = 518 * MIB  # "this process has 518.00 MiB memory in use" before any tensor there
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
SIGQUIT_LINE = "Received sigquit from a child process. It usually means the child failed."


class OutOfMemoryError(RuntimeError):
    """What ``--dry-run`` raises where torch would raise ``torch.OutOfMemoryError`` (same printed name)."""


OutOfMemoryError.__module__ = "torch"


def format_size(n: float) -> str:
    """torch's ``format_size`` for its OOM message (c10/cuda/CUDACachingAllocator.cpp)."""
    if n <= 1024:
        return f"{int(n)} bytes"
    if n <= 1048576:
        return f"{n / 1024:.2f} KiB"
    if n <= 1073741824:
        return f"{n / 1048576:.2f} MiB"
    return f"{n / 1073741824:.2f} GiB"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for the ranks' rendezvous (rank 0 listens on it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def gb(n: float) -> str:
    return f"{n / GIB:.2f}"


# ------------------------------------------------------------------------------------------- devices


class TorchDevice:
    """CUDA device ``index`` (of CUDA_VISIBLE_DEVICES) through torch: real allocations."""

    def __init__(self, index: int) -> None:
        self.torch: Any = importlib.import_module("torch")
        self.index = index
        self.torch.cuda.set_device(index)  # invalid ordinal: torch raises, the rank fails like SGLang's
        self.device = self.torch.device("cuda", index)
        self.held: list[Any] = []

    def mem_get_info(self) -> tuple[int, int]:
        free, total = self.torch.cuda.mem_get_info(self.index)
        return int(free), int(total)

    def uuid(self) -> str:
        text = str(self.torch.cuda.get_device_properties(self.index).uuid)
        return text if text.startswith(("GPU-", "MIG-")) else "GPU-" + text

    def all_reduce(self, rank: int, world: int, port: int) -> tuple[int, float]:
        """Join the group's NCCL communicator and all-reduce 4 MiB: (bytes, milliseconds); the sum is checked."""
        for name, value in NO_MULTICAST.items():
            os.environ[name] = value
        dist = importlib.import_module("torch.distributed")
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                device_id=self.device)
        n = 1 << 20  # float32: 4 MiB
        warm = self.torch.ones(n, dtype=self.torch.float32, device=self.device)
        dist.all_reduce(warm)  # the first call sets up the communicator's channels
        t = self.torch.full((n,), float(rank + 1), dtype=self.torch.float32, device=self.device)
        self.torch.cuda.synchronize(self.index)
        t0 = time.perf_counter()
        dist.all_reduce(t)
        self.torch.cuda.synchronize(self.index)
        ms = (time.perf_counter() - t0) * 1000
        want = world * (world + 1) / 2
        got_min, got_max = float(t.min().item()), float(t.max().item())
        if got_min != want or got_max != want or float(warm[0].item()) != world:
            raise RuntimeError(f"NCCL all-reduce gave {got_min}..{got_max}, expected {want} on every element")
        return n * 4, ms

    def allocate(self, nbytes: int) -> None:
        tensor = self.torch.empty(nbytes, dtype=self.torch.uint8, device=self.device)
        tensor.zero_()  # touch it: the memory is really there, not only reserved
        self.torch.cuda.synchronize(self.index)
        self.held.append(tensor)


class DryDevice:
    """``--dry-run``: a GPU of ``total`` bytes on paper; allocates nothing."""

    def __init__(self, index: int, total: int) -> None:
        self.index = index
        self.total = total
        self.used = DRY_CONTEXT_BYTES
        self.allocated = 0

    def mem_get_info(self) -> tuple[int, int]:
        return max(0, self.total - self.used), self.total

    def uuid(self) -> str:
        entries = [e.strip() for e in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if e.strip()]
        entry = entries[self.index] if self.index < len(entries) else str(self.index)
        if entry.startswith(("GPU-", "MIG-")):
            return entry
        return f"GPU-00000000-0000-0000-0000-{int(entry) if entry.isdigit() else self.index:012d}"

    def allocate(self, nbytes: int) -> None:
        free = self.total - self.used
        if nbytes > free:
            raise OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {format_size(nbytes)}. GPU {self.index} has a total "
                f"capacity of {format_size(self.total)} of which {format_size(free)} is free. Including "
                f"non-PyTorch memory, this process has {format_size(self.used)} memory in use. Of the "
                f"allocated memory {format_size(self.allocated)} is allocated by PyTorch, and 0 bytes is "
                "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try "
                "setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
                "documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/"
                "cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)")  # torch 2.11 on the H200
        self.used += nbytes
        self.allocated += nbytes


# -------------------------------------------------------------------------------------------- worker


def _exit_when_closed(fd: int) -> None:
    """The launcher's end of the life pipe closed (it exited, was killed, or ends us): exit now."""
    with contextlib.suppress(OSError):
        while os.read(fd, 4096):
            pass
    os._exit(0)


def worker(args: argparse.Namespace) -> int:
    rank = int(args.worker_rank)
    tag = f"TP{rank}"
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the launcher, which ends us
    threading.Thread(target=_exit_when_closed, args=(args.life_fd,), daemon=True).start()

    def status(msg: str) -> None:
        with contextlib.suppress(OSError):
            os.write(args.status_fd, (msg + "\n").encode())

    def phase_pause() -> None:
        if args.phase_s > 0:
            time.sleep(args.phase_s)

    try:
        dev: TorchDevice | DryDevice = (DryDevice(rank, int(args.dry_run_total_gib * GIB)) if args.dry_run
                                        else TorchDevice(rank))
        uuid = dev.uuid()
        status(f"uuid {uuid}")
        emit(f"GPU UUID of rank {rank}: {uuid}", tag)
        emit("Init torch distributed begin.", tag)
        if isinstance(dev, TorchDevice):
            nbytes, ms = dev.all_reduce(rank, args.tp, args.dist_port)
            emit(f"NCCL all-reduce of {args.tp} ranks: {nbytes / MIB:.2f} MiB in {ms:.2f} ms, sum ok", tag)
            status(f"nccl {ms:.3f}")
        else:
            emit(f"NCCL all-reduce of {args.tp} ranks: skipped (--dry-run)", tag)
        emit("Init torch distributed ends. mem usage=0.00 GB", tag)
        total_bytes = int(args.gib * GIB)
        weights = int(total_bytes * args.weights_share)
        kv = total_bytes - weights
        free0, total = dev.mem_get_info()
        emit(f"Load weight begin. avail mem={gb(free0)} GB", tag)
        started = time.monotonic()
        phase_pause()
        if args.fault == "oom" and rank == 0:
            dev.allocate(total + weights)  # more than the whole GPU: torch's own OOM
        dev.allocate(weights)
        free1, _ = dev.mem_get_info()
        emit(f"Load weight end. elapsed={time.monotonic() - started:.2f} s, type={MODEL_CLASS}, "
             f"avail mem={gb(free1)} GB, mem usage={gb(free0 - free1)} GB.", tag)
        phase_pause()
        dev.allocate(kv)
        free2, _ = dev.mem_get_info()
        tokens = kv // max(1, args.kv_bytes_per_token)
        emit(f"KV Cache is allocated. #tokens: {tokens}, K size: {gb(kv / 2)} GB, V size: {gb(kv / 2)} GB", tag)
        emit(f"Memory pool end. avail mem={gb(free2)} GB", tag)
        if rank == 0:
            emit(f"max_total_num_tokens={tokens}, chunked_prefill_size=8192, max_prefill_tokens=16384, "
                 f"max_running_requests={min(4096, max(1, tokens // 4096) * 128)}, "
                 f"context_len={args.context_len}, available_gpu_mem={gb(free2)} GB", tag)
    except Exception:  # as SGLang's scheduler: log the traceback, tell the launcher, exit 1
        emit("Scheduler hit an exception: " + traceback.format_exc().rstrip("\n"), tag)
        status("error")
        return 1
    status(f"ready {total - free2}")
    threading.Event().wait()  # hold the memory until the launcher goes (the life pipe) or SIGTERM
    return 0


# ------------------------------------------------------------------------------------------ launcher


class Rank:
    def __init__(self, rank: int, proc: subprocess.Popen[bytes], life_w: int, status_r: int,
                 events: queue.Queue[tuple[int, str | None]]) -> None:
        self.rank = rank
        self.proc = proc
        self.life_w: int | None = life_w
        self.errored = False
        self.uuid = ""
        self.used = 0
        self.nccl_ms: float | None = None
        self.eof = threading.Event()
        threading.Thread(target=self._read, args=(status_r, events), daemon=True).start()

    def _read(self, fd: int, events: queue.Queue[tuple[int, str | None]]) -> None:
        with os.fdopen(fd, "rb") as f:
            for line in f:
                msg = line.decode(errors="replace").strip()
                if msg == "error":
                    self.errored = True
                elif msg.startswith("uuid "):
                    self.uuid = msg.split(" ", 1)[1]
                elif msg.startswith("nccl "):
                    self.nccl_ms = float(msg.split(" ", 1)[1])
                elif msg.startswith("ready "):
                    self.used = int(msg.split(" ", 1)[1])
                events.put((self.rank, msg))
        self.eof.set()
        events.put((self.rank, None))

    def release(self) -> None:
        """Close our end of its life pipe: the worker exits."""
        if self.life_w is not None:
            with contextlib.suppress(OSError):
                os.close(self.life_w)
            self.life_w = None


class State:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.phase = "starting"  # starting | ready | shutting_down
        self.ranks: list[Rank] = []

    def info(self) -> dict[str, Any]:
        return {"version": "gpu-standin", "status": self.phase, "tp_size": self.args.tp, "gib": self.args.gib,
                "dry_run": bool(self.args.dry_run), "model_path": self.args.model_path, "pid": os.getpid(),
                "ranks": [{"rank": r.rank, "pid": r.proc.pid, "uuid": r.uuid, "gpu_bytes_used": r.used,
                           "nccl_all_reduce_ms": r.nccl_ms}
                          for r in self.ranks]}


def make_handler(state: State) -> type[api.BaseHandler]:
    class Handler(api.BaseHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path in ("/health", "/health_generate"):
                ok = state.phase == "ready"
                self.send_bytes(200 if ok else 503, b"" if ok else b"not ready", "text/plain")
            elif path in ("/server_info", "/get_server_info"):
                self.send_json(200, state.info())
            elif path in ("/model_info", "/get_model_info"):
                self.send_json(200, {"model_path": state.args.model_path, "is_generation": True})
            elif path == "/v1/models":
                self.send_json(200, {"object": "list", "data": [
                    {"id": state.args.model_path, "object": "model", "owned_by": "sglang",
                     "max_model_len": state.args.context_len}]})
            else:
                self.send_json(404, {"detail": "Not Found"})

        do_HEAD = do_GET

    return Handler


class Launcher:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.state = State(args)
        self.events: queue.Queue[tuple[int, str | None]] = queue.Queue()
        self.stop = threading.Event()
        self.httpd: api.QuietServer | None = None

    def spawn(self) -> None:
        src = str(Path(__file__).resolve().parents[1])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
        passed = ["--gib", str(self.args.gib), "--weights-share", str(self.args.weights_share),
                  "--kv-bytes-per-token", str(self.args.kv_bytes_per_token), "--phase-s", str(self.args.phase_s),
                  "--context-len", str(self.args.context_len),
                  "--dry-run-total-gib", str(self.args.dry_run_total_gib), "--tp", str(self.args.tp),
                  "--dist-port", str(free_port())]
        if self.args.fault:
            passed += ["--fault", self.args.fault]
        if self.args.dry_run:
            passed.append("--dry-run")
        for rank in range(self.args.tp):
            life_r, life_w = os.pipe()  # both ends non-inheritable: only this rank gets life_r
            status_r, status_w = os.pipe()
            proc = subprocess.Popen(
                [sys.executable, "-m", "gpudeploy_lab.gpu_standin", "--worker-rank", str(rank),
                 "--life-fd", str(life_r), "--status-fd", str(status_w), *passed],
                stdin=subprocess.DEVNULL, pass_fds=(life_r, status_w), env=env)
            os.close(life_r)
            os.close(status_w)
            self.state.ranks.append(Rank(rank, proc, life_w, status_r, self.events))

    def end_workers(self, grace: float = 5.0) -> None:
        """Close every life pipe (workers exit), wait, SIGKILL what is left (our children, by handle)."""
        for r in self.state.ranks:
            r.release()
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(r.proc.poll() is None for r in self.state.ranks):
            time.sleep(0.01)
        for r in self.state.ranks:
            if r.proc.poll() is None:
                r.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                r.proc.wait(timeout=5)

    def close_http(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None

    def fail(self, *lines: str) -> int:
        for line in lines:
            emit(line)
        self.state.phase = "shutting_down"
        self.end_workers(grace=2.0)
        self.close_http()
        return 1

    def shutdown(self) -> int:
        self.state.phase = "shutting_down"
        raw("INFO:     Shutting down")
        self.end_workers()
        self.close_http()
        raw(f"INFO:     Finished server process [{os.getpid()}]")
        return 0

    def start_http(self) -> OSError | None:
        host, port = self.args.host, self.args.port
        try:
            self.httpd = api.QuietServer(host, port, make_handler(self.state))
        except OSError as e:
            raw(f"ERROR:    [Errno {e.errno}] error while attempting to bind on address ('{host}', {port}): "
                f"{(e.strerror or str(e)).lower()}")
            return e
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        raw(f"INFO:     Started server process [{os.getpid()}]")
        raw(f"INFO:     Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)")
        return None

    def run(self) -> int:
        a = self.args
        emit(f"server_args=ServerArgs(model_path={a.model_path!r}, tp_size={a.tp}, host={a.host!r}, port={a.port}, "
             f"gpu_standin_gib={a.gib}, fault={a.fault!r}, dry_run={bool(a.dry_run)}, "
             f"cuda_visible_devices={os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
        err = self.start_http()
        if err is not None:
            return 1
        self.spawn()
        ready: set[int] = set()
        while True:
            if self.stop.is_set():
                return self.shutdown()
            try:
                rank, msg = self.events.get(timeout=0.02)
            except queue.Empty:
                rank, msg = -1, None
            if msg is not None and msg.startswith("ready"):
                ready.add(rank)
                if len(ready) == a.tp and self.state.phase == "starting":
                    self.state.phase = "ready"
                    emit("The server is fired up and ready to roll!")
            for r in self.state.ranks:
                code = r.proc.poll()
                if code is None:
                    continue
                r.eof.wait(0.3)
                # a process-group SIGTERM reaches the ranks and us at once: their exit is our stop
                if self.stop.wait(0.2 if code < 0 else 0):
                    return self.shutdown()
                if r.errored:
                    return self.fail(SIGQUIT_LINE)
                return self.fail(f"Rank {r.rank} scheduler is dead. Please check if there are relevant logs.",
                                 f"Child process unexpectedly failed with exitcode={code}. pid={r.proc.pid}")


# ---------------------------------------------------------------------------------------------- main


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python3 -m gpudeploy_lab.gpu_standin",
                                description="SGLang-shaped stand-in that holds real GPU memory per TP rank.")
    p.add_argument("--port", type=int, help="HTTP port (/health); required")
    p.add_argument("--host", default="127.0.0.1", help="HTTP address (127.0.0.1)")
    p.add_argument("--tp", "--tp-size", dest="tp", type=int, default=1, help="ranks: one worker per GPU (1)")
    p.add_argument("--gib", type=float, required=True, help="GiB each rank allocates on its GPU")
    p.add_argument("--fault", choices=["oom"], help="oom: rank 0 asks for more than its GPU has")
    p.add_argument("--dry-run", action="store_true", help="no torch, no GPU: the same lines, nothing allocated")
    p.add_argument("--dry-run-total-gib", type=float, default=DRY_TOTAL_GIB,
                   help=f"--dry-run's GPU size as torch reports it ({DRY_TOTAL_GIB})")
    p.add_argument("--weights-share", type=float, default=0.4, help="share of --gib logged as weights (0.4)")
    p.add_argument("--kv-bytes-per-token", type=int, default=131072,
                   help="for the #tokens figure (131072: Llama-3.1-8B in bf16)")
    p.add_argument("--context-len", type=int, default=8192)
    p.add_argument("--phase-s", type=float, default=0.2, help="pause between phases, seconds (0.2)")
    p.add_argument("--model-path", default="gpu-standin", help="the name it serves (no model is loaded)")
    p.add_argument("--worker-rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--dist-port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--life-fd", type=int, help=argparse.SUPPRESS)
    p.add_argument("--status-fd", type=int, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.worker_rank is None and args.port is None:
        p.error("the following arguments are required: --port")
    if args.tp < 1 or args.gib < 0 or not 0 <= args.weights_share <= 1:
        print("gpu_standin: --tp >= 1, --gib >= 0 and 0 <= --weights-share <= 1", file=sys.stderr)
        return 2
    if args.worker_rank is not None:
        return worker(args)
    launcher = Launcher(args)

    def on_term(signum: int, frame: object) -> None:
        launcher.state.phase = "shutting_down"
        launcher.stop.set()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    return launcher.run()


if __name__ == "__main__":
    sys.exit(main())
