"""`invoke plan` as a user runs it: exit codes, JSON shape, no tracebacks, and valid systemd units."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpudeploy.flagspec import load_flags
from gpudeploy.plan import load_plan

REPO = Path(__file__).resolve().parents[2]


def invoke(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), *args],
                          cwd=cwd, capture_output=True, text=True, timeout=60)


FLEET = "lab/inventory/hosts.yml"  # node171: a TP4 prefill and a TP4 decode of Qwen3-235B, a router


def test_plan_decode_json_on_shipped_inventory() -> None:
    res = invoke("plan", "--inventory", FLEET, "--host", "node171", "--role", "decode", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    [decode] = doc["units"]
    assert decode["host"] == "node171" and decode["unit"] == "gpudeploy-pd.decode.service"
    assert len(decode["gpus"]) == 4

    everything = json.loads(invoke("plan", "--inventory", FLEET, "--host", "node171", "--json").stdout)["units"]
    prefill = next(u for u in everything if u["role"] == "prefill")
    # All four on one NUMA node, none shared with the prefill, no shared port.
    assert decode["numa_node"] is not None and prefill["numa_node"] != decode["numa_node"]
    assert not set(decode["gpus"]) & set(prefill["gpus"])
    assert not set(decode["ports"].values()) & set(prefill["ports"].values())
    argv = decode["argv"]
    assert argv[argv.index("--disaggregation-mode") + 1] == "decode"
    assert argv[argv.index("--tp-size") + 1] == "4"
    flags = load_flags("sglang", decode["engine_version"])
    for word in argv[3:]:
        if word.startswith("--"):
            assert word in flags, word
    for key in ("host", "role", "unit", "gpus", "numa_node", "ports", "argv", "files"):
        assert key in decode


def test_bad_input_is_one_clear_message(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.yml"
    inv.write_text("hosts:\n  node171:\n    address: 10.0.0.1\n    numa_nodes: [{gpus: [0], cpus: '0'}]\n"
                   "    gpu_memory_gib: -5\n    roles: [nosuch]\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    res = invoke("plan", "--inventory", str(inv))
    assert res.returncode == 1
    assert "Traceback" not in res.stderr + res.stdout
    assert f"{inv}:5: host node171, key gpu_memory_gib: must be positive" in res.stderr
    assert "unknown role 'nosuch'" in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


@pytest.mark.parametrize(("value", "message"), [("abc", "--timeout takes a number of seconds, not 'abc'"),
                                                ("0", "--timeout must be more than 0 seconds, got '0'"),
                                                ("-5", "--timeout must be more than 0 seconds")])
def test_a_bad_timeout_is_a_message_not_a_traceback_or_ignored(value: str, message: str) -> None:
    # `--timeout abc` was a ValueError traceback; `--timeout 0` was silently the role's timeout.
    res = invoke("deploy", "--inventory", FLEET, "--host", "node171", "--timeout", value)
    assert res.returncode == 1 and message in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_list_shows_each_task_with_help() -> None:
    res = invoke("--list")
    assert res.returncode == 0
    # A task's line starts in column 2; its help's wrapped lines are indented further.
    lines = [ln for ln in res.stdout.splitlines()[1:] if ln.startswith("  ") and not ln.startswith("   ")]
    tasks = [ln.split()[0] for ln in lines]
    assert "plan" in tasks and "experiment.show" in tasks
    for ln in lines:
        assert len(ln.split()) > 1, f"task without help: {ln.strip()}"


def _good_inventories() -> list[Path]:
    """The lab's, and the examples a user copies whose hosts run systemd (container.yml's runs none)."""
    examples = [p for p in sorted((REPO / "inventory").glob("*.yml")) if "supervisor: process" not in p.read_text()]
    return [REPO / "lab" / "inventory" / "hosts.yml", REPO / "lab" / "inventory" / "lab.yml", *examples]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
@pytest.mark.parametrize("inventory", _good_inventories(), ids=lambda p: p.name)
def test_rendered_units_pass_systemd_analyze_verify(inventory: Path, tmp_path: Path) -> None:
    if not inventory.exists():
        pytest.skip(f"{inventory} not present")
    # A throwaway root with systemd's own units and each ExecStart binary, so verify checks our
    # files and nothing about this machine. Any output at all counts as a failure.
    root = tmp_path / "root"
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    plan = load_plan(str(inventory))
    assert plan.units
    for unit in plan.units:
        binary = root / unit.argv[0].lstrip("/")
        binary.parent.mkdir(parents=True, exist_ok=True)
        binary.write_text("#!/bin/sh\n")
        binary.chmod(0o755)
        path = root / unit.unit_path.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(unit.files[unit.unit_path])
    for unit in plan.units:
        res = subprocess.run(["systemd-analyze", "verify", f"--root={root}", str(root / unit.unit_path.lstrip("/"))],
                             capture_output=True, text=True, timeout=60, env={**os.environ, "SYSTEMD_LOG_COLOR": "0"})
        assert res.returncode == 0 and not res.stderr.strip() and not res.stdout.strip(), (unit.name, res)
