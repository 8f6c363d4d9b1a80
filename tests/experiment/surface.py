"""A response surface for the search's tests and bench/tune.py: fakelab's deploy and benchmark client
made to answer to the decode server's settings, as a real engine would, in a shape we can reason about.

The deployment is inventory/hosts.yml: TP4 prefill + TP4 decode of Qwen3-235B-A22B-FP8 on 96 GB GPUs
(8 GPUs), whose weights take 54.95 GiB per rank. Three decode settings move it:

    m  mem_fraction_static      the static share of each GPU's 95.6 GiB: weights + KV pool
    b  cuda_graph_max_bs        the largest batch that decodes through a CUDA graph
    r  max_running_requests     the most requests decoding at once

    KV pool       (m * 95.6 - 54.95) GiB per rank, 4000 tokens per GiB; a request holds in + out tokens
    batch n       min(concurrency, r, requests the KV pool holds)
    TPOT          8 + 0.18 n ms, x 1.35 when n > b (the batch runs eagerly, without a graph)
    output tok/s  n * 1000 / TPOT * (1 + 0.3 (m - 0.6)): a larger pool keeps more of the prefix cache

What it shows a search:
    - the memory model refuses m below ~0.59 (the weights do not fit: gpudeploy's real preflight);
    - a launch OOMs while capturing CUDA graphs where the headroom is short of what graphs of b need,
      (1 - m) * 95.6 < 5 + b / 32 GiB: m > 0.864 with b = 256, m > 0.906 with b = 128, ... (the preflight
      does not see it: only a launch shows it);
    - the SLO (p99 TPOT <= 40 ms) cuts the large batches: n <= 177 with a graph, n <= 120 without one;
    - the optimum lies inside: r = 256, b = 256, m just below the OOM edge (0.85); the best level is
      the highest concurrency meeting the SLO (the ladder [16, 64, 256] bisected: c = 160).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fakelab import RESULT, FakeLab

from gpudeploy.apply.deploy import UnitOutcome
from gpudeploy.apply.deployment import DeploymentOutcome, DeployResult
from gpudeploy.model import Plan
from gpudeploy.verify.causes import Cause
from gpudeploy.verify.gate import GateResult

GPU_GIB = 95.6
WEIGHTS_GIB = 54.95
TOKENS_PER_GIB = 4000
GPUS = 8
INPUT_LEN, OUTPUT_LEN = 128, 64
SLO_TPOT_MS = 40.0

SPACE = """\
search:
  space:
    decode.settings.mem_fraction_static: {range: [0.5, 0.95], step: 0.025}
    decode.settings.cuda_graph_max_bs: {choices: [32, 64, 128, 256]}
    decode.settings.max_running_requests: {choices: [64, 128, 256]}
  objective: output_tok_s_per_gpu
  budget: {launches: LAUNCHES}
  seed: SEED
"""
BENCH = f"""\
benchmark: {{concurrency: [16, 64, 256], prompts: 8, input_len: {INPUT_LEN}, output_len: {OUTPUT_LEN}}}
slo: {{p99_tpot_ms: {SLO_TPOT_MS:g}}}
"""
GRID = """\
grid:
  decode.settings.mem_fraction_static: [0.5, 0.525, 0.55, 0.575, 0.6, 0.625, 0.65, 0.675, 0.7, 0.725, 0.75, 0.775,
                                        0.8, 0.825, 0.85, 0.875, 0.9, 0.925, 0.95]
  decode.settings.cuda_graph_max_bs: [32, 64, 128, 256]
  decode.settings.max_running_requests: [64, 128, 256]
"""


def search_file(launches: int = 40, seed: int = 1, extra: str = "") -> str:
    return SPACE.replace("LAUNCHES", str(launches)).replace("SEED", str(seed)) + extra + BENCH


def decode(plan: Plan) -> tuple[float, int, int]:
    s = next(u for u in plan.units if u.role.name == "decode").role.settings
    return float(s["mem_fraction_static"]), int(s["cuda_graph_max_bs"]), int(s["max_running_requests"])


def launch_ooms(m: float, b: int) -> bool:
    return (1 - m) * GPU_GIB < 5 + b / 32


def figures(m: float, b: int, r: int, c: int) -> tuple[float, float]:
    """(TPOT ms, output tok/s) of decode at concurrency c."""
    kv_requests = max(0.0, m * GPU_GIB - WEIGHTS_GIB) * TOKENS_PER_GIB / (INPUT_LEN + OUTPUT_LEN)
    n = max(1.0, min(c, r, kv_requests))
    tpot = (8 + 0.18 * n) * (1.35 if n > b else 1.0)
    return tpot, n * 1000 / tpot * (1 + 0.3 * (m - 0.6))


def respond(plan: Plan, c: int) -> str:
    """SGLang bench_serving's result line (the recorded one, its figures replaced)."""
    tpot, tok_s = figures(*decode(plan), c)
    doc: dict[str, Any] = json.loads(RESULT.strip().splitlines()[-1])
    prompts = 8
    ttft = 40.0
    e2e = ttft + OUTPUT_LEN * tpot
    doc.update(completed=prompts, max_concurrency=c, output_throughput=tok_s, total_throughput=tok_s * 3,
               request_throughput=tok_s / OUTPUT_LEN, total_output_tokens=prompts * OUTPUT_LEN,
               duration=prompts * OUTPUT_LEN / tok_s)
    for stat in ("mean", "median", "p90", "p95", "p99"):
        doc.update({f"{stat}_tpot_ms": tpot, f"{stat}_itl_ms": tpot, f"{stat}_ttft_ms": ttft,
                    f"{stat}_e2e_latency_ms": e2e})
    return json.dumps(doc) + "\n"


