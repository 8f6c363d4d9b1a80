"""Every example of docs/keys.yml's ``slurm`` and ``slurm_login`` sections loads in a Slurm inventory
(the docs' reference table is generated from them)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpudeploy.errors import InputError, Problem
from gpudeploy.slurm.inventory import load_slurm_inventory

KEYS = yaml.safe_load((Path(__file__).parents[2] / "docs" / "keys.yml").read_text())
BASE: dict[str, Any] = {
    "deployment": "pd",
    "slurm": {"login": {"address": "10.232.0.10"}, "partition": "gpu", "time": "01:00:00", "gpus_per_node": 8,
              "output_dir": "/shared/gd"},
    "defaults": {"gpu_memory_gib": 96, "engine_versions": {"sglang": "0.5.23", "sglang_router": "0.3.2"}},
    "hosts": {"node0": {"numa_nodes": [{"id": 0, "gpus": [0, 1, 2, 3], "cpus": "0-7"}], "roles": ["router"]}},
}
CASES = [(s, k) for s in ("slurm", "slurm_login") for k in KEYS[s]]


@pytest.mark.parametrize(("section", "key"), CASES, ids=[f"{s}.{k}" for s, k in CASES])
def test_each_slurm_example_loads(tmp_path: Path, section: str, key: str) -> None:
    data = copy.deepcopy(BASE)
    example = yaml.safe_load(KEYS[section][key]["example"])
    assert list(example) == [key]
    where = data["slurm"] if section == "slurm" else data["slurm"]["login"]
    where.update(example)
    if key == "nodelist":
        where.pop("nodes", None)
    elif key != "nodes":
        data["slurm"].setdefault("nodes", 1)
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(data))
    problems: list[Problem] = []
    try:
        load_slurm_inventory(tmp_path / "hosts.yml", problems)
    except InputError as exc:
        problems += exc.problems
    assert problems == []
