"""The experiment file's `search:` section as a user writes it: every problem at once with file:line and
key, before anything runs or is written; a point of the space becomes a variant's overrides, with its
conditions (speculative_* only while an algorithm is on) and PD roles searched each on its own keys."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from test_experiment_file import invoke, write

from gpudeploy.errors import InputError
from gpudeploy.experiment.search_space import Search, label_of, overrides, sample
from gpudeploy.experiment.spec import load_experiment

BENCH = "benchmark: {concurrency: [1, 16], prompts: 8}\nslo: {p99_tpot_ms: 50}\n"


def test_every_problem_of_the_search_is_reported_at_its_line_and_nothing_runs(tmp_path: Path) -> None:
    path = write(tmp_path, """\
search:
  space:
    decod.settings.mem_fraction_static: {range: [0.6, 0.9]}
    decode.setting.x: {choices: [1]}
    decode.settings.mem_fraction_static: {range: [0.9, 0.6]}
    decode.settings.cuda_graph_max_bs: {range: [0, 256], log: true}
    decode.settings.chunked_prefill_size: {range: [1024, 8192], log: true, step: 1024}
    decode.settings.max_running_requests: {choices: []}
    decode.env.CUDA_VISIBLE_DEVICES: {choices: ["0,1"]}
    decode.settings.speculative_num_steps: {range: [1, 4], when: {decode.settings.no_such_key: x}}
    decode.tp_size: {range: [1.5, 8]}
    decode.settings.attention_backend: {choices: [fa3, fa3]}
  objective: [tok_per_s, p99_tpot_ms, {p99_ttft_ms: {concurrency: 8}}]
  budget: {launches: 10, trials: 5}
  sampler: gp
""" + BENCH)
    res = invoke("tune", "--file", str(path), "--dry-run")
    out = res.stdout + res.stderr
    assert res.returncode == 1 and "Traceback" not in out, out
    expected = [
        (6, "key search.space: search key 'decode.setting.x': expected ROLE.settings.NAME"),
        (7, "key search.space.decode.settings.mem_fraction_static.range: range [0.9, 0.6]: LOW must be below HIGH"),
        (8, "key search.space.decode.settings.cuda_graph_max_bs.range: a log range starts above 0"),
        (9, "key search.space.decode.settings.chunked_prefill_size.step: step and log do not go together"),
        (10, "key search.space.decode.settings.max_running_requests.choices: choices: give at least one value"),
        (11, "key search.space.decode.env.CUDA_VISIBLE_DEVICES: CUDA_VISIBLE_DEVICES is set by gpudeploy"),
        (12, "key search.space.decode.settings.speculative_num_steps.when: when: 'decode.settings.no_such_key' is "
             "not a key of the space with choices"),
        (13, "key search.space.decode.tp_size.range: tp_size is a whole number"),
        (14, "key search.space.decode.settings.attention_backend.choices: a value is listed twice"),
        (15, "key search.objective: unknown objective 'tok_per_s'"),
        (15, "key search.objective: p99_tpot_ms at which load? {p99_tpot_ms: {concurrency: C}}"),
        (15, "key search.objective: p99_ttft_ms: {concurrency: C}, C a level of benchmark.concurrency ([1, 16])"),
        (16, "key search.budget.trials: at least budget.launches (10)"),
        (17, "key search.sampler: gp is Optuna's GPSampler, which needs torch and scipy"),
    ]
    for line, text in expected:
        assert any(f"{path}:{line}:" in ln and text in ln for ln in out.splitlines()), (line, text, out)
    assert not (tmp_path / "results").exists() and not (tmp_path / "results.optuna.sqlite").exists()


def test_keys_the_deployment_does_not_have_are_found_before_the_first_trial(tmp_path: Path) -> None:
    # each key's values planned like a variant's: a role the deployment lacks, a flag SGLang 0.5.23 has not
    path = write(tmp_path, """\
search:
  space:
    decode.settings.mem_fraction_static: {range: [0.6, 0.9], step: 0.05}
    decod.settings.max_running_requests: {choices: [64, 128]}
    decode.settings.no_such_setting_at_all: {choices: [1, 2]}
  objective: output_tok_s_per_gpu
""" + BENCH)
    res = invoke("tune", "--file", str(path))
    out = res.stdout + res.stderr
    assert res.returncode == 1 and "Traceback" not in out, out
    assert f"{path}:6: key search.space.decod.settings.max_running_requests: role 'decod' is not a role of " \
           "deployment 'pd'" in out, out
    assert f"{path}:7: key search.space.decode.settings.no_such_setting_at_all:" in out and \
        "no_such_setting_at_all" in out.split(f"{path}:7:")[1], out
    assert not (tmp_path / "results").exists() and not (tmp_path / "results.optuna.sqlite").exists()


def test_search_and_variants_are_one_or_the_other_and_experiment_sends_a_search_to_tune(tmp_path: Path) -> None:
    both = write(tmp_path, "variants:\n  a: {}\nsearch:\n  space:\n    decode.settings.mem_fraction_static: "
                 "{range: [0.6, 0.9]}\n  objective: goodput\n" + BENCH)
    with pytest.raises(InputError) as exc:
        load_experiment(both)
    assert f"{both}:5: key search: a file holds either variants/grid" in str(exc.value), exc.value
    only = write(tmp_path, "search:\n  space:\n    decode.settings.mem_fraction_static: {range: [0.6, 0.9]}\n"
                 "  objective: goodput\n" + BENCH)
    res = invoke("experiment", "--file", str(only), "--dry-run")
    assert res.returncode == 1 and f"gpudeploy tune --file {only}" in res.stderr, res.stdout + res.stderr


def test_dry_run_shows_the_space_budget_and_study_and_writes_nothing(tmp_path: Path) -> None:
    path = write(tmp_path, """\
