"""An experiment on the real SGLang PD pair with SGLang's own client (marked ``sglang``).

`python -m sglang.bench_serving` needs SGLang's runtime: it runs on the router's host from the
engine's own venv, against the real router in front of the real pair (lab/inventory/lab-sglang.yml).
One variant, one level: what is checked is that the engine's own client measures the real engine.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import Lab
from deploytools import REPO, gd

pytestmark = [pytest.mark.lab, pytest.mark.sglang]


def test_sglang_bench_serving_measures_the_real_pair_through_the_router(lab: Lab, tmp_path: Path) -> None:
    spec = yaml.safe_load((REPO / "experiments" / "lab-sglang.yml").read_text())
    spec.update(inventory=str(REPO / "lab" / "inventory" / "lab-sglang.yml"), results=str(tmp_path / "results"),
                variants={"running-8": spec["variants"]["running-8"]})
    spec["benchmark"].update(concurrency=[2], prompts=6)
    path = tmp_path / "exp.yml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    res = gd("experiment", "--file", str(path), timeout=900)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "client: sglang's own benchmark, through the router" in out, out
    doc = json.loads(gd("experiment.show", "--file", str(path), "--json").stdout)
    [variant] = doc["variants"]
    assert variant["status"] == "measured" and variant["timing"] == "measured (CPU)", variant
    [level] = variant["levels"]
    assert level["figures"]["completed"] == 6 and level["figures"]["output_tok_s"] > 0, level
    assert "-m sglang.bench_serving" in " ".join(level["client_argv"])
    st = json.loads(gd("status", "--inventory", str(REPO / "lab" / "inventory" / "lab-sglang.yml"), "--json").stdout)
    assert not [u for h in st["hosts"].values() for u in h["units"] if u["state"].startswith("active")], st  # torn down
