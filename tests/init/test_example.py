"""Issue 45, item 9: `gpudeploy init --example` (no SSH) writes a commented example inventory and
copies the packaged roles beside it to edit; what it writes plans offline with nothing to fix, it
never overwrites without --force, and it says what to edit next."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gpudeploy
from gpudeploy.library import PACKAGED_ROLES

SRC = Path(gpudeploy.__file__).resolve().parents[1]


def gd(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GPUDEPLOY_INVENTORY"}
    return subprocess.run([sys.executable, "-m", "gpudeploy.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60, env={**env, "PYTHONPATH": str(SRC),
                                           "GPUDEPLOY_CALIBRATION": str(cwd / "calibration.json")})


def test_the_example_plans_offline_with_the_roles_copied_beside_it(tmp_path: Path) -> None:
    res = gd("init", "--example", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    inv = tmp_path / "inventory" / "hosts.yml"
    text = inv.read_text()
    assert text.startswith("# An example inventory") and text.count("#") > 20  # commented
    copied = sorted(p.name for p in (tmp_path / "roles").iterdir())
    assert copied == sorted(p.name for p in PACKAGED_ROLES.glob("*.yml"))
    assert "roles_dir: ../roles" in text
    assert f"wrote {Path('inventory') / 'hosts.yml'}" in res.stdout and "next:" in res.stdout
    assert "model.path" in res.stdout and "gpudeploy plan" in res.stdout  # what to edit, then what to run
    plan = gd("plan", "--json", cwd=tmp_path)  # ./inventory/hosts.yml, offline
    assert plan.returncode == 0, plan.stdout[-2000:] + plan.stderr
    units = {u["role"]: u for u in json.loads(plan.stdout)["units"]}
    assert set(units) == {"prefill", "decode", "router"}
    assert (units["prefill"]["numa_node"], units["prefill"]["gpus"]) == (0, [0, 1, 2, 3])
    assert (units["decode"]["numa_node"], units["decode"]["gpus"]) == (1, [4, 5, 6, 7])
    assert all(u["verdict"]["verdict"] == "ok" for u in units.values()), [u["verdict"] for u in units.values()]
    assert all(u["memory"]["verdict"] == "fits" for r, u in units.items() if r != "router")
    # the copies are the ones read: an edit there shows in the plan
    (tmp_path / "roles" / "decode.yml").write_text((tmp_path / "roles" / "decode.yml").read_text()
                                                   .replace("max_running_requests: 128", "max_running_requests: 96"))
    again = json.loads(gd("plan", "--json", "--role", "decode", cwd=tmp_path).stdout)["units"][0]["argv"]
    assert again[again.index("--max-running-requests") + 1] == "96"


def test_the_example_never_overwrites_without_force(tmp_path: Path) -> None:
    (tmp_path / "roles").mkdir()
    (tmp_path / "roles" / "decode.yml").write_text("# mine\n")
    res = gd("init", "--example", cwd=tmp_path)
    assert res.returncode == 1 and "roles/decode.yml" in res.stderr and "--force" in res.stderr, res.stderr
    assert not (tmp_path / "inventory").exists()  # nothing written
    assert (tmp_path / "roles" / "decode.yml").read_text() == "# mine\n"
    forced = gd("init", "--example", "--force", cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert (tmp_path / "roles" / "decode.yml").read_bytes() == (PACKAGED_ROLES / "decode.yml").read_bytes()


def test_an_example_at_the_top_of_the_folder_gets_its_roles_in_roles(tmp_path: Path) -> None:
    res = gd("init", "--example", "--out", "hosts.yml", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "roles_dir: roles" in (tmp_path / "hosts.yml").read_text() and (tmp_path / "roles" / "prefill.yml").is_file()
    assert gd("plan", "--inventory", "hosts.yml", cwd=tmp_path).returncode == 0
    assert gd("init", "--example", "--host", "10.0.0.1", cwd=tmp_path / "roles").returncode == 1  # no SSH with it