def on_deploy(lab: FakeLab, plan: Plan) -> DeployResult | None:
    """A decode whose graphs do not fit dies in capture, as SGLang 0.5.23 does (the gate's cause)."""
    m, b, _ = decode(plan)
    return oom(plan) if launch_ooms(m, b) else None


def oom(plan: Plan) -> DeployResult:
    """deploy's result when the decode server ran out of memory capturing its CUDA graphs."""
    dep = plan.units[0].deployment
    cause = Cause("oom-in-graph-capture", "CUDA out of memory after the weights loaded, while capturing CUDA graphs: "
                  "the headroom left by --mem-fraction-static is too small")
    hosts: dict[str, Any] = {}
    for u in plan.units:
        dead = u.role.name == "decode"
        gate = GateResult(False, "capturing CUDA graphs", 41.0, cause, died_at=1.0) if dead else None
        hosts.setdefault(u.host.name, []).append(UnitOutcome(u, "failed" if dead else "started", not dead, gate=gate))
    return DeployResult(hosts=hosts, deployments={dep: DeploymentOutcome(
        dep, ok=False, failure=f"{plan.units[0].host.name}/decode failed: {cause.summary}")})


def answer(lab: FakeLab) -> FakeLab:
    """``lab`` made to answer to the decode settings."""
    lab.on_deploy = lambda plan: on_deploy(lab, plan)
    lab.respond = respond
    return lab


def launched(lab: FakeLab) -> list[tuple[float, int, int]]:
    """Each launch's decode (m, b, r), in order."""
    return [decode(p) for p in lab.plans]


def write(tmp_path: Path, body: str) -> Path:
    from test_experiment_file import INVENTORY

    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "exp.yml"
    path.write_text(f"inventory: {INVENTORY}\nresults: {tmp_path / 'results'}\n" + body)
    return path


LADDER = (16, 64, 256)
BISECT = 2  # choose's default


def measured(m: float, b: int, r: int) -> dict[int, dict[str, Any]]:
    """The levels the runner measures of a variant (its ladder and bisection, choose.next_level), with
    the figures the runner reads: what the store would hold, computed without running anything."""
    from gpudeploy.experiment import choose

    levels: dict[int, dict[str, Any]] = {}
    slo = {"p99_tpot_ms": SLO_TPOT_MS}
    while (c := choose.next_level(LADDER, {k: not choose.misses(f, slo) for k, f in levels.items()}, True,
                                  BISECT)) is not None:
        tpot, tok_s = figures(m, b, r, c)
        levels[c] = {"completed": 8, "failed": 0, "p99_tpot_ms": tpot, "output_tok_s_per_gpu": tok_s / GPUS}
    return levels


def score(m: float, b: int, r: int) -> float | None:
    """output tok/s per GPU at the best level under the SLO; None where a launch dies or nothing meets it."""
    from gpudeploy.experiment import choose

    if launch_ooms(m, b):
        return None
    return choose.score(measured(m, b, r), {"p99_tpot_ms": SLO_TPOT_MS})


M_VALUES = tuple(round(0.5 + 0.025 * i, 3) for i in range(19))
B_VALUES = (32, 64, 128, 256)
R_VALUES = (64, 128, 256)
BOOTS_FROM = 0.6  # the memory preflight refuses m below this on this inventory (checked by the tests)


def grid_best() -> tuple[float, tuple[float, int, int]]:
    """The best feasible score over the grid and where (the preflight's refusals have no score)."""
    best = max((score(m, b, r) or 0.0, (m, b, r)) for m in M_VALUES if m >= BOOTS_FROM for b in B_VALUES
                for r in R_VALUES)
    return best
