"""Measure CUDA-graph capture memory the way SGLang captures decode graphs (run on a GPU, not in CI).

What SGLang does (model_executor/cuda_graph_runner.py, 0.5.9; runner/decode_cuda_graph_runner.py,
0.5.23) and what this script copies:
  * persistent input buffers sized for the largest batch (input_ids, positions, out_cache_loc,
    input_embeds, and next_token_logits_buffer = max_tokens x vocab fp32 that every graph's logits
    are copied into) plus the attention backend's graph metadata (FA3: a page table of
    max_bs x context int32), allocated inside the measured window, as SGLang does;
  * batch sizes captured largest first, each after two eager warm-up runs on the capture stream,
    all into ONE shared graph memory pool (torch.cuda.graph(pool=...));
  * "mem usage" = free memory before - free memory after, both read after empty_cache
    (sglang.srt.utils.get_available_gpu_memory), in GiB.

The forward is a TP-sharded decoder with random bf16 weights: RMSNorm with a residual stream,
QKV projection, decode attention over the KV cache (seq len 1 at capture, as SGLang's fill value),
output projection, an out-of-place all-reduce stand-in (a copy: one GPU), and a gated MLP or a
top-k MoE (fused-MoE-like intermediates: tokens x topk x 2I), then the final norm, the lm_head
shard (tokens x vocab/tp) and an all-gather stand-in (tokens x vocab) copied into the fp32 logits
buffer. Layers share one set of weights (graph memory does not depend on which tensor a kernel
reads), so a many-layer shard fits.

Usage (device):  python3 bench/device_graphs.py --out $OUT/h200-graph-capture.json --deadline-s 420
CPU check here:  python3 bench/device_graphs.py --dry-run   (tiny shapes, eager forward, no graphs)
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch
import torch.nn.functional as F

GIB = float(1 << 30)


def capture_sizes(max_bs: int, speculative: bool = False) -> list[int]:
    """SGLang's decode capture list (server_args._generate_cuda_graph_batch_sizes, 0.5.10/0.5.23)."""
    if speculative:
        sizes = (list(range(1, 9)) + list(range(10, 33, 2)) + list(range(40, 65, 4))
                 + list(range(72, 257, 8)) + list(range(272, max_bs + 1, 16)))
    else:
        sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    sizes = [b for b in sizes if b <= max_bs]
    if max_bs not in sizes:
        sizes.append(max_bs)
    return sizes


def prefill_sizes(max_tokens: int) -> list[int]:
    """SGLang's prefill/piecewise token list (generate_prefill_cuda_graph_batch_sizes, 0.5.23)."""
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
             + list(range(576, 1025, 64)) + list(range(1280, 4097, 256)) + list(range(4608, max_tokens + 1, 512)))
    return [s for s in sizes if s <= max_tokens]


