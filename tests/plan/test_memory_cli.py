"""The memory preflight as a user meets it: in `plan`, in `plan --suggest`, and in deploy, which
refuses only a certain failure and otherwise warns with the margin and goes ahead."""

from __future__ import annotations

import os
import subprocess
import sys
from itertools import takewhile
from pathlib import Path
from typing import Any

import yaml

from gpudeploy.plan import load_plan
from gpudeploy.plan.memcheck import memory_verdicts

REPO = Path(__file__).resolve().parents[2]
FACTS = {"kind": "mla", "weights_bytes": 146000000000, "layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
         "hidden_size": 7168, "vocab_size": 129280, "moe_intermediate_size": 2048, "num_experts_per_tok": 8,
         "mtp_layers": 1, "context_length": 163840}
LLAMA_70B = {"kind": "mha", "weights_bytes": 141107412992, "layers": 80, "kv_heads": 8, "head_dim": 128,
             "hidden_size": 8192, "intermediate_size": 28672, "vocab_size": 128256, "context_length": 131072}
MTP = {"speculative_algorithm": "EAGLE", "speculative_num_steps": 1, "speculative_eagle_topk": 1,
       "speculative_num_draft_tokens": 2}


def make(tmp: Path, settings: dict[str, Any], facts: dict[str, Any] = FACTS, gpu_gib: float = 95.6,
         version: str = "0.5.23") -> Path:
    (tmp / "roles").mkdir(exist_ok=True)
    (tmp / "roles" / "srv.yml").write_text(yaml.safe_dump(
        {"engine": "sglang", "tp_size": 4, "model": {"path": "/models/m", "facts": facts}, "settings": settings}))
    inv = tmp / "hosts.yml"
    # 127.0.0.1 port 1: if anything tried to connect, it would fail at once and stay on this machine.
    inv.write_text(yaml.safe_dump({
        "deployment": "m", "roles_dir": "roles",
        "defaults": {"gpu_memory_gib": gpu_gib, "engine_versions": {"sglang": version}, "ssh": {"port": 1}},
        "hosts": {"node171": {"address": "127.0.0.1", "roles": ["srv"], "numa_nodes": [
            {"id": 0, "gpus": [0, 1, 2, 3], "cpus": "0-31"}]}}}))
    return inv


def memory(tmp: Path, settings: dict[str, Any], **kw: Any) -> dict[str, Any]:
    mem = load_plan(str(make(tmp, settings, **kw))).units[0].memory
    assert mem is not None
    return mem


def invoke(*args: str) -> subprocess.CompletedProcess[str]:
    # this checkout's gpudeploy (a venv's editable install may point at another checkout)
    return subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), *args],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")})


def test_llama_70b_tp4_on_h100_at_defaults_fits(tmp_path: Path) -> None:
    for version in ("0.5.10", "0.5.23"):
        mem = memory(tmp_path, {}, facts=LLAMA_70B, gpu_gib=79.6, version=version)
        assert (mem["verdict"], mem["severity"]) == ("fits", "ok"), mem["reason"]
        assert mem["headroom_breakdown"]["cuda_graphs"] < 2.0      # not the 17.64 GiB of the old term
        assert mem["release_rules"] == version
        refusals, warnings = memory_verdicts(load_plan(str(make(tmp_path, {}, LLAMA_70B, 79.6, version))))
        assert refusals == [] and warnings == []


def test_a_certain_shortfall_refuses_and_its_recommendation_fits(tmp_path: Path) -> None:
    bad = memory(tmp_path, {"mem_fraction_static": 0.95})
    assert (bad["verdict"], bad["severity"]) == ("oom-in-graph-capture", "refuse")
    assert -bad["margin_gib"] > bad["error_band_gib"]
    fixed = memory(tmp_path, {"mem_fraction_static": 0.95, **bad["recommended"]})
    assert (fixed["verdict"], fixed["severity"]) == ("fits", "ok"), fixed["reason"]


def test_deploy_refuses_a_certain_oom_before_touching_any_host(tmp_path: Path) -> None:
    res = invoke("deploy", "--inventory", str(make(tmp_path, {"mem_fraction_static": 0.95})), "--host", "node171")
    assert res.returncode == 1
    assert "memory preflight predicts oom-in-graph-capture" in res.stderr
    # the key to edit and the file it is in, then the flag it renders (issue 45: the flag alone sent
    # users looking for a command line gpudeploy writes itself)
    assert f"Fix: in {tmp_path / 'roles' / 'srv.yml'}:" in res.stderr
    assert ": set settings.mem_fraction_static: 0.89 (the engine then gets --mem-fraction-static 0.89" in res.stderr
    assert "cannot reach" not in res.stdout + res.stderr  # refused before any connection


