"""Choosing the next level and variant, reading the clients' JSON, and the store -> table -> plot path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudeploy.experiment import bench, choose
from gpudeploy.experiment.plot import plot
from gpudeploy.experiment.show import summary, table
from gpudeploy.experiment.spec import Variant
from gpudeploy.experiment.store import RunRow, Store

LADDER = (1, 4, 16, 64)


def climb(passes_up_to: int, bisect: int = 3) -> list[int]:
    """Run the ladder against an engine that meets the SLO up to ``passes_up_to`` concurrency."""
    met: dict[int, bool] = {}
    order = []
    while (c := choose.next_level(LADDER, met, True, bisect)) is not None:
        order.append(c)
        met[c] = c <= passes_up_to
    return order


def test_the_ladder_stops_at_the_first_miss_then_bisects_to_the_highest_level_that_meets_the_slo() -> None:
    assert climb(100) == [1, 4, 16, 64]                 # everything meets it: no bisection
    assert climb(10) == [1, 4, 16, 10, 13, 11]          # 16 missed: 4..16 bisected three times
    assert climb(10, bisect=1) == [1, 4, 16, 10]
    assert climb(0) == [1]                              # the lowest level missed: nothing below 1
    assert climb(5, bisect=0) == [1, 4, 16]
    no_slo: dict[int, bool] = {}
    order = []
    while (c := choose.next_level(LADDER, no_slo, False, 3)) is not None:
        order.append(c)
        no_slo[c] = True
    assert order == list(LADDER)


def test_slo_misses_and_failed_requests() -> None:
    slo = {"p99_tpot_ms": 50.0, "p99_ttft_ms": 1000.0}
    good = {"completed": 10, "failed": 0, "p99_tpot_ms": 20.0, "p99_ttft_ms": 300.0}
    assert choose.misses(good, slo) == []
    assert choose.misses({**good, "p99_tpot_ms": 80.0}, slo) == ["p99_tpot_ms 80.0 > 50"]
    assert choose.misses({**good, "failed": 2}, slo) == ["2 requests failed"]
    assert choose.misses({**good, "p99_ttft_ms": None}, slo) == ["p99_ttft_ms not reported"]


def grid(n: int) -> list[Variant]:
    return [Variant(f"seqs={2 ** i}", {}, grid=(("r.settings.seqs", 2 ** i),), grid_index=(i,)) for i in range(n)]


def test_a_grid_dimension_stops_once_a_step_pays_less_than_asked() -> None:
    points = grid(5)
    scores = {"seqs=1": 100.0, "seqs=2": 180.0, "seqs=4": 185.0}
    assert choose.stop_reason(points[2], points, scores, {}, 5) is None       # 1 -> 2 gained 80%
    why = choose.stop_reason(points[3], points, scores, {}, 5)                # 2 -> 4 gained 2.8%
    assert why is not None and why.startswith("dimension r.settings.seqs stopped paying") and "+2.8%" in why
    assert choose.stop_reason(points[4], points, scores, {"seqs=8": why}, 5) == why  # and stays stopped
    assert choose.stop_reason(points[3], points, scores, {}, None) is None    # the option off: the whole grid


def test_pareto_front() -> None:
    pts = [(10.0, 100.0), (20.0, 80.0), (5.0, 90.0), (20.0, 100.0), (30.0, 10.0)]
    assert choose.pareto(pts) == [3, 4]


VLLM_DOC = {"duration": 4.0, "completed": 16, "failed": 0, "request_throughput": 4.0, "output_throughput": 128.0,
            "total_token_throughput": 256.0, "median_ttft_ms": 20.0, "p99_ttft_ms": 45.0, "median_tpot_ms": 8.0,
            "p99_tpot_ms": 12.5, "mean_tpot_ms": 8.2, "median_itl_ms": 8.0, "p99_itl_ms": 20.0,
            "median_e2el_ms": 250.0, "p99_e2el_ms": 400.0, "total_output_tokens": 512, "latencies": [0.25] * 16}
SGLANG_LINE = {"completed": 6, "output_throughput": 60.0, "total_throughput": 90.0, "median_tpot_ms": 0.0,
               "p99_tpot_ms": 0.01, "median_ttft_ms": 5.0, "p99_ttft_ms": 9.0, "accept_length": 2.5,
               "total_output_tokens": 48, "median_e2e_latency_ms": 100.0, "p99_e2e_latency_ms": 150.0}


def test_figures_come_from_each_clients_own_names() -> None:
    f = bench.figures("vllm", VLLM_DOC, prompts=16, concurrency=4, gpus=2)
    assert (f["completed"], f["failed"], f["output_tok_s"], f["total_tok_s"]) == (16, 0, 128.0, 256.0)
    assert f["output_tok_s_per_gpu"] == 64.0
    assert f["output_tok_s_per_user"] == 128.0         # 32 tokens a request in 250 ms
    assert (f["p99_ttft_ms"], f["p99_tpot_ms"]) == (45.0, 12.5)
    text = "\n".join([json.dumps({"completed": 1}), json.dumps(SGLANG_LINE)])  # it appends: the last line
    s = bench.figures("sglang", bench.parse_result("sglang", text), prompts=8, concurrency=2, gpus=0)
    assert s["failed"] == 2 and s["accept_length"] == 2.5 and s["total_tok_s"] == 90.0
    assert s["output_tok_s_per_gpu"] == 60.0          # no GPUs (CPU): per engine
    assert s["output_tok_s_per_user"] == 80.0         # 8 tokens in 100 ms: meaningful where TPOT is ~0
    assert s["p99_e2el_ms"] == 150.0                  # SGLang's e2e_latency names


def test_store_show_and_plot(tmp_path: Path) -> None:
    store = Store(tmp_path / "results")
    store.set_meta(name="t", slo={"p99_tpot_ms": 12.0})
    for pos, (name, tpots) in enumerate((("a", (10.0, 11.0, 20.0)), ("b", (9.0, 11.5, 11.9)))):
        store.begin_variant(name, pos, {"r": {"settings": {"x": pos}}}, [])
        store.update_variant(name, engine="vllm", client="vllm", synthetic=False, gpus=0, deploy_s=30.0,
                             engine_release="vllm 0.32.0", memory={"h/r": ["KV cache 64M"]})
        for c, tpot in zip((1, 4, 8), tpots, strict=True):
            doc = {**VLLM_DOC, "output_throughput": 100.0 * c ** 0.5 * (1 + pos), "p99_tpot_ms": tpot}
            raw = json.dumps(doc).encode()
            store.record_run(RunRow(name, c, 0, True, None, ["vllm", "bench"], None,
                                    bench.figures("vllm", doc, 16, c, 0), 0.0, 5.0), raw, "log")
        store.finish_variant(name, "measured")
    store.begin_variant("c", 2, {}, [])
    store.finish_variant("c", "skipped", verdict="memory preflight predicts weights-do-not-fit", saved_s=120.0)
    doc = summary(store)
    assert doc["best"] == {"variant": "b", "concurrency": 8, "output_tok_s_per_gpu": 100.0 * 8 ** 0.5 * 2,
                           "timing": "measured (CPU)"}  # gpus=0: a CPU engine
    a = next(v for v in doc["variants"] if v["name"] == "a")
    assert a["best_concurrency"] == 4 and [lv["meets_slo"] for lv in a["levels"]] == [True, True, False]
    assert doc["minutes_saved_by_preflight"] == 2.0
    # The raw file is the client's bytes, unchanged.
    raw_file = a["levels"][0]["raw_files"][0]
    assert json.loads((store.folder / raw_file).read_text())["latencies"] == [0.25] * 16
    text = table(doc)
    assert "* best under the SLO: b at concurrency 8" in text and "c: SKIPPED: memory preflight" in text
    png = plot(doc, tmp_path / "plot.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_figures_of_sglangs_real_bench_serving_line() -> None:
    # Written by SGLang 0.5.23's own `python -m sglang.bench_serving --backend sglang --dataset-name
    # random-ids --random-input-len 32 --random-output-len 32 --random-range-ratio 1 --num-prompts 8
    # --max-concurrency 2` (against a test server: server_info says fake), so the names are the real ones.
    text = (Path(__file__).parent / "data" / "sglang-0.5.23-bench_serving.jsonl").read_text()
    s = bench.figures("sglang", bench.parse_result("sglang", text), prompts=8, concurrency=2, gpus=4)
    assert (s["completed"], s["failed"]) == (8, 0)
    assert s["output_tok_s"] == pytest.approx(869.30, abs=0.01)
    assert s["output_tok_s_per_gpu"] == pytest.approx(217.33, abs=0.01)
    assert s["total_tok_s"] == pytest.approx(1738.60, abs=0.01)
    assert s["p99_ttft_ms"] == pytest.approx(4.535, abs=0.001)
    assert s["median_tpot_ms"] == pytest.approx(2.168, abs=0.001)
    assert s["median_e2el_ms"] == pytest.approx(71.07, abs=0.01)    # its e2e_latency names
    assert s["output_tok_s_per_user"] == pytest.approx(32 / 0.07107, rel=1e-3)
    assert s["accept_length"] is None                                 # not speculative
