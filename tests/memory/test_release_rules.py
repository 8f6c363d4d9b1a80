"""The rules that differ by SGLang release, by GPU and by what the estimate knows (issue 22): each
checked against the public log or the wheel's source it comes from."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpudeploy.memory import budget
from gpudeploy.memory.budget import Cal, evaluate
from gpudeploy.memory.defaults import (
    capture_batch_sizes,
    default_mem_fraction,
    effective_fraction,
    spec_defaults,
)
from gpudeploy.memory.gpuclass import gpu_class, preload_from_nvml
from gpudeploy.memory.inputs import RELEASE_DRIFT_FLOOR_GIB, RELEASE_DRIFT_GIB
from gpudeploy.memory.logparse import Measured
from gpudeploy.memory.modelfacts import ModelFacts, model_facts_from_dir, model_facts_from_mapping
from gpudeploy.memory.releases import CHECKED, release_rules
from gpudeploy.memory.settings import EngineSettings

HERE = Path(__file__).parent
TABLE = yaml.safe_load((HERE / "cases.yaml").read_text())


def model(name: str) -> ModelFacts:
    return model_facts_from_mapping(TABLE["models"][name], where=f"cases.yaml:models.{name}")


def case(case_id: str) -> dict[str, Any]:
    return next(c for c in TABLE["cases"] if c["id"] == case_id)


def settings(d: dict[str, Any]) -> EngineSettings:
    return EngineSettings.from_settings(d, tp_size=d.get("tp_size", 1))


def test_multimodal_models_get_sglangs_lower_fraction() -> None:
    """sgl-project/sglang#11830's Qwen2.5-VL-7B on a B200 (0.5.9): the default 0.857 times 0.95 times the
    ViT factor (hidden 1280, 24 layers as SGLang reads them) is 0.767, and that is the KV pool it logged."""
    vl = model("qwen2.5-vl-7b")
    s = EngineSettings(tp_size=1, disable_prefill_cuda_graph=True)
    assert default_mem_fraction(178.4, s, release_rules("0.5.9"), vl) == pytest.approx(0.767, abs=0.001)
    assert default_mem_fraction(178.4, s, release_rules("0.5.9"), replace(vl, multimodal=False)) == 0.856
    b = budget(178.4, vl, s, release="0.5.9")
    assert b.kv_tokens == pytest.approx(2261377, rel=0.02)
    # 0.4.5 - 0.4.7 multiply even a given fraction by 0.9 (model_runner): sgl-project/sglang#4895's 0.88
    gemma = model("gemma-3-27b-it-int4-awq")
    given = EngineSettings(tp_size=1, mem_fraction_static=0.88)
    assert effective_fraction(23.64, given, release_rules("0.4.4"), gemma) == pytest.approx(0.792)
    assert effective_fraction(23.64, given, release_rules("0.5.9"), gemma) == 0.88


def test_eagle_defaults_by_release() -> None:
    """auto_choose_speculative_params: 5/4/8 for every model to 0.4.9, DeepSeek 3/1/4 from 0.4.10, and
    from 0.5 3/1/4 for all but Llama (the wheels' server_args / speculative_hook.py)."""
    llama = ModelFacts(name="l", kind="mha", weight_bytes=1, layers=1, architecture="LlamaForCausalLM")
    dsv3 = replace(llama, architecture="DeepseekV3ForCausalLM")
    qwen = replace(llama, architecture="Qwen3MoeForCausalLM")
    got = {rel: tuple(spec_defaults(m, release_rules(rel)) for m in (llama, dsv3, qwen))
           for rel in ("0.4.6", "0.4.10", "0.5.9", "0.5.23")}
    assert got == {"0.4.6": ((5, 4, 8),) * 3, "0.4.10": ((5, 4, 8), (3, 1, 4), (5, 4, 8)),
                   "0.5.9": ((5, 4, 8), (3, 1, 4), (3, 1, 4)), "0.5.23": ((5, 4, 8), (3, 1, 4), (3, 1, 4))}
    assert EngineSettings(speculative_algorithm="EAGLE").spec(spec_defaults(qwen, release_rules("0.4.6"))) == (5, 4, 8)


def test_capture_lists_by_release() -> None:
    """To 0.4.7 the list ends at 160 (256 over 96 GiB); 0.4.8 adds 256 over 90 GiB (a 96 GB card); 0.5.3
    on, the list runs to the GPU tier's max_bs (cuda_graph_runner.py / server_args)."""
    def end(rel: str) -> int:
        r = release_rules(rel)
        from gpudeploy.memory.defaults import resolved_defaults
        return max(capture_batch_sizes(resolved_defaults(95.0, EngineSettings(tp_size=4), r)[1], False, r, 95.0))
    assert (end("0.4.6"), end("0.4.8"), end("0.5.9")) == (160, 256, 512)


def test_fa3_page_table_per_graph_only_where_sglang_picked_fa3() -> None:
    """Llama 4 Scout at 1M context boots on 8xH100 in 0.4.5 (sgl-project/sglang#5133), whose backend was
    flashinfer (one index buffer); 0.4.6 - 0.4.9 pick FA3 for it, which copied a page table per graph."""
    scout = model("llama-4-scout-bf16")
    s = EngineSettings(tp_size=8, context_length=1_000_000)
    old = evaluate(79.19, scout, s, Cal(), release_rules("0.4.5"))
    fa3 = evaluate(79.19, scout, s, Cal(), release_rules("0.4.6"))
    assert (old.graphs["attention_backend"], fa3.graphs["attention_backend"]) == ("flashinfer", "fa3")
    # both keep per-graph logits (before 0.4.10); only FA3 adds bs x 1M x 4 B of page table per graph
    assert fa3.graphs["cuda_graphs"]["per_graph"] - old.graphs["cuda_graphs"]["per_graph"] > 5.0
    assert old.severity != "refuse"


def test_dp_attention_keeps_the_attention_weights_whole_on_fewer_ranks() -> None:
    """Kimi-K2 at DP32/TP32 (sgl-project/sglang#24453): the attention weights are split over TP/DP = 1 rank,
    so each rank holds its share of the experts plus all of the attention: the report's ~19 GB of KV at
    f 0.7 on an 80 GB rank."""
    c = case("sglang-24453-kimi-k2-dp32-deepep")
    kimi = model("kimi-k2-fp8")
    b = budget(c["capacity"], kimi, settings(c["settings"]), release=c["release"])
    split = budget(c["capacity"], kimi, settings({**c["settings"], "enable_dp_attention": False, "dp_size": 1}),
                   release=c["release"])
    assert b.weights_gib - split.weights_gib == pytest.approx(kimi.attention_weight_bytes / 2**30 * (1 - 1 / 32),
                                                              rel=0.01)
    assert b.kv_pool_gib == pytest.approx(19.0, rel=0.1)
    assert any("DP attention splits the attention weights" in n for n in b.notes)


def test_tp_graph_memory_includes_ncclss_buffers() -> None:
    """The two public logs at TP > 1: within 5 % once NCCL's channel buffers are counted (10 % low at TP8
    without them)."""
    for gc in TABLE["graph_cases"]:
        s = settings(gc["settings"])
        m = model(gc["model"])
        b = budget(gc["capacity"], m, s, release=gc["release"])
        if s.tp_size > 1:
            assert b.headroom_breakdown["cuda_graphs"] == pytest.approx(gc["reported_graph_gib"], rel=0.05), gc["id"]
            assert b.graphs["cuda_graphs"]["comm"] == pytest.approx(0.07 * (min(s.tp_size, 8) - 1))


@pytest.mark.parametrize(("capacity", "tp", "name", "logged", "source"), [
    (139.80, 8, None, 137.34, "sgl-project/sglang#11716: Load weight begin. avail mem=137.34 GB (TP0, 8xH200)"),
    (23.64, 1, None, 23.16, "sgl-project/sglang#3419: Load weight begin. avail mem=23.16 GB (RTX 4090)"),
    (23.64, 1, None, 22.46, "allenai/olmocr#105: Load weight begin. avail mem=22.46 GB (RTX 4090, WSL2)"),
])
def test_free_memory_before_load_by_gpu_class(capacity: float, tp: int, name: str | None, logged: float,
                                              source: str) -> None:
    p, band = gpu_class(capacity, name).preload_free(capacity, tp)
    assert abs(p - logged) <= band + 0.01, source


def test_free_memory_at_deploy_comes_from_nvml() -> None:
    """At deploy NVML says what is free (here another process holds 30 GiB, deployed past with --force);
    the engine's context and NCCL still come off it, by the GPU's own kind from its name."""
    p, band = preload_from_nvml(64.9, 1, "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", 94.97)
    assert p == pytest.approx(64.9 - 0.85) and band == pytest.approx(0.4)
    field = model("field-146gb-fp8-moe")
    s = EngineSettings(tp_size=4, mem_fraction_static=0.5)
    planned = budget(94.97, field, s, release="0.5.10")
    at_deploy = budget(94.97, field, s, release="0.5.10", gpu_name="NVIDIA RTX PRO 6000 Blackwell", free_gib=64.9)
    assert planned.severity != "refuse"
    assert at_deploy.verdict == "kv-pool-empty" and at_deploy.severity == "refuse"
    assert any(i.source.startswith("NVML at deploy") for i in at_deploy.inputs)


def test_what_is_assumed_is_said_and_widens_the_band() -> None:
    """A shape read from config.json is grounded; one given as a guess widens the band, and a verdict
    inside it is "uncertain", naming the guess and what would make it certain."""
    grounded = model_facts_from_dir(HERE / "fixtures" / "deepseek-v3")
    guessed = model("field-146gb-fp8-moe")
    s = EngineSettings(tp_size=4, mem_fraction_static=0.85)
    a = budget(95.0, replace(grounded, weight_bytes=guessed.weight_bytes), s, release="0.5.9")
    b = budget(95.0, guessed, s, release="0.5.9")
    # the fixture's index lists no tensors, so the MTP layer's own bytes are its count's share: said,
    # but it moves the KV tokens, not the headroom (no band)
    assert [i.name for i in a.inputs if not i.grounded] == ["MTP layers' bytes", "free memory before load"]
    assert next(i for i in a.inputs if i.name == "MTP layers' bytes").band_gib == 0
    assert "model shape" in [i.name for i in b.inputs if not i.grounded]
    assert b.error_band_gib > a.error_band_gib + 9
    assert (b.verdict, b.severity) == ("uncertain", "warn")
    assert "model shape" in b.reason and "config.json" in b.reason
    j = b.to_json()
    assert "model shape" in j["assumed"] and j["inputs"][0]["certain_by"]


def test_a_release_not_read_borrows_the_older_rules_and_says_so() -> None:
    b = budget(79.19, model("qwen3-235b-a22b-fp8"), EngineSettings(tp_size=4), release="0.5.17")
    rules = next(i for i in b.inputs if i.name == "release rules")
    assert not rules.grounded and "0.5.10" in rules.source and "0.5.23" in rules.source
    # past the newest release read there is nothing above to bound it: the table-wide drift
    newer = budget(79.19, model("qwen3-235b-a22b-fp8"), EngineSettings(tp_size=4), release="0.6.0")
    assert next(i for i in newer.inputs if i.name == "release rules").band_gib == RELEASE_DRIFT_GIB


def test_an_unread_release_is_banded_by_how_far_its_read_neighbours_move_these_settings() -> None:
    """Between two read releases the need moves by what their own arithmetic says for these settings
    (at least RELEASE_DRIFT_FLOOR_GIB), not by the largest move over every setup ever seen."""
    def band(b: Any) -> float:
        return float(next(i for i in b.inputs if i.name == "release rules").band_gib)

    # where 0.5.10's and 0.5.23's arithmetic agree, 0.5.17 is as sure as they are
    agree = budget(79.19, model("qwen3-235b-a22b-fp8"), EngineSettings(tp_size=4), release="0.5.17")
    assert band(agree) == RELEASE_DRIFT_FLOOR_GIB
    # a multimodal hybrid at 0.5.14: 0.5.10 captures no prefill graphs for it, 0.5.23 does: that much band,
    # and the verdict is still sure
    s = EngineSettings(tp_size=1, mem_fraction_static=0.8, context_length=32768, max_running_requests=1)
    logged = Measured(preload_free_gib=41.29, weights_gib=17.17)
    hybrid = budget(119.7, model("qwen3.5-9b"), s, logged, release="0.5.14")
    newer = budget(119.7, model("qwen3.5-9b"), s, logged, release="0.5.23")
    assert "prefill_graphs" in newer.headroom_breakdown and "prefill_graphs" not in hybrid.headroom_breakdown
    assert band(hybrid) == pytest.approx(abs(newer.headroom_needed_gib - hybrid.headroom_needed_gib))
    assert "0.5.23's rules need" in next(i for i in hybrid.inputs if i.name == "release rules").source
    assert (hybrid.verdict, hybrid.severity) == ("fits", "ok"), hybrid.reason


def test_the_release_drift_band_covers_the_drift_between_checked_releases() -> None:
    """RELEASE_DRIFT_GIB: at least the largest change of the headroom need between two neighbouring
    checked releases, over the validation table's settings."""
    worst = 0.0
    for c in TABLE["cases"]:
        m = model_facts_from_dir(HERE / "fixtures" / c["model"]["fixture"]) if isinstance(c["model"], dict) \
            else model(c["model"])
        s = settings(c["settings"])
        needs = [evaluate(c["capacity"], m, s, Cal(), r).headroom_needed_gib for r in CHECKED if r.name >= "0.5"]
        worst = max([worst] + [abs(x - y) for x, y in itertools.pairwise(needs) if x and y])
    assert 0 < worst <= RELEASE_DRIFT_GIB


@pytest.mark.parametrize("release", ["0.5.10", "0.5.23"])
def test_dp_attention_sizes_each_ranks_request_pool_for_its_share(release: str) -> None:
    """With DP attention every attention rank has its own request pool, of max_running_requests // dp
    rows (0.5.10 model_runner_kv_cache_mixin.py:841-852, 0.5.23 kv_cache_configurator.py:3119-3131):
    a 1024-request DeepSeek-V3 at DP8 holds 128 requests' tables per rank, not 1024."""
    dsv3 = model_facts_from_dir(HERE / "fixtures" / "deepseek-v3")
    s = EngineSettings(tp_size=8, dp_size=8, enable_dp_attention=True, mem_fraction_static=0.85,
                       max_running_requests=1024)
    got = budget(139.8, dsv3, s, release=release)
    assert got.running_requests == 128
    assert got.headroom_breakdown["req_to_token"] == pytest.approx(128 * (dsv3.context_length + 4) * 4 / 2**30)
