"""`invoke experiment` on real lab hosts, as a user runs it.

Real engine (vLLM's CPU build behind the real sglang-router on lab3, `vllm bench serve` from the lab's
vLLM venv on lab3): two variants of --max-num-seqs; the store's rows are the client's own JSON.

Stand-ins (SGLang stand-in PD pair behind the real router on lab2; the client is `vllm bench serve`
from the lab's vLLM venv, because SGLang's bench_serving needs SGLang's whole runtime, see the
README): a variant the memory preflight refuses is skipped with its verdict and the time it saved, a
variant whose decode engine dies under load is recorded as failed under load with its cause, and
--resume after a Ctrl-C re-runs nothing that finished. Waits are conditions with deadlines.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import Lab
from deploytools import REPO, STORES, Deployments, gd, standin_role, wait_for

from gpudeploy.experiment import bench
from gpudeploy_lab import engine

pytestmark = [pytest.mark.lab, pytest.mark.router,
              pytest.mark.skipif(not (engine.ROUTER.is_built() and engine.VLLM.is_built()),
                                 reason="the lab's vLLM and sglang-router venvs are not built "
                                        "(python -m gpudeploy_lab engine)")]

# A small model's facts for the memory preflight (the stand-in serves no real weights).
FACTS = {"kind": "mha", "weights_bytes": 2_000_000_000, "layers": 16, "kv_heads": 8, "head_dim": 64,
         "hidden_size": 2048, "intermediate_size": 5632, "vocab_size": 32000, "context_length": 4096}
VLLM_CLIENT = {"client": "vllm", "python": engine.GUEST_PYTHON, "tokenizer": engine.GUEST_MODEL}


def pd_roles() -> dict[str, dict[str, Any]]:
    model = {"path": "/models/tiny-exp", "facts": FACTS}
    env = {"SGLANG_STANDIN_WEIGHTS_GIB": "1.9"}
    pre = standin_role(None, tp=1, settings={"disaggregation_mode": "prefill"}, model=model)
    dec = standin_role(None, tp=1, settings={"disaggregation_mode": "decode"}, model=model)
    for r in (pre, dec):
        r["env"].update(env)
    rt = {"engine": "sglang_router", "upstreams": {"prefill": ["pre"], "decode": ["dec"]},
          "python": engine.ROUTER_GUEST_PYTHON, "extra_args": ["--disable-circuit-breaker"],
          "health": {"timeout_s": 60}, "stop_timeout_s": 5}
    return {"pre": pre, "dec": dec, "rt": rt}


def write_experiment(root: Path, inventory: Path, variants: dict[str, Any], **bench_keys: Any) -> Path:
    doc = {"inventory": str(inventory), "results": str(root / "results"), "variants": variants,
           "benchmark": {**VLLM_CLIENT, "input_len": 16, "output_len": 8, "concurrency": [1, 2], "prompts": 6,
                         "warmup": 1, "timeout_s": 240, **bench_keys}}
    path = root / "exp.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def experiment(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    res = gd("experiment", *args, timeout=timeout)
    print(res.stdout[-6000:], res.stderr[-3000:])
    return res


def show(path: Path) -> dict[str, Any]:
    res = gd("experiment.show", "--file", str(path), "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


def variant(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(v for v in doc["variants"] if v["name"] == name)


def unit_active(lab: Lab, host: str, unit: str) -> str:
    return lab.ssh(host, f"systemctl is-active {unit} || true").stdout.strip()


def test_real_vllm_two_variants_store_matches_the_clients_json(deployments: Deployments, lab: Lab,
                                                              tmp_path: Path) -> None:
    roles = {name: yaml.safe_load((REPO / "lab" / "roles" / f"{name}.yml").read_text()) for name in ("vllm-tiny",
                                                                                             "vllm-router")}
    inv = deployments.inventory("vexp", roles, host="lab3")
    exp = write_experiment(tmp_path, inv, {"seqs-1": {"vllm-tiny": {"settings": {"max_num_seqs": 1}}},
                                           "seqs-4": {"vllm-tiny": {"settings": {"max_num_seqs": 4}}}},
                           input_len=16, output_len=16, concurrency=[1, 4], prompts=8, warmup=1)
    started = time.monotonic()
    res = experiment("--file", str(exp))
    took = time.monotonic() - started
    print(f"experiment: two vLLM variants took {took:.0f} s")
    assert res.returncode == 0, res.stdout + res.stderr
    doc = show(exp)
    for name in ("seqs-1", "seqs-4"):
        v = variant(doc, name)
        assert v["status"] == "measured" and v["timing"] == "measured (CPU)" and not v["synthetic"], v
        assert v["engine_release"] == "vllm 0.32.0", v
        assert any("KV cache" in line for lines in v["memory"].values() for line in lines), v["memory"]
        argv = next(u["argv"] for u in v["units"] if u["role"] == "vllm-tiny")
        assert argv[argv.index("--max-num-seqs") + 1] == name.split("-")[1]
        assert [lv["concurrency"] for lv in v["levels"]] == [1, 4]
        for lv in v["levels"]:
            (raw_file,) = lv["raw_files"]
            raw = json.loads((tmp_path / "results" / raw_file).read_text())   # the client's own file
            assert raw["num_prompts"] == 8 and raw["max_concurrency"] == lv["concurrency"], raw.keys()
            assert len(raw["latencies"]) == 8 and raw["completed"] == 8 and raw["failed"] == 0
            # the client's figures, and the power the run drew (none on a CPU engine)
            assert lv["figures"] == {**bench.figures("vllm", raw, 8, lv["concurrency"], 0), "output_tok_s_per_w": None}
            assert lv["figures"]["output_tok_s"] == raw["output_throughput"]
            assert lv["figures"]["p99_tpot_ms"] == raw["p99_tpot_ms"]
            assert "--max-concurrency" in lv["client_argv"] and "bench" in lv["client_argv"]
    # How much the setting changes throughput is a measurement (printed, and in the README's run),
    # not an assertion: on this shared 2-core machine seqs-4 measured 1.27x to 2.4x seqs-1 at c=4 (5 runs).
    one = variant(doc, "seqs-1")["levels"][1]["figures"]["output_tok_s"]
    four = variant(doc, "seqs-4")["levels"][1]["figures"]["output_tok_s"]
    print(f"experiment: c=4 output tok/s: seqs-1 {one:.1f}, seqs-4 {four:.1f}")
    # The best is the variant whose recorded score is highest (no SLO: its best level's tok/s per GPU).
    scores = {n: variant(doc, n)["score_tok_s_per_gpu"] for n in ("seqs-1", "seqs-4")}
    assert doc["best"]["variant"] == max(scores, key=lambda n: scores[n]), (doc["best"], scores)
    assert (tmp_path / "results" / "plot.png").stat().st_size > 10_000
    assert "seqs-4" in (tmp_path / "results" / "table.txt").read_text()
    # The experiment tore its last variant down.
    assert unit_active(lab, "lab3", "gpudeploy-vexp.vllm-tiny.service") in ("inactive", "failed", "unknown")


def test_oom_variant_skipped_and_death_under_load_recorded(deployments: Deployments, lab: Lab,
                                                           tmp_path: Path) -> None:
    inv = deployments.inventory("sexp", pd_roles(), host="lab2")
    exp = write_experiment(tmp_path, inv, {
        "base": {},
        "too-small": {"dec": {"settings": {"mem_fraction_static": 0.01}}},   # the weights cannot fit
        "dies": {"dec": {"env": {"SGLANG_STANDIN_FAULT": "crash-after-requests",
                                 "SGLANG_STANDIN_FAULT_AFTER": "6"}}},
    })
    res = experiment("--file", str(exp))
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "== too-small: SKIPPED, predicted not to boot: memory preflight predicts" in out, out
    doc = show(exp)
    base, small, dies = (variant(doc, n) for n in ("base", "too-small", "dies"))
    assert base["status"] == "measured" and base["timing"] == "synthetic", base
    assert [lv["concurrency"] for lv in base["levels"]] == [1, 2]
    assert small["status"] == "skipped" and "predicts" in small["verdict"] and small["levels"] == []
    assert small["saved_min"] and small["saved_min"] * 60 == pytest.approx(base["deploy_s"], abs=0.6)
    assert doc["minutes_saved_by_preflight"] == small["saved_min"]
    # Died while the client ran: recorded as such, with the cause the decode's journal shows.
    assert dies["status"] == "failed-under-load", dies
    assert dies["failure"].startswith("lab2/dec: ") and "illegal memory access" in dies["failure"], dies
    assert any(lv["failed_under_load"] for lv in dies["levels"]), dies["levels"]
    assert doc["best"]["variant"] == "base" and doc["best"]["timing"] == "synthetic"
    text = gd("experiment.show", "--file", str(exp)).stdout
    assert "synthetic" in text and "dies: FAILED-UNDER-LOAD: lab2/dec" in text, text
    assert "too-small: SKIPPED: memory preflight predicts" in text, text
    for unit in ("gpudeploy-sexp.pre.service", "gpudeploy-sexp.dec.service", "gpudeploy-sexp.rt.service"):
        assert unit_active(lab, "lab2", unit) != "active", unit


def rows(db: Path) -> tuple[dict[str, str], dict[tuple[str, int], float]]:
    if not db.exists():
        return {}, {}
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        variants = {n: s for n, s in conn.execute("SELECT name, status FROM variants")}
        runs = {(v, c): t for v, c, t in conn.execute("SELECT variant, concurrency, started FROM runs WHERE ok = 1")}
    except sqlite3.OperationalError:  # the schema is being created
        return {}, {}
    finally:
        conn.close()
    return variants, runs


def test_resume_after_ctrl_c_reruns_nothing_finished(deployments: Deployments, lab: Lab, tmp_path: Path) -> None:
    inv = deployments.inventory("rexp", pd_roles(), host="lab2")
    exp = write_experiment(tmp_path, inv, {"first": {}, "second": {"dec": {"settings": {"max_running_requests": 64}}}},
                           concurrency=[1, 2, 4])
    db = tmp_path / "results" / "experiment.sqlite"
    env = {**os.environ, **STORES}
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "--search-root", str(REPO), "experiment", "--file",
                             str(exp)], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # Ctrl-C once the second variant has a finished level and is running the next one.
        wait_for(lambda: (lambda v, r: v.get("second") == "running" and ("second", 1) in r)(*rows(db)), 400,
                 "the second variant's first level")
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    print(out[-4000:])
    assert proc.returncode == 130, out
    assert "interrupted during the benchmark of variant second" in out or "interrupted" in out, out
    assert "still running:" in out and "--deployment rexp" in out, out
    variants, before = rows(db)
    assert variants == {"first": "measured", "second": "interrupted"}, variants
    assert ("first", 4) in before and ("second", 1) in before

    res = experiment("--file", str(exp), "--resume")
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "== first: already measured; not re-run (--resume)" in out, out
    variants, after = rows(db)
    assert variants == {"first": "measured", "second": "measured"}, variants
    # Nothing that finished ran again: same rows, same start times; the rest of the ladder was added.
    assert {k: v for k, v in after.items() if k in before} == before
    assert {("second", 2), ("second", 4)} <= set(after)
    assert "--deployment rexp" not in out


def test_two_checkpoints_and_a_shipped_config_file_with_power_in_the_table(deployments: Deployments, lab: Lab,
                                                                           tmp_path: Path) -> None:
    """Issue 25: the checkpoint varies (model.path with its own facts), one variant ships tuned MoE
    configs (uploaded to lab2, pointed at by SGLANG_MOE_CONFIG_DIR), and the table shows the stand-in
    GPUs' power; the NVML samplers are gone with the runs that used them."""
    inv = deployments.inventory("cexp", pd_roles(), host="lab2")
    configs = tmp_path / "tuned" / "configs" / "triton_3_4_0"
    configs.mkdir(parents=True)
    tuned = configs / "E=128,N=384,device_name=NVIDIA_RTX_PRO_6000,dtype=fp8_w8a8.json"
    tuned.write_text('{"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "num_warps": 4}}\n')
    half = {**FACTS, "weights_bytes": 1_000_000_000}  # the smaller checkpoint's own facts

    def checkpoint(path: str, facts: dict[str, Any]) -> dict[str, Any]:
        return {"model": {"path": path, "facts": facts}}

    exp = write_experiment(tmp_path, inv, {
        "ckpt-a": {"pre": checkpoint("/models/tiny-exp-a", FACTS), "dec": checkpoint("/models/tiny-exp-a", FACTS)},
        "ckpt-b": {"pre": checkpoint("/models/tiny-exp-b", half),
                   "dec": {**checkpoint("/models/tiny-exp-b", half), "files": {"SGLANG_MOE_CONFIG_DIR": "tuned"}}},
    })
    dry = experiment("--file", str(exp), "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    for name in ("ckpt-a", "ckpt-b"):
        block = dry.stdout.split(f"== {name}:", 1)[1].split("== ", 1)[0]
        assert "memory lab2/pre: " in block and "memory lab2/dec: " in block, block
    assert "ships tuned (1 file, " in dry.stdout, dry.stdout

    res = experiment("--file", str(exp))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "shipped tuned (1 file) to lab2:/var/lib/gpudeploy/shipped/" in res.stdout, res.stdout
    doc = show(exp)
    for name, path in (("ckpt-a", "/models/tiny-exp-a"), ("ckpt-b", "/models/tiny-exp-b")):
        v = variant(doc, name)
        assert v["status"] == "measured", v
        for role in ("pre", "dec"):
            argv = next(u["argv"] for u in v["units"] if u["role"] == role)
            assert argv[argv.index("--model-path") + 1] == path, argv
        for lv in v["levels"]:
            f = lv["figures"]
            assert f["mean_power_w"] and f["mean_power_w"] > 0 and f["power_samples"] > 0, f
            assert f["output_tok_s_per_w"] == pytest.approx(f["output_tok_s"] / f["mean_power_w"], rel=0.01), f
            assert f["power_standin"] is True and f["mean_sm_util_pct"] is not None, f
    b_dec = next(u for u in variant(doc, "ckpt-b")["units"] if u["role"] == "dec")
    shipped = b_dec["env"]["SGLANG_MOE_CONFIG_DIR"]
    assert shipped.startswith("/var/lib/gpudeploy/shipped/"), b_dec["env"]
    assert "SGLANG_MOE_CONFIG_DIR" not in next(u for u in variant(doc, "ckpt-a")["units"] if u["role"] == "dec")["env"]
    on_host = lab.ssh("lab2", f"cat '{shipped}/configs/triton_3_4_0/{tuned.name}'", check=True).stdout
    assert on_host == tuned.read_text()  # the very file, where the engine was pointed
    env_file = lab.ssh("lab2", "cat /etc/gpudeploy/cexp.dec.env", check=True).stdout  # the last variant's run
    assert f"SGLANG_MOE_CONFIG_DIR={shipped}" in env_file, env_file
    assert lab.ssh("lab2", "ls -A /var/lib/gpudeploy/shipped/ | grep -c '^.incoming' || true").stdout.strip() == "0"
    table = (tmp_path / "results" / "table.txt").read_text()
    head = next(line for line in table.splitlines() if "VARIANT" in line)
    assert " W " in head and " /W " in head, table
    assert "power from a stand-in NVML (the lab's): modelled" in table, table
    # no sampler outlived its run: nothing on lab2 runs the sampler's script (read, never killed by name)
    procs = lab.ssh("lab2", "ps -eo pid,args", check=True).stdout
    assert "nvmlDeviceGetPowerUsage" not in procs, procs
