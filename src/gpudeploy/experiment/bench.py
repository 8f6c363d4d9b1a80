"""The engine's own benchmark client: its argv for one run, and the figures read from its JSON.

    SGLang deployments: python -m sglang.bench_serving --backend sglang --dataset-name random-ids ...
                        --output-file <one file per run> (it appends a JSON line per run)
    vLLM deployments:   vllm bench serve --backend vllm --dataset-name random ... --save-result
                        --result-dir D --result-filename F

The client runs on the router's host, against the router, so what it measures is what users of the
deployment get. Its argv is a list (the transport quotes it); nothing from the experiment file is run
through a shell. It runs under ``timeout`` (so it ends by itself, also when gpudeploy is gone) and with
proxies off: benchmark traffic goes to the router and nowhere else. Its HOME, TMPDIR and caches are
its own run folder (benchdir.py: private to the SSH user, made atomically), and its python runs
with ``-s`` and PYTHONNOUSERSITE=1: no user site-packages, wherever HOME points.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from ..errors import InputError, Problem
from ..model import Host, Plan, Unit
from .spec import Benchmark, Experiment

METRICS = ("ttft", "tpot", "itl", "e2el")
KILL_AFTER_S = 10


@dataclass(frozen=True)
class Target:
    """Where the client runs and what it measures."""

    host: Host  # the router's host (the engine's, without a router)
    url: str  # http://address:port of the router
    through: str  # host/role of the router
    model: str  # the name requests carry
    tokenizer: str
    client: str  # sglang | vllm
    engine: str  # sglang | vllm: what serves behind the router
    gpus: int  # GPUs of the deployment's engines
    synthetic: bool  # the engines are the lab's SGLang stand-in: token timing is synthetic
    python: str | None = None  # the client's interpreter (SGLang's: the engines' own, which has sglang)


def engine_family(unit: Unit) -> str:
    return "vllm" if unit.role.log_format == "vllm" else "sglang" if unit.role.engine == "sglang" else "command"


def target(exp: Experiment, plan: Plan) -> Target:
    """The router of the deployment (or its one engine) and the client that fits its engines."""
    engines = [u for u in plan.units if u.role.engine != "sglang_router"]
    routers = [u for u in plan.units if u.role.engine == "sglang_router"]
    problems: list[Problem] = []
    if len(routers) > 1:
        problems.append(Problem(f"the deployment has {len(routers)} routers; an experiment measures through one",
                                file=exp.file, key="deployment"))
    if not routers and len(engines) != 1:
        problems.append(Problem("the deployment has no router and more than one engine: add a router role",
                                file=exp.file, key="deployment"))
    if problems:
        raise InputError(problems)
    front = routers[0] if routers else engines[0]
    families = {engine_family(u) for u in engines}
    engine = "sglang" if "sglang" in families else "vllm"
    client = exp.benchmark.client or engine
    model = _served_name(engines)
    tokenizer = exp.benchmark.tokenizer or str(next((u.role.model.get("path") for u in engines
                                                     if u.role.model.get("path")), "") or "")
    if not tokenizer:
        raise InputError([Problem("the client needs a tokenizer: set benchmark.tokenizer (a model folder on the "
                                  "router's host)", file=exp.file, key="benchmark.tokenizer")])
    gpus = sum(len(u.gpus) for u in engines)
    synthetic = any(u.role.engine == "sglang" and "SGLANG_STANDIN_SPEED" in u.env for u in engines)
    python = exp.benchmark.python
    if python is None and client == "sglang" and engine == "sglang":
        python = next((u.role.python or u.host.python for u in engines if u.role.engine == "sglang"), None)
    return Target(front.host, f"http://{front.host.address}:{front.ports['http']}", front.key, model, tokenizer,
                  client, engine, gpus, synthetic, python)


def _served_name(engines: list[Unit]) -> str:
    for u in engines:
        name = u.role.settings.get("served_model_name")
        if name:
            return str(name)
    return str(next((u.role.model.get("path") for u in engines if u.role.model.get("path")), "default"))


def run_prefix(experiment: str, variant: str, concurrency: int, repeat: int) -> str:
    """The start of a run folder's name (benchdir.py adds a part nobody can guess)."""
    return f"{experiment}.{variant}.c{concurrency}-r{repeat}."


def result_path(t: Target, folder: str) -> str:
    return f"{folder}/result.json" if t.client == "vllm" else f"{folder}/result.jsonl"


