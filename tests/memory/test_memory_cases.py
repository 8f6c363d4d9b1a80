"""Table-driven validation of the memory preflight against cases.yaml and the H200 measurements."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpudeploy.memory.graphs import Capture, capture_memory, error_band
from gpudeploy.memory.modelfacts import ModelFacts, model_facts_from_dir, model_facts_from_mapping
from gpudeploy.memory.recommend import (
    SEVERITIES,
    VERDICTS,
    EngineSettings,
    budget,
    default_mem_fraction,
    suggest,
)
from gpudeploy.memory.releases import RELEASES, release_rules
from gpudeploy.plan.calibrate import Measured

HERE = Path(__file__).parent
TABLE = yaml.safe_load((HERE / "cases.yaml").read_text())
DEVICE = json.loads((HERE / "data" / "h200-graph-capture-2026-12-01.json").read_text())


def _model(spec: Any) -> ModelFacts:
    if isinstance(spec, dict) and "fixture" in spec:
        return model_facts_from_dir(HERE / "fixtures" / spec["fixture"])
    return model_facts_from_mapping(TABLE["models"][spec], where=f"cases.yaml:models.{spec}")


def _settings(d: dict[str, Any]) -> EngineSettings:
    return EngineSettings.from_settings(d, tp_size=d.get("tp_size", 1))


def _budget(case: dict[str, Any], settings: dict[str, Any] | None = None, **kw: Any) -> Any:
    if case.get("logged") and "measured" not in kw:
        # what the source's log said before the pools were sized: free memory before load, weights
        kw = {**kw, "measured": Measured(**case["logged"]), "measured_settings": _settings(case["settings"])}
    return budget(case["capacity"], _model(case["model"]), _settings(settings or case["settings"]),
                  release=release_rules(case["release"]), **kw)


def _case(case_id: str) -> dict[str, Any]:
    return next(c for c in TABLE["cases"] if c["id"] == case_id)


@pytest.mark.parametrize("row", TABLE["default_fraction"],
                         ids=lambda r: f"{r['gpu']}-tp{r['tp']}-{r['spec']}-{r['release']}")
def test_default_fraction(row: dict[str, Any]) -> None:
    s = EngineSettings(tp_size=row["tp"], speculative_algorithm=row["spec"])
    got = default_mem_fraction(row["capacity"], s, release_rules(row["release"]))
    assert got == pytest.approx(row["expect"], abs=0.0005)


def test_release_ranges() -> None:
    """A release whose wheel was read has its own rules; one between two borrows the older one's,
    and says so (its rules are an assumed input)."""
    got = {v: (r.name, r.checked, r.checked_as) for v in ("0.4.3", "0.4.6.post5", "0.4.10", "0.5.5", "0.5.9",
                                                          "0.5.10.post1", "0.5.17", "0.5.23", "0.6.0")
           for r in [release_rules(v)]}
    assert got == {"0.4.3": ("0.4.3", False, "0.4.5"), "0.4.6.post5": ("0.4.6", True, ""),
                   "0.4.10": ("0.4.10", True, ""), "0.5.5": ("0.5.5", False, "0.5.3"), "0.5.9": ("0.5.9", True, ""),
                   "0.5.10.post1": ("0.5.10", True, ""), "0.5.17": ("0.5.17", False, "0.5.10"),
                   "0.5.23": ("0.5.23", True, ""), "0.6.0": ("0.6.0", False, "0.5.23")}
    assert release_rules(None).name == "0.5.23" and release_rules("0.4").name == "0.4.7"


@pytest.mark.parametrize("case", TABLE["graph_cases"], ids=lambda c: c["id"])
def test_graph_memory_within_the_stated_error_of_public_logs(case: dict[str, Any]) -> None:
    b = _budget(case)
    predicted = b.headroom_breakdown["cuda_graphs"]
    assert abs(predicted - case["reported_graph_gib"]) <= error_band(predicted, grounded=True), b.graphs


def _device_rows() -> list[dict[str, Any]]:
    # the MoE prefill emulation materialises each token's top-k copies, which SGLang's fused MoE
    # never does; every other configuration checks the graph term as SGLang would see it
    return [r for r in DEVICE["results"] if "usage_gib" in r and r["name"] != "qwen235-tp4-prefill-8192"]


@pytest.mark.parametrize("row", _device_rows(), ids=lambda r: r["name"])
def test_graph_term_matches_the_h200_measurements(row: dict[str, Any]) -> None:
    s, c = row["config"]["shape"], row["config"]
    model = ModelFacts(name=s["model"], kind="mha", weight_bytes=1, layers=s["layers"], kv_heads=s["kv_heads"],
                       head_dim=s["head_dim"], hidden_size=s["hidden"], vocab_size=s["vocab"],
                       intermediate_size=s["inter"], moe_intermediate_size=s["moe_inter"],
                       num_experts_per_tok=s["topk"])
    prefill = c["mode"] == "prefill"
    cap = Capture(tuple(row["sizes"]), c["tokens_per_bs"], s["layers"], 1 if prefill else c["tokens_per_bs"],
                  prefill=prefill)
    g = capture_memory(model, s["tp"], s["context"], cap, RELEASES["0.5.23"])
    assert g.usage == pytest.approx(row["usage_gib"], abs=max(0.1, 0.15 * row["usage_gib"]))
    assert g.usage + g.peak_extra == pytest.approx(row["peak_gib"], abs=max(0.15, 0.2 * row["peak_gib"]))


def test_layer_count_barely_matters_but_per_graph_outputs_do() -> None:
    """The H200 run: 4 vs 80 layers of a Llama-70B TP8 shard differ only by the graphs' driver memory."""
    rows = {r["name"]: r for r in DEVICE["results"]}
    l4, l80 = rows["llama70-tp8-bs512-L4"], rows["llama70-tp8-bs512"]
    assert l4["warm"]["usage_gib"] == l80["warm"]["usage_gib"]
    assert 0.2 < l80["usage_gib"] - l4["usage_gib"] < 0.35
    legacy, now = RELEASES["0.4.7"], RELEASES["0.5.23"]
    model = model_facts_from_dir(HERE / "fixtures" / "llama-3.1-70b")
    sizes = tuple(range(8, 161, 8))
    old = capture_memory(model, 8, 131072, Capture(sizes, layers=80), legacy)
    new = capture_memory(model, 8, 131072, Capture(sizes, layers=80), now)
    assert old.per_graph > 3 * new.usage            # per-graph logits and page-table slices add up


