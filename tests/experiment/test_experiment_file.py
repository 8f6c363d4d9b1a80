"""The experiment file as a user writes it: every problem at once with file:line, nothing touched; the
variants planned like a deploy, one predicted not to boot marked as such; --dry-run touches nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpudeploy.errors import InputError
from gpudeploy.experiment.spec import load_experiment
from gpudeploy.experiment.variants import plan_variants

REPO = Path(__file__).resolve().parents[2]
INVENTORY = REPO / "lab" / "inventory" / "hosts.yml"  # node171: TP4 prefill + TP4 decode of Qwen3-235B, a router


def invoke(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "exp.yml"
    path.write_text(f"inventory: {INVENTORY}\nresults: {tmp_path / 'results'}\n" + body)
    return path


GOOD = """\
variants:
  base: {}
  more-requests: {decode: {settings: {max_running_requests: 256}}}
  low-fraction: {decode: {settings: {mem_fraction_static: 0.3}}}
benchmark:
  concurrency: [1, 16]
  prompts: 8
slo: {p99_tpot_ms: 50}
"""


def test_every_problem_is_reported_with_file_and_line_and_nothing_is_touched(tmp_path: Path) -> None:
    path = write(tmp_path, """\
variants:
  ok: {decode: {settings: {max_running_requests: 64}}}
  typo-role: {decod: {settings: {max_running_requests: 64}}}
  bad-key: {decode: {setings: {x: 1}}}
  bad flag: {decode: {settings: {no_such_setting_at_all: 3}}}
grid:
  decode.settings: [1, 2]
benchmark:
  concurrency: [4, 1]
  prompts: 0
  client: trtllm
slo: {p99_tpot: 50}
""")
    res = invoke("experiment", "--file", str(path), "--dry-run")
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "Traceback" not in out
    expected = [
        (7, "variant name 'bad flag'"),
        (9, "grid dimension 'decode.settings'"),
        (11, "the concurrency ladder goes up"),
        (12, "benchmark.prompts: must be >= 1"),
        (13, "benchmark.client: one of sglang, vllm"),
        (14, "slo.p99_tpot: unknown key"),
        (6, "variants.bad-key.decode.setings: unknown key (allowed: env, extra_args, files, model, settings, tp_size)"),
    ]
    for line, text in expected:
        assert f"{path}:{line}:" in out and text in out, (line, text, out)
    assert not (tmp_path / "results").exists()


def test_a_variant_that_names_a_role_or_flag_wrongly_is_refused_before_anything_runs(tmp_path: Path) -> None:
    path = write(tmp_path, """\
variants:
  typo-role: {decod: {settings: {max_running_requests: 64}}}
  unknown-flag: {decode: {settings: {no_such_setting_at_all: 3}}}
benchmark: {concurrency: [1]}
""")
    with pytest.raises(InputError) as exc:
        plan_variants(load_experiment(path))
    text = str(exc.value)
    assert f"{path}:4: " in text and "variant typo-role: role 'decod' is not a role of deployment 'pd'" in text
    assert f"{path}:5: " in text and "variant unknown-flag" in text and "no_such_setting_at_all" in text
    assert not (tmp_path / "results").exists()


def test_variants_are_planned_and_one_predicted_not_to_boot_is_marked(tmp_path: Path) -> None:
    planned = {p.variant.name: p for p in plan_variants(load_experiment(write(tmp_path, GOOD)))}
    assert list(planned) == ["base", "more-requests", "low-fraction"]
    assert planned["base"].boots and planned["more-requests"].boots
    decode = next(u for u in planned["more-requests"].plan.units if u.role.name == "decode")
    assert decode.argv[decode.argv.index("--max-running-requests") + 1] == "256"
    base_decode = next(u for u in planned["base"].plan.units if u.role.name == "decode")
    assert base_decode.argv[base_decode.argv.index("--max-running-requests") + 1] == "128"
    # Qwen3-235B-FP8's 220 GiB of weights on one 96 GB GPU: the preflight's certainty, with its reason.
    one = planned["low-fraction"]
    assert not one.boots
    assert "weights" in one.refusals[0] and "predicts" in one.refusals[0], one.refusals


def test_dry_run_prints_each_variant_and_the_client_and_writes_nothing(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    res = invoke("experiment", "--file", str(path), "--dry-run")
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "== low-fraction: SKIP, the memory preflight predicts it does not boot" in out, out
    assert "== more-requests: deploy, then benchmark through node171/router with sglang's client" in out, out
    # SGLang's own client, from the engines' interpreter (inventory python), against the router's port.
    assert ("/opt/sglang/.venv/bin/python -s -m sglang.bench_serving --backend sglang "
            "--base-url http://10.0.0.171:8000") in out, out  # -s: no user site-packages
    assert "--dataset-name random-ids" in out and "--output-file" in out, out
    assert "--max-running-requests 256" in out
    assert not (tmp_path / "results").exists()


def test_grid_points_follow_the_variants_in_order(tmp_path: Path) -> None:
    exp = load_experiment(write(tmp_path, """\
variants:
  base: {}
grid:
  decode.settings.max_running_requests: [64, 128]
  decode.settings.chunked_prefill_size: [4096, 8192]
benchmark: {concurrency: [1]}
choose: {stop_when_gain_below_percent: 5}
"""))
    assert [v.name for v in exp.variants] == [
        "base", "max_running_requests=64,chunked_prefill_size=4096",
        "max_running_requests=64,chunked_prefill_size=8192", "max_running_requests=128,chunked_prefill_size=4096",
        "max_running_requests=128,chunked_prefill_size=8192"]
    assert exp.variants[4].grid_index == (1, 1)
    assert exp.variants[4].overrides == {"decode": {"settings": {"max_running_requests": 128,
                                                                 "chunked_prefill_size": 8192}}}
    assert exp.choose.stop_when_gain_below_percent == 5.0


@pytest.mark.parametrize(("value", "message"), [
    (".inf", "must be a finite number of seconds, got inf"),   # was `timeout -k 30 inf` and an endless client wait
    ("172800", "must be at most 86400 seconds (a day), got 172800.0"),
])
def test_a_benchmark_timeout_that_never_ends_is_refused_at_its_line(tmp_path: Path, value: str, message: str) -> None:
    path = write(tmp_path, GOOD.replace("prompts: 8", f"prompts: 8\n  timeout_s: {value}"))
    with pytest.raises(InputError) as err:
        load_experiment(path)
    assert f"{path}:10: key benchmark.timeout_s: {message}" in str(err.value)
