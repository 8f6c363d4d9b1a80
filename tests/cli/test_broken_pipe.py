"""Issue 45, item 8: `gpudeploy plan --json | head` ended in a BrokenPipeError traceback. A reader that
went away ends the command quietly, with 141 (128 + SIGPIPE, as `yes | head` leaves it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

import gpudeploy

SRC = Path(gpudeploy.__file__).resolve().parents[1]


def test_a_reader_that_went_away_ends_the_command_quietly(tmp_path: Path) -> None:
    (tmp_path / "inventory").mkdir()
    (tmp_path / "inventory" / "hosts.yml").write_text(yaml.safe_dump({
        "deployment": "d", "defaults": {"gpu_memory_gib": 95.6,
                                        "engine_versions": {"sglang": "0.5.23", "sglang_router": "0.3.2"}},
        "hosts": {"n1": {"address": "192.0.2.1", "numa_nodes": [{"id": 0, "gpus": [0, 1, 2, 3], "cpus": "0-7"},
                                                                 {"id": 1, "gpus": [4, 5, 6, 7], "cpus": "8-15"}],
                         "roles": ["prefill", "decode", "router"]}}}))
    env = {k: v for k, v in os.environ.items() if k != "GPUDEPLOY_INVENTORY"}
    for args in (["plan", "--json"], ["plan"], ["roles"], ["--help"]):
        read, write = os.pipe()
        os.close(read)  # the reader is gone before the first write
        try:
            res = subprocess.run([sys.executable, "-m", "gpudeploy.cli", *args], cwd=tmp_path, stdout=write,
                                 stderr=subprocess.PIPE, text=True, timeout=60,
                                 env={**env, "PYTHONPATH": str(SRC),
                                      "GPUDEPLOY_CALIBRATION": str(tmp_path / "calibration.json")})
        finally:
            os.close(write)
        assert res.returncode == 141, (args, res.stderr)
        assert res.stderr == "", (args, res.stderr)  # no traceback, no "Exception ignored"