@pytest.mark.parametrize("case", TABLE["cases"], ids=lambda c: c["id"])
def test_case_verdict(case: dict[str, Any]) -> None:
    b = _budget(case)
    assert b.verdict in VERDICTS and b.severity in SEVERITIES
    assert (b.verdict, b.severity) == (case["expect"], case["severity"]), b.reason
    assert b.reason
    if case["boots"]:
        assert b.severity != "refuse", b.reason
    if "reported_tokens" in case:
        assert b.kv_tokens == pytest.approx(case["reported_tokens"], rel=case["tokens_within"])
    if "reported_min_fraction" in case:
        assert b.weights_gib / b.preload_free_gib == pytest.approx(case["reported_min_fraction"], abs=0.01)


@pytest.mark.parametrize("case", [c for c in TABLE["cases"] if c["severity"] != "ok"], ids=lambda c: c["id"])
def test_recommendation_fits_when_fed_back(case: dict[str, Any]) -> None:
    settings = dict(case["settings"])
    b = _budget(case)
    assert b.recommended, b.message
    settings.update(b.recommended)
    if b.needs_more_gpus:
        assert settings["tp_size"] == b.needs_more_gpus > case["settings"].get("tp_size", 1)
    again = _budget(case, settings)
    assert again.verdict == "fits" and again.margin_gib >= again.spare_wanted_gib, (b.recommended, again.reason)
    assert again.kv_tokens >= 4096


@pytest.mark.parametrize("case", [c for c in TABLE["cases"] if "after_failure" in c], ids=lambda c: c["id"])
def test_one_failure_is_enough(case: dict[str, Any]) -> None:
    """After the failure the source reports, the next plan predicts it and recommends what fits."""
    after = case["after_failure"]
    measured = Measured.from_json(after["measured"])
    failed = _settings(case["settings"])
    b = _budget(case, measured=measured, measured_settings=failed)
    assert b.verdict == after["expect"], b.reason
    assert b.recommended, b.message
    fixed = {**case["settings"], **b.recommended}
    again = _budget(case, fixed, measured=measured, measured_settings=failed)
    assert (again.verdict, again.severity) == ("fits", "ok"), again.reason
    assert again.margin_gib >= again.error_band_gib
    for other in TABLE["cases"]:
        if other["model"] == case["model"] and other["boots"] and other["release"] == case["release"]:
            kept = _budget(other, measured=measured, measured_settings=failed)
            assert kept.severity != "refuse", (other["id"], kept.reason)


