"""Learning from one failed launch (issue 22): torch's OOM text and SGLang's own lines are read in
whatever phase they come, the shortfall is kept with its phase, and the next plan's recommendation
covers it, computed, and says why."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from gpudeploy.memory import EngineSettings, budget, parse_memory_log, suggest
from gpudeploy.memory.logparse import parse_oom
from gpudeploy.memory.modelfacts import model_facts_from_mapping

HERE = Path(__file__).parent
TABLE = yaml.safe_load((HERE / "cases.yaml").read_text())
FIELD = model_facts_from_mapping(TABLE["models"]["field-146gb-fp8-moe"], "cases.yaml:models.field-146gb-fp8-moe")
MTP = {"speculative_algorithm": "EAGLE", "speculative_num_steps": 1, "speculative_eagle_topk": 1,
       "speculative_num_draft_tokens": 2}
FAILED = EngineSettings.from_settings({"mem_fraction_static": 0.70, **MTP}, tp_size=4)


def field_log() -> list[str]:
    text = (HERE / "logs" / "field-mtp-oom-0.5.23.log").read_text()
    return [line for line in text.splitlines() if not line.startswith("#")]


def test_torchs_oom_text_is_read_whole() -> None:
    """c10's CUDACachingAllocator message, every figure of it (GiB)."""
    got = parse_oom(field_log()[-2])
    assert got == {"tried": 7.5, "gpu": 1, "capacity": 94.97, "free": 2.3, "in_use": 92.67, "allocated": 90.05,
                   "reserved": 1.1}
    assert parse_oom("CUDA out of memory. Tried to allocate 448.00 MiB. GPU 3 has a total capacity of 95.00 GiB "
                     "of which 301.12 MiB is free.")["free"] == pytest.approx(301.12 / 1024)


def test_the_fields_oom_is_read_from_the_rank_that_printed_it_in_its_phase() -> None:
    """The field's line came from GPU 1, as a traceback with no "Capture ... failed" line: it is still
    an OOM of the target-verify capture (0.5.23's begin line), with its shortfall."""
    m = parse_memory_log(field_log())
    assert (m.failure, m.oom_phase, m.oom_gpu) == ("oom-in-graph-capture", "graph-capture:verify", 1)
    assert m.shortfall_gib == pytest.approx(5.2)
    assert m.oom_capacity_gib == 94.97 and m.oom_in_use_gib == 92.67
    assert m.graph_floor_gib == pytest.approx(26.50 - 2.30 + 7.50)     # what the capture used and wanted


def test_the_next_plan_covers_the_logged_shortfall_and_says_why() -> None:
    m = parse_memory_log(field_log())
    for release in ("0.5.9", "0.5.23"):
        again = budget(95.0, FIELD, FAILED, m, release=release)
        # the very settings that died are refused now (they are no estimate any more)
        assert (again.verdict, again.severity) == ("oom-in-graph-capture", "refuse"), again.reason
        proven = float(re.search(r"needed at least ([\d.]+) GiB of headroom", again.lesson).group(1))  # type: ignore[union-attr]
        assert proven > again.headroom_available_gib                   # the run proved more than it had
        assert "7.50 GiB with 2.30 GiB free" in again.lesson and "target-verify" in again.lesson
        fixed = EngineSettings.from_settings({"mem_fraction_static": 0.70, **MTP, **again.recommended}, tp_size=4)
        after = budget(95.0, FIELD, fixed, m, FAILED, release=release)
        assert (after.verdict, after.severity) == ("fits", "ok"), after.reason
        # computed, not a fixed step: the headroom it leaves holds what the run proved, with the band
        assert after.headroom_available_gib >= proven + after.error_band_gib - 1e-6
        assert "covers the last run's shortfall" in again.message and "7.50 GiB" in again.message


def test_an_oom_in_the_verify_capture_scales_the_verify_graphs_not_the_draft_ones() -> None:
    """The field's OOM came after "Capture target verify CUDA graph begin": its floor is what the verify
    capture took. The draft's graphs are captured after the target's and were never reached: they keep
    their estimate, so a smaller decode cap is not credited with shrinking what the run proved."""
    m = parse_memory_log(field_log())
    assert m.oom_phase == "graph-capture:verify"
    estimate = budget(95.0, FIELD, FAILED, release="0.5.9")
    learned = budget(95.0, FIELD, FAILED, m, release="0.5.9")
    assert set(learned.graphs["scale_from_measurement"]) == {"verify_graphs"}
    assert learned.headroom_breakdown["draft_graphs"] == pytest.approx(estimate.headroom_breakdown["draft_graphs"])
    assert learned.headroom_breakdown["verify_graphs"] >= m.graph_floor_gib - 1e-9


def test_plan_suggest_offers_the_fix_the_field_found() -> None:
    """The field's own fix was 0.60 with graphs capped at bs 16; after the OOM it is among the suggestions."""
    out = suggest(95.0, FIELD, FAILED, parse_memory_log(field_log()), release="0.5.9")
    assert any(s.settings.get("cuda_graph_max_bs") == 16 and 0.55 <= s.settings["mem_fraction_static"] <= 0.65
               for s in out), [s.settings for s in out]
    assert out[0].speculative


LOADED = ["[t TP0] Load weight begin. avail mem=93.52 GB",
          "[t TP0] Load weight end. elapsed=40.02 s, type=X, avail mem=58.95 GB, mem usage=34.57 GB."]
POOL_DONE = [*LOADED, "[t TP0] KV Cache is allocated. #tokens: 480652, KV size: 31.46 GB",
             "[t TP0] Memory pool end. avail mem=26.80 GB"]
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total capacity of " \
      "94.97 GiB of which 1.00 GiB is free."


def test_an_oom_in_warmup_raises_the_activations_by_the_shortfall() -> None:
    lines = [*POOL_DONE, "[t TP0] Capture cuda graph begin. avail mem=26.50 GB",
             "[t TP0] Capture cuda graph end. Time elapsed: 12.11 s. mem usage=1.54 GB. avail mem=24.96 GB.",
             "[t TP0] max_total_num_tokens=480652, chunked_prefill_size=8192, max_prefill_tokens=16384, "
             "max_running_requests=2048, context_len=163840, available_gpu_mem=24.96 GB", OOM]
    m = parse_memory_log(lines)
    assert (m.failure, m.oom_phase) == ("oom-at-warmup", "warmup")
    s = EngineSettings(tp_size=4, mem_fraction_static=0.70)
    b = budget(95.0, FIELD, s, m, release="0.5.9")
    assert b.severity == "refuse" and "activations" in b.lesson
    assert b.headroom_breakdown["activations"] >= 3.0


def test_an_oom_allocating_the_pool_takes_the_shortfall_off_the_free_memory() -> None:
    """sgl-project/sglang#24364 (WSL2): the pool's allocation failed with the log's own "avail mem" saying
    there was room: the next plan believes that much less is free."""
    m = parse_memory_log([*LOADED, OOM])
    assert (m.failure, m.oom_phase) == ("memory-pool-does-not-fit", "weights-loaded")
    s = EngineSettings(tp_size=4, mem_fraction_static=0.70)
    b = budget(95.0, FIELD, s, m, release="0.5.9")
    assert b.preload_free_gib == pytest.approx(93.52 - 3.0)
    assert "less was free than its own log said" in b.lesson
