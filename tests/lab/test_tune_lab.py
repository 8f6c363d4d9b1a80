"""`invoke tune` on real lab hosts, through the real CLI, as a user runs it (issue 47).

The SGLang stand-in PD pair behind the real router on lab2, measured by `vllm bench serve` (as in
test_experiment_lab.py: SGLang's own client needs SGLang's runtime). The stand-in answers to its
memory settings as SGLang does (src/gpudeploy_lab/standin/memory.py): with
SGLANG_STANDIN_GRAPH_MIB_PER_BS=256 a decode that captures graphs up to batch 160 needs 40 GiB of
headroom, so it dies in CUDA graph capture at mem_fraction_static 0.6 or more (only a launch shows
it: gpudeploy's preflight estimates a tiny model's graphs), while 0.01 leaves no room for the weights
(the preflight refuses it, no launch). Token timing is the stand-in's: the figures are synthetic;
what is checked is what the search does with them. Waits are conditions with deadlines.

    1. a prefill-only change between two trials restarts prefill and leaves decode and the router
       running (the same processes);
    2. the inventory's own decode (0.6, 160) is the first trial: it dies with its cause recorded, and
       its region (mem_fraction_static >= 0.6 with cuda_graph_max_bs >= 160) is never launched again;
       0.01 is refused without a launch;
    3. Ctrl-C while a later trial is benchmarked, then the same command: the study goes on, no finished
       trial runs again;
    4. the best variant's files deploy as they are.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import Lab
from deploytools import REPO, STORES, Deployments, gd, standin_role, wait_for

from gpudeploy_lab import engine

pytestmark = [pytest.mark.lab, pytest.mark.router,
              pytest.mark.skipif(not (engine.ROUTER.is_built() and engine.VLLM.is_built()),
                                 reason="the lab's vLLM and sglang-router venvs are not built "
                                        "(python -m gpudeploy_lab engine)")]

FACTS = {"kind": "mha", "weights_bytes": 2_000_000_000, "layers": 16, "kv_heads": 8, "head_dim": 64,
         "hidden_size": 2048, "intermediate_size": 5632, "vocab_size": 32000, "context_length": 4096}
CLIENT = {"client": "vllm", "python": engine.GUEST_PYTHON, "tokenizer": engine.GUEST_MODEL}


def pd_roles(decode_settings: dict[str, Any]) -> dict[str, dict[str, Any]]:
    model = {"path": "/models/tiny-tune", "facts": FACTS}
    # the prefill's graphs fit whatever the search does (the release's default graph batch would not:
    # the stand-in's graphs cost SGLANG_STANDIN_GRAPH_MIB_PER_BS per captured batch size)
    pre = standin_role(None, tp=1, settings={"disaggregation_mode": "prefill", "chunked_prefill_size": 2048,
                                            "mem_fraction_static": 0.6, "cuda_graph_max_bs": 8}, model=model)
    dec = standin_role(None, tp=1, settings={"disaggregation_mode": "decode", **decode_settings}, model=model)
    for r in (pre, dec):
        r["env"].update({"SGLANG_STANDIN_WEIGHTS_GIB": "1.9", "SGLANG_STANDIN_GRAPH_MIB_PER_BS": "256"})
    rt = {"engine": "sglang_router", "upstreams": {"prefill": ["pre"], "decode": ["dec"]},
          "python": engine.ROUTER_GUEST_PYTHON, "extra_args": ["--disable-circuit-breaker"],
          "health": {"timeout_s": 60}, "stop_timeout_s": 5}
    return {"pre": pre, "dec": dec, "rt": rt}


def write(root: Path, inventory: Path, space: dict[str, Any], budget: dict[str, int],
          concurrency: tuple[int, ...] = (1, 2)) -> Path:
    doc = {"inventory": str(inventory), "results": str(root / "results"),
           "search": {"space": space, "objective": "output_tok_s_per_gpu", "budget": budget, "seed": 1},
           "benchmark": {**CLIENT, "input_len": 16, "output_len": 8, "concurrency": list(concurrency), "prompts": 6,
                         "warmup": 1, "timeout_s": 240}}
    root.mkdir(parents=True, exist_ok=True)
    path = root / "exp.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def tune(*args: str, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    res = gd("tune", *args, timeout=timeout)
    print(res.stdout[-8000:], res.stderr[-3000:])
    return res


def rows(db: Path) -> dict[str, dict[str, Any]]:
    """key -> the store's row (status, overrides, started, finished) and its finished levels' start times."""
    if not db.exists():
        return {}
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        out = {k: {"status": s, "overrides": json.loads(o), "started": st, "finished": f, "runs": {}}
               for k, s, o, st, f in conn.execute("SELECT key, status, overrides, started, finished FROM variants")}
        for k, c, t in conn.execute("SELECT variant_key, concurrency, started FROM runs WHERE ok = 1"):
            if k in out:
                out[k]["runs"][c] = t
    except sqlite3.OperationalError:  # the schema is being created
        return {}
    finally:
        conn.close()
    return out


def dec_point(row: dict[str, Any]) -> tuple[float, int]:
    s = row["overrides"]["dec"]["settings"]
    return float(s["mem_fraction_static"]), int(s["cuda_graph_max_bs"])


def test_a_search_on_the_stand_in_prunes_learns_resumes_and_answers_with_files_that_deploy(
        deployments: Deployments, lab: Lab, tmp_path: Path) -> None:
    # 1. Only what changed restarts between trials: two trials that differ in prefill alone (one level
    #    each: what is checked here is what restarts, not the ladder).
    inv = deployments.inventory("tpre", pd_roles({"mem_fraction_static": 0.6, "cuda_graph_max_bs": 8}), host="lab2")
    first = write(tmp_path / "pre", inv, {"pre.settings.chunked_prefill_size": {"choices": [2048, 4096]}},
                  {"launches": 2, "trials": 8}, concurrency=(1,))
    res = tune("--file", str(first))
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    # decode and the router kept running across the prefill change: each was started once (the first
    # trial), and the second found that process unchanged and healthy (the router was restarted before)
    for role in ("dec", "rt"):
        started = re.findall(rf"\[lab2/{role}\] (?:re)?started \S+: MainPID (\d+)", out)
        kept = re.findall(rf"\[lab2/{role}\] unchanged and healthy \(MainPID (\d+)\); not restarted", out)
        assert len(started) == 1 and kept == started, (role, started, kept, out)
    assert len(re.findall(r"\[lab2/pre\] (?:re)?started ", out)) == 2, out
    assert "restarted after its engines" not in out, out
    assert "launches: 2 spent (2 measured, 0 failed)" in out, out
    for unit in ("gpudeploy-tpre.pre.service", "gpudeploy-tpre.dec.service", "gpudeploy-tpre.rt.service"):
        assert lab.ssh("lab2", f"systemctl is-active {unit} || true").stdout.strip() != "active", unit

    # 2. and 3. The main search: the inventory's own decode dies first; Ctrl-C later; the same command again.
    inv = deployments.inventory("tune", pd_roles({"mem_fraction_static": 0.6, "cuda_graph_max_bs": 160}), host="lab2")
    path = write(tmp_path / "main", inv, {
        "pre.settings.chunked_prefill_size": {"choices": [2048, 4096]},
        "dec.settings.mem_fraction_static": {"choices": [0.01, 0.6, 0.9]},
        "dec.settings.cuda_graph_max_bs": {"choices": [8, 160]},
    }, {"launches": 4, "trials": 30})
    db = tmp_path / "main" / "results" / "experiment.sqlite"
    env = {**os.environ, **STORES}
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "--search-root", str(REPO), "tune", "--file", str(path)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # Ctrl-C once a trial is measured and a later one has a finished level and is running the next
        wait_for(lambda: (lambda r: any(v["status"] == "measured" for v in r.values())
                          and any(v["status"] == "running" and v["runs"] for v in r.values()))(rows(db)),
                 900, "a measured trial, then one running with a finished level")
        proc.send_signal(signal.SIGINT)
        cut, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    print(cut[-6000:])
    assert proc.returncode == 130, cut
    assert "`invoke tune --file" in cut and "goes on from here" in cut, cut
    before = rows(db)
    finished_before = {k: v for k, v in before.items() if v["status"] in ("measured", "skipped", "deploy-failed")}

    res = tune("--file", str(path))
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "going on with the study" in out and "optuna-dashboard sqlite:///" in out, out
    after = rows(db)
    for key, row in finished_before.items():  # no finished trial ran again
        assert (after[key]["started"], after[key]["runs"]) == (row["started"], row["runs"]), (key, row, after[key])
    # the inventory's own decode died in graph capture, with its cause; its region was never launched again
    died = [v for v in after.values() if v["status"] == "deploy-failed"]
    assert [dec_point(v) for v in died] == [(0.6, 160)], died
    doc = json.loads(gd("experiment.show", "--file", str(path), "--json").stdout)
    failed = next(v for v in doc["variants"] if v["status"] == "deploy-failed")
    assert "CUDA out of memory" in failed["failure"], failed
    launched = [v for v in after.values() if v["status"] in ("measured", "deploy-failed", "interrupted")]
    assert not [v for v in launched if v not in died and dec_point(v)[0] >= 0.6 and dec_point(v)[1] >= 160]
    # 0.01 refused by the preflight, no launch: no unit ever ran it
    refused = [v for v in doc["variants"] if v["overrides"]["dec"]["settings"]["mem_fraction_static"] == 0.01]
    assert all(v["status"] == "skipped" and "memory preflight predicts" in v["verdict"] and not v["units"]
               for v in refused), refused
    assert "launches: 4 spent" in out and "1 oom-in-graph-capture" in out, out

    # 4. The best variant's files deploy as they are.
    best_inv = tmp_path / "main" / "results" / "best" / "hosts.yml"
    assert f"`gpudeploy deploy --inventory {best_inv}` deploys it as it is" in out, out
    deployments.made.append(best_inv)  # torn down with the rest
    dep = gd("deploy", "--inventory", str(best_inv), timeout=600)
    assert dep.returncode == 0, dep.stdout + dep.stderr
    best = doc["variants"][0]  # best first
    want = best["overrides"]["dec"]["settings"]
    status = json.loads(gd("status", "--inventory", str(best_inv), "--json").stdout)
    assert status["healthy"], status
    argv = lab.ssh("lab2", "cat /proc/$(systemctl show -p MainPID --value gpudeploy-tune.dec.service)/cmdline "
                   "| tr '\\0' ' '", check=True).stdout
    assert f"--mem-fraction-static {want['mem_fraction_static']:g}" in argv, argv
