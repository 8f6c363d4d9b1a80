"""Parsing SGLang memory log lines, the calibration store, and budgets that use measured figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudeploy.plan.calibrate import CalibrationStore, Measured, calibration_key, parse_memory_log
from gpudeploy.plan.memory import EngineSettings, budget, recommendation_flags
from gpudeploy.plan.modelfacts import model_facts_from_mapping

LOGS = Path(__file__).parent / "logs"
FIELD_MODEL = {"kind": "mla", "weights_bytes": 146000000000, "layers": 61, "kv_lora_rank": 512,
               "qk_rope_head_dim": 64, "hidden_size": 7168, "vocab_size": 129280,
               "moe_intermediate_size": 2048, "num_experts_per_tok": 8, "context_length": 163840,
               "mtp_layers": 1}
SPEC = {"speculative_algorithm": "EAGLE", "speculative_num_steps": 1, "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 2}

OOM_LOG = (LOGS / "field-mtp-f070-oom.log").read_text().splitlines()

OK_LOG = (LOGS / "maverick-ok.log").read_text().splitlines()


def test_parse_oom_run() -> None:
    m = parse_memory_log(OOM_LOG)
    assert m.preload_free_gib == 93.52          # TP0 only
    assert m.weights_gib == 34.02 and m.after_load_avail_gib == 59.50
    assert m.kv_tokens == 480652 and m.kv_gib == 31.46
    assert m.pool_end_avail_gib == 26.80
    assert (m.oom_tried_gib, m.oom_free_gib) == (7.5, 2.3)
    assert m.failure == "oom-in-graph-capture"
    assert m.phase_reached == "graph-capture"
    assert m.graph_gib is None


def test_parse_ok_run() -> None:
    m = parse_memory_log(OK_LOG)
    assert m.failure is None and m.phase_reached == "ready"
    assert m.kv_gib == pytest.approx(16.78)
    assert m.graph_gib == 6.19 and m.graph_end_avail_gib == 5.24
    assert m.max_running_requests == 2048


@pytest.mark.parametrize(("line", "failure", "extra"), [
    ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: "
     "mem_fraction_static=0.84", "kv-pool-empty", {}),
    ("ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.88.",
     "kv-pool-empty", {}),
    ("RuntimeError: Not enough GPU memory for hybrid (mamba/linear-attention) state cache. Computed",
     "mamba-state-does-not-fit", {}),
    ("Capture cuda graph failed: CUDA out of memory. Tried to allocate 448.00 MiB. GPU 3 has a total "
     "capacity of 95.00 GiB of which 301.12 MiB is free.", "oom-in-graph-capture",
     {"oom_tried_gib": 448 / 1024}),
])
def test_parse_failures(line: str, failure: str, extra: dict[str, float]) -> None:
    m = parse_memory_log(["[2026-01-01 00:00:00 TP0] Load weight begin. avail mem=90.00 GB", line])
    assert m.failure == failure
    for k, v in extra.items():
        assert getattr(m, k) == pytest.approx(v)


def test_parse_mamba_and_newest_graph_line() -> None:
    m = parse_memory_log([
        "[x TP0] Mamba Cache is allocated. max_mamba_cache_size: 96, conv_state size: 0.50GB, ssm_state size: 13.50GB",
        "[x TP0] Capture draft decode CUDA graph end. elapsed=3.1 s. mem usage=1.20 GB. avail mem=20.00 GB.",
        "[x TP0] Capture target decode CUDA graph end. elapsed=9.9 s. mem usage=4.30 GB. avail mem=15.70 GB.",
    ])
    assert m.mamba_slots == 96 and m.state_gib == 14.0
    assert m.graph_gib == pytest.approx(5.5) and m.graph_end_avail_gib == 15.7


def test_store_roundtrip(tmp_path: Path) -> None:
    store = CalibrationStore(tmp_path / "cal" / "memory.json")
    settings = {"tp_size": 4, "mem_fraction_static": 0.7}
    assert store.get("gpu1", "dsv3", settings) is None
    m = parse_memory_log(OOM_LOG)
    store.put("gpu1", "dsv3", settings, m)
    store.put("gpu2", "dsv3", settings, Measured(weights_gib=1.0))
    assert store.get("gpu1", "dsv3", settings) == m
    assert store.get("gpu1", "dsv3", {"mem_fraction_static": 0.7, "tp_size": 4}) == m  # order-free
    assert store.get("gpu1", "dsv3", {**settings, "cuda_graph_max_bs": 16}) is None
    assert calibration_key("a", "b", {"x": 1}) != calibration_key("a", "b", {"x": 2})


def test_measured_oom_tightens_the_recommendation() -> None:
    model = model_facts_from_mapping(FIELD_MODEL, "field")
    s = EngineSettings.from_settings({"mem_fraction_static": 0.70, **SPEC}, tp_size=4)
    est = budget(95.0, model, s)
    measured = parse_memory_log(OOM_LOG)
    got = budget(95.0, model, s, measured=measured)
    assert got.verdict == "oom-in-graph-capture"
    assert got.preload_free_gib == 93.52 and got.weights_gib == 34.02
    # the OOM says >= 26.8 + 1.25 - 2.3 + 7.5 GiB was needed: more than estimated
    assert got.headroom_needed_gib >= 33.0 > est.headroom_needed_gib
    assert got.measured["graph_scale"] > 1
    assert got.recommended["mem_fraction_static"] < est.recommended["mem_fraction_static"]
    fed = EngineSettings.from_settings({"mem_fraction_static": 0.70, **SPEC, **got.recommended}, tp_size=4)
    assert budget(95.0, model, fed, measured=measured, measured_settings=s).verdict == "fits"


def test_measured_graph_usage_replaces_estimate() -> None:
    model = model_facts_from_mapping(
        {"kind": "mha", "weights_bytes": 400000000000, "layers": 48, "kv_heads": 8, "head_dim": 128,
         "hidden_size": 5120, "vocab_size": 202048, "intermediate_size": 16384,
         "moe_intermediate_size": 8192, "num_experts_per_tok": 1, "context_length": 1048576}, "maverick")
    s = EngineSettings(tp_size=8, cuda_graph_max_bs=160, context_length=131072)
    b = budget(79.19, model, s, measured=parse_memory_log(OK_LOG))
    assert b.verdict == "fits"
    graphs = b.headroom_breakdown["cuda_graphs"]
    assert graphs == pytest.approx(6.19, abs=0.01)
    assert b.measured["graph_gib"]["measured"] == 6.19


def test_recommendation_flags_per_release() -> None:
    rec = {"mem_fraction_static": 0.6, "cuda_graph_max_bs": 16, "max_running_requests": 48,
           "speculative_algorithm": None, "tp_size": 8}
    assert recommendation_flags(rec) == ["--mem-fraction-static", "0.6", "--cuda-graph-max-bs", "16",
                                         "--max-running-requests", "48"]
    names_0523 = {"cuda_graph_max_bs": "--cuda-graph-max-bs-decode"}
    flags = recommendation_flags(rec, lambda n: names_0523.get(n, "--" + n.replace("_", "-")))
    assert flags[2] == "--cuda-graph-max-bs-decode"