def test_deploy_warns_with_the_margin_inside_the_error_band_and_goes_ahead(tmp_path: Path) -> None:
    inv = make(tmp_path, {"mem_fraction_static": 0.92})
    refusals, warnings = memory_verdicts(load_plan(str(inv)))
    assert refusals == []
    assert len(warnings) == 1 and "GiB short in the headroom, within the estimate's +-" in warnings[0]
    res = invoke("deploy", "--inventory", str(inv), "--host", "node171")
    assert "memory preflight predicts" not in res.stderr       # not refused ...
    assert "within the estimate's +-" in res.stdout            # ... warned, and it went on to the host
    assert res.returncode != 0                                  # port 1 answers nobody


def test_plan_shows_the_warning_with_margin_and_band(tmp_path: Path) -> None:
    res = invoke("plan", "--inventory", str(make(tmp_path, {"mem_fraction_static": 0.92})))
    assert res.returncode == 0, res.stderr
    assert "verdict OOM-IN-GRAPH-CAPTURE   WARNING: inside the estimate's error, deploy goes ahead" in res.stdout
    assert "headroom margin -1.09 GiB, error band +-1.51 GiB (SGLang 0.5.23 rules)" in res.stdout
    assert f"safer: in {tmp_path / 'roles' / 'srv.yml'}:" in res.stdout
    assert ": set settings.mem_fraction_static: 0.89 (the engine then gets --mem-fraction-static 0.89" in res.stdout


def test_a_refused_unit_says_what_about_and_the_key_to_edit_before_any_figure(tmp_path: Path) -> None:
    # issue 45: "recommended: --mem-fraction-static 0.94" gave a flag gpudeploy writes itself, not the
    # role file's key; and an empty KV pool leaves all of (1 - f) x P "available" as headroom, which
    # was shown as "margin +46.92 GiB" under the refusal
    inv = make(tmp_path, {"mem_fraction_static": 0.30}, facts=LLAMA_70B)
    res = invoke("plan", "--inventory", str(inv))
    lines = res.stdout.splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.startswith("   memory   verdict"))
    memory = [lines[first], *takewhile(lambda ln: ln.startswith(" " * 14), lines[first + 1:])]  # its block
    assert memory[0] == "   memory   verdict KV-POOL-EMPTY   deploy refuses this unit (or --force)", memory
    assert memory[1].startswith("              why: mem_fraction_static 0.300 gives "), memory
    role = tmp_path / "roles" / "srv.yml"
    assert memory[2].startswith(f"              fix: in {role}:"), memory
    assert ": set settings.mem_fraction_static: " in memory[2] and "(the engine then gets --mem-fraction-static" \
        in memory[2]
    assert not [ln for ln in memory if "margin" in ln], memory
    assert "              headroom not reached: the check stops at kv-pool-empty (why: above)" in memory
    refused = invoke("deploy", "--inventory", str(inv), "--host", "node171")
    assert refused.returncode == 1 and f"Fix: in {role}:" in refused.stderr, refused.stderr
    assert "set settings.mem_fraction_static: " in refused.stderr


def test_plan_suggest_prints_settings_that_fit(tmp_path: Path) -> None:
    res = invoke("plan", "--inventory", str(make(tmp_path, {"mem_fraction_static": 0.95, **MTP})), "--suggest")
    # the shape is known and 0.5.23's speculative graphs are its own arithmetic: short by more than the
    # band is certain (plan exits 2: deploy would refuse), and --suggest still lists what fits
    assert res.returncode == 2, res.stderr
    assert "grounded: model shape, checkpoint size, release rules, speculative graphs" in res.stdout, res.stdout
    assert "fits: --mem-fraction-static" in res.stdout and "KV tokens" in res.stdout


def test_after_a_failure_the_next_plans_learn_from_it_also_under_the_recommended_settings(tmp_path: Path) -> None:
    from gpudeploy.plan.calibrate import CalibrationStore, parse_memory_log

    settings = {"mem_fraction_static": 0.70, **MTP}
    inv = make(tmp_path, settings, version="0.5.10")
    first = load_plan(str(inv)).units[0].memory
    assert first is not None and first["verdict"] == "fits"      # nothing measured foresees it
    store = CalibrationStore(tmp_path / "calibration.json")
    lines = (REPO / "tests/memory/logs/sglang-0.5.9-graph-oom.log").read_text().splitlines()
    store.put("node171", "/models/m", settings, parse_memory_log(lines))   # what deploy keeps of the failure
    again = load_plan(str(inv), store=store).units[0].memory
    assert again is not None and again["verdict"] == "oom-in-graph-capture"
    assert again["recommended_flags"]
    fixed = make(tmp_path, {**settings, **again["recommended"]}, version="0.5.10")
    after = load_plan(str(fixed), store=store).units[0].memory
    assert after is not None and (after["verdict"], after["severity"]) == ("fits", "ok"), after["reason"]
    assert after["measured"]["failure"] == "oom-in-graph-capture"  # still knows the failed run


