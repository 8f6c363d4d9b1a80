"""A variant's overrides are checked like the inventory's role keys (reserved env names, env name syntax,
control characters, value types, a TP that splits over its nodes), with the experiment file's line
and key, before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from test_experiment_file import invoke, write

from gpudeploy.errors import InputError
from gpudeploy.experiment.spec import load_experiment
from gpudeploy.experiment.variants import plan_variants

BAD = """\
variants:
  gpus: {decode: {env: {CUDA_VISIBLE_DEVICES: "0,1,2,3"}}}
  inject: {decode: {env: {"A\\nLD_PRELOAD": /tmp/x.so}}}
  value: {decode: {env: {NCCL_DEBUG: "INFO\\nLD_PRELOAD=/tmp/x.so"}}}
  bad-name: {decode: {env: {1ABC: x}}}
  typed: {decode: {env: {X: [1, 2]}}}
  words: {decode: {extra_args: [--x, {a: 1}]}}
  removed: {decode: {env: {SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT: null}}}
grid:
  decode.env.CUDA_DEVICE_ORDER: [FASTEST_FIRST]
  decode.env.NCCL_DEBUG: ["WARN\\nLD_PRELOAD=/tmp/y.so"]
benchmark: {concurrency: [1]}
"""


def test_variant_env_and_args_are_refused_as_the_inventory_refuses_them(tmp_path: Path) -> None:
    # Before: a variant could set CUDA_VISIBLE_DEVICES (decode on prefill's GPUs) or an env key with a
    # newline (a line of its own in the env file: LD_PRELOAD=...); --dry-run printed the plan.
    path = write(tmp_path, BAD)
    res = invoke("experiment", "--file", str(path), "--dry-run")
    out = res.stdout + res.stderr
    assert res.returncode == 1 and "Traceback" not in out, out
    expected = [
        (4, "key variants.gpus.decode.env.CUDA_VISIBLE_DEVICES: CUDA_VISIBLE_DEVICES is set by gpudeploy"),
        (5, "key variants.inject.decode.env: 'A\\nLD_PRELOAD' is not a valid environment variable name"),
        (6, "key variants.value.decode.env.NCCL_DEBUG: value of NCCL_DEBUG: 'INFO\\nLD_PRELOAD=/tmp/x.so' "
            "contains a newline"),
        (7, "key variants.bad-name.decode.env: '1ABC' is not a valid environment variable name"),
        (8, "key variants.typed.decode.env: value of X must be a string or number"),
        (9, "key variants.words.decode.extra_args: extra_args is a list of words"),
        (12, "key grid.decode.env.CUDA_DEVICE_ORDER: CUDA_DEVICE_ORDER is set by gpudeploy"),
        (13, "key grid.decode.env.NCCL_DEBUG: value of NCCL_DEBUG: 'WARN\\nLD_PRELOAD=/tmp/y.so' contains a newline"),
    ]
    for line, text in expected:
        assert any(f"{path}:{line}:" in ln and text in ln for ln in out.splitlines()), (line, text, out)
    assert "variants.removed" not in out  # null removes an inherited key: allowed
    assert "LD_PRELOAD=/tmp/x.so\n" not in out and not (tmp_path / "results").exists()


def test_a_null_env_value_removes_the_inherited_key_and_values_read_as_the_inventory_reads_them(
        tmp_path: Path) -> None:
    exp = load_experiment(write(tmp_path, """\
variants:
  removed: {decode: {env: {SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT: null, SGLANG_FLAG: true, N: 3}}}
benchmark: {concurrency: [1]}
"""))
    [p] = plan_variants(exp)
    decode = next(u for u in p.plan.units if u.role.name == "decode")
    assert "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT" not in decode.role.env
    assert decode.env["SGLANG_FLAG"] == "true" and decode.env["N"] == "3"  # as in a role file (was "True")


def test_a_variant_tp_that_does_not_split_over_the_groups_nodes_is_refused(tmp_path: Path) -> None:
    roles = tmp_path / "roles"
    roles.mkdir()
    (roles / "big.yml").write_text(yaml.safe_dump({"engine": "sglang", "tp_size": 8, "nnodes": 2,
                                                   "model": {"path": "/models/m"}}))
    hosts = {f"n{i}": {"address": f"192.0.2.{20 + i}", "roles": ["big"],
                       "numa_nodes": [{"id": 0, "gpus": list(range(8)), "cpus": "0-63"}]} for i in (1, 2)}
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"deployment": "big", "roles_dir": str(roles),
                                   "defaults": {"gpu_memory_gib": 141, "engine_versions": {"sglang": "0.5.23"}},
                                   "hosts": hosts}))
    path = tmp_path / "exp.yml"
    path.write_text(f"inventory: {inv}\nresults: {tmp_path / 'results'}\nvariants:\n"
                    "  tp3: {big: {tp_size: 3}}\n  tp4: {big: {tp_size: 4}}\nbenchmark: {concurrency: [1]}\n")
    with pytest.raises(InputError) as exc:
        plan_variants(load_experiment(path))
    [problem] = exc.value.problems
    assert f"{path}:4:" in str(problem) and "key variants.tp3.big.tp_size" in str(problem), problem
    assert "tp_size 3 is the whole group's TP; it must split evenly over 2 nodes" in str(problem)