def test_suggest_lists_fitting_settings_best_first() -> None:
    case = _case("field-tp4-fp8-moe-mtp-f070")
    failed = _settings(case["settings"])
    measured = Measured.from_json(case["after_failure"]["measured"])
    out = suggest(case["capacity"], _model(case["model"]), failed, measured, failed, release=case["release"])
    assert out
    assert out[0].speculative  # keeps what the role asked for when something fits
    for sug in out:
        b = _budget(case, {**case["settings"], **sug.settings}, measured=measured, measured_settings=failed)
        assert (b.verdict, b.severity) == ("fits", "ok")
        assert b.kv_tokens == sug.kv_tokens > 0


def test_l40s_spec_no_fraction_works() -> None:
    """sglang#4330: with those speculative settings no --mem-fraction-static value boots."""
    case = _case("sglang-4330-l40s-spec-f085")
    for hundredths in range(50, 100):
        b = _budget(case, {**case["settings"], "mem_fraction_static": hundredths / 100})
        assert b.verdict != "fits"


def test_hybrid_state_per_release() -> None:
    case = _case("field-hybrid-512-extra-buffer")
    model = _model(case["model"])
    # "~74 GB of state alone": 512 requests x one state slot
    assert 512 * model.state_bytes_per_request(1) / 2**30 == pytest.approx(73.4, abs=0.1)
    # 0.5.23 solves slots and speculative states together and caps running requests, with a warning
    new = _budget({**case, "release": "0.5.23"})
    assert new.severity != "refuse" and new.running_requests < 512
    assert any("caps max_running_requests" in n for n in new.notes)
    # 64 requests without speculative decoding boot in SGLang: the cap is SGLang's, not a failure
    plain = {k: v for k, v in case["settings"].items() if not k.startswith("speculative")}
    ok = _budget(case, {**plain, "max_running_requests": 64})
    assert ok.verdict in ("fits", "uncertain") and ok.severity != "refuse"
    # extra_buffer keeps more slots per request than no_buffer: fewer requests fit
    nb = _budget(case, {**plain, "mamba_scheduler_strategy": "no_buffer"})
    eb = _budget(case, plain)
    assert nb.running_requests > eb.running_requests


def test_budget_to_json_has_keys() -> None:
    case = _case("llama-3.1-70b-tp4-h100-defaults-0.5.23")
    j = _budget(case).to_json()
    assert (j["verdict"], j["severity"], j["release_rules"]) == ("fits", "ok", "0.5.23")
    assert set(j["headroom_breakdown"]) >= {"cuda_graphs", "prefill_graphs", "req_to_token", "activations"}
    assert j["margin_gib"] > j["error_band_gib"] > 0
    assert set(j["cuda_graphs"]["cuda_graphs"]) >= {"first_use", "input_buffers", "attn_metadata", "pool"}
    assert j["fraction_is_default"] is True


def test_the_hybrid_extra_buffer_case_is_fixed_without_extra_buffer() -> None:
    """The field's hybrid + MTP at 512 requests with extra_buffer: SGLang's "increase
    --mem-fraction-static" never helped (0.80 -> 0.90 -> 0.95); dropping extra_buffer did. The reason
    names the mamba state, and the recommendation drops extra_buffer, keeps MTP and passes the check."""
    case = _case("field-hybrid-512-extra-buffer")
    b = _budget(case)
    assert b.verdict == "kv-pool-empty" and "mamba state" in b.reason and "no_buffer" in b.reason
    assert b.recommended["mamba_scheduler_strategy"] == "no_buffer"
    assert b.recommended.get("speculative_algorithm", "kept") is not None
    again = _budget(case, {**case["settings"], **b.recommended})
    assert (again.verdict, again.severity) == ("fits", "ok"), again.reason
    for hundredths in (80, 90, 95):     # what the operator tried
        tried = _budget(case, {**case["settings"], "mem_fraction_static": hundredths / 100})
        assert tried.severity == "refuse"


def test_a_fixed_mamba_pool_that_leaves_no_kv_says_raise_the_fraction() -> None:
    """Nemotron-3-Ultra at TP4 EP4 with max_mamba_cache_size 48 (KI-KUBE/dgxarley): 0.85 died with "Not
    enough memory. Please try to increase --mem-fraction-static", 0.88 booted. The slots were asked for,
    so SGLang's advice is right here: the reason names the floor, and the recommendation raises the fraction."""
    case = _case("nemotron-3-ultra-ep4-gb10-f085")
    b = _budget(case)
    floor = float(re.search(r"raise it above ([\d.]+)", b.reason).group(1))  # type: ignore[union-attr]
    assert 0.85 < floor < 0.88, b.reason
    assert b.recommended.get("mem_fraction_static", 0) > floor, b.recommended
