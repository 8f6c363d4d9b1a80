"""Issue 45, items 4, 7 and 8: `plan` says yes or no. It ends with a recap (per unit ok / warn /
refuse, why, the fix) and exits 2 where deploy would refuse (`render` too); the unit files' text only
with --files. A refused unit says what the refusal is about and the role file's key to edit, and
shows no headroom margin that reads as fine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

import gpudeploy
from gpudeploy.library import PACKAGED_ROLES

SRC = Path(gpudeploy.__file__).resolve().parents[1]


def gd(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GPUDEPLOY_INVENTORY"}
    return subprocess.run([sys.executable, "-m", "gpudeploy.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60, env={**env, "PYTHONPATH": str(SRC),
                                           "GPUDEPLOY_CALIBRATION": str(cwd / "calibration.json")})


def project(tmp: Path, prefill_fraction: float = 0.70) -> Path:
    """An inventory/ and roles/ as the README lays them out: one 8-GPU node (96 GB cards), the packaged
    prefill (copied, with ``prefill_fraction``), decode and router. At 0.50 the prefill's 54.95 GiB of
    weights per rank do not fit in its static memory: an empty KV pool, which deploy refuses."""
    (tmp / "roles").mkdir(parents=True)
    text = (PACKAGED_ROLES / "prefill.yml").read_text()
    assert "mem_fraction_static: 0.70 " in text
    (tmp / "roles" / "prefill.yml").write_text(text.replace("mem_fraction_static: 0.70 ",
                                                            f"mem_fraction_static: {prefill_fraction:.2f} "))
    inv = tmp / "inventory" / "hosts.yml"
    inv.parent.mkdir()
    inv.write_text(yaml.safe_dump({
        "deployment": "d", "defaults": {"gpu_memory_gib": 95.6,
                                        "engine_versions": {"sglang": "0.5.23", "sglang_router": "0.3.2"}},
        "hosts": {"n1": {"address": "192.0.2.1", "numa_nodes": [{"id": 0, "gpus": [0, 1, 2, 3], "cpus": "0-7"},
                                                                 {"id": 1, "gpus": [4, 5, 6, 7], "cpus": "8-15"}],
                         "roles": ["prefill", "decode", "router"]}}}))
    return inv


def recap(stdout: str) -> list[str]:
    lines = stdout.splitlines()
    return lines[lines.index("recap (what deploy would do):") + 1:]


def test_plan_that_deploy_would_refuse_ends_with_the_recap_and_exits_2(tmp_path: Path) -> None:
    project(tmp_path, prefill_fraction=0.50)
    res = gd("plan", cwd=tmp_path)
    assert res.returncode == 2, res.stdout + res.stderr  # was 0, the verdict in the middle of 171 lines
    rows = recap(res.stdout)
    assert rows[0].startswith("  n1/prefill  REFUSE  memory preflight predicts kv-pool-empty: mem_fraction_static "
                              "0.500 gives"), rows
    assert rows[1].split()[:2] == ["fix:", "in"] and "set settings.mem_fraction_static: 0.94" in rows[1]
    assert rows[2].startswith("  n1/decode   OK      memory fits") and rows[3].startswith("  n1/router   OK")
    assert rows[4].startswith("deploy would REFUSE n1/prefill") and "plan exits 2" in rows[4]
    help_text = gd("plan", "--help", cwd=tmp_path).stdout
    assert "2 deploy would refuse a unit" in help_text


def test_plan_shows_unit_files_only_with_files(tmp_path: Path) -> None:
    project(tmp_path)
    short = gd("plan", cwd=tmp_path)
    assert short.returncode == 0, short.stdout + short.stderr
    assert "[Service]" not in short.stdout and "ExecStart=" not in short.stdout
    assert "   files    /etc/systemd/system/gpudeploy-d.prefill.service, /etc/gpudeploy/d.prefill.env" in short.stdout
    assert recap(short.stdout)[-1] == "deploy would go ahead with 3 unit(s)"
    assert len(short.stdout.splitlines()) < 60  # was 171, two thirds of them the files' text
    full = gd("plan", "--files", cwd=tmp_path)
    assert full.returncode == 0 and "   --- /etc/systemd/system/gpudeploy-d.prefill.service" in full.stdout
    assert "   | ExecStart=/usr/bin/python3 -m sglang.launch_server" in full.stdout and "   | [Service]" in full.stdout


def test_plan_json_keeps_its_content_and_adds_the_verdicts(tmp_path: Path) -> None:
    project(tmp_path, prefill_fraction=0.50)
    res = gd("plan", "--json", cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    doc = json.loads(res.stdout)
    assert doc["deploy_would_refuse"] is True
    verdicts = {u["role"]: u["verdict"] for u in doc["units"]}
    assert [verdicts[r]["verdict"] for r in ("prefill", "decode", "router")] == ["refuse", "ok", "ok"]
    assert "settings.mem_fraction_static" in verdicts["prefill"]["fix"]
    assert all(u["files"] and u["argv"] and "memory" in u for u in doc["units"])  # the files' text, as before
    ok = project(tmp_path / "ok")
    fine = gd("plan", "--json", "--inventory", str(ok), cwd=tmp_path / "ok")
    assert fine.returncode == 0 and json.loads(fine.stdout)["deploy_would_refuse"] is False


def test_render_exits_2_where_deploy_would_refuse(tmp_path: Path) -> None:
    project(tmp_path, prefill_fraction=0.50)
    res = gd("render", "--target", "k8s", cwd=tmp_path)
    assert res.returncode == 2, res.stderr[-3000:]
    assert "kind: LeaderWorkerSet" in res.stdout  # the YAML, on stdout as before
    assert "deploy would REFUSE n1/prefill" in res.stderr and "recap" not in res.stdout
    ok = project(tmp_path / "ok")
    fine = gd("render", "--target", "k8s", "--inventory", str(ok), cwd=tmp_path / "ok")
    assert fine.returncode == 0 and "deploy would go ahead with 3 unit(s)" in fine.stderr, fine.stderr[-3000:]
