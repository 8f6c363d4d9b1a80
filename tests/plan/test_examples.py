"""Issue 46: the example inventories a user copies (every file in inventory/) plan offline with nothing
to fix and give the units their comments promise: `gpudeploy plan` on each where it is, and on a copy
as the default inventory (inventory/hosts.yml) of a folder of the user's own, where the only roles near
are the packaged ones and the roles_dir folder the example names, copied with it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import gpudeploy

REPO = Path(__file__).resolve().parents[2]
SRC = Path(gpudeploy.__file__).resolve().parents[1]
EXAMPLES = REPO / "inventory"
NODE = ([0, 1, 2, 3], 0), ([4, 5, 6, 7], 1)  # a TP4 prefill on NUMA node 0, a TP4 decode on node 1
ROUTER: tuple[list[int], None] = ([], None)
WHOLE_NODE: tuple[list[int], None] = (list(range(8)), None)  # spans both NUMA nodes

# example -> (host, role) -> (GPUs, NUMA node): every unit the plan must have, and no other
UNITS: dict[str, dict[tuple[str, str], tuple[list[int], int | None]]] = {
    "one-node": {("node171", "prefill"): NODE[0], ("node171", "decode"): NODE[1], ("node171", "router"): ROUTER},
    "two-nodes": {("node171", "prefill"): NODE[0], ("node171", "decode"): NODE[1], ("node171", "router"): ROUTER,
                  ("node172", "prefill"): NODE[0], ("node172", "decode"): NODE[1]},
    "container": {("gpubox", "prefill"): NODE[0], ("gpubox", "decode"): NODE[1], ("gpubox", "router"): ROUTER},
    "tp16-two-nodes": {("node181", "tp16"): WHOLE_NODE, ("node181", "tp16-router"): ROUTER,
                       ("node182", "tp16"): WHOLE_NODE},
}
# where each example's units are written: systemd units, or the process supervisor's specs (no systemd)
UNIT_DIR = {"container": "/etc/gpudeploy/units/"}
# what the router is started with: the servers it fronts
ROUTER_ARGV = {
    "two-nodes": ["--prefill http://10.0.0.171:30000 8998 --prefill http://10.0.0.172:30000 8998",
                  "--decode http://10.0.0.171:30010 --decode http://10.0.0.172:30010"],
    "tp16-two-nodes": ["--worker-urls http://10.0.0.181:30000 --host"],  # the group's leader only
}
# a multi-node group: (host, role) -> its rank
RANKS = {"tp16-two-nodes": {("node181", "tp16"): 0, ("node182", "tp16"): 1}}


def gd(*args: str, cwd: Path, tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GPUDEPLOY_INVENTORY"}
    env.update(PYTHONPATH=str(SRC), GPUDEPLOY_CALIBRATION=str(tmp / "calibration.json"))
    return subprocess.run([sys.executable, "-m", "gpudeploy.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env=env)


def test_every_example_is_tested() -> None:
    assert sorted(p.stem for p in EXAMPLES.glob("*.yml")) == sorted(UNITS)


def copied(name: str, tmp_path: Path) -> Path:
    """The example as ./inventory/hosts.yml of a folder of the user's own, with the roles_dir it names."""
    home = tmp_path / "mine"
    (home / "inventory").mkdir(parents=True)
    source = EXAMPLES / f"{name}.yml"
    shutil.copyfile(source, home / "inventory" / "hosts.yml")
    roles_dir = (yaml.safe_load(source.read_text()) or {}).get("roles_dir")
    if roles_dir:
        shutil.copytree(source.parent / roles_dir, home / "inventory" / roles_dir)
    assert not (home / "roles").exists()  # ../roles: none, the packaged roles only
    return home


@pytest.mark.parametrize("where", ["in place", "copied"])
@pytest.mark.parametrize("name", sorted(UNITS))
def test_the_example_plans_offline_with_the_units_it_describes(name: str, where: str, tmp_path: Path) -> None:
    if where == "in place":
        res = gd("plan", "--json", "--inventory", f"inventory/{name}.yml", cwd=REPO, tmp=tmp_path)
    else:
        # the default inventory, ./inventory/hosts.yml, as a user types it
        res = gd("plan", "--json", cwd=copied(name, tmp_path), tmp=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr  # 1: a problem; 2: deploy would refuse
    doc = json.loads(res.stdout)
    assert not doc["deploy_would_refuse"]
    units: dict[tuple[str, str], dict[str, Any]] = {(u["host"], u["role"]): u for u in doc["units"]}
    assert {k: (u["gpus"], u["numa_node"]) for k, u in units.items()} == UNITS[name]
    for (host, role), unit in units.items():
        assert unit["verdict"]["verdict"] == "ok", (host, role, unit["verdict"])
        if unit["gpus"]:  # the memory preflight ran and found it fits (every GPU role has model facts)
            assert unit["memory"]["verdict"] == "fits", (host, role, unit["memory"])
        where_units = UNIT_DIR.get(name, "/etc/systemd/system/")
        assert any(path.startswith(where_units) for path in unit["files"]), (host, role, list(unit["files"]))
        if role in ("router", "tp16-router"):
            argv = " ".join(unit["argv"])
            assert all(part in argv for part in ROUTER_ARGV.get(name, [])), argv
    for key, rank in RANKS.get(name, {}).items():
        assert units[key]["group"]["rank"] == rank and units[key]["group"]["nnodes"] == 2


def test_an_example_in_place_reads_the_packaged_library_not_a_copy_of_it(tmp_path: Path) -> None:
    # its roles_dir defaults to ../roles, the top-level roles/: the packaged library itself (the package's
    # roles folder links to it), so no role is listed twice or as overriding the packaged one
    res = gd("roles", "--json", "--inventory", "inventory/one-node.yml", cwd=REPO, tmp=tmp_path)
    assert res.returncode == 0, res.stderr
    listed = json.loads(res.stdout)
    assert sorted(r["name"] for r in listed) == ["command", "decode", "prefill", "router", "vllm"]
    assert all(r["source"] == "packaged" and not r["overrides_packaged"] for r in listed), listed