search:
  space:
    decode.settings.mem_fraction_static: {range: [0.6, 0.9], step: 0.05}
    decode.settings.speculative_algorithm: {choices: [null, EAGLE]}
    decode.settings.speculative_num_steps: {range: [1, 4]}
  objective: [output_tok_s_per_gpu, {p99_tpot_ms: {concurrency: 16}}]
  budget: {launches: 12, hours: 2}
""" + BENCH)
    res = invoke("tune", "--file", str(path), "--dry-run")
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "objectives: output_tok_s_per_gpu (max), p99_tpot_ms@c16 (min); under the SLO p99_tpot_ms <= 50" in out
    assert "sampler: nsga2; budget: 12 launches, 120 trials, 2 hours" in out, out
    assert "decode.settings.speculative_num_steps: int in [1, 4] (when decode.settings.speculative_algorithm is " \
           "not null)" in out, out
    assert f"study: {tmp_path / 'results.optuna.sqlite'} (optuna-dashboard sqlite:///" in out, out
    assert not (tmp_path / "results").exists() and not (tmp_path / "results.optuna.sqlite").exists()


class Fixed:
    """A trial whose choices are given (optuna.Trial's suggest_* with fixed answers); records what it was asked."""

    def __init__(self, **answers: Any) -> None:
        self.answers = {k.replace("__", "."): v for k, v in answers.items()}
        self.asked: list[str] = []

    def _answer(self, name: str) -> Any:
        self.asked.append(name)
        return self.answers[name]

    def suggest_float(self, name: str, low: float, high: float, *, step: float | None = None,
                      log: bool = False) -> float:
        return float(self._answer(name))

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False) -> int:
        return int(self._answer(name))

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
        value = self._answer(name)
        assert value in choices
        return value


def search_of(tmp_path: Path, space: str) -> Search:
    exp = load_experiment(write(tmp_path, f"search:\n  space:\n{space}  objective: output_tok_s_per_gpu\n" + BENCH))
    assert exp.search is not None
    return exp.search


def test_speculative_keys_are_searched_only_while_an_algorithm_is_on_and_removed_otherwise(tmp_path: Path) -> None:
    search = search_of(tmp_path, """\
    decode.settings.speculative_num_steps: {range: [1, 4]}
    decode.settings.speculative_algorithm: {choices: [null, EAGLE]}
    decode.settings.mem_fraction_static: {range: [0.6, 0.9], step: 0.01}
""")
    off = Fixed(**{"decode.settings.speculative_algorithm": None, "decode.settings.mem_fraction_static": 0.8200000001})
    params = sample(off, search)
    assert "decode.settings.speculative_num_steps" not in off.asked  # never sampled: it means nothing here
    assert params == {"decode.settings.speculative_algorithm": None, "decode.settings.mem_fraction_static": 0.82}
    # a role file's own speculative_num_steps must not reach an engine without an algorithm
    assert overrides(search, params) == {"decode": {"settings": {"speculative_num_steps": None,
                                                                 "speculative_algorithm": None,
                                                                 "mem_fraction_static": 0.82}}}
    on = Fixed(**{"decode.settings.speculative_algorithm": "EAGLE", "decode.settings.speculative_num_steps": 3,
                  "decode.settings.mem_fraction_static": 0.7})
    params = sample(on, search)
    assert on.asked[:2] == ["decode.settings.speculative_algorithm", "decode.settings.speculative_num_steps"]
    assert overrides(search, params)["decode"]["settings"]["speculative_num_steps"] == 3
    assert label_of(search, params) == "speculative_num_steps=3,speculative_algorithm=EAGLE,mem_fraction_static=0.7"


def test_pd_roles_are_searched_each_on_its_keys_and_a_joined_checkpoint_is_one_value(tmp_path: Path) -> None:
    search = search_of(tmp_path, """\
    prefill.settings.chunked_prefill_size: {range: [2048, 16384], log: true}
    decode.settings.max_running_requests: {choices: [64, 128]}
    prefill+decode.model.path:
      choices: [/models/Qwen3-235B-A22B-FP8, {path: /models/Qwen3-235B-A22B-FP4, facts: {kind: mha}}]
    decode.env.SGLANG_ENABLE_JIT_DEEPGEMM: {choices: [true, false]}
""")
    params = sample(Fixed(**{"prefill.settings.chunked_prefill_size": 4096, "decode.settings.max_running_requests": 64,
                             "prefill+decode.model.path": "/models/Qwen3-235B-A22B-FP4",
                             "decode.env.SGLANG_ENABLE_JIT_DEEPGEMM": False}), search)
    ov = overrides(search, params)
    fp4 = {"path": "/models/Qwen3-235B-A22B-FP4", "facts": {"kind": "mha"}}
    assert ov == {"prefill": {"settings": {"chunked_prefill_size": 4096}, "model": fp4},
                  "decode": {"settings": {"max_running_requests": 64}, "model": fp4,
                             "env": {"SGLANG_ENABLE_JIT_DEEPGEMM": "false"}}}
