"""Flags of a release gpudeploy has not captured, learned from a host earlier: `invoke plan` finds them
by release, whatever the release string looks like (a local part, a non-PEP 440 suffix), and says
so plainly when it has none, never with a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HELP_0510 = REPO / "src" / "gpudeploy" / "data" / "sglang-0.5.10-launch_server-help.txt"


def inventory(tmp_path: Path, release: str) -> Path:
    inv = tmp_path / "hosts.yml"
    inv.write_text(f"""\
deployment: t
roles_dir: {REPO / 'roles'}
defaults:
  gpu_memory_gib: 95.6
  engine_versions: {{sglang: "{release}", sglang_router: "0.3.2"}}
  python: /opt/sglang/.venv/bin/python
hosts:
  n1:
    address: 10.0.0.1
    numa_nodes: [{{id: 0, gpus: [0, 1, 2, 3], cpus: "0-31"}}]
    roles: [decode]
""")
    return inv


def plan(inv: Path, cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), "plan", "--inventory",
                           str(inv), *args], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "GPUDEPLOY_FLAGS_CACHE": str(cache)})


def learned_before(cache: Path, release: str) -> None:
    """A --help kept by an earlier gpudeploy (its file layout: one file per release), 0.5.10's flags."""
    cache.mkdir(parents=True, exist_ok=True)
    (cache / f"sglang-{release}-launch_server-help.txt").write_text(HELP_0510.read_text())


def argv_of(res: subprocess.CompletedProcess[str]) -> list[str]:
    assert res.returncode == 0, res.stdout + res.stderr
    [unit] = json.loads(res.stdout)["units"]
    return list(unit["argv"])


def test_a_learned_release_with_a_dash_is_found_and_not_learned_again(tmp_path: Path) -> None:
    # `0.5.24-cu128` was read as release 0.5.24 from the file name: plan called it "not captured" (so
    # every deploy learned it again) and listed a 0.5.24 it did not have.
    cache = tmp_path / "flags"
    learned_before(cache, "0.5.24-cu128")
    argv = argv_of(plan(inventory(tmp_path, "0.5.24-cu128"), cache, "--json"))
    assert argv[argv.index("--cuda-graph-max-bs") + 1] == "64", argv  # 0.5.10's spelling: the learned help


def test_a_release_near_a_learned_one_is_not_known_and_not_a_traceback(tmp_path: Path) -> None:
    # Inventory 0.5.24 with only 0.5.24-cu128 learned: a KeyError traceback from flagspec.load_flags.
    # Now it plans offline with the nearest release it has (issue 22), and says so.
    cache = tmp_path / "flags"
    learned_before(cache, "0.5.24-cu128")
    res = plan(inventory(tmp_path, "0.5.24"), cache)
    out = res.stdout + res.stderr
    assert res.returncode == 0 and "Traceback" not in out, out
    assert "flags    of 0.5.24-cu128, the nearest release gpudeploy has captured: 0.5.24 is not captured" in out, out


def test_a_learned_release_with_a_local_part_is_found(tmp_path: Path) -> None:
    # `0.5.23+cu128` (a local build) never matched the file-name pattern: learned again at every deploy.
    cache = tmp_path / "flags"
    learned_before(cache, "0.5.23+cu128")
    argv = argv_of(plan(inventory(tmp_path, "0.5.23+cu128"), cache, "--json"))
    assert "--cuda-graph-max-bs" in argv and "--cuda-graph-max-bs-decode" not in argv, argv


def test_the_same_release_written_another_way_is_the_captured_one(tmp_path: Path) -> None:
    # PEP 440: 0.5.23.0 is 0.5.23, so its captured --help applies (it was "not captured").
    argv = argv_of(plan(inventory(tmp_path, "0.5.23.0"), tmp_path / "flags", "--json"))
    assert "--cuda-graph-max-bs-decode" in argv, argv