def test_deploy_summary_reads_both_releases_log_formats() -> None:
    from gpudeploy.report import memory_figures

    logs = REPO / "tests/memory/logs"
    new = [line for line in (logs / "sglang-0.5.23-format.log").read_text().splitlines() if not line.startswith("#")]
    assert memory_figures(new) == "memory: weights 14.62 GiB, KV tokens 1106304, cuda graphs 0.52 GiB"
    old = [line for line in (logs / "sglang-0.5.9-eagle.log").read_text().splitlines() if not line.startswith("#")]
    assert memory_figures(old) == "memory: weights 18.70 GiB, KV tokens 1512000, cuda graphs 0.54 GiB"


HYBRID = {"kind": "hybrid", "assumed": ["shape"], "weights_gib": 51.8, "layers": 64, "full_attention_layers": 16,
          "linear_layers": 48, "kv_heads": 4, "head_dim": 256, "state_bytes_per_request": 153944064,
          "hidden_size": 5120, "vocab_size": 248320, "intermediate_size": 17408, "context_length": 262144,
          "mtp_layers": 1}


def test_the_hybrid_recommendation_is_shown_with_every_flag_it_needs(tmp_path: Path) -> None:
    """The field's hybrid + MTP: the plan's recommendation drops extra_buffer in the release's spelling
    (0.5.23's --mamba-radix-cache-strategy), and merged into the role it passes the same check (it is
    what `recommended_settings` shows). 0.5.10 refuses no_buffer with speculative decoding and the
    radix cache at start, so there the recommendation keeps extra_buffer and serves fewer requests."""
    settings = {"max_running_requests": 512, "mamba_scheduler_strategy": "extra_buffer", **MTP}

    def plan(where: str, version: str, merged: dict[str, Any] | None = None) -> dict[str, Any]:
        (tmp_path / where).mkdir()
        inv = make(tmp_path / where, merged or settings, facts=HYBRID, version=version)
        text = yaml.safe_load(inv.read_text())
        text["hosts"]["node171"]["numa_nodes"] = [{"id": 0, "gpus": [0], "cpus": "0-7"}]
        inv.write_text(yaml.safe_dump(text))
        role = yaml.safe_load((tmp_path / where / "roles" / "srv.yml").read_text())
        (tmp_path / where / "roles" / "srv.yml").write_text(yaml.safe_dump({**role, "tp_size": 1}))
        mem = load_plan(str(inv)).units[0].memory
        assert mem is not None
        return mem

    mem = plan("one", "0.5.23")
    assert mem["severity"] != "ok"
    flags = mem["recommended_flags"]
    assert flags[flags.index("--mamba-radix-cache-strategy") + 1] == "no_buffer", flags
    merged = mem["recommended_settings"]
    assert merged["mamba_scheduler_strategy"] == "no_buffer" and merged["speculative_algorithm"] == "EAGLE"
    again = plan("two", "0.5.23", merged)
    assert (again["verdict"], again["severity"]) == ("fits", "ok"), again["reason"]
    kept = plan("three", "0.5.10")["recommended_settings"]
    assert kept["mamba_scheduler_strategy"] == "extra_buffer" and kept["max_running_requests"] < 512, kept


def test_turning_speculative_decoding_off_names_the_flags_to_drop(tmp_path: Path) -> None:
    from gpudeploy.plan.memcheck import merged_settings, removed_settings

    role = {"mem_fraction_static": 0.9, **MTP, "speculative_draft_model_path": "/m/draft"}
    rec = {"mem_fraction_static": 0.93, "speculative_algorithm": None, "speculative_num_steps": None,
           "speculative_eagle_topk": None, "speculative_num_draft_tokens": None}
    assert merged_settings(role, rec) == {"mem_fraction_static": 0.93}
    assert removed_settings(role, rec) == [*MTP, "speculative_draft_model_path"]


def test_a_release_gpudeploy_has_not_captured_plans_offline_marked_as_such(tmp_path: Path) -> None:
    """`invoke plan` of 0.5.99: the flags and memory rules of 0.5.23, the nearest captured release, said so;
    deploy still stops to read the host's own --help first (FlagsNotKnown)."""
    import pytest

    from gpudeploy.errors import InputError
    from gpudeploy.plan.flags import FlagsNotKnown

    inv = make(tmp_path, {"mem_fraction_static": 0.85}, version="0.5.99")
    res = invoke("plan", "--inventory", str(inv))
    assert res.returncode == 0, res.stderr
    assert "flags    of 0.5.23, the nearest release gpudeploy has captured" in res.stdout
    res = invoke("plan", "--inventory", str(inv), "--json")
    unit = __import__("json").loads(res.stdout)["units"][0]
    assert (unit["engine_version"], unit["flags_release"]) == ("0.5.99", "0.5.23")
    rules = next(i for i in unit["memory"]["inputs"] if i["name"] == "release rules")
    assert not rules["grounded"] and "0.5.23" in rules["source"]
    with pytest.raises(InputError) as err:
        load_plan(str(inv))
    assert any(isinstance(p, FlagsNotKnown) for p in err.value.problems)
