"""Reading SGLang's memory log lines (pasted from public threads, or its format strings, cited in
each log's header), the calibration store, and plans that learn from a previous run."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudeploy.memory.modelfacts import model_facts_from_mapping
from gpudeploy.memory.recommend import EngineSettings, budget, recommendation_flags
from gpudeploy.plan.calibrate import CalibrationStore, Measured, calibration_key, parse_memory_log

LOGS = Path(__file__).parent / "logs"
FIELD_MODEL = {"kind": "mla", "weights_bytes": 146000000000, "layers": 61, "kv_lora_rank": 512,
               "qk_rope_head_dim": 64, "hidden_size": 7168, "vocab_size": 129280,
               "moe_intermediate_size": 2048, "num_experts_per_tok": 8, "context_length": 163840,
               "mtp_layers": 1}
SPEC = {"speculative_algorithm": "EAGLE", "speculative_num_steps": 1, "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 2}


def log(name: str) -> list[str]:
    return [line for line in (LOGS / name).read_text().splitlines() if not line.startswith("#")]


def test_public_tp8_start_reads_rank_zero_only() -> None:
    m = parse_memory_log(log("public-sglang-11716-tp8.log"))
    # rank 0 logged no KV or pool line in the excerpt: other ranks' figures are not taken as its own
    assert m.kv_tokens is None and m.pool_end_avail_gib is None
    assert m.phase_reached == "graph-capture" and m.failure is None


def test_public_b200_run_that_boots() -> None:
    m = parse_memory_log(log("public-sglang-11830-b200.log"))
    assert m.graph_gib == 1.44 and m.graph_end_avail_gib == 37.06
    assert m.max_running_requests == 4096
    # the scheduler's summary line comes after every capture, before the HTTP server is up
    assert m.phase_reached == "warmup" and m.failure is None


def test_piecewise_lines_are_not_the_decode_graphs() -> None:
    m = parse_memory_log(log("public-sglang-20758-piecewise.log"))
    assert m.graph_gib == 0.83 and m.graph_end_avail_gib == 10.81     # TP0's, not TP1's
    assert m.prefill_graph_gib is None                                  # begun, not ended


def test_0523_formats() -> None:
    m = parse_memory_log(log("sglang-0.5.23-format.log"))
    assert m.kv_tokens == 1106304 and m.kv_gib == pytest.approx(50.64)
    assert m.weights_gib == 14.62 and m.preload_free_gib == 78.42
    assert m.pool_end_avail_gib == 12.05
    assert m.prefill_graph_gib == 1.31          # "target prefill" graphs are counted apart
    assert m.graph_gib == 0.52 and m.graph_end_avail_gib == 10.16
    assert m.phase_reached == "graphs-captured"


def test_draft_run_keeps_the_targets_figures() -> None:
    m = parse_memory_log(log("sglang-0.5.9-eagle.log"))
    assert (m.preload_free_gib, m.weights_gib, m.after_load_avail_gib) == (78.10, 18.70, 59.40)
    assert m.kv_tokens == 1512000 and m.kv_gib == pytest.approx(46.14)
    assert m.pool_end_avail_gib == 17.30
    assert m.graph_gib == 0.54 and m.graph_end_avail_gib == 16.74
    assert m.draft_weights_gib == 0.55 and m.draft_kv_gib == pytest.approx(0.58)
    assert m.draft_graph_gib == 0.21


def test_graph_oom_gives_a_floor_on_graph_memory() -> None:
    m = parse_memory_log(log("sglang-0.5.9-graph-oom.log"))
    assert m.preload_free_gib == 93.52          # TP0 only
    assert m.weights_gib == 34.02 and m.after_load_avail_gib == 59.50
    assert m.kv_tokens == 480652 and m.kv_gib == 31.46
    assert (m.oom_tried_gib, m.oom_free_gib) == (7.5, 2.3)
    assert m.failure == "oom-in-graph-capture" and m.phase_reached == "graph-capture"
    assert m.graph_gib is None
    # it had 26.50 GiB when capture began, used all but 2.30 of it and wanted 7.50 more
    assert m.graph_begin_avail_gib == 26.50 and m.graph_floor_gib == pytest.approx(31.70)


@pytest.mark.parametrize(("line", "failure", "extra"), [
    ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: "
     "self.server_args.mem_fraction_static=0.84", "kv-pool-empty", {}),
    ("ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.88. "
     "Raise --mem-fraction-static above 0.912", "kv-pool-empty", {}),
    ("RuntimeError: Not enough GPU memory for hybrid (mamba/linear-attention) state cache. Computed "
     "max_mamba_cache_size=0", "mamba-state-does-not-fit", {}),
    ("Capture cuda graph failed: CUDA out of memory. Tried to allocate 448.00 MiB. GPU 3 has a total "
     "capacity of 95.00 GiB of which 301.12 MiB is free.", "oom-in-graph-capture",
     {"oom_tried_gib": 448 / 1024}),
])
def test_parse_failures(line: str, failure: str, extra: dict[str, float]) -> None:
    m = parse_memory_log(["[2026-01-01 00:00:00 TP0] Load weight begin. avail mem=90.00 GB", line])
    assert m.failure == failure
    for k, v in extra.items():
        assert getattr(m, k) == pytest.approx(v)


def test_store_roundtrip(tmp_path: Path) -> None:
    store = CalibrationStore(tmp_path / "cal" / "memory.json")
    settings = {"tp_size": 4, "mem_fraction_static": 0.7}
    assert store.get("gpu1", "dsv3", settings) is None
    m = parse_memory_log(log("sglang-0.5.9-graph-oom.log"))
    store.put("gpu1", "dsv3", settings, m)
    store.put("gpu2", "dsv3", settings, Measured(weights_gib=1.0))
    assert store.get("gpu1", "dsv3", settings) == m
    assert store.get("gpu1", "dsv3", {"mem_fraction_static": 0.7, "tp_size": 4}) == m  # order-free
    assert store.get("gpu1", "dsv3", {**settings, "cuda_graph_max_bs": 16}) is None
    assert calibration_key("a", "b", {"x": 1}) != calibration_key("a", "b", {"x": 2})


def test_a_failed_capture_makes_the_next_plan_predict_it_and_recommend_what_fits() -> None:
    model = model_facts_from_mapping(FIELD_MODEL, "field")
    s = EngineSettings.from_settings({"mem_fraction_static": 0.70, **SPEC}, tp_size=4)
    before = budget(95.0, model, s, release="0.5.9")
    assert before.verdict == "fits"                        # nothing measured predicts this failure
    measured = parse_memory_log(log("sglang-0.5.9-graph-oom.log"))
    got = budget(95.0, model, s, measured=measured, release="0.5.9")
    assert got.verdict == "oom-in-graph-capture"
    assert got.preload_free_gib == 93.52 and got.weights_gib == 34.02
    graphs = sum(v for k, v in got.headroom_breakdown.items() if k.endswith("_graphs"))
    assert graphs >= 31.70 - 1e-9                          # at least the floor the OOM proves
    fed = EngineSettings.from_settings({"mem_fraction_static": 0.70, **SPEC, **got.recommended}, tp_size=4)
    again = budget(95.0, model, fed, measured=measured, measured_settings=s, release="0.5.9")
    assert again.verdict == "fits" and again.margin_gib >= again.spare_wanted_gib


def test_measured_graph_usage_replaces_estimate() -> None:
    model = model_facts_from_mapping(
        {"kind": "mha", "weights_gib": 15.5, "layers": 28, "kv_heads": 4, "head_dim": 128, "hidden_size": 3584,
         "vocab_size": 152064, "intermediate_size": 18944, "context_length": 128000}, "qwen2.5-vl-7b")
    s = EngineSettings(tp_size=1, disable_prefill_cuda_graph=True)
    b = budget(178.4, model, s, measured=parse_memory_log(log("public-sglang-11830-b200.log")), release="0.5.9")
    assert b.verdict == "fits"
    assert b.headroom_breakdown["cuda_graphs"] == pytest.approx(1.44, abs=0.01)
    assert b.measured["graph_gib"]["measured"] == 1.44
    assert b.error_band_gib < budget(178.4, model, s, release="0.5.9").error_band_gib


def test_recommendation_flags_per_release() -> None:
    rec = {"mem_fraction_static": 0.6, "cuda_graph_max_bs": 16, "max_running_requests": 48,
           "speculative_algorithm": None, "tp_size": 8}
    assert recommendation_flags(rec) == ["--mem-fraction-static", "0.6", "--cuda-graph-max-bs", "16",
                                         "--max-running-requests", "48"]
    names_0523 = {"cuda_graph_max_bs": "--cuda-graph-max-bs-decode"}
    flags = recommendation_flags(rec, lambda n: names_0523.get(n, "--" + n.replace("_", "-")))
    assert flags[2] == "--cuda-graph-max-bs-decode"


def test_store_latest_run_under_any_settings(tmp_path: Path) -> None:
    store = CalibrationStore(tmp_path / "memory.json")
    assert store.latest("gpu1", "m") is None
    store.put("gpu1", "m", {"mem_fraction_static": 0.85}, Measured(failure="oom-in-graph-capture"))
    store.put("gpu1", "m", {"mem_fraction_static": 0.80}, Measured(weights_gib=34.0))
    store.put("gpu2", "m", {"mem_fraction_static": 0.70}, Measured(weights_gib=1.0))
    assert store.latest("gpu1", "m") == ({"mem_fraction_static": 0.80}, Measured(weights_gib=34.0))