@dataclass(frozen=True)
class Shape:
    """One TP shard of a model: the sizes one rank sees."""

    model: str
    tp: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int                 # dense MLP width (full model); 0 for MoE
    vocab: int
    context: int = 131072
    experts: int = 0           # MoE: routed experts, top-k, expert width (full model)
    topk: int = 0
    moe_inter: int = 0

    @property
    def q_local(self) -> int:
        return max(1, self.heads // self.tp) * self.head_dim

    @property
    def kv_local(self) -> int:
        return max(1, self.kv_heads // self.tp) * self.head_dim


@dataclass(frozen=True)
class Config:
    name: str
    shape: Shape
    max_bs: int
    tokens_per_bs: int = 1            # speculative verify graphs: draft tokens per request
    mode: str = "decode"              # "decode" | "prefill" (token-count list, one request)
    shared_logits: bool = True        # SGLang copies logits into one persistent buffer
    sizes: tuple[int, ...] = field(default=())

    def batch_sizes(self) -> list[int]:
        if self.sizes:
            return list(self.sizes)
        if self.mode == "prefill":
            return prefill_sizes(self.max_bs)
        return capture_sizes(self.max_bs, self.tokens_per_bs > 1)


LLAMA8 = Shape("llama-3.1-8b", 1, 32, 4096, 32, 8, 128, 14336, 128256)
LLAMA70 = Shape("llama-3.1-70b", 4, 80, 8192, 64, 8, 128, 28672, 128256)
QWEN7 = Shape("qwen2.5-7b", 1, 28, 3584, 28, 4, 128, 18944, 152064, context=32768)
QWEN32 = Shape("qwen3-32b", 2, 64, 5120, 64, 8, 128, 25600, 151936, context=40960)
QWEN235 = Shape("qwen3-235b-a22b", 4, 94, 4096, 64, 4, 128, 0, 151936, context=40960,
                experts=128, topk=8, moe_inter=1536)
DSV3ISH = Shape("deepseek-v3-like", 8, 61, 7168, 128, 128, 128, 0, 129280, context=163840,
                experts=256, topk=8, moe_inter=2048)
MISTRAL_SMALL = Shape("mistral-small-24b", 1, 40, 5120, 32, 8, 128, 32768, 131072, context=32768)


def plan() -> list[Config]:
    """Configurations, most informative first (the run stops at the deadline)."""
    out = [
        Config("llama70-tp4-bs512", LLAMA70, 512),
        Config("llama70-tp8-bs512", replace(LLAMA70, tp=8), 512),
        Config("llama70-tp8-bs512-L4", replace(LLAMA70, tp=8, layers=4), 512),
        Config("llama70-tp8-bs512-L16", replace(LLAMA70, tp=8, layers=16), 512),
        Config("llama70-tp8-bs512-L40", replace(LLAMA70, tp=8, layers=40), 512),
        # graph-exec (driver) memory alone: a tiny model, many layers, the full bs list
        Config("tiny-L80-bs512", Shape("tiny", 1, 80, 256, 4, 2, 64, 512, 1024, context=1024), 512),
        Config("tiny-L20-bs512", Shape("tiny", 1, 20, 256, 4, 2, 64, 512, 1024, context=1024), 512),
        Config("llama8-tp1-bs256", LLAMA8, 256),
        Config("llama8-tp1-bs160", LLAMA8, 160),
        Config("llama8-tp1-bs64", LLAMA8, 64),
        Config("llama8-tp1-bs8", LLAMA8, 8),
        Config("llama8-tp1-bs256-perlogits", LLAMA8, 256, shared_logits=False),
        Config("qwen235-tp4-bs512", QWEN235, 512),
        Config("qwen235-tp4-bs160", QWEN235, 160),
        Config("dsv3ish-tp8-bs256", DSV3ISH, 256),
        Config("qwen7-tp1-bs256", QWEN7, 256),
        Config("qwen32-tp2-bs256", QWEN32, 256),
        Config("mistral24-tp1-bs256", MISTRAL_SMALL, 256),
        Config("llama8-vocab32k-bs256", replace(LLAMA8, vocab=32000), 256),
        Config("llama8-vocab256k-bs256", replace(LLAMA8, vocab=256000), 256),
        Config("llama8-h2048-bs256", replace(LLAMA8, hidden=2048, heads=16, inter=8192), 256),
        Config("llama8-h8192-bs256", replace(LLAMA8, hidden=8192, heads=64, inter=28672, layers=16), 256),
        Config("llama8-ctx8k-bs256", replace(LLAMA8, context=8192), 256),
        Config("llama70-tp4-bs48-eagle4", LLAMA70, 48, tokens_per_bs=4),
        Config("llama70-tp4-bs160-eagle4", LLAMA70, 160, tokens_per_bs=4),
        Config("llama8-tp1-bs48-eagle4", LLAMA8, 48, tokens_per_bs=4),
        Config("llama70-tp2-bs512", replace(LLAMA70, tp=2), 512),
        Config("llama70-tp4-bs256", LLAMA70, 256),
        Config("llama70-tp4-bs64", LLAMA70, 64),
        Config("llama8-prefill-8192", LLAMA8, 8192, mode="prefill"),
        Config("qwen235-tp4-prefill-8192", QWEN235, 8192, mode="prefill"),
        Config("llama70-tp4-bs512-perlogits", LLAMA70, 512, shared_logits=False),
    ]
    return out


def tiny(c: Config) -> Config:
    """CPU dry run: the same structure at toy sizes."""
    s = c.shape
    small = replace(s, layers=2, hidden=64, heads=max(2, s.tp * 2), kv_heads=max(1, s.tp), head_dim=16,
                    inter=128 if s.inter else 0, moe_inter=32 if s.moe_inter else 0, vocab=1000,
                    context=256, experts=8 if s.experts else 0)
    return replace(c, shape=small, max_bs=min(c.max_bs, 16 if c.mode == "decode" else 64))


class Decoder:
    """A TP shard of a decoder-only model with random weights (shared across layers)."""

    def __init__(self, s: Shape, max_tokens: int, device: torch.device) -> None:
        self.s = s
        dt = torch.bfloat16
        torch.manual_seed(0)

        def w(*shape: int) -> torch.Tensor:
            # in place: no temporary whose freed block the capture could later reuse for free
            return torch.empty(*shape, device=device, dtype=dt).normal_(0.0, 0.02)

        h = s.hidden
        self.embed = w(s.vocab // s.tp + 1, h)
        self.lm_head = w(s.vocab // s.tp + 1, h)
        self.w_qkv = w(h, s.q_local + 2 * s.kv_local)
        self.w_o = w(s.q_local, h)
        self.norm = torch.ones(h, device=device, dtype=dt)
        if s.experts:
            width = s.moe_inter // s.tp
            self.w_router = w(h, s.experts)
            self.w_up = w(h, 2 * width)
            self.w_down = w(width, h)
        else:
            width = s.inter // s.tp
            self.w_up = w(h, 2 * width)
            self.w_down = w(width, h)
        self.width = width
        # a small KV cache: graph memory does not depend on its size
        self.kv_tokens = max(4096, max_tokens + 1)
        self.k_cache = torch.zeros(self.kv_tokens, s.kv_local, device=device, dtype=dt)
        self.v_cache = torch.zeros(self.kv_tokens, s.kv_local, device=device, dtype=dt)

    def rms(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.norm, 1e-6)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        s = self.s
        if not s.experts:
            gu = x @ self.w_up
            a = F.silu(gu[:, : self.width])
            a.mul_(gu[:, self.width:])
            return a @ self.w_down
        n = x.shape[0]
        logits = (x @ self.w_router).float()
        weights, _idx = torch.topk(torch.softmax(logits, dim=-1), s.topk, dim=-1)
        # fused_moe's intermediate caches: tokens*topk rows of 2I, then I, then hidden
        xt = x.unsqueeze(1).expand(n, s.topk, x.shape[1]).reshape(n * s.topk, x.shape[1])
        c1 = xt @ self.w_up
        c2 = F.silu(c1[:, : self.width])
        c2.mul_(c1[:, self.width:])
        c3 = (c2 @ self.w_down).view(n, s.topk, -1)
        return (c3 * weights.to(c3.dtype).unsqueeze(-1)).sum(dim=1)

    def attention(self, x: torch.Tensor, loc: torch.Tensor, page_table: torch.Tensor) -> torch.Tensor:
        s = self.s
        n = x.shape[0]
        qkv = x @ self.w_qkv
        q = qkv[:, : s.q_local]
        k = qkv[:, s.q_local: s.q_local + s.kv_local]
        v = qkv[:, s.q_local + s.kv_local:]
        self.k_cache.index_copy_(0, loc, k)
        self.v_cache.index_copy_(0, loc, v)
        # decode attention at capture: every request has seq len 1 (SGLang's fill value), so each
        # token reads back its own KV slot; the page table is only allocated (FA3 reads it)
        kk = self.k_cache.index_select(0, loc).view(n, -1, s.head_dim)
        vv = self.v_cache.index_select(0, loc).view(n, -1, s.head_dim)
        heads = q.shape[1] // s.head_dim
        rep = heads // kk.shape[1]
        qh = q.reshape(n, heads, s.head_dim)
        score = (qh * kk.repeat_interleave(rep, dim=1)).sum(-1, keepdim=True)
        out = torch.softmax(score.float(), dim=-1).to(x.dtype) * vv.repeat_interleave(rep, dim=1)
        return out.reshape(n, heads * s.head_dim) @ self.w_o

    def forward(self, ids: torch.Tensor, loc: torch.Tensor, page_table: torch.Tensor,
                logits_out: torch.Tensor | None, logit_rows: int) -> torch.Tensor:
        s = self.s
        x = self.embed.index_select(0, ids.clamp(max=self.embed.shape[0] - 1))
        residual = x
        x = self.rms(x)
        for _ in range(s.layers):
            a = self.attention(x, loc, page_table).clone()     # out-of-place all-reduce stand-in
            residual = residual + a
            x = self.rms(residual)
            m = self.mlp(x).clone()
            residual = residual + m
            x = self.rms(residual)
        last = x[-logit_rows:] if logit_rows < x.shape[0] else x
        shard = last @ self.lm_head.t()                          # tokens x vocab/tp
        gathered = shard.repeat(1, s.tp)[:, : s.vocab]           # all-gather stand-in: tokens x vocab
        if logits_out is not None:
            logits_out[: last.shape[0]].copy_(gathered)          # SGLang: into next_token_logits_buffer
            return logits_out[: last.shape[0]]
        return gathered.float()


def free_gib(empty: bool) -> float:
    if empty:
        torch.cuda.empty_cache()
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0] / GIB


def measure(c: Config, dry: bool, model: Decoder | None = None) -> dict[str, Any]:
    device = torch.device("cpu" if dry else "cuda")
    s = c.shape
    sizes = c.batch_sizes()
    max_bs = max(sizes)
    tok_per = 1 if c.mode == "prefill" else c.tokens_per_bs
    max_tokens = max_bs * tok_per
    model = model or Decoder(s, max_tokens, device)
    t0 = time.time()
    before = 0.0 if dry else free_gib(True)
    reserved0 = 0 if dry else torch.cuda.memory_reserved()
    if not dry:
        torch.cuda.reset_peak_memory_stats()
    # persistent buffers, as GraphInputBuffers + the attention backend's init_cuda_graph_state
    with torch.device(device):
        ids = torch.zeros(max_tokens, dtype=torch.int64)
        positions = torch.zeros(max_tokens, dtype=torch.int64)
        loc = torch.arange(max_tokens, dtype=torch.int64) % model.kv_tokens
        embeds = torch.zeros(max_tokens, s.hidden, dtype=torch.bfloat16)
        logit_rows_max = 1 if c.mode == "prefill" else max_tokens
        logits_buf = torch.zeros(logit_rows_max, s.vocab, dtype=torch.float32) if c.shared_logits else None
        page_rows = 1 if c.mode == "prefill" else max_bs
        page_table = torch.zeros(page_rows, s.context, dtype=torch.int32)
    buffer_bytes = sum(t.numel() * t.element_size() for t in (ids, positions, loc, embeds)) + (
        logits_buf.numel() * 4 if logits_buf is not None else 0)
    metadata_bytes = page_table.numel() * 4
    graphs: list[Any] = []
    outputs: list[torch.Tensor] = []
    avail_track: list[tuple[int, float]] = []
    if dry:
        for bs in sorted(sizes, reverse=True)[:3]:
            n = bs * tok_per
            out = model.forward(ids[:n], loc[:n], page_table, logits_buf, 1 if c.mode == "prefill" else n)
            assert torch.isfinite(out.float()).all()
            outputs.append(out)
        return {"name": c.name, "dry_run": True, "sizes": sizes, "out_shape": list(outputs[0].shape)}
    pool = torch.cuda.graph_pool_handle()
    stream = torch.cuda.Stream()
    peak_used = 0.0
    with torch.cuda.stream(stream):
        for bs in sorted(sizes, reverse=True):                  # largest first, one shared pool
            n = bs * tok_per
            rows = 1 if c.mode == "prefill" else n
            for _ in range(2):
                torch.cuda.synchronize()
                model.forward(ids[:n], loc[:n], page_table, logits_buf, rows)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool, stream=stream):
                out = model.forward(ids[:n], loc[:n], page_table, logits_buf, rows)
            graphs.append(g)
            outputs.append(out)
            now = free_gib(False)
            peak_used = max(peak_used, before - now)
            avail_track.append((bs, round(now, 4)))
    torch.cuda.synchronize()
    graphs[-1].replay()                                          # the smallest graph replays
    torch.cuda.synchronize()
    after = free_gib(True)
    reserved1 = torch.cuda.memory_reserved()
    usage = before - after
    non_torch = usage - (reserved1 - reserved0) / GIB
    # the highest the process got during capture: the allocator's peak plus what is not torch's
    peak = (torch.cuda.max_memory_reserved() - reserved0) / GIB + max(0.0, non_torch)
    result = {
        "name": c.name, "config": {**asdict(c), "shape": asdict(s)}, "sizes": sizes, "n_graphs": len(sizes),
        "max_bs": max_bs, "max_tokens": max_tokens,
        "usage_gib": round(usage, 4),
        "torch_reserved_delta_gib": round((reserved1 - reserved0) / GIB, 4),
        "non_torch_gib": round(non_torch, 4), "peak_gib": round(peak, 4),
        "buffers_gib": round(buffer_bytes / GIB, 4), "metadata_gib": round(metadata_bytes / GIB, 4),
        "peak_during_capture_gib": round(peak_used, 4),
        "max_reserved_gib": round((torch.cuda.max_memory_reserved() - reserved0) / GIB, 4),
        "avail_after_each_bs": avail_track, "seconds": round(time.time() - t0, 2),
    }
    del graphs, outputs, pool, ids, positions, loc, embeds, logits_buf, page_table
    gc.collect()
    torch.cuda.empty_cache()
    return result


def cold_and_warm(c: Config, dry: bool) -> dict[str, Any]:
    """In a fresh process, as SGLang: the first capture also loads kernels and cuBLAS workspaces.

    The same capture again (new stream, new pool) gives the warm figure; cold - warm is what
    first use costs (lazily loaded kernel modules, library handles).
    """
    if dry:
        return measure(tiny(c), True)
    s = c.shape
    max_tokens = max(c.batch_sizes()) * (1 if c.mode == "prefill" else c.tokens_per_bs)
    model = Decoder(s, max_tokens, torch.device("cuda"))
    torch.cuda.synchronize()
    cold = measure(c, False, model)
    warm = measure(c, False, model)
    cold["warm"] = {k: warm[k] for k in ("usage_gib", "non_torch_gib", "torch_reserved_delta_gib", "peak_gib")}
    cold["first_use_gib"] = round(cold["usage_gib"] - warm["usage_gib"], 4)
    return cold


def run_isolated(c: Config, dry: bool) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--one", c.name] + (["--dry-run"] if dry else [])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            r: dict[str, Any] = json.loads(line[len("RESULT "):])
            return r
    return {"name": c.name, "error": f"child rc {p.returncode}: {(p.stderr or p.stdout)[-400:]}"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="device-graphs.json")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, eager forward only")
    ap.add_argument("--deadline-s", type=float, default=420.0, help="stop starting configs after this")
    ap.add_argument("--only", default="", help="comma-separated config names")
    ap.add_argument("--isolate", action="store_true", help="each config in a fresh process (cold, then warm)")
    ap.add_argument("--one", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        c = next(c for c in plan() if c.name == args.one)
        print("RESULT " + json.dumps(cold_and_warm(c, args.dry_run)), flush=True)
        return 0
    configs = plan()
    if args.only:
        keep = set(args.only.split(","))
        configs = [c for c in configs if c.name in keep]
    dry = args.dry_run
    meta: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version(),
                            "date": time.strftime("%Y-%m-%d"), "dry_run": dry,
                            "method": "sglang-style decode capture: largest bs first, one shared pool, "
                                      "usage = free before - free after (empty_cache)"}
    if not dry:
        p = torch.cuda.get_device_properties(0)
        meta.update(device=p.name, total_gib=round(p.total_memory / GIB, 3),
                    free_at_start_gib=round(torch.cuda.mem_get_info()[0] / GIB, 3))
    results: list[dict[str, Any]] = []
    start = time.time()
    for c in configs:
        if time.time() - start > args.deadline_s:
            results.append({"name": c.name, "skipped": "deadline"})
            continue
        try:
            r = run_isolated(c, dry) if args.isolate else measure(tiny(c) if dry else c, dry)
        except torch.cuda.OutOfMemoryError as e:
            r = {"name": c.name, "error": f"OOM: {str(e)[:200]}"}
            gc.collect()
            torch.cuda.empty_cache()
        except Exception as e:  # keep the other configs' figures
            r = {"name": c.name, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        results.append(r)
        print(json.dumps({k: r.get(k) for k in ("name", "n_graphs", "usage_gib", "non_torch_gib", "buffers_gib",
                                                 "metadata_gib", "peak_gib", "first_use_gib", "seconds",
                                                 "error", "dry_run")}), flush=True)
        with open(args.out, "w") as f:                            # partial results survive a timeout
            json.dump({"meta": meta, "results": results}, f, indent=1)
    print(f"{'config':34} {'graphs':>6} {'usage':>7} {'nontorch':>8} {'buffers':>7} {'meta':>6} {'peak':>7} "
          f"{'1st-use':>7}")
    for r in results:
        if "usage_gib" in r:
            print(f"{r['name']:34} {r['n_graphs']:6d} {r['usage_gib']:7.3f} {r['non_torch_gib']:8.3f} "
                  f"{r['buffers_gib']:7.3f} {r['metadata_gib']:6.3f} {r['peak_gib']:7.3f} "
                  f"{r.get('first_use_gib', 0.0):7.3f}")
        else:
            print(f"{r['name']:34} {r.get('error') or r.get('skipped') or 'dry-run ok'}")
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
