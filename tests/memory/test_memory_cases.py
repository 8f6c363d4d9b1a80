"""Table-driven validation of the memory model against cases.yaml."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpudeploy.plan.memory import (
    VERDICTS,
    EngineSettings,
    budget,
    default_mem_fraction,
    suggest,
)
from gpudeploy.plan.modelfacts import ModelFacts, model_facts_from_dir, model_facts_from_mapping

HERE = Path(__file__).parent
TABLE = yaml.safe_load((HERE / "cases.yaml").read_text())


def _model(spec: Any) -> ModelFacts:
    if isinstance(spec, dict) and "fixture" in spec:
        return model_facts_from_dir(HERE / "fixtures" / spec["fixture"])
    return model_facts_from_mapping(TABLE["models"][spec], where=f"cases.yaml:models.{spec}")


def _settings(d: dict[str, Any]) -> EngineSettings:
    return EngineSettings.from_settings(d, tp_size=d.get("tp_size", 1))


@pytest.mark.parametrize("row", TABLE["default_fraction"], ids=lambda r: f"{r['gpu']}-tp{r['tp']}-{r['spec']}")
def test_default_fraction(row: dict[str, Any]) -> None:
    s = EngineSettings(tp_size=row["tp"], speculative_algorithm=row["spec"])
    assert default_mem_fraction(row["capacity"], s) == pytest.approx(row["expect"], abs=0.0005)


@pytest.mark.parametrize("case", TABLE["cases"], ids=lambda c: c["id"])
def test_case_verdict(case: dict[str, Any]) -> None:
    model = _model(case["model"])
    s = _settings(case["settings"])
    b = budget(case["capacity"], model, s)
    assert b.verdict in VERDICTS
    assert b.verdict == case["expect"], b.reason
    assert b.reason
    if "reported_tokens" in case:
        assert b.kv_tokens == pytest.approx(case["reported_tokens"], rel=case["tokens_within"])
    if "reported_min_fraction" in case:
        assert b.weights_gib / b.preload_free_gib == pytest.approx(case["reported_min_fraction"], abs=0.01)


@pytest.mark.parametrize("case", [c for c in TABLE["cases"] if c["expect"] != "fits"], ids=lambda c: c["id"])
def test_recommendation_fits_when_fed_back(case: dict[str, Any]) -> None:
    model = _model(case["model"])
    settings = dict(case["settings"])
    b = budget(case["capacity"], model, _settings(settings))
    assert b.recommended, b.message
    settings.update(b.recommended)
    if b.needs_more_gpus:
        assert settings["tp_size"] == b.needs_more_gpus > case["settings"].get("tp_size", 1)
    again = budget(case["capacity"], model, _settings(settings))
    assert again.verdict == "fits", (b.recommended, again.reason)
    assert again.kv_tokens >= 4096


def test_suggest_lists_fitting_settings_best_first() -> None:
    case = next(c for c in TABLE["cases"] if c["id"] == "field-tp4-fp8-moe-mtp-f070")
    model = _model(case["model"])
    s = _settings(case["settings"])
    out = suggest(case["capacity"], model, s)
    assert out
    assert out[0].speculative  # keeps what the role asked for when something fits
    for sug in out:
        merged = {**case["settings"], **sug.settings}
        b = budget(case["capacity"], model, _settings(merged))
        assert b.verdict == "fits"
        assert b.kv_tokens == sug.kv_tokens > 0


def test_l40s_spec_no_fraction_works() -> None:
    """sglang#4330: with those speculative settings no --mem-fraction-static value boots."""
    case = next(c for c in TABLE["cases"] if c["id"] == "sglang-4330-l40s-spec-f085")
    model = _model(case["model"])
    for hundredths in range(50, 100):
        s = _settings({**case["settings"], "mem_fraction_static": hundredths / 100})
        assert budget(case["capacity"], model, s).verdict != "fits"


def test_hybrid_state_numbers() -> None:
    case = next(c for c in TABLE["cases"] if c["id"] == "field-hybrid-512-extra-buffer")
    model = _model(case["model"])
    # "~74 GB of state alone": 512 requests x one state slot
    assert 512 * model.state_bytes_per_request(1) / 2**30 == pytest.approx(73.4, abs=0.1)
    b = budget(case["capacity"], model, _settings(case["settings"]))
    assert b.recommended["max_running_requests"] < 512
    # extra_buffer keeps more slots per request than no_buffer: fewer requests fit
    nb = budget(case["capacity"], model, _settings({**case["settings"], "mamba_scheduler_strategy": "no_buffer"}))
    assert nb.running_requests > b.running_requests


def test_budget_to_json_has_keys() -> None:
    model = _model("field-146gb-fp8-moe")
    b = budget(95.0, model, EngineSettings(tp_size=4, mem_fraction_static=0.85))
    j = b.to_json()
    assert j["verdict"] == "oom-in-graph-capture"
    assert j["recommended"]["mem_fraction_static"] < 0.85
    assert set(j["headroom_breakdown"]) >= {"cuda_graphs", "req_to_token", "activations"}
    assert j["fraction_is_default"] is False
