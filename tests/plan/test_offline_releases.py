"""Any SGLang release plans offline (issue 44): a release gpudeploy has not captured is spelled like
the nearest captured one below it, and a flag that only a newer captured release has is a warning
for it (the release may have it too; deploy reads its own --help and checks again), never a refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudeploy.errors import InputError
from gpudeploy.plan.build import load_plan
from gpudeploy.report import unit_verdicts

REPO = Path(__file__).resolve().parents[2]

# every release on PyPI from 0.4.4 to 0.5.23 (``pip index versions sglang``), posts left out
RELEASES = (["0.4.4", "0.4.5", "0.4.6", "0.4.7", "0.4.8", "0.4.9", "0.4.10", "0.5.1", "0.5.2", "0.5.3"]
            + [f"0.5.{n}" for n in range(4, 24)])


def inventory(tmp_path: Path, release: str, settings: str = "") -> Path:
    roles = tmp_path / "roles"
    roles.mkdir(exist_ok=True)
    (roles / "dec.yml").write_text(f"""\
engine: sglang
tp_size: 4
model:
  path: /models/Qwen3-235B-A22B-FP8
  facts: {{name: Qwen3-235B-A22B-FP8, kind: mha, weights_gib: 219.8, layers: 94, num_attention_heads: 64,
          kv_heads: 4, head_dim: 128, hidden_size: 4096, vocab_size: 151936, moe_intermediate_size: 1536,
          num_experts_per_tok: 8, context_length: 40960}}
settings:
  mem_fraction_static: 0.80
  max_running_requests: 128
{settings}""")
    inv = tmp_path / "hosts.yml"
    inv.write_text(f"""\
deployment: t
roles_dir: {roles}
defaults:
  gpu_memory_gib: 140.4
  engine_versions: {{sglang: "{release}"}}
  python: /opt/sglang/.venv/bin/python
hosts:
  n1:
    address: 10.0.0.1
    numa_nodes: [{{id: 0, gpus: [0, 1, 2, 3], cpus: "0-31"}}]
    roles: [dec]
""")
    return inv


def test_a_flag_only_a_newer_capture_has_is_a_warning_for_a_release_between(tmp_path: Path) -> None:
    # 0.5.17 has --cuda-graph-backend-prefill (0.5.23 has it, 0.5.10 does not): plan failed with
    # "sglang 0.5.10 has no flag --cuda-graph-backend-prefill".
    plan = load_plan(str(inventory(tmp_path, "0.5.17", "  cuda_graph_backend_prefill: disabled\n")),
                     offline_flags=True)
    [unit] = plan.units
    assert unit.argv[unit.argv.index("--cuda-graph-backend-prefill") + 1] == "disabled"
    [verdict] = unit_verdicts(plan)
    assert verdict["verdict"] == "warn"
    said = " ".join(verdict["reasons"])
    assert "--cuda-graph-backend-prefill" in said and "0.5.23" in said and "0.5.10" in said, said


def test_an_extra_arg_only_a_newer_capture_has_is_a_warning(tmp_path: Path) -> None:
    inv = inventory(tmp_path, "0.5.17")
    role = tmp_path / "roles" / "dec.yml"
    role.write_text(role.read_text() + 'extra_args: ["--cuda-graph-backend-prefill", "disabled"]\n')
    plan = load_plan(str(inv), offline_flags=True)
    [verdict] = unit_verdicts(plan)
    assert verdict["verdict"] == "warn" and "extra_args" in " ".join(verdict["reasons"]), verdict


def test_a_flag_no_captured_release_has_is_still_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError) as err:
        load_plan(str(inventory(tmp_path, "0.5.17", "  cuda_graph_backend_prefil: disabled\n")), offline_flags=True)
    assert "has no flag --cuda-graph-backend-prefil" in str(err.value)


def test_a_value_only_a_newer_capture_accepts_is_a_warning(tmp_path: Path) -> None:
    # extra_buffer_lazy: a choice of 0.5.23's --mamba-radix-cache-strategy, not of 0.5.10's spelling
    plan = load_plan(str(inventory(tmp_path, "0.5.20", "  mamba_scheduler_strategy: extra_buffer_lazy\n")),
                     offline_flags=True)
    [unit] = plan.units
    assert "extra_buffer_lazy" in unit.argv
    assert unit_verdicts(plan)[0]["verdict"] == "warn"


@pytest.mark.parametrize("release", RELEASES)
def test_every_release_plans_offline(tmp_path: Path, release: str) -> None:
    plan = load_plan(str(inventory(tmp_path, release, "  cuda_graph_max_bs: 64\n")), offline_flags=True)
    [unit] = plan.units
    assert unit.memory is not None and unit.memory["verdict"] not in ("unknown", None), unit.memory
    assert unit.memory["release_rules"] == release