def client_argv(b: Benchmark, t: Target, concurrency: int, folder: str) -> list[str]:
    """The whole command line of one run, with its environment and time limit in front."""
    env = ["/usr/bin/env", "-u", "http_proxy", "-u", "https_proxy", "-u", "HTTP_PROXY", "-u", "HTTPS_PROXY",
           "-u", "all_proxy", "-u", "ALL_PROXY", "NO_PROXY=*", "no_proxy=*", "HF_HUB_OFFLINE=1",
           "TRANSFORMERS_OFFLINE=1", "VLLM_NO_USAGE_STATS=1", "DO_NOT_TRACK=1", "PYTHONNOUSERSITE=1",
           f"HOME={folder}",
           f"TMPDIR={folder}", f"HF_HOME={folder}/hf", f"XDG_CACHE_HOME={folder}/cache"]
    limit = ["timeout", "-k", str(KILL_AFTER_S), f"{b.timeout_s:g}"]
    if t.client == "vllm":
        head = [t.python, "-s", "-m", "vllm.entrypoints.cli.main"] if t.python else ["vllm"]
        argv = [*head, "bench", "serve", "--backend", b.backend or ("vllm" if t.engine == "vllm" else "openai"),
                "--base-url", t.url, "--endpoint", "/v1/completions", "--model", t.model, "--tokenizer", t.tokenizer,
                "--dataset-name", b.dataset or "random", "--random-input-len", str(b.input_len),
                "--random-output-len", str(b.output_len), "--num-prompts", str(b.prompts),
                "--max-concurrency", str(concurrency), "--request-rate", "inf", "--num-warmups", str(b.warmup),
                "--seed", str(b.seed), "--ignore-eos", "--temperature", "0",
                "--percentile-metrics", ",".join(METRICS), "--metric-percentiles", "50,90,99",
                "--save-result", "--result-dir", folder, "--result-filename", "result.json", "--disable-tqdm"]
    else:
        argv = [t.python or "python3", "-s", "-m", "sglang.bench_serving", "--backend", b.backend or "sglang",
                "--base-url", t.url, "--model", t.model, "--tokenizer", t.tokenizer,
                "--dataset-name", b.dataset or "random-ids", "--random-input-len", str(b.input_len),
                "--random-output-len", str(b.output_len), "--random-range-ratio", "1",
                "--num-prompts", str(b.prompts), "--max-concurrency", str(concurrency), "--request-rate", "inf",
                "--warmup-requests", str(b.warmup), "--seed", str(b.seed),
                "--output-file", f"{folder}/result.jsonl", "--disable-tqdm"]
    return [*limit, *env, *argv, *b.extra_args]


def parse_result(client: str, text: str) -> dict[str, Any]:
    """The client's own file -> its JSON document (SGLang's: the last line; one run per file)."""
    text = text.strip()
    if not text:
        raise ValueError("the client wrote an empty result file")
    if client == "sglang":
        text = text.splitlines()[-1]
    doc = json.loads(text)
    if not isinstance(doc, dict):
        raise ValueError("the result is not a JSON object")
    return doc


def _num(doc: dict[str, Any], key: str) -> float | None:
    v = doc.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or math.isinf(v):
        return None
    return float(v)


def figures(client: str, doc: dict[str, Any], prompts: int, concurrency: int, gpus: int) -> dict[str, Any]:
    """The figures the table shows, read from the client's JSON under its own names.

    tok/s per GPU divides output tok/s by the engines' GPUs (by 1 for a CPU engine, which has none);
    tok/s per user is a request's output tokens over its median end-to-end latency: the rate at which
    one user's answer is complete, first token included (1000 / TPOT leaves the wait for the first
    token out and is meaningless where a stream arrives in one piece: TPOT ~0).
    """
    completed = int(_num(doc, "completed") or 0)
    failed = int(_num(doc, "failed") or 0) if client == "vllm" else max(0, prompts - completed)
    out: dict[str, Any] = {"completed": completed, "failed": failed, "duration_s": _num(doc, "duration"),
                           "request_per_s": _num(doc, "request_throughput"),
                           "output_tok_s": _num(doc, "output_throughput"),
                           "total_tok_s": _num(doc, "total_token_throughput" if client == "vllm"
                                               else "total_throughput"),
                           "accept_length": _num(doc, "accept_length")}
    for m in METRICS:
        for stat in ("mean", "median", "p90", "p99"):
            # SGLang names end-to-end latency e2e_latency; vLLM e2el.
            name = f"{stat}_e2e_latency_ms" if m == "e2el" and client == "sglang" else f"{stat}_{m}_ms"
            out[f"{stat}_{m}_ms"] = _num(doc, name)
    output = out["output_tok_s"]
    out["output_tok_s_per_gpu"] = output / max(1, gpus) if output is not None else None
    tokens, e2el = _num(doc, "total_output_tokens"), out["median_e2el_ms"]
    out["output_tok_s_per_user"] = tokens / completed / (e2el / 1000) if tokens and completed and e2el else None
    return out
